"""BM25 as the collection's sparse vectors (rag.index.bm25_sparse): the engine ranks with bm25s' scores, an
incremental sync normalises by the chunk set's mean length, and searches pick the engine's BM25 only where it is."""

import logging

import numpy as np
import pytest

from rag.index.bm25 import B, K1, BM25Index, tokenize
from rag.index.bm25_sparse import LENGTH_FIELD, SPARSE, EngineBM25, PassageTerms, has_bm25, query_vector
from rag.index.qdrant import CollectionName, create_collection, get_client, point_alias_to, point_id
from rag.index.sync import sync_bm25, sync_collection
from rag.retrieval import RetrievalError
from rag.retrieval.service import open_bm25
from tests.test_retrieval import SERVER, TEXTS, chunk_table, client, embedder  # noqa: F401 - fixtures

MORE = {
    "tea": "Green tea is brewed from the leaves of the tea plant and served hot; tea has caffeine.",
    "coffee": "Coffee beans are roasted, ground and brewed with hot water; coffee has more caffeine than tea.",
    "oven": "A hot oven bakes bread, pizza and cakes; the oven heats the air around the food.",
    "moon": "The moon orbits the earth; its gravity pulls the tides of the oceans.",
    "mice": "Mice are small rodents; cats chase mice and owls hunt them at night.",
    "long": " ".join(["Rivers carry water to the sea"] * 6) + "; water evaporates and falls as rain.",
}
CORPUS = {**TEXTS, **MORE}
QUERIES = [
    "hot water",
    "cats chase mice",
    "caffeine in tea and coffee",
    "orbit of the moon and planets",
    "bread baked in a hot oven",
    "the of and",
]


def _synced(client, embedder, tmp_path, texts, strategy="bm"):
    chunks = chunk_table(texts)
    run = sync_collection(client, chunks, embedder, strategy=strategy, model="wordllama")
    sync_bm25(chunks, tmp_path / strategy)
    return run, BM25Index.load(tmp_path / strategy)


def test_the_engine_ranks_with_bm25s_scores(client, embedder, tmp_path):
    run, bm25s = _synced(client, embedder, tmp_path, CORPUS)
    assert has_bm25(client, run.alias)
    engine = EngineBM25(client, run.alias)
    for query in QUERIES:
        want, got = bm25s.search(query, 20), engine.search(query, 20)
        assert dict(got) == pytest.approx(dict(want), rel=1e-4), query
        assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    assert engine.search("the of and", 5) == [] and query_vector("the of and") is None  # stop words only


def test_an_incremental_sync_normalises_new_passages_by_the_chunk_sets_mean_length(client, embedder, tmp_path):
    run, _ = _synced(client, embedder, tmp_path, TEXTS)
    changed = dict(TEXTS, bread="Sourdough bread rises slowly with wild yeast in a warm kitchen overnight.", **MORE)
    del changed["pasta"]
    again, _ = _synced(client, embedder, tmp_path, changed)
    assert (again.added, again.updated, again.deleted) == (len(MORE), 1, 1)

    lengths = {cid: len(tokens) for cid, tokens in zip(changed, tokenize(list(changed.values())))}
    avgdl = sum(lengths.values()) / len(lengths)
    points = client.retrieve(
        again.alias, [point_id("bread"), point_id("cats")], with_payload=True, with_vectors=[SPARSE]
    )
    by_id = {p.payload["chunk_id"]: p for p in points}
    assert {cid: p.payload[LENGTH_FIELD] for cid, p in by_id.items()} == {
        "bread": lengths["bread"],
        "cats": lengths["cats"],
    }
    bread = by_id["bread"].vector[SPARSE]
    tf = np.asarray(PassageTerms.of([changed["bread"]]).counts)
    assert bread.values == pytest.approx((tf / (tf + K1 * (1 - B + B * lengths["bread"] / avgdl))).tolist(), rel=1e-5)
    # An untouched point keeps the values written with the mean of its own sync (nothing is re-tokenized).
    first_avgdl = sum(len(t) for t in tokenize(list(TEXTS.values()))) / len(TEXTS)
    tf = np.asarray(PassageTerms.of([TEXTS["cats"]]).counts)
    want = tf / (tf + K1 * (1 - B + B * lengths["cats"] / first_avgdl))
    assert by_id["cats"].vector[SPARSE].values == pytest.approx(want.tolist(), rel=1e-5)


