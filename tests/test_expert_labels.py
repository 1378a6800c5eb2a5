"""Expert labels: the store (latest label wins, an undo retracts, retries are safe, refused writes change nothing,
an older store gains the table), the annotation API behind the expert token, and the export as graded qrels with
the experts' expected answers. Fake answerer, no model loads."""

import hashlib
import json
import os
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from rag.annotation.queue import AnnotationQueue, QueueItem, item_id, queue_path, write_queue
from rag.feedback import (
    ExpertLabel,
    ExpertUndo,
    FeedbackStore,
    FeedbackSubmission,
    IdempotencyConflictError,
    NothingToUndoError,
    UnknownQueryError,
    export_rag_dataset,
    export_versioned,
    judgments,
    latest_dataset,
    training_pairs,
)
from rag.feedback.dataset import dataset_root, expert_query_id
from rag.serving.app import create_app
from rag.serving.settings import ServeSettings
from tests.test_api import AUTH, TOKEN, FakeAnswerer

EXPERT_TOKEN = "expert-token-0123456789"
EXPERT = {"Authorization": f"Bearer {EXPERT_TOKEN}"}


def item(question: str, chunk_id: str, text: str | None = None, query_id: str | None = None) -> QueueItem:
    return QueueItem(
        item_id=item_id(question, chunk_id),
        question=question,
        query_id=query_id,
        source="production" if query_id else "synthetic",
        chunk_id=chunk_id,
        doc_id=f"doc-{chunk_id[0]}",
        text=text or f"passage {chunk_id}",
        page_start=1,
        page_end=1,
        uncertainty=0.5,
    )


def label(
    store: FeedbackStore,
    it: QueueItem,
    grade: int,
    *,
    expert: str = "ann",
    key: str | None = None,
    answer: str | None = None,
):
    body = ExpertLabel(
        item_id=it.item_id,
        grade=grade,
        expert=expert,
        expert_answer=answer,
        idempotency_key=key or f"{it.item_id}-{grade}-{expert}-{answer}",
    )
    return store.record_expert_label(body, question=it.question, passage=it.model_dump(), query_id=it.query_id)


def undo(store: FeedbackStore, it: QueueItem, *, expert: str = "ann", key: str = "u"):
    return store.undo_expert_label(ExpertUndo(item_id=it.item_id, expert=expert, idempotency_key=key))


@pytest.fixture
def store(tmp_path):
    st = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    yield st
    st.close()


# ---- store ------------------------------------------------------------------------------------------------------


def test_the_latest_label_wins_an_undo_retracts_and_retries_are_safe(store):
    cats, dogs = item("what do cats eat", "a1"), item("where do dogs sleep", "b1")
    first = label(store, cats, 0, key="k1")
    assert label(store, cats, 0, key="k1") == first.model_copy(update={"duplicate": True})  # a retry: stored once
    with pytest.raises(IdempotencyConflictError, match="already used"):
        label(store, cats, 2, key="k1")
    label(store, cats, 2, answer="mice")  # the expert changes their mind: the latest row is the label
    label(store, dogs, 1, expert="bob")
    current = store.current_expert_labels()
    assert {k: (v["grade"], v["expert"]) for k, v in current.items()} == {
        cats.item_id: (2, "ann"),
        dogs.item_id: (1, "bob"),
    }
    assert current[cats.item_id]["expert_answer"] == "mice" and current[cats.item_id]["created_at"].tzinfo is not None
    assert store.expert_progress([cats.item_id, dogs.item_id, "other"], expert="ann") == {
        "total": 3,
        "labelled": 2,
        "labelled_since": 2,
        "by_expert": 1,
    }
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    assert store.expert_progress([cats.item_id], since=future)["labelled_since"] == 0

    rows = len(store.table("expert_labels"))
    with pytest.raises(NothingToUndoError, match="given by 'bob'"):
        undo(store, dogs, expert="ann")  # only the expert who gave a label can undo it
    assert len(store.table("expert_labels")) == rows
    ack = undo(store, cats, key="u1")
    assert ack.grade is None and undo(store, cats, key="u1").duplicate  # a retried undo is answered, not refused
    assert cats.item_id not in store.current_expert_labels()
    with pytest.raises(NothingToUndoError, match="no label"):
        undo(store, cats, key="u2")
    assert store.expert_high_water_mark() == ack.label_id == rows + 1 and store.count_expert_labels(rows) == 1
    assert store.counts()["expert_labels"] == rows + 1
    table = store.table("expert_labels").sort_values("label_id")
    assert table["grade"].isna().tolist() == [False] * rows + [True] and table["expert"].notna().all()
    assert table["text_hash"].iloc[0] == hashlib.sha256(b"passage a1").hexdigest()  # the text the expert read
    assert store.integrity_problems() == []


