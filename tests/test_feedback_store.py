"""Feedback store: what is stored, what is refused (store unchanged), idempotency, concurrent writers,
SIGKILL during writes, and the RAG-Dataset export checked against hand-derived qrels."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from contextlib import contextmanager

import pandas as pd
import pytest
from pydantic import ValidationError

from rag.evaluation.beir import load_beir
from rag.feedback import (
    FeedbackStore,
    FeedbackSubmission,
    IdempotencyConflictError,
    ImplicitEvent,
    UnknownPassageError,
    UnknownQueryError,
    export_rag_dataset,
    training_pairs,
)
from tests.conftest import REPO

TABLES = ["queries", "passages", "retrievals", "answers", "feedback_submissions", "feedback", "implicit_events"]


def chunks(*ids: str) -> list[dict]:
    return [
        {
            "chunk_id": cid,
            "doc_id": f"doc-{cid[0]}",
            "page_start": 1,
            "page_end": 2,
            "text": f"passage {cid}",
            "rank": rank,
            "score": 1.0 / rank,
            "cited": rank == 1,
        }
        for rank, cid in enumerate(ids, start=1)
    ]


POSTGRES = os.environ.get("RAG_TEST_POSTGRES_URL")  # e.g. postgresql+psycopg://postgres:pg@127.0.0.1:5432/postgres


@contextmanager
def scratch_postgres(admin_url: str):
    """A database of its own for one test, dropped afterwards."""
    import sqlalchemy as sa

    name = f"rag_feedback_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    """Every store test runs on SQLite, and on Postgres when RAG_TEST_POSTGRES_URL names a server."""
    if request.param == "sqlite":
        st = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
        yield st
        st.close()
        return
    if not POSTGRES:
        pytest.skip(
            "set RAG_TEST_POSTGRES_URL=postgresql+psycopg://user:password@host/db to run the store tests on Postgres"
        )
    with scratch_postgres(POSTGRES) as url:
        st = FeedbackStore(url)
        yield st
        st.close()


def snapshot(store: FeedbackStore) -> dict[str, int]:
    return {name: len(store.table(name)) for name in TABLES}


def test_query_feedback_and_counts(store):
    q = store.record_query(
        "what is a cat?",
        answer="a feline",
        chunks=chunks("a1", "a2", "b1"),
        session_id="s",
        model_version="minilm@abc",
        settings={"k": 3},
        latency_ms=12.5,
    )
    ack = store.submit_feedback(
        FeedbackSubmission(
            query_id=q.query_id,
            idempotency_key="k1",
            answer_score=1,
            passages=[{"chunk_id": "a1", "score": 1}, {"chunk_id": "b1", "score": -1}],
            comment="good",
        )
    )
    assert len(ack.event_ids) == 3 and not ack.duplicate
    assert store.high_water_mark() == max(ack.event_ids)
    assert store.count_feedback(since_event_id=ack.event_ids[0]) == 2
    counts = store.counts()
    assert counts["queries"] == 1 and counts["feedback_events"] == 3 and counts["passages"] == 3
    assert counts["answer_up"] == 1 and counts["passage_up"] == 1 and counts["passage_down"] == 1
    retrieved = store.table("retrievals").sort_values("rank")
    assert list(retrieved["chunk_id"]) == ["a1", "a2", "b1"] and list(retrieved["cited"]) == [True, False, False]
    assert store.table("queries").loc[0, "model_version"] == "minilm@abc"


def test_corrections_lists_only_answers_sent_under_the_asking_session(store):
    """What rag.serving.corrected reads, on each backend: a correction counts under the identity of the client that
    asked, and only when sent under the session that asked."""
    asked = [
        store.record_query("why?", answer="x", chunks=chunks("a1"), client_session=f"s{i}", client_key=f"k{i}")
        for i in range(3)
    ]
    for i, (q, session) in enumerate(zip(asked, ["s0", "s1", "intruder"], strict=True)):
        sub = FeedbackSubmission(query_id=q.query_id, idempotency_key=f"c{i}", correction=f"because {i}")
        store.submit_feedback(sub, client_session=session)
    store.submit_feedback(FeedbackSubmission(query_id=asked[0].query_id, idempotency_key="r", answer_score=1))
    found = store.corrections()
    assert list(found["answer"]) == ["because 0", "because 1"] and list(found["sender"]) == ["k0", "k1"]
    assert set(found["question"]) == {"why?"}


def test_duplicate_submission_is_stored_once(store):
    q = store.record_query("q", answer="a", chunks=chunks("a1"))
    sub = FeedbackSubmission(query_id=q.query_id, idempotency_key="same", answer_score=-1)
    first = store.submit_feedback(sub)
    before = snapshot(store)
    again = store.submit_feedback(sub)
    assert again.duplicate and again.event_ids == first.event_ids and again.submission_id == first.submission_id
    assert snapshot(store) == before
    with pytest.raises(IdempotencyConflictError, match="already used"):
        store.submit_feedback(FeedbackSubmission(query_id=q.query_id, idempotency_key="same", answer_score=1))
    assert snapshot(store) == before


def test_bad_feedback_leaves_the_store_unchanged(store):
    q = store.record_query("q", answer="a", chunks=chunks("a1", "a2"))
    before = snapshot(store)
    with pytest.raises(UnknownQueryError, match="unknown query_id"):
        store.submit_feedback(FeedbackSubmission(query_id="nope", idempotency_key="k", answer_score=1))
    with pytest.raises(UnknownPassageError, match="not retrieved"):
        store.submit_feedback(
            FeedbackSubmission(
                query_id=q.query_id,
                idempotency_key="k2",
                answer_score=1,
                passages=[{"chunk_id": "a1", "score": 1}, {"chunk_id": "zz", "score": 1}],
            )
        )
    with pytest.raises(UnknownPassageError):
        store.record_event(ImplicitEvent(query_id=q.query_id, chunk_id="zz"))
    assert snapshot(store) == before
    with pytest.raises(ValidationError, match="at most 2000"):
        FeedbackSubmission(query_id=q.query_id, idempotency_key="k3", answer_score=1, comment="x" * 1_000_000)
    with pytest.raises(ValidationError, match="empty feedback"):
        FeedbackSubmission(query_id=q.query_id, idempotency_key="k4")
    with pytest.raises(ValidationError):
        FeedbackSubmission(query_id=q.query_id, idempotency_key="k5", answer_score=2)


def test_reformulation_and_click_events(store):
    first = store.record_query("cats?", answer="a", chunks=chunks("a1"), session_id="s1")
    second = store.record_query("what do cats eat?", answer="b", chunks=chunks("a2"), session_id="s1")
    assert second.reformulation_of == first.query_id
    liked = store.record_query("dogs?", answer="c", chunks=chunks("b1"), session_id="s2")
    store.submit_feedback(FeedbackSubmission(query_id=liked.query_id, idempotency_key="up", answer_score=1))
    assert store.record_query("birds?", answer="d", chunks=chunks("b2"), session_id="s2").reformulation_of is None
    click = store.record_event(ImplicitEvent(query_id=first.query_id, chunk_id="a1", idempotency_key="c1"))
    assert store.record_event(ImplicitEvent(query_id=first.query_id, chunk_id="a1", idempotency_key="c1")) == click
    events = store.table("implicit_events")
    assert sorted(events["kind"]) == ["click", "reformulation"]


def test_concurrent_writers_lose_nothing(store):
    queries = [store.record_query(f"q{i}", answer="a", chunks=chunks("a1", "a2")).query_id for i in range(4)]
    acks, errors = [], []

    def worker(n: int) -> None:
        for i in range(15):
            try:
                acks.append(
                    store.submit_feedback(
                        FeedbackSubmission(
                            query_id=queries[i % 4],
                            idempotency_key=f"w{n}-{i}",
                            answer_score=1,
                            passages=[{"chunk_id": "a2", "score": -1}],
                        )
                    )
                )
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stored = set(store.table("feedback")["event_id"])
    assert {e for a in acks for e in a.event_ids} == stored and len(stored) == 6 * 15 * 2


def test_export_matches_hand_derived_qrels(store, tmp_path):
    q1 = store.record_query("what do cats eat", answer="mice", chunks=chunks("a1", "a2", "b1"))
    q2 = store.record_query("where do dogs sleep", answer="kennel", chunks=chunks("b1", "b2"))
    store.record_query("never rated", answer="-", chunks=chunks("c1"))
    store.submit_feedback(
        FeedbackSubmission(
            query_id=q1.query_id,
            idempotency_key="1",
            answer_score=-1,
            passages=[{"chunk_id": "a1", "score": 1}, {"chunk_id": "a2", "score": -1}, {"chunk_id": "b1", "score": -1}],
            correction="cats eat mice and birds",
            correction_source="expert",
        )
    )
    # The user changes their mind about a2: the latest rating wins.
    store.submit_feedback(
        FeedbackSubmission(query_id=q1.query_id, idempotency_key="2", passages=[{"chunk_id": "a2", "score": 1}])
    )
    store.submit_feedback(
        FeedbackSubmission(
            query_id=q2.query_id, idempotency_key="3", answer_score=1, passages=[{"chunk_id": "b2", "score": 1}]
        )
    )
    out = export_rag_dataset(store, tmp_path / "ds")

    def qrels(name):
        return sorted(map(tuple, pd.read_csv(out / "qrels" / name, sep="\t", dtype=str).values.tolist()))

    a, b = q1.query_id, q2.query_id
    assert qrels("chunk_qrels.tsv") == sorted([(a, "a1", "1"), (a, "a2", "1"), (a, "b1", "-1"), (b, "b2", "1")])
    # doc-a has a positive passage; doc-b has b1 (-1) for q1 but b2 (+1) for q2.
    assert qrels("document_qrels.tsv") == sorted([(a, "doc-a", "1"), (a, "doc-b", "-1"), (b, "doc-b", "1")])
    answers = [json.loads(line) for line in open(out / "answers.jsonl")]
    expert = next(x for x in answers if x["source"] == "expert")
    system_a = next(x for x in answers if x["source"] == "system" and x["query_id"] == a)
    assert expert["text"] == "cats eat mice and birds"
    assert sorted(qrels("answer_qrels.tsv")) == sorted(
        [
            (a, system_a["_id"], "-1"),
            (a, expert["_id"], "1"),
            (b, next(x["_id"] for x in answers if x["query_id"] == b), "1"),
        ]
    )
    stats = json.loads((out / "stats.json").read_text())
    assert stats["queries"] == 2 and stats["chunk_qrels_positive"] == 3 and stats["chunk_qrels_negative"] == 1
    assert stats["feedback_events"] == 8 and stats["high_water_mark"] == store.high_water_mark()
    beir = load_beir(out, split="train")  # BEIR-compatible: the positive qrels as a train split
    assert beir.qrels == {a: {"a1": 1, "a2": 1}, b: {"b2": 1}} and beir.queries[b] == "where do dogs sleep"
    positives, negatives = training_pairs(out)
    assert sorted(positives) == sorted(
        [("what do cats eat", "passage a1"), ("what do cats eat", "passage a2"), ("where do dogs sleep", "passage b2")]
    )
    assert negatives == [("what do cats eat", "passage b1")]
    feedback_rows = [json.loads(line) for line in open(out / "feedback.jsonl")]
    assert len(feedback_rows) == 8 and {r["idempotency_key"] for r in feedback_rows} == {"1", "2", "3"}


WRITER = textwrap.dedent("""
    import sys
    from rag.feedback import FeedbackStore, FeedbackSubmission
    store = FeedbackStore(sys.argv[1])
    qid = sys.argv[2]
    i = 0
    while True:
        ack = store.submit_feedback(FeedbackSubmission(
            query_id=qid, idempotency_key=f"{sys.argv[3]}-{i}", answer_score=1,
            passages=[{"chunk_id": "a1", "score": 1}, {"chunk_id": "a2", "score": -1}], comment="x" * 500))
        sys.stdout.write(" ".join(map(str, [ack.submission_id, *ack.event_ids])) + "\\n")
        sys.stdout.flush()
        i += 1
