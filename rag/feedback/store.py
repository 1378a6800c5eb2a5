"""The feedback store: SQLite in WAL mode by default, any SQLAlchemy URL (Postgres) with FEEDBACK_DB_URL.

Every write is one transaction that validates first (unknown query or passage, conflicting idempotency key),
so a refused request leaves the store exactly as it was and an acknowledged one is durable (synchronous=FULL).
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
from sqlalchemy import Engine, create_engine, event, func, inspect, insert, select, update
from sqlalchemy.exc import IntegrityError

from rag.feedback import schema as s
from rag.feedback.models import (
    ExpertAck,
    ExpertLabel,
    ExpertUndo,
    FeedbackAck,
    FeedbackSubmission,
    IdempotencyConflictError,
    ImplicitEvent,
    NothingToUndoError,
    StoredQuery,
    UnknownPassageError,
    UnknownQueryError,
)
from rag.store import data_dir

REFORMULATION_SECONDS = 120  # a session asking again this soon, without rating the answer up, rephrased it


def default_url(root: Path | None = None) -> str:
    return os.environ.get("FEEDBACK_DB_URL") or f"sqlite:///{Path(root or data_dir()) / 'feedback.sqlite'}"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _utc(stamp: datetime) -> datetime:
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)  # SQLite returns the stored UTC without zone


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _insert_ignoring_duplicates(conn, table, rows: list[dict]) -> None:
    """Insert rows whose key may already exist: a concurrent writer (Postgres lets two transactions insert the same
    new passage) must not turn a retrieval log into a 500, and the existing row is the same content."""
    if not rows:
        return
    if conn.dialect.name in ("sqlite", "postgresql"):
        dialect_insert = __import__(f"sqlalchemy.dialects.{conn.dialect.name}", fromlist=["insert"]).insert
        conn.execute(dialect_insert(table).on_conflict_do_nothing(), rows)
    else:
        conn.execute(insert(table), rows)


def _migrate(engine: Engine) -> None:
    """Bring a store created by an older version up to the current schema (create_all adds tables, not columns)."""
    _migrate_passage_versions(engine)
    _migrate_rollout(engine)
    _migrate_timings(engine)
    _migrate_shared_picks(engine)
    _migrate_event_sessions(engine)
    _migrate_issued_sessions(engine)


def _migrate_issued_sessions(engine: Engine) -> None:
    """Stores created before the server issued sessions: add the issued session and client key columns (NULL for
    earlier rows, which a canary then does not credit: no one can say which session sent them)."""
    wanted = {
        "queries": (("client_session", "VARCHAR(64)"), ("client_key", "VARCHAR(32)")),
        "feedback_submissions": (("client_session", "VARCHAR(64)"),),
        "implicit_events": (("client_session", "VARCHAR(64)"),),
    }
    with engine.begin() as conn:
        for table, columns in wanted.items():
            have = {c["name"] for c in inspect(conn).get_columns(table)}
            for column, kind in columns:
                if column not in have:
                    conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _migrate_event_sessions(engine: Engine) -> None:
    """Stores created before events carried their session: add implicit_events.session_id (NULL for earlier
    events, which a canary then does not count: no one can say which session clicked)."""
    with engine.begin() as conn:
        if "session_id" not in {c["name"] for c in inspect(conn).get_columns("implicit_events")}:
            conn.exec_driver_sql("ALTER TABLE implicit_events ADD COLUMN session_id VARCHAR(128)")


def _migrate_timings(engine: Engine) -> None:
    """Stores created before per-step timings: add queries.timings_ms (NULL for earlier queries)."""
    with engine.begin() as conn:
        if "timings_ms" not in {c["name"] for c in inspect(conn).get_columns("queries")}:
            conn.exec_driver_sql("ALTER TABLE queries ADD COLUMN timings_ms JSON")


def _migrate_shared_picks(engine: Engine) -> None:
    """Stores created before shared interleaving picks were recorded: add retrievals.shared (NULL: earlier canary
    queries are credited as plain team draft credited them)."""
    with engine.begin() as conn:
        if "shared" not in {c["name"] for c in inspect(conn).get_columns("retrievals")}:
            conn.exec_driver_sql("ALTER TABLE retrievals ADD COLUMN shared BOOLEAN")


def _migrate_rollout(engine: Engine) -> None:
    """Stores created before canary rollouts: add queries.arm and retrievals.team (NULL for every earlier query: none
    of them was served by a canary)."""
    with engine.begin() as conn:
        for table, column in (("queries", "arm"), ("retrievals", "team")):
            if column not in {c["name"] for c in inspect(conn).get_columns(table)}:
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} VARCHAR(16)")


def _migrate_passage_versions(engine: Engine) -> None:
    """Stores created before passage versioning: add retrievals.text_hash and record the text each passage row holds
    as its first version (that is the text every earlier query was shown)."""
    if "text_hash" in {c["name"] for c in inspect(engine).get_columns("retrievals")}:
        return
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE retrievals ADD COLUMN text_hash VARCHAR(64)")
        for row in conn.execute(select(s.passages)).mappings().all():
            digest = text_hash(row["text"])
            _insert_ignoring_duplicates(
                conn,
                s.passage_versions,
                [
                    {
                        "chunk_id": row["chunk_id"],
                        "text_hash": digest,
                        "doc_id": row["doc_id"],
                        "page_start": row["page_start"],
                        "page_end": row["page_end"],
                        "text": row["text"],
                        "first_served_at": None,
                    }
                ],
            )
            conn.execute(
                update(s.retrievals).where(s.retrievals.c.chunk_id == row["chunk_id"]).values(text_hash=digest)
            )


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # WAL: readers (the sensors, exports) never block the API's writers; FULL: an acknowledged commit
    # survives a crash of the process or the machine.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()
    # Let SQLAlchemy emit BEGIN itself (see _begin), instead of the sqlite3 module's implicit, deferred one.
    dbapi_connection.isolation_level = None


def _begin(conn) -> None:
    # A deferred transaction that reads and then writes fails with SQLITE_BUSY (no wait) when another writer
    # committed in between; writers take the lock up front instead and queue on busy_timeout.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get("immediate") else "BEGIN")


class FeedbackStore:
    def __init__(self, url: str | None = None, *, root: Path | None = None, create: bool = True):
        self.url = url or default_url(root)
        if self.url.startswith("sqlite:///"):
            Path(self.url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(self.url, pool_pre_ping=not self.url.startswith("sqlite"))
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _begin)
        if create:
            s.metadata.create_all(self.engine)
            _migrate(self.engine)
        # SQLite has one writer at a time. This process's writers queue on this lock, each woken the moment the one
        # before commits, instead of in SQLite's busy handler, which sleeps up to 100 ms between retries: with ten
        # clients asking at once, that sleeping was most of /ask's tail. Other processes still wait on busy_timeout.
        self._write_lock = threading.RLock() if self.engine.dialect.name == "sqlite" else nullcontext()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _writing(self) -> Iterator:
        with self._write_lock, self.engine.connect() as conn:
            conn.info["immediate"] = True
            try:
                with conn.begin():
                    yield conn
            finally:
                conn.info["immediate"] = False

    # ---- writes -------------------------------------------------------------------------------------------

    def record_query(
        self,
        text: str,
        *,
        answer: str,
        chunks: Iterable[dict],
        session_id: str | None = None,
        model_version: str | None = None,
        settings: dict | None = None,
        latency_ms: float | None = None,
        not_in_context: bool = False,
        arm: str | None = None,
        timings_ms: dict[str, float] | None = None,
        client_session: str | None = None,
        client_key: str | None = None,
    ) -> StoredQuery:
        """Store an asked question, what was retrieved (chunk_id, doc_id, page_start, page_end, text, rank,
        score, cited, and `team` and `shared` for an interleaved canary answer) and the system's answer. `arm`: which
        arm of a running canary served it (production or canary), None outside a canary; `timings_ms`: the steps'
        times; `client_session` and `client_key`: the session the server issued and the keyed client identity
        (rag.serving.sessions), what a canary judges by."""
        query_id, answer_id, now = str(uuid.uuid4()), str(uuid.uuid4()), _now()
        chunks = list(chunks)
        with self._writing() as conn:
            previous = None
            if session_id:
                previous = conn.execute(
                    select(s.queries.c.query_id, s.queries.c.created_at)
                    .where(s.queries.c.session_id == session_id)
                    .order_by(s.queries.c.created_at.desc())
                    .limit(1)
                ).first()
            conn.execute(
                insert(s.queries).values(
                    query_id=query_id,
                    text=text,
                    created_at=now,
                    session_id=session_id,
                    model_version=model_version,
                    settings=settings,
                    latency_ms=latency_ms,
                    arm=arm,
                    timings_ms=timings_ms,
                    client_session=client_session,
                    client_key=client_key,
                )
            )
            hashes = self._upsert_passages(conn, chunks, now)
            if chunks:
                conn.execute(
                    insert(s.retrievals),
                    [
                        {
                            "query_id": query_id,
                            "chunk_id": c["chunk_id"],
                            "rank": int(c.get("rank") or i),
                            "score": None if c.get("score") is None else float(c["score"]),
                            "cited": bool(c.get("cited")),
                            "text_hash": hashes[c["chunk_id"]],
                            "team": c.get("team"),
                            "shared": None if c.get("team") is None else bool(c.get("shared")),
                        }
                        for i, c in enumerate(chunks, start=1)
                    ],
                )
            conn.execute(
                insert(s.answers).values(
                    answer_id=answer_id,
                    query_id=query_id,
                    text=answer,
                    source="system",
                    not_in_context=not_in_context,
                    created_at=now,
                )
            )
            reformulation_of = None
            if previous is not None and self._is_reformulation(conn, previous, now):
                reformulation_of = previous.query_id
                conn.execute(
                    insert(s.implicit_events).values(
                        query_id=previous.query_id, kind="reformulation", related_query_id=query_id, created_at=now
                    )
                )
        return StoredQuery(query_id=query_id, answer_id=answer_id, reformulation_of=reformulation_of)

    @staticmethod
    def _is_reformulation(conn, previous, now: datetime) -> bool:
        if now - _utc(previous.created_at) > timedelta(seconds=REFORMULATION_SECONDS):
            return False
        liked = conn.execute(
            select(func.count())
            .select_from(s.feedback)
            .where(s.feedback.c.query_id == previous.query_id, s.feedback.c.target == "answer", s.feedback.c.score == 1)
        ).scalar()
        return not liked

    @staticmethod
    def _upsert_passages(conn, chunks: list[dict], now: datetime) -> dict[str, str]:
        """Record the served text of each chunk as a version; `passages` follows the latest text. Returns the text
        hash per chunk id, for the retrieval rows."""
        if not chunks:
            return {}
        rows = {
            c["chunk_id"]: {
                "chunk_id": c["chunk_id"],
                "doc_id": str(c.get("doc_id", "")),
                "page_start": c.get("page_start"),
                "page_end": c.get("page_end"),
                "text": c.get("text", ""),
            }
            for c in chunks
        }
        hashes = {cid: text_hash(row["text"]) for cid, row in rows.items()}
        stored = dict(
            conn.execute(
                select(s.passages.c.chunk_id, s.passages.c.text).where(s.passages.c.chunk_id.in_(list(rows)))
            ).all()
        )
        _insert_ignoring_duplicates(conn, s.passages, [row for cid, row in rows.items() if cid not in stored])
        for cid, row in rows.items():
            if cid in stored and stored[cid] != row["text"]:
                conn.execute(
                    update(s.passages)
                    .where(s.passages.c.chunk_id == cid)
                    .values(**{k: v for k, v in row.items() if k != "chunk_id"})
                )
        known = set(
            conn.execute(
                select(s.passage_versions.c.chunk_id, s.passage_versions.c.text_hash).where(
                    s.passage_versions.c.chunk_id.in_(list(rows))
                )
            ).tuples()
        )
        _insert_ignoring_duplicates(
            conn,
            s.passage_versions,
            [
                {**row, "text_hash": hashes[cid], "first_served_at": now}
                for cid, row in rows.items()
                if (cid, hashes[cid]) not in known
            ],
        )
        return hashes

    def _idempotent(self, replay: Callable, write: Callable):
        """`write(conn)` in one writing transaction, unless `replay(conn)` finds the same key already stored (its
        first acknowledgement is returned; other content under the key raises IdempotencyConflictError)."""
        try:
            with self._writing() as conn:
                first = replay(conn)
                return first if first is not None else write(conn)
        except IntegrityError:
            # The same key raced (Postgres: both transactions saw no row); the other one committed first.
            with self.engine.connect() as conn:
                first = replay(conn)
            if first is None:
                raise
            return first

    def submit_feedback(self, sub: FeedbackSubmission, *, client_session: str | None = None) -> FeedbackAck:
        """Store one submission atomically. The same idempotency key with the same content returns the first
        acknowledgement; with other content it is refused (409). `client_session`: the server-issued session that
        sent it (the API verified it), the only one a canary credits the query's ratings from."""
        digest = sub.payload_hash()

        def write(conn) -> FeedbackAck:
            self._validate_targets(conn, sub)
            now = _now()
            submission_id = conn.execute(
                insert(s.submissions).values(
                    idempotency_key=sub.idempotency_key,
                    payload_hash=digest,
                    query_id=sub.query_id,
                    session_id=sub.session_id,
                    client_session=client_session,
                    comment=sub.comment,
                    created_at=now,
                )
            ).inserted_primary_key[0]
            rows = []
            if sub.answer_score is not None:
                system_answer = conn.execute(
                    select(s.answers.c.answer_id).where(
                        s.answers.c.query_id == sub.query_id, s.answers.c.source == "system"
                    )
                ).scalar()
                rows.append({"target": "answer", "answer_id": system_answer, "score": sub.answer_score})
            rows += [{"target": "passage", "chunk_id": p.chunk_id, "score": p.score} for p in sub.passages]
            corrected = None
            if sub.correction is not None:
                corrected = str(uuid.uuid4())
                conn.execute(
                    insert(s.answers).values(
                        answer_id=corrected,
                        query_id=sub.query_id,
                        text=sub.correction,
                        source=sub.correction_source,
                        created_at=now,
                    )
                )
                rows.append({"target": "correction", "answer_id": corrected, "score": 1})
            event_ids = [
                conn.execute(
                    insert(s.feedback).values(
                        submission_id=submission_id,
                        query_id=sub.query_id,
                        created_at=now,
                        **{"answer_id": None, "chunk_id": None, **row},
                    )
                ).inserted_primary_key[0]
                for row in rows
            ]
            return FeedbackAck(submission_id=submission_id, event_ids=event_ids, answer_id=corrected)

        return self._idempotent(lambda conn: self._replay(conn, sub.idempotency_key, digest), write)

    @staticmethod
    def _keyed(conn, table, key: str, digest: str, what: str, *columns):
        """The row stored under an idempotency key (None: none); a key reused for other content is refused."""
        first = conn.execute(select(*columns, table.c.payload_hash).where(table.c.idempotency_key == key)).first()
        if first is not None and first.payload_hash != digest:
            raise IdempotencyConflictError(
                f"idempotency key {key!r} was already used for {what}: use a new key for each new one"
            )
        return first

    @classmethod
    def _replay(cls, conn, key: str, digest: str) -> FeedbackAck | None:
        first = cls._keyed(conn, s.submissions, key, digest, "different feedback", s.submissions.c.submission_id)
        if first is None:
            return None
        rows = conn.execute(
            select(s.feedback.c.event_id, s.feedback.c.target, s.feedback.c.answer_id)
            .where(s.feedback.c.submission_id == first.submission_id)
            .order_by(s.feedback.c.event_id)
        ).all()
        corrected = next((r.answer_id for r in rows if r.target == "correction"), None)
        return FeedbackAck(
            submission_id=first.submission_id, event_ids=[r.event_id for r in rows], duplicate=True, answer_id=corrected
        )

    @staticmethod
    def _validate_targets(conn, sub: FeedbackSubmission) -> None:
        if conn.execute(select(s.queries.c.query_id).where(s.queries.c.query_id == sub.query_id)).first() is None:
            raise UnknownQueryError(f"unknown query_id {sub.query_id!r}: rate the query_id that /ask returned")
        if sub.passages:
            retrieved = set(
                conn.execute(select(s.retrievals.c.chunk_id).where(s.retrievals.c.query_id == sub.query_id)).scalars()
            )
            unknown = [p.chunk_id for p in sub.passages if p.chunk_id not in retrieved]
            if unknown:
                raise UnknownPassageError(
                    f"passages {unknown[:5]} were not retrieved for query {sub.query_id}: "
                    "only the passages /ask returned can be rated"
                )

    def record_event(self, ev: ImplicitEvent, *, client_session: str | None = None) -> int:
        """Store a click (or another implicit event); the same idempotency key with the same event returns the first
        event's id, with another event (another query, passage or kind) it is refused (409), as /feedback refuses it.
        `client_session`: the server-issued session that sent it (a canary credits clicks only from the session that
        was shown the query)."""
        try:
            with self._writing() as conn:
                if ev.idempotency_key:
                    known = self._event_with_key(conn, ev)
                    if known is not None:
                        return known
                self._validate_targets(
                    conn,
                    FeedbackSubmission(
                        query_id=ev.query_id, idempotency_key="-", passages=[{"chunk_id": ev.chunk_id, "score": 1}]
                    ),
                )
                return conn.execute(
                    insert(s.implicit_events).values(
                        query_id=ev.query_id,
                        kind=ev.kind,
                        chunk_id=ev.chunk_id,
                        idempotency_key=ev.idempotency_key,
                        session_id=ev.session_id,
                        client_session=client_session,
                        created_at=_now(),
                    )
                ).inserted_primary_key[0]
        except IntegrityError:
            # The same key raced (Postgres: both transactions saw no row; the unique key refused the second).
            if not ev.idempotency_key:
                raise
            with self.engine.connect() as conn:
                known = self._event_with_key(conn, ev)
            if known is None:
                raise
            return known

    @staticmethod
    def _event_with_key(conn, ev: ImplicitEvent) -> int | None:
        """The id of the event stored under ev's idempotency key (None: none); a key reused for another event is
        refused, so a retry is told apart from a client that reuses keys."""
        e = s.implicit_events
        first = conn.execute(
            select(e.c.event_id, e.c.query_id, e.c.kind, e.c.chunk_id).where(e.c.idempotency_key == ev.idempotency_key)
        ).first()
        if first is None:
            return None
        if (first.query_id, first.kind, first.chunk_id) != (ev.query_id, ev.kind, ev.chunk_id):
            raise IdempotencyConflictError(
                f"idempotency key {ev.idempotency_key!r} was already used for another event: use a new key for each "
                "new one"
            )
        return first.event_id

    def record_expert_label(
        self, label: ExpertLabel, *, question: str, passage: dict, query_id: str | None = None
    ) -> ExpertAck:
        """Store an expert's grade of (question, passage): `passage` is the chunk as the expert read it (chunk_id,
        doc_id, page_start, page_end, text; recorded as a passage version like a retrieval), `query_id` the
        production question it came from (None for a synthetic one). It becomes the item's label (the latest wins)."""

        def row(conn, now: datetime) -> dict:
            if (
                query_id is not None
                and conn.execute(select(s.queries.c.query_id).where(s.queries.c.query_id == query_id)).first() is None
            ):
                raise UnknownQueryError(
                    f"the item's query {query_id!r} is not in this feedback store: rebuild the "
                    "annotation queue from the store the API writes to"
                )
            digest = self._upsert_passages(conn, [passage], now)[passage["chunk_id"]]
            return {
                "query_id": query_id,
                "question": question,
                "chunk_id": passage["chunk_id"],
                "text_hash": digest,
                "grade": label.grade,
                "expert_answer": label.expert_answer,
            }

        return self._write_expert(label, row)

    def undo_expert_label(self, undo: ExpertUndo) -> ExpertAck:
        """Retract the item's current label, when the same expert gave it: the item is unlabelled again (an earlier
        label of the item does not come back)."""

        def row(conn, _now: datetime) -> dict:
            latest = (
                conn.execute(
                    select(s.expert_labels)
                    .where(s.expert_labels.c.item_id == undo.item_id)
                    .order_by(s.expert_labels.c.label_id.desc())
                    .limit(1)
                )
                .mappings()
                .first()
            )
            if latest is None or latest["grade"] is None:
                raise NothingToUndoError(f"item {undo.item_id!r} has no label to undo")
            if latest["expert"] != undo.expert:
                raise NothingToUndoError(
                    f"the label of item {undo.item_id!r} was given by {latest['expert']!r}: only "
                    "they can undo it (label the item again to replace it)"
                )
            return {
                **{k: latest[k] for k in ("query_id", "question", "chunk_id", "text_hash")},
                "grade": None,
                "expert_answer": None,
            }

        return self._write_expert(undo, row)

    def _write_expert(self, action: ExpertLabel | ExpertUndo, row_of: Callable[[object, datetime], dict]) -> ExpertAck:
        """One expert_labels row in one transaction; the same idempotency key again returns the first answer."""
        digest = action.payload_hash()

        def write(conn) -> ExpertAck:
            now = _now()
            row = row_of(conn, now)
            label_id = conn.execute(
                insert(s.expert_labels).values(
                    idempotency_key=action.idempotency_key,
                    payload_hash=digest,
                    item_id=action.item_id,
                    expert=action.expert,
                    created_at=now,
                    **row,
                )
            ).inserted_primary_key[0]
            return ExpertAck(label_id=label_id, item_id=action.item_id, grade=row["grade"])

        return self._idempotent(lambda conn: self._expert_replay(conn, action.idempotency_key, digest), write)

    def expert_replay(self, action: ExpertLabel | ExpertUndo) -> ExpertAck | None:
        """The acknowledgement of an action already stored under its idempotency key (None: not stored yet)."""
        with self.engine.connect() as conn:
            return self._expert_replay(conn, action.idempotency_key, action.payload_hash())

    @classmethod
    def _expert_replay(cls, conn, key: str, digest: str) -> ExpertAck | None:
        first = cls._keyed(
            conn,
            s.expert_labels,
            key,
            digest,
            "another expert label or undo",
            s.expert_labels.c.label_id,
            s.expert_labels.c.item_id,
            s.expert_labels.c.grade,
        )
        return (
            None
            if first is None
            else ExpertAck(label_id=first.label_id, item_id=first.item_id, grade=first.grade, duplicate=True)
        )

    # ---- reads ---------------------------------------------------------------------------------------------

    def high_water_mark(self) -> int:
        """The newest feedback event id (0 when there is none): what the retrain sensor counts from."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.max(s.feedback.c.event_id), 0))).scalar())

    def expert_high_water_mark(self) -> int:
        """The newest expert label id (0 when there is none): a new expert label makes a new dataset version."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.max(s.expert_labels.c.label_id), 0))).scalar())

    def count_expert_labels(self, since_label_id: int = 0) -> int:
        """Expert label rows (undos included) after `since_label_id`, the expert mark a dataset was exported at."""
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(s.expert_labels).where(s.expert_labels.c.label_id > since_label_id)
                ).scalar()
            )

    def current_expert_labels(self) -> dict[str, dict]:
        """item id -> its label (the item's latest row: label_id, grade, expert, created_at, ...); items whose
        latest row is an undo are absent."""
        latest = (
            select(s.expert_labels.c.item_id, func.max(s.expert_labels.c.label_id).label("label_id"))
            .group_by(s.expert_labels.c.item_id)
            .subquery()
        )
        stmt = (
            select(s.expert_labels)
            .join(latest, s.expert_labels.c.label_id == latest.c.label_id)
            .where(s.expert_labels.c.grade.is_not(None))
        )
        with self.engine.connect() as conn:
            return {
                row["item_id"]: {**row, "created_at": _utc(row["created_at"])} for row in conn.execute(stmt).mappings()
            }

    def expert_progress(
        self, item_ids: Iterable[str], *, since: datetime | None = None, expert: str | None = None
    ) -> dict[str, int]:
        """How many of `item_ids` (a queue) have a label: `labelled`, of `total`; `labelled_since`: labelled at or
        after `since` (when the queue was built); `by_expert`: labelled by `expert`."""
        ids = set(item_ids)
        done = [label for item, label in self.current_expert_labels().items() if item in ids]
        return {
            "total": len(ids),
            "labelled": len(done),
            "labelled_since": sum(1 for d in done if since is None or d["created_at"] >= _utc(since)),
            "by_expert": sum(1 for d in done if d["expert"] == expert),
        }

    def count_feedback(self, since_event_id: int = 0) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(s.feedback).where(s.feedback.c.event_id > since_event_id)
                ).scalar()
            )

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            out = {
                name: int(conn.execute(select(func.count()).select_from(table)).scalar())
                for name, table in (
                    ("queries", s.queries),
                    ("submissions", s.submissions),
                    ("feedback_events", s.feedback),
                    ("implicit_events", s.implicit_events),
                    ("passages", s.passages),
                    ("passage_versions", s.passage_versions),
                    ("expert_labels", s.expert_labels),
                )
            }
            for target, score, n in conn.execute(
                select(s.feedback.c.target, s.feedback.c.score, func.count()).group_by(
                    s.feedback.c.target, s.feedback.c.score
                )
            ):
                out[f"{target}_{'up' if score > 0 else 'down'}"] = int(n)
        return out

    def recent_queries(self, limit: int) -> pd.DataFrame:
        """The newest `limit` queries (query_id, text, created_at, n_retrieved), oldest first."""
        stmt = (
            select(
                s.queries.c.query_id,
                s.queries.c.text,
                s.queries.c.created_at,
                func.count(s.retrievals.c.chunk_id).label("n_retrieved"),
            )
            .select_from(s.queries.outerjoin(s.retrievals, s.retrievals.c.query_id == s.queries.c.query_id))
            .group_by(s.queries.c.query_id, s.queries.c.text, s.queries.c.created_at)
            .order_by(s.queries.c.created_at.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            df = pd.DataFrame(
                conn.execute(stmt).mappings().all(), columns=["query_id", "text", "created_at", "n_retrieved"]
            )
        return df.iloc[::-1].reset_index(drop=True)

    def corrections(self) -> pd.DataFrame:
        """The answers people wrote in to their own questions (question, answer, sender, created_at), oldest first:
        only a correction sent under the server-issued session that asked the question (as a canary credits
        signals), so that nobody can lend a correction the identity of whoever asked. `sender` is that client's
        keyed identity (rag.serving.sessions), else its session, so that one client correcting the same answer
        under many sessions counts once where agreement is needed."""
        sender = func.coalesce(s.queries.c.client_key, s.queries.c.client_session)
        stmt = (
            select(
                s.queries.c.text.label("question"),
                s.answers.c.text.label("answer"),
                sender.label("sender"),
                s.answers.c.created_at,
            )
            .select_from(
                s.answers.join(s.queries, s.answers.c.query_id == s.queries.c.query_id)
                .join(
                    s.feedback,
                    (s.feedback.c.answer_id == s.answers.c.answer_id) & (s.feedback.c.target == "correction"),
                )
                .join(s.submissions, s.submissions.c.submission_id == s.feedback.c.submission_id)
            )
            .where(s.answers.c.source != "system", s.submissions.c.client_session == s.queries.c.client_session)
            .order_by(s.answers.c.created_at)
        )
        with self.engine.connect() as conn:
            return pd.DataFrame(
                conn.execute(stmt).mappings().all(), columns=["question", "answer", "sender", "created_at"]
            )

    def oldest_queries(self, limit: int) -> pd.DataFrame:
        stmt = select(s.queries.c.query_id, s.queries.c.text).order_by(s.queries.c.created_at).limit(limit)
        with self.engine.connect() as conn:
            return pd.DataFrame(conn.execute(stmt).mappings().all(), columns=["query_id", "text"])

    def feedback_scores(self, *, target: str = "answer", query_ids: list[str] | None = None) -> list[int]:
        stmt = select(s.feedback.c.score).where(s.feedback.c.target == target)
        if query_ids is not None:
            stmt = stmt.where(s.feedback.c.query_id.in_(query_ids))
        with self.engine.connect() as conn:
            return [int(v) for v in conn.execute(stmt).scalars()]

    def retrieved_counts(self, query_ids: list[str]) -> dict[str, int]:
        """Passages retrieved per query (queries that retrieved none are absent)."""
        stmt = (
            select(s.retrievals.c.query_id, func.count())
            .where(s.retrievals.c.query_id.in_(query_ids))
            .group_by(s.retrievals.c.query_id)
        )
        with self.engine.connect() as conn:
            return {qid: int(n) for qid, n in conn.execute(stmt)}

    def table(self, name: str) -> pd.DataFrame:
        """A whole table as a frame (exports, tests)."""
        table = s.metadata.tables[name]
        with self.engine.connect() as conn:
            return pd.DataFrame(conn.execute(select(table)).mappings().all(), columns=[c.name for c in table.columns])

    def integrity_problems(self) -> list[str]:
        """SQLite's own integrity and foreign-key checks (empty when consistent)."""
        if self.engine.dialect.name != "sqlite":
            return []
        with self.engine.connect() as conn:
            problems = [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check") if r[0] != "ok"]
            problems += [f"foreign key: {tuple(r)}" for r in conn.exec_driver_sql("PRAGMA foreign_key_check")]
        return problems

    def queries_since(self, since: datetime | None, limit: int, *, newest: bool = False) -> pd.DataFrame:
        """Up to `limit` queries (query_id, text, created_at) asked at or after `since` (None: all): the oldest
        ones, or the newest with newest=True; oldest first either way. The drift sensor's windows."""
        order = (
            (s.queries.c.created_at.desc(), s.queries.c.query_id.desc())
            if newest
            else (s.queries.c.created_at, s.queries.c.query_id)
        )
        stmt = select(s.queries.c.query_id, s.queries.c.text, s.queries.c.created_at).order_by(*order).limit(limit)
        if since is not None:
            stmt = stmt.where(s.queries.c.created_at >= since.astimezone(timezone.utc))
        with self.engine.connect() as conn:
            df = pd.DataFrame(conn.execute(stmt).mappings().all(), columns=["query_id", "text", "created_at"])
        return (df.iloc[::-1] if newest else df).reset_index(drop=True)