def test_refused_labels_write_nothing(store):
    ghost = item("what do cats eat", "a1", query_id="no-such-query")
    before = {t: len(store.table(t)) for t in ("expert_labels", "passages", "passage_versions")}
    with pytest.raises(UnknownQueryError, match="rebuild the annotation queue"):
        label(store, ghost, 2)
    assert {t: len(store.table(t)) for t in before} == before
    with pytest.raises(ValueError, match="grade"):
        ExpertLabel(item_id="x", grade=3, expert="ann", idempotency_key="k")
    with pytest.raises(ValueError, match="expert"):
        ExpertLabel(item_id="x", grade=1, expert="  ", idempotency_key="k")
    with pytest.raises(ValueError, match="expert_answer"):
        ExpertLabel(item_id="x", grade=1, expert="ann", idempotency_key="k", expert_answer="x" * 5000)
    assert (
        ExpertLabel(item_id="x", grade=1, expert="ann", idempotency_key="k", expert_answer="  ").expert_answer is None
    )


def test_a_store_from_before_expert_labels_gains_the_table(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    old = FeedbackStore(url)
    q = old.record_query(
        "what do cats eat", answer="mice", chunks=[{"chunk_id": "a1", "doc_id": "doc-a", "text": "passage a1"}]
    )
    old.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # the schema as it was before expert labels
        conn.exec_driver_sql("DROP TABLE expert_labels")
    engine.dispose()
    assert "expert_labels" not in sa.inspect(sa.create_engine(url)).get_table_names()
    store = FeedbackStore(url)
    try:
        assert store.expert_high_water_mark() == 0 and store.current_expert_labels() == {}
        label(store, item("what do cats eat", "a1", query_id=q.query_id), 2)
        assert len(store.table("expert_labels")) == 1 and store.integrity_problems() == []
        assert store.table("passage_versions")["chunk_id"].tolist() == ["a1"]  # same text: no second version
    finally:
        store.close()


# ---- export -----------------------------------------------------------------------------------------------------


def test_export_has_graded_qrels_expert_answers_and_every_row(store, tmp_path):
    asked = store.record_query(
        "what do cats eat",
        answer="mice",
        chunks=[{"chunk_id": "a1", "doc_id": "doc-a", "text": "passage a1", "rank": 1}],
    )
    store.submit_feedback(
        FeedbackSubmission(query_id=asked.query_id, idempotency_key="f1", passages=[{"chunk_id": "a1", "score": 1}])
    )
    production = item("what do cats eat", "a2", query_id=asked.query_id)
    sky_1, sky_2 = item("Why is the sky blue?", "s1", "Rayleigh scattering"), item("why is the  SKY blue?", "s2")
    moon = item("how far is the moon", "m1")
    label(store, production, 0)
    label(store, production, 1, answer="mice and birds")
    label(store, sky_1, 2, answer="scattering", expert="bob")
    label(store, sky_2, 0, answer="wrong answer later undone")
    undo(store, sky_2)
    label(store, moon, 2, answer="far")
    undo(store, moon, key="u-moon")
    # The passage is edited after it was labelled: the export keeps the text the expert read.
    store.record_query("sky?", answer="-", chunks=[{"chunk_id": "s1", "doc_id": "doc-s", "text": "edited sky text"}])

    out = export_rag_dataset(store, tmp_path / "ds")
    sky = expert_query_id("why is the sky blue?")
    assert sky == expert_query_id("Why is the  sky blue?")  # one question however it is spaced or cased
    qrels = (out / "qrels" / "expert_qrels.tsv").read_text().splitlines()
    corpus = {d["_id"]: d for d in map(json.loads, open(out / "corpus.jsonl"))}
    sky_passage = next(pid for pid in corpus if pid.startswith("s1@"))
    assert corpus[sky_passage]["text"] == "Rayleigh scattering"
    assert qrels[0] == "query-id\tcorpus-id\tscore"
    assert sorted(qrels[1:]) == sorted([f"{asked.query_id}\ta2\t1", f"{sky}\t{sky_passage}\t2"])
    queries = {q["_id"]: q for q in map(json.loads, open(out / "queries.jsonl"))}
    assert set(queries) == {asked.query_id, sky}  # the moon's only label was undone
    assert queries[asked.query_id]["metadata"]["expert_answer"] == "mice and birds"
    assert (
        queries[sky]["metadata"]["source"] == "expert-queue"
        and queries[sky]["metadata"]["expert_answer"] == "scattering"
    )
    assert queries[sky]["text"] == "Why is the sky blue?"
    rows = [json.loads(line) for line in open(out / "expert_labels.jsonl")]
    assert [r["grade"] for r in rows] == [0, 1, 2, 0, None, 2, None]
    assert {r["expert"] for r in rows} == {"ann", "bob"} and all(r["created_at"] for r in rows)
    assert rows[2]["dataset_query_id"] == sky and "payload_hash" not in rows[0]
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["expert_labels"], stats["expert_questions"], stats["expert_qrels"], stats["expert_answers"]) == (
        7,
        2,
        2,
        2,
    )
    assert stats["expert_grades"] == {"2": 1, "1": 1, "0": 0} and stats["expert_high_water_mark"] == 7
    assert stats["queries"] == 2

    judged = judgments(out)
    assert sorted(judged.expert_qrels) == sorted([(asked.query_id, "a2", 1), (sky, sky_passage, 2)])
    assert judged.expert_answers == {asked.query_id: "mice and birds", sky: "scattering"}
    assert all(q in judged.queries and c in judged.corpus for q, c, _ in judged.expert_qrels)
    assert judged.chunk_qrels == [(asked.query_id, "a1", 1)]
    assert training_pairs(out) == ([("what do cats eat", "passage a1")], [])  # user ratings only, as before