""")


def test_sigkill_during_writes_loses_no_acknowledged_row(tmp_path):
    url = f"sqlite:///{tmp_path / 'crash.sqlite'}"
    store = FeedbackStore(url)
    qid = store.record_query("q", answer="a", chunks=chunks("a1", "a2")).query_id
    store.close()
    rng = random.Random(7)
    acknowledged: dict[int, list[int]] = {}
    for attempt in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, url, qid, f"run{attempt}"], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:  # wait until it writes, then kill at a random point
            time.sleep(0.05)
        time.sleep(rng.uniform(0.05, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader.join(timeout=5)
        assert lines, "the writer acknowledged nothing before it was killed"
        for line in lines:
            if not line.endswith("\n"):  # cut by the kill: the client never saw this acknowledgement
                continue
            sub_id, *events = map(int, line.split())
            acknowledged[sub_id] = events
    store = FeedbackStore(url)
    assert store.integrity_problems() == []
    feedback = store.table("feedback")
    stored = feedback.groupby("submission_id")["event_id"].apply(sorted).to_dict()
    for sub_id, events in acknowledged.items():
        assert stored.get(sub_id) == sorted(events), f"acknowledged submission {sub_id} lost or torn"
    # Atomic: every stored submission (acknowledged or not) has all three of its ratings.
    assert set(feedback.groupby("submission_id").size()) == {3}
    assert set(store.table("feedback_submissions")["submission_id"]) == set(stored)
    store.close()


def test_an_edited_passage_keeps_the_rated_text_in_exports_and_the_gate(store, tmp_path):
    from rag.feedback import judgments
    from rag.training.data import split_feedback, training_data

    before = store.record_query("what do cats eat", answer="mice", chunks=chunks("a1", "a2"))
    store.submit_feedback(
        FeedbackSubmission(query_id=before.query_id, idempotency_key="1", passages=[{"chunk_id": "a1", "score": 1}])
    )
    # The document is edited without moving chunk boundaries: same chunk id, other text.
    edited = [{**c, "text": "cats are obligate carnivores"} if c["chunk_id"] == "a1" else c for c in chunks("a1", "a2")]
    after = store.record_query("are cats carnivores", answer="yes", chunks=edited)
    store.submit_feedback(
        FeedbackSubmission(query_id=after.query_id, idempotency_key="2", passages=[{"chunk_id": "a1", "score": -1}])
    )
    assert len(store.table("passage_versions")) == 3
    out = export_rag_dataset(store, tmp_path / "ds")
    positives, negatives = training_pairs(out)
    assert positives == [("what do cats eat", "passage a1")]  # the text the user liked, not today's
    assert negatives == [("are cats carnivores", "cats are obligate carnivores")]
    corpus = {d["_id"]: d for d in map(json.loads, open(out / "corpus.jsonl"))}
    assert corpus["a1"]["text"] == "cats are obligate carnivores"  # the latest text keeps the chunk id
    old = next(d for pid, d in corpus.items() if pid.startswith("a1@"))
    assert old["text"] == "passage a1" and old["metadata"]["chunk_id"] == "a1"

    # The gate scores a held-out rating only against a chunk that still has the rated text.
    judged = judgments(out)
    split = split_feedback(judged, dev_fraction=1.0)
    assert split.dev_passages == {old["_id"]: "passage a1"}
    chunk_set = pd.DataFrame(
        {
            "chunk_id": ["a1", "a2"],
            "doc_id": ["doc-a"] * 2,
            "char_start": [0, 30],
            "char_end": [28, 40],
            "text": ["cats are obligate carnivores", "passage a2"],
        }
    )
    data = training_data([], chunk_set, extra_positives=[("x", "passage a2")], feedback=split, min_feedback_gate=1)
    assert "what do cats eat" not in (data.gate.queries.values() if data.gate else [])


def test_a_store_from_before_passage_versioning_is_migrated(tmp_path):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    old = FeedbackStore(url)
    q = old.record_query("what do cats eat", answer="mice", chunks=chunks("a1"))
    old.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # the schema as it was: no versions, no text hash on retrievals
        conn.exec_driver_sql("DROP TABLE passage_versions")
        conn.exec_driver_sql("ALTER TABLE retrievals DROP COLUMN text_hash")
    engine.dispose()
    store = FeedbackStore(url)
    assert store.table("retrievals")["text_hash"].notna().all()
    store.record_query("cats?", answer="-", chunks=[{**chunks("a1")[0], "text": "edited"}])
    store.submit_feedback(
        FeedbackSubmission(query_id=q.query_id, idempotency_key="1", passages=[{"chunk_id": "a1", "score": 1}])
    )
    positives, _ = training_pairs(export_rag_dataset(store, tmp_path / "ds"))
    assert positives == [("what do cats eat", "passage a1")]
    store.close()


def test_a_click_whose_idempotency_key_races_returns_the_first_event(store, monkeypatch):
    q = store.record_query("cats?", answer="a", chunks=chunks("a1"))
    first = store.record_event(ImplicitEvent(query_id=q.query_id, chunk_id="a1", idempotency_key="k"))
    # The racing transaction did not see the other's row yet (Postgres, read committed): its insert hits the key.
    lookups = iter([None])
    real = FeedbackStore._event_with_key
    monkeypatch.setattr(
        FeedbackStore, "_event_with_key", staticmethod(lambda conn, key: next(lookups, None) or real(conn, key))
    )
    assert store.record_event(ImplicitEvent(query_id=q.query_id, chunk_id="a1", idempotency_key="k")) == first
    assert len(store.table("implicit_events")) == 1
