"""The PostgreSQL backend: the state in two tables, the locks as session advisory locks.

    rag_state       (namespace, key) -> value (JSON text), token (new on every write: the change mark), updated_at
    rag_state_log   id (order), namespace, op (an intent's id), entry (JSON text)

Each write is one transaction. A lock is pg_advisory_lock on a connection held for as long as the lock (autocommit:
no transaction stays open meanwhile); a process killed while holding one loses its connection, and PostgreSQL
releases the lock with it, as the kernel releases a dead process's flock.

On its first use for a namespace, a database with no state there imports what the file backend holds under the
registry root (rollout states, the pending intent, the log): switching a data dir to the database keeps its running
canary, its history and an unfinished promotion."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    exists,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from rag.state import StateBusy

log = logging.getLogger(__name__)

metadata = MetaData()
documents = Table(
    "rag_state",
    metadata,
    Column("namespace", Text, primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("value", Text, nullable=False),
    Column("token", String(32), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
entries = Table(
    "rag_state_log",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("namespace", Text, nullable=False, index=True),
    Column("op", String(64), nullable=True, index=True),
    Column("entry", Text, nullable=False),
)

# Change marks are read on every request a server answers (is a canary running?): a database round trip is saved
# for this long after the last one. A write made by this process is seen at once.
MARKS_TTL_SECONDS = 1.0
_engines: dict[str, Engine] = {}
_guard = threading.Lock()


def engine_for(url: str) -> Engine:
    """One engine per URL and process, its tables created once (under a lock: replicas start together)."""
    with _guard:
        engine = _engines.get(url)
        if engine is None:
            engine = create_engine(url, pool_pre_ping=True)
            with engine.begin() as conn:
                conn.execute(select(func.pg_advisory_xact_lock(lock_key("rag.state", "schema"))))
                metadata.create_all(conn)
            _engines[url] = engine
        return engine


def lock_key(namespace: str, name: str) -> int:
    """The advisory lock's 64-bit key (signed, as PostgreSQL's bigint) of lock `name` in `namespace`."""
    digest = hashlib.sha256(f"{namespace}\x1f{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class SqlState:
    def __init__(self, url: str, *, namespace: str, root: Path):
        self.url, self.namespace, self.root = url, namespace, Path(root)
        self.engine = engine_for(url)
        self._marks: dict[tuple, tuple[float, tuple]] = {}
        self._import_files()

    def describe(self) -> str:
        where = self.engine.url.render_as_string(hide_password=True)
        return f"{where} (tables rag_state, rag_state_log; namespace {self.namespace})"

    def _scoped(self, table):
        return table.c.namespace == self.namespace

    def read(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(
                select(documents.c.value).where(self._scoped(documents), documents.c.key == key)
            ).scalar_one_or_none()

    def write(self, key: str, text_: str) -> None:
        row = {
            "namespace": self.namespace,
            "key": key,
            "value": text_,
            "token": uuid.uuid4().hex,
            "updated_at": datetime.now(UTC),
        }
        upsert = pg_insert(documents).values(**row)
        upsert = upsert.on_conflict_do_update(
            index_elements=[documents.c.namespace, documents.c.key],
            set_={
                "value": upsert.excluded.value,
                "token": upsert.excluded.token,
                "updated_at": upsert.excluded.updated_at,
            },
        )
        with self.engine.begin() as conn:
            conn.execute(upsert)
        self._marks.clear()

    def delete(self, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(documents).where(self._scoped(documents), documents.c.key == key))
        self._marks.clear()

    def marks(self, keys: list[str]) -> tuple:
        wanted = tuple(keys)
        cached = self._marks.get(wanted)
        if cached is not None and time.monotonic() - cached[0] < MARKS_TTL_SECONDS:
            return cached[1]
        with self.engine.connect() as conn:
            tokens = dict(
                conn.execute(
                    select(documents.c.key, documents.c.token).where(
                        self._scoped(documents), documents.c.key.in_(wanted)
                    )
                ).all()
            )
        out = tuple(tokens.get(key) for key in wanted)
        self._marks[wanted] = (time.monotonic(), out)
        return out

    def append(self, entry: dict) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(entries).values(**self._log_row(entry)))

    def _log_row(self, entry: dict) -> dict:
        op = entry.get("op")
        return {
            "namespace": self.namespace,
            "op": str(op) if op is not None else None,
            "entry": json.dumps(entry, sort_keys=True, default=str),
        }

    def entries(self, limit: int | None = None) -> list[dict]:
        query = select(entries.c.entry).where(self._scoped(entries)).order_by(entries.c.id.desc())
        if limit:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).scalars().all()
        return [json.loads(row) for row in reversed(rows)]

    def logged(self, op: str) -> bool:
        with self.engine.connect() as conn:
            return bool(conn.execute(select(exists().where(self._scoped(entries), entries.c.op == op))).scalar())

    def lock_id(self, name: str) -> str:
        return f"{self.url}#{self.namespace}#{name}"

    @contextlib.contextmanager
    def hold(self, name: str, wait: bool = True) -> Iterator[None]:
        key = lock_key(self.namespace, name)
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            if wait:
                conn.execute(select(func.pg_advisory_lock(key)))
            elif not conn.execute(select(func.pg_try_advisory_lock(key))).scalar():
                raise StateBusy(f"it holds the advisory lock {name!r} ({key}) of namespace {self.namespace}")
            try:
                yield
            finally:
                try:
                    conn.execute(select(func.pg_advisory_unlock(key)))
                except Exception:  # noqa: BLE001 - the session is dropped below, which releases the lock too
                    conn.invalidate()
                    raise
        finally:
            conn.close()

    def _import_files(self) -> None:
        from rag.state.files import FileState

        files = FileState(self.root)
        docs = list(files.documents())
        lines = files.entries()
        if not docs and not lines:
            return
        with self.engine.begin() as conn:
            conn.execute(select(func.pg_advisory_xact_lock(lock_key(self.namespace, "import"))))
            held = (
                conn.execute(select(exists().where(self._scoped(documents)))).scalar()
                or conn.execute(select(exists().where(self._scoped(entries)))).scalar()
            )
            if held:
                return
            now = datetime.now(UTC)
            for key, value in docs:
                conn.execute(
                    insert(documents).values(
                        namespace=self.namespace, key=key, value=value, token=uuid.uuid4().hex, updated_at=now
                    )
                )
            for entry in lines:
                conn.execute(insert(entries).values(**self._log_row(entry)))
        log.warning(
            "rollout state imported from %s into %s: %d documents, %d log entries (the files are no longer read)",
            files.describe(),
            self.describe(),
            len(docs),
            len(lines),
        )