def test_a_dataset_without_expert_files_still_loads_and_keeps_its_version(store, tmp_path):
    q = store.record_query("what do cats eat", answer="mice", chunks=[{"chunk_id": "a1", "doc_id": "d", "text": "t"}])
    store.submit_feedback(
        FeedbackSubmission(query_id=q.query_id, idempotency_key="f", passages=[{"chunk_id": "a1", "score": 1}])
    )
    out = export_rag_dataset(store, tmp_path / "ds")
    digest = hashlib.sha256()  # the fingerprint exports had before expert labels existed
    for name in ("corpus.jsonl", "queries.jsonl", "answers.jsonl", "qrels/chunk_qrels.tsv", "qrels/answer_qrels.tsv"):
        digest.update((out / name).read_bytes())
    assert json.loads((out / "stats.json").read_text())["version"] == digest.hexdigest()[:16]
    assert "expert_answer" not in (out / "queries.jsonl").read_text()
    os.remove(out / "qrels" / "expert_qrels.tsv")
    os.remove(out / "expert_labels.jsonl")
    judged = judgments(out)
    assert judged.expert_qrels == [] and judged.expert_answers == {} and judged.chunk_qrels == [(q.query_id, "a1", 1)]


def test_expert_labels_make_a_new_version_and_latest_picks_the_newest(store, tmp_path):
    q = store.record_query("what do cats eat", answer="mice", chunks=[{"chunk_id": "a1", "doc_id": "d", "text": "t"}])
    store.submit_feedback(FeedbackSubmission(query_id=q.query_id, idempotency_key="f1", answer_score=1))
    first = export_versioned(store, tmp_path)
    assert first.name == "hw-0000000001" and export_versioned(store, tmp_path) == first
    label(store, item("what do cats eat", "a1", query_id=q.query_id), 2)
    second = export_versioned(store, tmp_path)
    assert second.name == "hw-0000000001-e0000000001" and latest_dataset(tmp_path) == second
    assert (
        json.loads((second / "stats.json").read_text())["version"]
        != json.loads((first / "stats.json").read_text())["version"]
    )
    store.submit_feedback(FeedbackSubmission(query_id=q.query_id, idempotency_key="f2", answer_score=-1))
    third = export_versioned(store, tmp_path)
    assert third.name == "hw-0000000002-e0000000001" and latest_dataset(tmp_path) == third
    # Folder names are compared as numbers, old names without an expert mark included.
    for name in ("hw-0000000010", "hw-0000000009-e0000000099", ".tmp-x", "hw-junk"):
        (dataset_root(tmp_path) / name).mkdir()
        (dataset_root(tmp_path) / name / "stats.json").write_text("{}")
    assert latest_dataset(tmp_path).name == "hw-0000000010"


