"""HTTP API: ask → feedback round trip, bad input (unknown ids, duplicates, 1 MB comments, missing token) gets
a clear 4xx and leaves the store unchanged, metrics, OpenAPI; and the real Answerer over a serving replica of an
embedded Qdrant index that a concurrent re-index does not disturb."""

import hashlib

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from rag.feedback import FeedbackStore
from rag.index.qdrant import QdrantSettings, close_client, get_client
from rag.index.sync import sync_bm25, sync_collection
from rag.qa import AnswerResult
from rag.serving.app import create_app
from rag.serving.settings import ServeSettings
from rag.store import CHUNKS_TABLE, TableStore, bm25_root

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEXTS = {
    "cats": "Cats are small domesticated felines that purr and chase mice.",
    "dogs": "Dogs are loyal domesticated canines that bark and fetch sticks.",
    "rockets": "Rockets burn fuel to reach orbit and launch satellites into space.",
    "bread": "Bread is baked from flour, water, yeast and salt in a hot oven.",
}
TABLES = ["queries", "passages", "retrievals", "answers", "feedback_submissions", "feedback", "implicit_events"]


class FakeAnswerer:
    """Ranks the passages by shared words with the question; answers with the best one."""

    model_version = "fake@1"

    def ask(self, question: str) -> AnswerResult:
        words = set(question.lower().split())
        ranked = sorted(TEXTS.items(), key=lambda kv: -len(words & set(kv[1].lower().rstrip(".").split())))[:3]
        chunks = [
            {
                "chunk_id": cid,
                "doc_id": f"{cid}.md",
                "page_start": 1,
                "page_end": 1,
                "text": text,
                "rank": rank,
                "score": 1.0 / rank,
                "cited": rank == 1,
                "attributed": False,
            }
            for rank, (cid, text) in enumerate(ranked, start=1)
        ]
        return AnswerResult(
            question=question,
            answer=ranked[0][1],
            cited_chunk_ids=[ranked[0][0]],
            attributed_chunk_ids=[],
            not_in_context=False,
            latency_ms=1.0,
            chunks=chunks,
            generator="fake",
            settings={"fake": True},
        )


@pytest.fixture
def store(tmp_path):
    st = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    yield st
    st.close()


@pytest.fixture
def client(store):
    app = create_app(lambda: FakeAnswerer(), store, ServeSettings(api_token=TOKEN))
    with TestClient(app) as c:
        yield c


def snapshot(store):
    return {name: len(store.table(name)) for name in TABLES}


