"""Index-layer correctness: l2 scores as similarities, BM25 versions a reader can still load, incremental sync
that never hides a changed document, and clean-up that never drops a collection an alias serves."""

import os

import numpy as np
import pytest

from rag.index.bm25 import BM25Index
from rag.index.qdrant import CollectionName, alias_target, create_collection, point_alias_to, similarity
from rag.index.sync import sync_collection
from rag.qa.steps import filter_hits
from rag.retrieval import Index, RetrievalParams, retrieve
from tests.test_retrieval import TEXTS, NewWeights, chunk_table, client, embedder, ids  # noqa: F401 (fixtures)

# --- 1. l2: Qdrant's score is a distance; retrieval reports a similarity ---------------------------------------

POINTS = {"near": [1.0, 0.0], "mid": [2.0, 0.0], "far": [6.0, 0.0]}  # l2 distances from QUERY: 0.1, 1.1, 5.1
QUERY = [0.9, 0.0]


class AxisEmbedder:
    """Fixed 2-d vectors, so the l2 distance of every point to the query is known."""

    name, dim, version = "axis", 2, "axis01"

    def encode_passages(self, texts):
        return np.array([POINTS[t] for t in texts], dtype=np.float32)

    def encode_queries(self, texts):
        return np.array([QUERY for _ in texts], dtype=np.float32)


@pytest.fixture
def l2_index(client):  # noqa: F811 (the client fixture)
    chunks = chunk_table({cid: cid for cid in POINTS})
    run = sync_collection(client, chunks, AxisEmbedder(), strategy="l2", model="axis", distance="l2")
    assert run.collection.endswith("__l2")
    # No BM25 term matches the query, so hybrid-cc ranks by the dense score alone.
    bm25 = BM25Index.build(chunks["chunk_id"].tolist(), chunks["text"].tolist())
    return Index(chunks.set_index("chunk_id"), bm25, client, run.alias, AxisEmbedder())


def test_l2_distance_becomes_a_similarity_closest_highest(l2_index):
    hits = retrieve(l2_index, "unrelated words", "dense", RetrievalParams(k=3))
    assert ids(hits) == ["near", "mid", "far"]
    assert [h.score for h in hits] == pytest.approx([1 / 1.1, 1 / 2.1, 1 / 6.1], rel=1e-4)
    assert similarity(0.0, "l2") == 1.0 and similarity(0.7, "cosine") == 0.7 and similarity(-2.0, "dot") == -2.0


def test_hybrid_cc_ranks_the_closest_l2_point_first(l2_index):
    hits = retrieve(l2_index, "unrelated words", "hybrid-cc", RetrievalParams(k=3, alpha=0.5))
    assert ids(hits) == ["near", "mid", "far"] and hits[0].score > hits[-1].score


def test_min_score_keeps_the_close_l2_points(l2_index):
    hits = retrieve(l2_index, "unrelated words", "dense", RetrievalParams(k=3))
    assert ids(filter_hits(hits, min_score=0.4)) == ["near", "mid"]  # d <= 1/0.4 - 1 = 1.5


# --- 2. BM25: the previous version outlives the pointer swap ----------------------------------------------------


def bm25(texts: dict[str, str], fingerprint: str) -> BM25Index:
    return BM25Index.build(list(texts), list(texts.values()), fingerprint)


def test_a_reader_that_read_the_old_pointer_still_loads_it_after_a_save(tmp_path):
    bm25({"cats": TEXTS["cats"]}, "v1").save(tmp_path)
    seen = BM25Index.current_fingerprint(tmp_path)  # a reader resolves the pointer ...
    bm25({"dogs": TEXTS["dogs"]}, "v2").save(tmp_path)  # ... a save swaps it ...
    old = BM25Index.load_version(tmp_path, seen)  # ... and the reader's version is still there
    assert old.fingerprint == "v1" and old.search("purring cats", 1)[0][0] == "cats"
    assert BM25Index.load(tmp_path).fingerprint == "v2"
    bm25({"bread": TEXTS["bread"]}, "v3").save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CURRENT", "v2", "v3"]  # older than previous: gone


def test_load_follows_the_pointer_when_its_version_was_dropped_meanwhile(tmp_path, monkeypatch):
    for version in ("v1", "v2", "v3"):
        bm25({"cats": TEXTS["cats"]}, version).save(tmp_path)
    stale = iter(["v1"])  # CURRENT read before two saves, v1 dropped since
    real = BM25Index.current_fingerprint
    monkeypatch.setattr(BM25Index, "current_fingerprint", staticmethod(lambda root: next(stale, None) or real(root)))
    assert BM25Index.load(tmp_path).fingerprint == "v3"