def test_searches_take_the_engines_bm25_only_where_the_collection_carries_it(client, embedder, tmp_path):
    run, _ = _synced(client, embedder, tmp_path, TEXTS)
    assert isinstance(open_bm25(tmp_path / "bm", client, run.alias), EngineBM25)
    assert isinstance(open_bm25(tmp_path / "bm", client, run.alias, "bm25s"), BM25Index)
    assert isinstance(open_bm25(tmp_path / "bm", None, None), BM25Index)  # bm25-only searches open no collection

    # A collection built before the sparse vector existed: bm25s serves, an incremental sync writes no sparse vector.
    name = CollectionName("old", "wordllama")
    create_collection(client, name.versioned(embedder.version, "cosine"), embedder.dim, "cosine", bm25=False)
    point_alias_to(client, name.alias, name.versioned(embedder.version, "cosine"))
    old = sync_collection(client, chunk_table(TEXTS), embedder, strategy="old", model="wordllama")
    assert not old.rebuilt and old.added == len(TEXTS) and not has_bm25(client, old.alias)
    assert isinstance(open_bm25(tmp_path / "bm", client, old.alias), BM25Index)
    with pytest.raises(RetrievalError, match="re-index"):
        open_bm25(tmp_path / "bm", client, old.alias, "engine")


def test_a_filtered_engine_bm25_search_counts_only_matching_points(client, embedder, tmp_path):
    from qdrant_client import models

    run, _ = _synced(client, embedder, tmp_path, CORPUS)
    only = models.Filter(must=[models.FieldCondition(key="doc_id", match=models.MatchAny(any=["doc-tea", "doc-oven"]))])
    hits = EngineBM25(client, run.alias).search("hot water", 1, only)
    assert [c for c, _ in hits] in (["tea"], ["oven"])


def test_the_default_engine_writes_and_ranks_bm25_through_a_data_dir(tmp_path, embedder, monkeypatch, caplog):
    """`rag search`'s path: open_index on the embedded default (Qdrant Edge) serves BM25 from the collection."""
    from rag.index.qdrant import QdrantSettings, close_client
    from rag.retrieval import retrieve
    from rag.retrieval.service import open_index
    from rag.store import CHUNKS_TABLE, TableStore, bm25_root

    monkeypatch.delenv("RAG_BM25", raising=False)
    settings = QdrantSettings(path=str(tmp_path / "qdrant"), engine="auto")
    chunks = chunk_table(CORPUS)
    TableStore(tmp_path / "tables").write(chunks, CHUNKS_TABLE, "t")
    sync_bm25(chunks, bm25_root(tmp_path, "t"))
    try:
        sync_collection(get_client(settings), chunks, embedder, strategy="t", model="wordllama")
        index = open_index("t", "wordllama", root=tmp_path, qdrant=settings)
        assert isinstance(index.bm25, EngineBM25)
        hits = retrieve(index, "cats chase mice", "hybrid-rrf")
        assert hits[0].chunk["chunk_id"] in {"mice", "cats"} and "bm25_rank" in hits[0].signals
        # a collection counted as large gets told which breadth to set, once per open, unless one is set
        monkeypatch.setattr("rag.index.qdrant.LARGE_COLLECTION_POINTS", len(chunks))
        with caplog.at_level(logging.WARNING, logger="rag.retrieval.service"):
            open_index(
                "t",
                "wordllama",
                root=tmp_path,
                qdrant=settings.model_copy(update={"hnsw_ef": None, "exact_search": False}),
            )
            open_index("t", "wordllama", root=tmp_path, qdrant=settings.model_copy(update={"hnsw_ef": 2048}))
        assert len([r for r in caplog.records if "RAG_HNSW_EF=2048" in r.getMessage()]) == 1
        monkeypatch.setenv("RAG_BM25", "bm25s")
        assert isinstance(open_index("t", "wordllama", root=tmp_path, qdrant=settings).bm25, BM25Index)
        monkeypatch.setenv("RAG_HNSW_EF", "256")  # the searches' HNSW breadth reaches the engine
        wide = open_index("t", "wordllama", root=tmp_path, qdrant=settings.model_copy(update={"hnsw_ef": 256}))
        assert QdrantSettings(path=str(tmp_path / "x")).hnsw_ef == 256 and wide.hnsw_ef == 256
        asked = []
        search = wide.client.query_points
        monkeypatch.setattr(
            wide.client, "query_points", lambda *a, **kw: asked.append(kw.get("search_params")) or search(*a, **kw)
        )
        assert [h.chunk["chunk_id"] for h in retrieve(wide, "cats chase mice", "dense")] == [
            h.chunk["chunk_id"] for h in retrieve(index, "cats chase mice", "dense")
        ]
        assert asked[0].hnsw_ef == 256 and not asked[0].exact
        monkeypatch.setenv("RAG_EXACT_SEARCH", "1")  # every dense vector scored: the exact top k
        exact = open_index("t", "wordllama", root=tmp_path, qdrant=QdrantSettings(path=settings.path, engine="auto"))
        assert exact.exact and exact.hnsw_ef == 256
        monkeypatch.setattr(
            exact.client, "query_points", lambda *a, **kw: asked.append(kw.get("search_params")) or search(*a, **kw)
        )
        asked.clear()
        exact_hits = [h.chunk["chunk_id"] for h in retrieve(exact, "cats chase mice", "dense")]
        assert asked[0].exact and asked[0].hnsw_ef == 256
        assert exact_hits == [h.chunk["chunk_id"] for h in retrieve(index, "cats chase mice", "dense")]
        monkeypatch.setenv("RAG_EXACT_SEARCH", "maybe")
        with pytest.raises(ValueError, match="RAG_EXACT_SEARCH='maybe': give 1 or 0"):
            QdrantSettings()
    finally:
        close_client(settings)


