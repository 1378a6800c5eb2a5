"""Indexes and retrieval on a tiny corpus: every mode, filters, MMR, incremental sync, alias swap."""

import hashlib
import os

import numpy as np
import pandas as pd
import pytest

from rag.embedding import load_embedder
from rag.index.bm25 import BM25Index
from rag.index.bm25_sparse import EngineBM25
from rag.index.qdrant import CollectionName, QdrantSettings, alias_target, close_client, create_collection, get_client
from rag.index.sync import sync_bm25, sync_collection
from rag.retrieval import Index, RetrievalError, RetrievalParams, SearchFilter, retrieve
from rag.retrieval.fusion import convex_combination, min_max, reciprocal_rank_fusion
from rag.retrieval.mmr import mmr
from rag.retrieval.service import open_bm25

TEXTS = {
    "cats": "Cats are small domesticated felines that purr and chase mice.",
    "dogs": "Dogs are loyal domesticated canines that bark and fetch sticks.",
    "rockets": "Rockets burn fuel to reach orbit and launch satellites into space.",
    "bread": "Bread is baked from flour, water, yeast and salt in a hot oven.",
    "pasta": "Pasta is boiled in salted water and served with tomato sauce.",
    "planets": "Planets orbit the sun; Jupiter is the largest planet of the solar system.",
}


def chunk_table(texts: dict[str, str], pages: dict[str, int] | None = None) -> pd.DataFrame:
    rows = []
    for cid, text in texts.items():
        page = (pages or {}).get(cid, 1)
        rows.append(
            {
                "chunk_id": cid,
                "doc_id": f"doc-{cid}",
                "strategy": "t",
                "text": text,
                "char_start": 0,
                "char_end": len(text),
                "page_start": page,
                "page_end": page,
                "section_path": [],
                "prev_chunk_id": None,
                "next_chunk_id": None,
                "n_tokens": len(text.split()),
                "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                "table_html": None,
            }
        )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def embedder():
    return load_embedder("wordllama")


SERVER = os.environ.get("RAG_TEST_QDRANT_URL")  # e.g. http://127.0.0.1:6333: the same tests against a Qdrant server


@pytest.fixture(params=["local-path", "memory", "edge", "server"])
def client(request, tmp_path):
    """One code path for every location and engine: an embedded folder, in-memory, a Qdrant Edge folder, and a server
    when RAG_TEST_QDRANT_URL is set."""
    if request.param == "server" and not SERVER:
        pytest.skip("set RAG_TEST_QDRANT_URL=http://host:6333 to run these tests against a Qdrant server")
    settings = {
        "local-path": QdrantSettings(path=str(tmp_path / "qdrant"), engine="local"),
        "memory": QdrantSettings(path=":memory:", engine="local"),
        "edge": QdrantSettings(path=str(tmp_path / "qdrant-edge"), engine="edge"),
        "server": QdrantSettings(url=SERVER),
    }[request.param]
    client = get_client(settings)
    yield client
    if request.param == "server":  # a shared server keeps what tests made: remove this module's strategy "t"
        for alias in client.get_aliases().aliases:
            if alias.alias_name.startswith("t__"):
                client.delete_alias(alias.alias_name)
        for collection in client.get_collections().collections:
            if collection.name.startswith("t__"):
                client.delete_collection(collection.name)
    close_client(settings)


@pytest.fixture(params=["engine", "bm25s"])
def index(request, tmp_path, client, embedder):
    """BM25 from the collection's sparse vectors (what searches use by default) and from the bm25s index."""
    chunks = chunk_table(TEXTS, pages={"rockets": 3, "planets": 4})
    run = sync_collection(client, chunks, embedder, strategy="t", model="wordllama")
    sync_bm25(chunks, tmp_path / "bm25")
    bm25 = open_bm25(tmp_path / "bm25", client, run.alias, request.param)
    assert isinstance(bm25, EngineBM25 if request.param == "engine" else BM25Index)
    return Index(chunks.set_index("chunk_id"), bm25, client, run.alias, embedder)


def ids(hits):
    return [h.chunk["chunk_id"] for h in hits]