# ---- API --------------------------------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def client(store, root):
    app = create_app(
        lambda: FakeAnswerer(), store, ServeSettings(api_token=TOKEN, expert_token=EXPERT_TOKEN), root=root
    )
    with TestClient(app) as c:
        yield c


def build_queue(root, *items: QueueItem, created_at: datetime | None = None) -> AnnotationQueue:
    queue = AnnotationQueue(
        strategy="t", selection="active", items=list(items), **({"created_at": created_at} if created_at else {})
    )
    write_queue(root, queue)
    return queue


def body(it: QueueItem, grade: int, key: str, **extra) -> dict:
    return {"item_id": it.item_id, "grade": grade, "expert": "ann", "idempotency_key": key, **extra}


def test_only_the_expert_token_reads_the_queue_and_writes_labels(client, store, root):
    cats = item("what do cats eat", "a1")
    build_queue(root, cats)
    refused = [
        client.get("/annotation/next?expert=ann", headers=AUTH),
        client.post("/annotation/labels", json=body(cats, 2, "k"), headers=AUTH),
        client.post(
            "/annotation/undo", json={"item_id": cats.item_id, "expert": "ann", "idempotency_key": "u"}, headers=AUTH
        ),
    ]
    for response in refused:
        assert response.status_code == 403 and "expert token" in response.json()["error"], response.text
    for headers in ({}, {"Authorization": "Bearer wrong-token-xxxxxxxx"}):
        response = client.post("/annotation/labels", json=body(cats, 2, "k"), headers=headers)
        assert response.status_code == 401 and "expert token" in response.json()["error"]
    assert client.post("/ask", json={"question": "cats?"}, headers=EXPERT).status_code == 401  # and not the reverse
    assert len(store.table("expert_labels")) == 0
    batch = client.get("/annotation/next?expert=ann", headers=EXPERT)
    assert batch.status_code == 200 and batch.json()["items"][0]["item_id"] == cats.item_id
    assert client.post("/annotation/labels", json=body(cats, 2, "k"), headers=EXPERT).status_code == 201
    assert store.current_expert_labels()[cats.item_id]["expert"] == "ann"
    with pytest.raises(ValueError, match="must differ"):
        ServeSettings(api_token=TOKEN, expert_token=TOKEN)
    assert ServeSettings(api_token=TOKEN).expert_token != TOKEN  # random when not given