def test_only_a_large_collection_at_the_default_breadth_gets_a_hint():
    from rag.index.qdrant import LARGE_COLLECTION_POINTS, QdrantSettings

    default = QdrantSettings(path="unused", hnsw_ef=None, exact_search=False)
    assert default.breadth_hint(LARGE_COLLECTION_POINTS - 1) is None
    assert "RAG_HNSW_EF=2048" in default.breadth_hint(LARGE_COLLECTION_POINTS)
    assert default.model_copy(update={"hnsw_ef": 512}).breadth_hint(10**6) is None
    assert default.model_copy(update={"exact_search": True}).breadth_hint(10**6) is None


def test_migrate_engine_gives_a_collection_written_before_the_sparse_vector_bm25_in_the_engine(
    tmp_path, embedder, monkeypatch
):  # noqa: F811
    from rag.index.migrate import migrate_to_edge
    from rag.index.qdrant import QdrantSettings, close_client
    from rag.index.sync import point_batch

    monkeypatch.delenv("RAG_QDRANT_ENGINE", raising=False)
    folder, chunks = tmp_path / "qdrant", chunk_table(CORPUS)
    local = QdrantSettings(path=str(folder), engine="local")
    try:
        old = get_client(local)
        create_collection(old, "old", embedder.dim, "cosine", bm25=False)  # as collections were written before it
        rows = chunks.to_dict("records")
        old.upsert("old", point_batch(rows, embedder.encode_passages([r["text"] for r in rows])))
        point_alias_to(old, "old-alias", "old")
        assert not has_bm25(old, "old-alias")
    finally:
        close_client(local)
    done = migrate_to_edge(folder, log=lambda _: None)
    assert done.bm25_added == ["old"] and done.points == {"old": len(CORPUS)}
    sync_bm25(chunks, tmp_path / "bm25s")
    bm25s = BM25Index.load(tmp_path / "bm25s")
    edge = QdrantSettings(path=str(folder), engine="edge")
    try:
        migrated = get_client(edge)
        assert has_bm25(migrated, "old-alias")
        engine = EngineBM25(migrated, "old-alias")
        for query in QUERIES:
            assert dict(engine.search(query, 20)) == pytest.approx(dict(bm25s.search(query, 20)), rel=1e-4), query
        cats = migrated.retrieve("old", [point_id("cats")], with_payload=True, with_vectors=True)[0]
        assert cats.payload[LENGTH_FIELD] == len(tokenize([CORPUS["cats"]])[0]) and "dense" in cats.vector
    finally:
        close_client(edge)


def test_bm25_loads_no_numba_and_leaves_it_importable():
    """bm25s imports numba for a backend nothing here uses; a process that tokenizes, builds and searches BM25 (a
    serving replica) never loads it, and a later `import numba` (ranx) still works."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from rag.index.bm25 import BM25Index, tokenize\n"
        "index = BM25Index.build(['a', 'b'], ['green tea is brewed', 'cats chase mice'])\n"
        "assert [c for c, _ in index.search('brewing tea', k=1)] == ['a']\n"
        "assert tokenize(['Cats chasing']) == [['cat', 'chase']]\n"
        "assert 'numba' not in sys.modules, 'numba was loaded'\n"
        "import numba, bm25s\n"
        "assert not bm25s.NUMBA_AVAILABLE\n"
        "print('ok', numba.__version__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]