def ask(client, question="which animal does purr"):
    response = client.post("/ask", json={"question": question, "session_id": "s1"}, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def test_ask_then_feedback_lands_in_the_store(client, store):
    data = ask(client)
    assert (
        data["answer"] == TEXTS["cats"]
        and data["passages"][0]["chunk_id"] == "cats"
        and data["model_version"] == "fake@1"
    )
    body = {
        "query_id": data["query_id"],
        "idempotency_key": "k1",
        "answer_score": 1,
        "passages": [{"chunk_id": "cats", "score": 1}, {"chunk_id": data["passages"][1]["chunk_id"], "score": -1}],
        "correction": "Cats purr.",
        "comment": "nice",
    }
    response = client.post("/feedback", json=body, headers=AUTH)
    assert response.status_code == 201 and len(response.json()["event_ids"]) == 4
    feedback = store.table("feedback").sort_values("event_id")
    assert list(feedback["target"]) == ["answer", "passage", "passage", "correction"]
    assert list(feedback["score"]) == [1, 1, -1, 1]
    assert store.table("queries").loc[0, "text"] == "which animal does purr"
    click = client.post(
        "/events", json={"query_id": data["query_id"], "kind": "click", "chunk_id": "cats"}, headers=AUTH
    )
    assert click.status_code == 200 and click.json()["event_id"] >= 1
    metrics = client.get("/metrics", headers=AUTH).json()
    assert metrics["store"]["feedback_events"] == 4 and metrics["store"]["queries"] == 1
    assert metrics["requests"]["POST /ask"]["count"] == 1 and metrics["requests"]["POST /feedback"]["count"] == 1
    assert client.get("/health").json()["status"] == "ok"


def test_bad_input_is_a_clear_4xx_and_changes_nothing(client, store):
    data = ask(client)
    before = snapshot(store)
    good = {"query_id": data["query_id"], "idempotency_key": "dup", "answer_score": -1}
    cases = [
        (client.post("/feedback", json=good), 401, "bearer token"),
        (
            client.post("/feedback", json=good, headers={"Authorization": "Bearer wrong-token-xxxxxxxx"}),
            401,
            "bearer token",
        ),
        (client.post("/ask", json={"question": "x"}), 401, "bearer token"),
        (client.post("/feedback", json={**good, "query_id": "nope"}, headers=AUTH), 404, "unknown query_id"),
        (
            client.post("/feedback", json={**good, "passages": [{"chunk_id": "ghost", "score": 1}]}, headers=AUTH),
            422,
            "not retrieved",
        ),
        (client.post("/feedback", json={**good, "comment": "x" * 1_000_000}, headers=AUTH), 413, "bytes"),
        (client.post("/feedback", json={**good, "comment": "x" * 5_000}, headers=AUTH), 422, "comment"),
        (client.post("/feedback", json={**good, "answer_score": 5}, headers=AUTH), 422, "answer_score"),
        (
            client.post("/feedback", json={"query_id": data["query_id"], "idempotency_key": "e"}, headers=AUTH),
            422,
            "empty feedback",
        ),
        (
            client.post("/feedback", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"}),
            422,
            "JSON",
        ),
        (client.post("/ask", json={"question": ""}, headers=AUTH), 422, "question"),
        (client.post("/ask", json={"question": "q" * 9000}, headers=AUTH), 422, "question"),
        (
            client.post(
                "/events", json={"query_id": data["query_id"], "kind": "click", "chunk_id": "ghost"}, headers=AUTH
            ),
            422,
            "not retrieved",
        ),
    ]
    for response, status, words in cases:
        assert response.status_code == status, response.text
        assert words.lower() in response.json()["error"].lower(), response.json()
    assert cases[0][0].headers["WWW-Authenticate"] == "Bearer"
    assert snapshot(store) == before
    first = client.post("/feedback", json=good, headers=AUTH)
    again = client.post("/feedback", json=good, headers=AUTH)
    assert (first.status_code, again.status_code) == (201, 200) and again.json()["duplicate"] is True
    assert again.json()["event_ids"] == first.json()["event_ids"]
    conflict = client.post("/feedback", json={**good, "answer_score": 1}, headers=AUTH)
    assert conflict.status_code == 409 and "already used" in conflict.json()["error"]
    assert len(store.table("feedback")) == 1


def test_metrics_need_the_token_and_count_the_store_once_per_ttl(store, monkeypatch):
    import sqlalchemy as sa

    from rag.serving import app as app_module

    counted: list[str] = []

    def on_execute(_conn, _cursor, statement, *_):
        if "count(" in statement.lower():
            counted.append(statement)

    now = [1000.0]
    monkeypatch.setattr(app_module, "_monotonic", lambda: now[0], raising=False)
    sa.event.listen(store.engine, "before_cursor_execute", on_execute)
    app = create_app(lambda: FakeAnswerer(), store, ServeSettings(api_token=TOKEN, metrics_cache_seconds=30))
    try:
        with TestClient(app) as c:
            assert c.get("/metrics").status_code == 401
            assert c.get("/metrics", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"}).status_code == 401
            assert not counted  # refused before anything was counted
            first = c.get("/metrics", headers=AUTH)
            assert first.status_code == 200 and first.json()["store"]["queries"] == 0
            scans = len(counted)
            assert scans > 0
            ask(c)
            now[0] += 29
            again = c.get("/metrics", headers=AUTH).json()
            assert len(counted) == scans  # within the TTL: no table counted again
            assert again["store"]["queries"] == 0 and again["requests"]["POST /ask"]["count"] == 1  # requests are live
            now[0] += 2
            later = c.get("/metrics", headers=AUTH).json()
            assert len(counted) == 2 * scans and later["store"]["queries"] == 1
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", on_execute)


def test_openapi_schema_is_published(client):
    schema = client.get("/openapi.json").json()
    assert {"/ask", "/feedback", "/events", "/health", "/metrics"} <= set(schema["paths"])
    assert "FeedbackSubmission" in schema["components"]["schemas"]
    assert client.get("/").status_code == 200 and "ask-form" in client.get("/").text
    assert client.get("/static/app.js").status_code == 200


def chunk_table(texts: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "chunk_id": cid,
                "doc_id": f"{cid}.md",
                "strategy": "t",
                "text": text,
                "char_start": 0,
                "char_end": len(text),
                "page_start": 1,
                "page_end": 1,
                "section_path": [],
                "prev_chunk_id": None,
                "next_chunk_id": None,
                "n_tokens": len(text.split()),
                "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                "table_html": None,
            }
            for cid, text in texts.items()
        ]
    )


def build_index(root, texts: dict[str, str], strategy: str = "t") -> None:
    """What `rag index` leaves in a data dir: the chunk table, BM25 files, a wordllama collection."""
    from rag.embedding import load_embedder

    chunks = chunk_table(texts)
    TableStore(root / "tables").write(chunks, CHUNKS_TABLE, strategy)
    sync_bm25(chunks, bm25_root(root, strategy))
    settings = QdrantSettings(path=str(root / "qdrant"))
    try:
        sync_collection(get_client(settings), chunks, load_embedder("wordllama"), strategy=strategy, model="wordllama")
    finally:
        close_client(settings)


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    root = tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.delenv("RAG_QDRANT_PATH", raising=False)
    build_index(root, TEXTS)
    return root


def real_app(root, store, refresh_seconds: float = 0):
    from rag.serving.server import build_app

    settings = ServeSettings(api_token=TOKEN, refresh_seconds=refresh_seconds)
    return build_app(settings, root=root, store=store, strategy="t", model="wordllama", mode="hybrid-rrf")


def test_real_answerer_serves_from_a_replica_while_the_primary_is_reindexed(data_root, store):
    app = real_app(data_root, store)
    with TestClient(app) as c:
        data = ask(c, "which animal does purr and chase mice")
        assert data["passages"][0]["chunk_id"] == "cats" and "purr" in data["answer"]
        assert data["model_version"].startswith("wordllama@")
        assert c.get("/health").json()["index"]["generation"] == 1
        # The primary folder is free while the API serves: a re-index can take it (as a Dagster run would).
        build_index(data_root, {**TEXTS, "tea": "Green tea is brewed from the leaves of Camellia sinensis."})
        assert ask(c, "how is green tea brewed")["passages"][0]["chunk_id"] != "tea"  # old replica until refreshed
        index = app.state.serving
        assert index.refresh() is False  # first sight of a change: wait until it is stable
        assert index.refresh() is True and index.generation == 2
        assert ask(c, "how is green tea brewed")["passages"][0]["chunk_id"] == "tea"
    assert store.counts()["queries"] == 3


def test_stale_replicas_are_dropped_and_live_ones_kept(tmp_path):
    from rag.serving.index import drop_stale_replicas

    live, stale = QdrantSettings(path=str(tmp_path / "replica-1")), QdrantSettings(path=str(tmp_path / "replica-2"))
    get_client(live), get_client(stale)
    close_client(stale)  # a server that died leaves its folder unlocked
    try:
        assert drop_stale_replicas(tmp_path) == [tmp_path / "replica-2"]
        assert (tmp_path / "replica-1").exists() and not (tmp_path / "replica-2").exists()
    finally:
        close_client(live)


def test_an_unhandled_server_error_is_counted_as_5xx(store):
    class Broken(FakeAnswerer):
        def ask(self, question):
            raise RuntimeError("the index vanished")

    app = create_app(lambda: Broken(), store, ServeSettings(api_token=TOKEN))
    with TestClient(app, raise_server_exceptions=False) as c:
        assert c.post("/ask", json={"question": "cats?"}, headers=AUTH).status_code == 500
        counts = c.get("/metrics", headers=AUTH).json()["requests"]["POST /ask"]
    assert counts["count"] == 1 and counts["5xx"] == 1


def test_text_no_one_can_read_and_reused_event_keys_get_clear_errors(client, store):
    """A lone surrogate ("abc\\udc00", valid JSON) reached the tokenizer and gave a plain-text 500; a question of
    zero-width spaces was retrieved and stored; /events answered a reused key as a duplicate whatever it carried."""
    import json

    def post_escaped(path: str, body: dict):  # as a client sends it: "\udc00" escaped in the JSON text
        return client.post(path, content=json.dumps(body), headers={**AUTH, "Content-Type": "application/json"})

    data = ask(client)
    before = snapshot(store)
    for question, words in (
        ("abc\udc00", "not valid unicode"),
        ("\u200b\u200b\u2060\ufeff", "invisible characters"),
        (" \u200b\n\t", "invisible characters"),
    ):
        response = post_escaped("/ask", {"question": question})
        assert response.status_code == 422 and words in response.json()["error"].lower(), response.text
    for field in ("comment", "correction"):
        response = post_escaped(
            "/feedback", {"query_id": data["query_id"], "idempotency_key": field, "answer_score": 1, field: "x\udc00"}
        )
        assert response.status_code == 422 and response.headers["content-type"] == "application/json", response.text
    assert snapshot(store) == before
    assert ask(client, "who was Jürgen \u200bHabermas? 日本")["answer"]  # text with such characters is still asked

    shown = [p["chunk_id"] for p in data["passages"]]
    click = {"query_id": data["query_id"], "kind": "click", "chunk_id": shown[0], "idempotency_key": "click-1"}
    first = client.post("/events", json=click, headers=AUTH)
    again = client.post("/events", json=click, headers=AUTH)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    other = client.post("/events", json={**click, "chunk_id": shown[1]}, headers=AUTH)
    assert other.status_code == 409 and "already used for another event" in other.json()["error"]
    unknown = client.post("/events", json={**click, "query_id": "no-such-query"}, headers=AUTH)
    assert unknown.status_code == 409  # as /feedback: a reused key is checked first
    fresh = client.post("/events", json={**click, "query_id": "no-such-query", "idempotency_key": "k2"}, headers=AUTH)
    assert fresh.status_code == 404 and "unknown query_id" in fresh.json()["error"]
    assert (store.table("implicit_events")["kind"] == "click").sum() == 1