def test_labelling_through_the_api(client, store, root):
    assert client.get("/annotation/next?expert=ann", headers=EXPERT).status_code == 409
    missing = client.post("/annotation/labels", json=body(item("q", "a1"), 2, "k0"), headers=EXPERT)
    assert missing.status_code == 409 and "materialize the `annotation_queue` asset" in missing.json()["error"]
    asked = store.record_query(
        "what do cats eat", answer="mice", chunks=[{"chunk_id": "a1", "doc_id": "doc-a", "text": "passage a1"}]
    )
    cats, dogs = item("what do cats eat", "a1", query_id=asked.query_id), item("where do dogs sleep", "b1")
    built = build_queue(root, cats, dogs)

    outside = client.post("/annotation/labels", json=body(item("not queued", "z9"), 2, "k1"), headers=EXPERT)
    assert outside.status_code == 404 and "not in the current annotation queue" in outside.json()["error"]
    assert client.post("/annotation/labels", json=body(cats, 5, "k1"), headers=EXPERT).status_code == 422
    assert len(store.table("expert_labels")) == 0 and len(store.table("passages")) == 1

    first = client.post("/annotation/labels", json=body(cats, 2, "k1", expert_answer="mice"), headers=EXPERT)
    again = client.post("/annotation/labels", json=body(cats, 2, "k1", expert_answer="mice"), headers=EXPERT)
    assert (first.status_code, again.status_code) == (201, 200) and again.json() == {**first.json(), "duplicate": True}
    assert client.post("/annotation/labels", json=body(cats, 0, "k1"), headers=EXPERT).status_code == 409
    stored = store.table("expert_labels")
    assert (
        len(stored) == 1 and stored.loc[0, "query_id"] == asked.query_id and stored.loc[0, "question"] == cats.question
    )

    batch = client.get("/annotation/next?expert=ann&limit=5", headers=EXPERT).json()
    assert [i["item_id"] for i in batch["items"]] == [dogs.item_id]  # the labelled item is not served again
    assert batch["progress"] == {"total": 2, "labelled": 1, "labelled_since_queue": 1, "by_you": 1}
    assert batch["strategy"] == "t" and batch["items"][0]["text"] == "passage b1"

    bob_undo = {"item_id": cats.item_id, "expert": "bob", "idempotency_key": "u0"}
    assert client.post("/annotation/undo", json=bob_undo, headers=EXPERT).status_code == 409
    undone = client.post(
        "/annotation/undo", json={**bob_undo, "expert": "ann", "idempotency_key": "u1"}, headers=EXPERT
    )
    assert undone.status_code == 201 and undone.json()["grade"] is None
    assert client.get("/annotation/next?expert=ann", headers=EXPERT).json()["items"][0]["item_id"] == cats.item_id

    # A rebuilt queue (new file) is read again; labels given before it count as labelled, not as labelled since.
    client.post("/annotation/labels", json=body(dogs, 1, "k2"), headers=EXPERT)
    later = built.created_at + timedelta(hours=1)
    build_queue(root, dogs, item("new question", "c1"), created_at=later)
    os.utime(queue_path(root), ns=(1, 1))  # whatever the clock's resolution, the file's stamp changes
    progress = client.get("/annotation/next?expert=bob", headers=EXPERT).json()["progress"]
    assert progress == {"total": 2, "labelled": 1, "labelled_since_queue": 0, "by_you": 0}
    # A retry of a label whose item a rebuild dropped is still answered as the retry it is.
    assert (
        client.post("/annotation/labels", json=body(cats, 2, "k1", expert_answer="mice"), headers=EXPERT).status_code
        == 200
    )
    schema = client.get("/openapi.json").json()
    assert {"/annotation/next", "/annotation/labels", "/annotation/undo"} <= set(schema["paths"])
    assert client.get("/expert").status_code == 200 and "expert.js" in client.get("/expert").text


def test_an_annotation_queue_file_that_fails_validation_is_a_clear_error_not_a_500(client, root):
    """A hand-edited or truncated queue file made /annotation/next and /annotation/labels answer 500."""
    from rag.annotation.queue import queue_path

    cats = item("what do cats eat", "a1")
    build_queue(root, cats)
    for broken in ('{"strategy": "t", "items": [{"question": 3}]}', "{not json", ""):
        queue_path(root).write_text(broken, encoding="utf-8")
        for response in (
            client.get("/annotation/next?expert=ann", headers=EXPERT),
            client.post("/annotation/labels", json=body(cats, 2, f"k{len(broken)}"), headers=EXPERT),
        ):
            assert response.status_code == 503, response.text
            assert "cannot be read" in response.json()["error"] and "materialize the `annotation_queue`" in (
                response.json()["error"]
            )
    build_queue(root, cats)  # rebuilt: served again
    assert client.get("/annotation/next?expert=ann", headers=EXPERT).json()["items"][0]["item_id"] == cats.item_id