def test_a_crash_before_the_swap_leaves_the_old_version_live(tmp_path, monkeypatch):
    import rag.index.bm25 as module

    bm25({"cats": TEXTS["cats"]}, "v1").save(tmp_path)

    def crash(*args, **kwargs):
        raise OSError("killed")

    for target in ("_fsync_tree", "atomic_write"):  # while the new folder is written, then at the pointer swap
        with monkeypatch.context() as patched:
            patched.setattr(module, target, crash)
            with pytest.raises(OSError, match="killed"):
                bm25({"dogs": TEXTS["dogs"]}, "v2").save(tmp_path)
        live = BM25Index.load(tmp_path)
        assert live.fingerprint == "v1" and live.chunk_ids == ["cats"]
    bm25({"dogs": TEXTS["dogs"]}, "v2").save(tmp_path)  # the next save completes and clears the crashed leftovers
    assert BM25Index.load(tmp_path).fingerprint == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CURRENT", "v1", "v2"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names open files through /proc")
def test_files_and_folder_are_fsynced_before_the_pointer_swap(tmp_path, monkeypatch):
    import rag.index.bm25 as module

    events, real_fsync, real_write = [], os.fsync, module.atomic_write

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def swap(path, *args, **kwargs):
        events.append(("swap", str(path)))
        real_write(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(module, "atomic_write", swap)
    bm25({"cats": TEXTS["cats"]}, "v1").save(tmp_path)
    before = {path for kind, path in events[: events.index(("swap", str(tmp_path / "CURRENT")))] if kind == "fsync"}
    assert any(p.endswith("/chunk_ids.json") for p in before) and any("/bm25s/" in p for p in before)
    assert str(tmp_path) in before  # the folder's rename is durable before CURRENT names it


# --- 3. incremental sync: upsert before delete ----------------------------------------------------------------


class Watched:
    """A client that runs `check` after every write, as a search arriving between two steps would."""

    def __init__(self, inner, check):
        self._inner, self._check, self.ops = inner, check, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def upsert(self, *args, **kwargs):
        return self._write("upsert", args, kwargs)

    def delete(self, *args, **kwargs):
        return self._write("delete", args, kwargs)

    def _write(self, op, args, kwargs):
        result = getattr(self._inner, op)(*args, **kwargs)
        self.ops.append((op, self._check()))
        return result


def test_a_changed_document_is_findable_between_every_sync_step(client, embedder):  # noqa: F811
    first = sync_collection(client, chunk_table(TEXTS), embedder, strategy="order", model="wordllama")
    texts = dict(TEXTS, pasta="Fresh pasta is rolled from eggs and flour.")
    texts["bread-v2"] = texts.pop("bread").replace("Bread", "Rye bread")  # re-chunked: a new chunk id
    chunks = chunk_table(texts)
    chunks.loc[chunks["chunk_id"] == "bread-v2", "doc_id"] = "doc-bread"

    def findable():
        index = Index(chunks.set_index("chunk_id"), None, client, first.alias, embedder)
        hits = retrieve(
            index,
            "rye bread baked from flour, water, yeast and salt in a hot oven",
            "dense",
            RetrievalParams(k=1, filters={"doc_ids": ["doc-bread"]}),
        )
        return ids(hits)

    watched = Watched(client, findable)
    run = sync_collection(watched, chunks, embedder, strategy="order", model="wordllama")
    assert [op for op, _ in watched.ops] == ["upsert", "delete"]
    assert [found for _, found in watched.ops] == [["bread-v2"], ["bread-v2"]]
    assert (run.added, run.updated, run.deleted, run.rebuilt) == (1, 1, 1, False)
    stored = {
        p.payload["chunk_id"]: p.payload["text"] for p in client.scroll(run.alias, limit=100, with_payload=True)[0]
    }
    assert set(stored) == set(texts) and stored["pasta"].startswith("Fresh")


# --- 4. clean-up keeps every alias target --------------------------------------------------------------------


def test_clean_up_never_drops_a_collection_production_serves(client, embedder):  # noqa: F811
    chunks, name = chunk_table(TEXTS), CollectionName("keep", "wordllama")
    old = sync_collection(client, chunks, embedder, strategy="keep", model="wordllama")
    point_alias_to(client, "keep__production", old.collection)
    leftover = name.versioned("crashed01", "cosine")
    create_collection(client, leftover, embedder.dim, "cosine")  # half-built, no alias: may go

    new = sync_collection(client, chunks, NewWeights(embedder), strategy="keep", model="wordllama")
    assert alias_target(client, name.alias) == new.collection and new.dropped_collections == [leftover]
    assert alias_target(client, "keep__production") == old.collection
    assert client.count("keep__production", exact=True).count == len(TEXTS)

    # Back to the old weights (a rollback): production's collection is reused in place, not rebuilt over.
    back = sync_collection(client, chunks, embedder, strategy="keep", model="wordllama")
    assert back.collection == old.collection and not back.rebuilt and back.added == 0
    assert alias_target(client, name.alias) == alias_target(client, "keep__production") == old.collection
    assert back.dropped_collections == [new.collection]