def test_rrf_and_convex_combination_math():
    fused = reciprocal_rank_fusion([[("a", 9.0), ("b", 5.0)], [("b", 0.7), ("c", 0.1)]], k=60)
    assert fused[0] == ("b", pytest.approx(1 / 62 + 1 / 61))
    assert [i for i, _ in fused] == ["b", "a", "c"]
    assert min_max([("x", 2.0), ("y", 4.0)]) == {"x": 0.0, "y": 1.0}
    cc = dict(convex_combination([("a", 0.9), ("b", 0.1)], [("b", 10.0), ("c", 5.0)], alpha=0.25))
    assert cc == {"a": pytest.approx(0.25), "b": pytest.approx(0.75), "c": pytest.approx(0.0)}
    with pytest.raises(ValueError):
        convex_combination([], [], alpha=1.5)


def test_fusion_breaks_ties_by_first_appearance_whatever_the_ids_are():
    """Retrieval fuses point ids over a collection's payloads and chunk ids over a table (rag.retrieval.chunks):
    tied items must come out in the same order either way."""
    dense, sparse = [("z", 0.9), ("m", 0.1)], [("a", 7.0), ("n", 1.0)]
    renamed = {"z": "a2", "m": "n2", "a": "z2", "n": "m2"}  # the other way round alphabetically

    def rename(ranking):
        return [(renamed[item], score) for item, score in ranking]

    for fuse in (lambda d, s: convex_combination(d, s, 0.5), lambda d, s: reciprocal_rank_fusion([d, s])):
        fused = fuse(dense, sparse)
        assert fused[0][1] == pytest.approx(fused[1][1])  # z (dense's best) and a (sparse's best) tie
        assert [renamed[item] for item, _ in fused] == [item for item, _ in fuse(rename(dense), rename(sparse))]
        assert [item for item, _ in fused] == ["z", "a", "m", "n"]


def test_mmr_prefers_a_diverse_second_pick():
    q = np.array([1.0, 0.0])
    cands = np.array([[1.0, 0.0], [0.99, 0.141], [0.6, 0.8]])
    cands /= np.linalg.norm(cands, axis=1, keepdims=True)
    assert mmr(q, cands, 2, lambda_=1.0) == [0, 1]
    assert mmr(q, cands, 2, lambda_=0.3) == [0, 2]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid-rrf", "hybrid-cc"])
def test_each_mode_ranks_the_matching_chunk_first(index, mode):
    hits = retrieve(index, "which animal purrs and chases mice", mode, RetrievalParams(k=3))
    assert ids(hits)[0] == "cats"
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert all(hits[i].score >= hits[i + 1].score for i in range(len(hits) - 1))
    assert hits[0].to_json()["text"] == TEXTS["cats"]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid-rrf"])
def test_filters_by_document_and_page(index, mode):
    only_dogs = RetrievalParams(k=5, filters=SearchFilter(doc_ids=["doc-dogs"]))
    assert set(ids(retrieve(index, "domesticated animals", mode, only_dogs))) == {"dogs"}
    pages = RetrievalParams(k=5, filters=SearchFilter(page_from=3, page_to=4))
    assert set(ids(retrieve(index, "orbit of planets and rockets", mode, pages))) <= {"rockets", "planets"}


def test_mmr_option_returns_k_distinct_hits(index):
    hits = retrieve(index, "domesticated animals", "dense", RetrievalParams(k=3, mmr_lambda=0.5))
    assert len(set(ids(hits))) == 3


def test_bad_queries_and_modes_are_clear_errors(index):
    with pytest.raises(RetrievalError, match="empty"):
        retrieve(index, "   ", "bm25")
    with pytest.raises(RetrievalError, match="limit"):
        retrieve(index, "x" * 10_000_000, "bm25")
    with pytest.raises(RetrievalError, match="unknown retrieval mode"):
        retrieve(index, "cats", "fuzzy")


def test_incremental_sync_writes_only_changes(client, embedder):
    chunks = chunk_table(TEXTS)
    first = sync_collection(client, chunks, embedder, strategy="inc", model="wordllama")
    assert first.rebuilt and first.points == len(TEXTS)
    again = sync_collection(client, chunks, embedder, strategy="inc", model="wordllama")
    assert (again.added, again.updated, again.deleted, again.rebuilt) == (0, 0, 0, False)

    changed = dict(TEXTS, bread="Sourdough bread rises slowly with wild yeast.", comets="Comets have icy tails.")
    del changed["pasta"]
    third = sync_collection(client, chunk_table(changed), embedder, strategy="inc", model="wordllama")
    assert (third.added, third.updated, third.deleted) == (1, 1, 1) and third.points == len(changed)
    got = client.scroll(third.alias, limit=100, with_payload=["chunk_id", "text"])[0]
    assert {p.payload["chunk_id"]: p.payload["text"] for p in got}["bread"].startswith("Sourdough")


class NewWeights:
    """The same model under a new weights version, as after fine-tuning."""

    def __init__(self, base):
        self._base, self.name, self.dim, self.version = base, base.name, base.dim, "newweights01"

    def encode_passages(self, texts):
        return self._base.encode_passages(texts)

    encode_queries = encode = encode_passages


def test_new_model_version_builds_a_new_collection_and_swaps_the_alias(client, embedder):
    chunks = chunk_table(TEXTS)
    old = sync_collection(client, chunks, embedder, strategy="swap", model="wordllama")
    name = CollectionName("swap", "wordllama")
    # A crashed earlier build of the new version left a half-filled collection without the alias.
    create_collection(client, name.versioned("newweights01", "cosine"), embedder.dim, "cosine")
    new = sync_collection(client, chunks, NewWeights(embedder), strategy="swap", model="wordllama")
    assert new.rebuilt and new.collection != old.collection
    assert alias_target(client, name.alias) == new.collection
    assert old.collection in new.dropped_collections
    names = [c.name for c in client.get_collections().collections if c.name.startswith("swap__")]
    assert names == [new.collection] and client.count(name.alias).count == len(TEXTS)


def test_search_refuses_a_collection_built_with_other_weights(tmp_path, embedder):
    from rag.retrieval.service import open_index
    from rag.store import CHUNKS_TABLE, TableStore

    settings = QdrantSettings(path=str(tmp_path / "q2"))
    chunks = chunk_table(TEXTS)
    TableStore(tmp_path / "tables").write(chunks, CHUNKS_TABLE, "t")
    sync_bm25(chunks, tmp_path / "indexes" / "bm25" / "t")
    sync_collection(get_client(settings), chunks, NewWeights(embedder), strategy="t", model="wordllama")
    with pytest.raises(RetrievalError, match="other weights"):
        open_index("t", "wordllama", root=tmp_path, qdrant=settings)
    sync_collection(get_client(settings), chunks, embedder, strategy="t", model="wordllama")
    assert open_index("t", "wordllama", root=tmp_path, qdrant=settings).alias == "t__wordllama"


def test_points_of_chunks_gone_from_the_chunk_set_are_skipped(index):
    # Between re-chunking and re-embedding the collection still holds the old chunks.
    # Searches map point ids to chunk ids through the chunk set, so such points have no chunk id and are left out.
    fresh = Index(index.chunks.drop(index="cats"), index.bm25, index.client, index.alias, index.embedder)
    for mode in ["dense", "bm25", "hybrid-cc"]:
        hits = retrieve(fresh, "which animal purrs and chases mice", mode, RetrievalParams(k=3))
        assert "cats" not in ids(hits) and [h.rank for h in hits] == list(range(1, len(hits) + 1)), mode
    assert ids(retrieve(fresh, "which animal purrs and chases mice", "dense", RetrievalParams(k=3))) != []


def test_query_vectors_are_encoded_once_per_index(index):
    calls = []
    original = index.embedder.encode_queries

    class Counting:
        name, dim, version = index.embedder.name, index.embedder.dim, index.embedder.version

        def encode_queries(self, texts):
            calls.append(texts)
            return original(texts)

    counted = Index(index.chunks, index.bm25, index.client, index.alias, Counting())
    for mode in ["dense", "hybrid-rrf", "hybrid-cc"]:
        retrieve(counted, "rockets and orbit", mode)
    assert calls == [["rockets and orbit"]]
