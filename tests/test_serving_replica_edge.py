"""Serving replicas of an edge primary are built by copying the shard's files (segments with their HNSW graph),
not point by point: the replica answers as the primary does, keeps its index, and a failed copy leaves nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from qdrant_client.http import models

from rag.index import edge as edge_module
from rag.index.edge import EdgeClient, EdgeOptions
from rag.index.qdrant import (
    CollectionName,
    QdrantSettings,
    alias_target,
    close_client,
    get_client,
    point_alias_to,
)
from rag.index.sync import sync_collection
from rag.retrieval import Index, RetrievalParams, retrieve
from rag.serving import index as serving_module
from rag.serving.index import ServingIndex, replicate_collection
from rag.store import CHUNKS_TABLE, TableStore
from tests.test_retrieval import TEXTS, chunk_table, embedder, ids  # noqa: F401 (fixture)

DIM = 32
POINTS = 600
# Thresholds low enough that a few hundred 32-float vectors get an HNSW graph on optimize.
SMALL_INDEX = EdgeOptions(indexing_threshold_kb=10, full_scan_threshold_kb=1, max_indexing_threads=1)


def edge(path: Path) -> QdrantSettings:
    return QdrantSettings(path=str(path), engine="edge")


def build_primary(folder: Path, n: int = POINTS, seed: int = 7) -> None:
    """An indexed collection `c_v1` behind alias `c`, written and closed as a Dagster run leaves it."""
    client = EdgeClient(folder, SMALL_INDEX)
    rng = np.random.default_rng(seed)
    client.create_collection(
        "c_v1", vectors_config={"dense": models.VectorParams(size=DIM, distance=models.Distance.COSINE)}
    )
    client.create_payload_index("c_v1", "doc_id", models.PayloadSchemaType.KEYWORD)
    client.upsert(
        "c_v1",
        models.Batch(
            ids=list(range(1, n + 1)),
            vectors={"dense": rng.normal(size=(n, DIM)).tolist()},
            payloads=[{"doc_id": f"d{i % 13}", "n": i} for i in range(1, n + 1)],
        ),
    )
    point_alias_to(client, "c", "c_v1")
    client.close()


def queries(seed: int = 11, n: int = 8) -> list[list[float]]:
    return np.random.default_rng(seed).normal(size=(n, DIM)).tolist()


def top_k(client, alias: str, query: list[float], **kw) -> list[tuple[int, float]]:
    return [(p.id, p.score) for p in client.query_points(alias, query, using="dense", limit=10, **kw).points]


def disk_bytes(folder: Path) -> int:
    """Bytes allocated on disk, holes excluded."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def primary(tmp_path):
    build_primary(tmp_path / "primary")
    settings = edge(tmp_path / "primary")
    yield settings
    close_client(settings)


def test_a_file_copied_replica_answers_as_the_primary_and_keeps_its_hnsw(tmp_path, primary, monkeypatch):
    def point_by_point(*args, **kwargs):
        raise AssertionError("an edge-to-edge replica is copied file by file, not point by point")

    monkeypatch.setattr(serving_module, "copy_collection", point_by_point)
    src = get_client(primary)
    want_info = src.get_collection("c")
    want = {i: top_k(src, "c", q) for i, q in enumerate(queries())}
    want_payloads = {r.id: r.payload for r in src.retrieve("c", list(range(1, 40)))}
    assert want_info.indexed_vectors_count > 0  # the primary has a graph to keep
    close_client(primary)

    target = edge(tmp_path / "replica")
    try:
        assert replicate_collection(primary, target, "c") == "c_v1"
        replica = get_client(target)
        info = replica.get_collection("c")
        assert info.points_count == want_info.points_count == POINTS
        assert info.config.params.vectors == want_info.config.params.vectors
        # Copied, not rebuilt: a replica opened with Edge's default threshold would index none of these 600 points.
        assert info.indexed_vectors_count == want_info.indexed_vectors_count
        assert info.segments_count == want_info.segments_count
        for i, q in enumerate(queries()):
            got = top_k(replica, "c", q)
            assert [p for p, _ in got] == [p for p, _ in want[i]]
            assert [s for _, s in got] == pytest.approx([s for _, s in want[i]], abs=1e-6)
        assert {r.id: r.payload for r in replica.retrieve("c", list(range(1, 40)))} == want_payloads
        flt = models.Filter(must=[models.FieldCondition(key="doc_id", match=models.MatchValue(value="d3"))])
        assert replica.count("c", count_filter=flt).count == sum(1 for i in range(1, POINTS + 1) if i % 13 == 3)
        meta = json.loads((tmp_path / "replica" / "meta.json").read_text())
        assert meta == {"engine": "qdrant-edge", "aliases": {"c": "c_v1"}}
        assert sorted(p.name for p in (tmp_path / "replica" / "collection").iterdir()) == ["c_v1"]
        # Edge preallocates WAL and payload pages as sparse files: a plain copy would write ~100 MB of zeros.
        assert disk_bytes(tmp_path / "replica") < 2 * disk_bytes(tmp_path / "primary") + (1 << 20)
    finally:
        close_client(target)


def test_the_primary_takes_writes_and_searches_after_its_collection_was_exported(tmp_path):
    build_primary(tmp_path / "primary")
    client = EdgeClient(tmp_path / "primary", SMALL_INDEX)
    query = queries(n=1)[0]
    before = top_k(client, "c", query)  # the shard is open in this client when it is exported
    assert client.export_collection("c", tmp_path / "replica", alias="c") == "c_v1"

    client.upsert("c", [models.PointStruct(id=POINTS + 1, vector={"dense": query}, payload={"doc_id": "new"})])
    assert client.count("c").count == POINTS + 1
    assert top_k(client, "c", query)[0] == (POINTS + 1, pytest.approx(1.0, abs=1e-5))
    client.delete("c", models.PointIdsList(points=[1, 2]))
    client.optimize("c")
    assert client.count("c").count == POINTS - 1
    assert [r.id for r in client.retrieve("c", [1, 2, 3])] == [3]

    replica = EdgeClient(tmp_path / "replica")
    try:
        assert replica.count("c").count == POINTS  # a copy: the primary's later writes are not in it
        assert top_k(replica, "c", query) == before
        replica.upsert("c", [models.PointStruct(id=POINTS + 2, vector={"dense": query}, payload={})])
        assert client.retrieve("c", [POINTS + 2]) == []  # and the replica's writes are not in the primary
    finally:
        replica.close()
        client.close()


def test_an_export_writes_what_was_not_yet_optimized_with_its_index(tmp_path):
    build_primary(tmp_path / "primary")
    client = EdgeClient(tmp_path / "primary", SMALL_INDEX)
    rng = np.random.default_rng(5)
    client.upsert(
        "c_v1",
        models.Batch(
            ids=list(range(POINTS + 1, 2 * POINTS + 1)), vectors={"dense": rng.normal(size=(POINTS, DIM)).tolist()}
        ),
    )
    client.export_collection("c_v1", tmp_path / "replica")
    indexed = client.get_collection("c_v1").indexed_vectors_count
    client.close()
    replica = EdgeClient(tmp_path / "replica", SMALL_INDEX)
    try:
        assert indexed == 2 * POINTS  # optimized before the copy, as an alias swap would have
        assert replica.get_collection("c_v1").indexed_vectors_count == indexed
        assert replica.get_aliases().aliases == []
    finally:
        replica.close()


def test_an_export_refuses_an_open_folder_or_a_collection_it_already_holds(tmp_path):
    build_primary(tmp_path / "primary")
    client = EdgeClient(tmp_path / "primary")
    other = EdgeClient(tmp_path / "open")
    try:
        with pytest.raises(edge_module.QdrantLockedError):
            client.export_collection("c", tmp_path / "open", alias="c")
        assert other.get_collections().collections == []
        client.export_collection("c", tmp_path / "replica", alias="c")
        with pytest.raises(ValueError, match="already"):
            client.export_collection("c", tmp_path / "replica", alias="c")
    finally:
        other.close()
        client.close()
    replica = EdgeClient(tmp_path / "replica")
    assert replica.count("c").count == POINTS  # the refused second export left the first one as it was
    replica.close()


@pytest.mark.parametrize("fail_at", ["copytree", "third file"])
def test_a_failed_copy_leaves_no_replica_and_the_primary_untouched(tmp_path, primary, monkeypatch, fail_at):
    src = get_client(primary)
    want = [top_k(src, "c", q) for q in queries()]
    close_client(primary)
    files_before = tree(tmp_path / "primary" / "collection")
    meta_before = (tmp_path / "primary" / "meta.json").read_text()
    if fail_at == "copytree":

        def broken(*args, **kwargs):
            raise OSError("disk full")

        monkeypatch.setattr(edge_module.shutil, "copytree", broken)
    else:
        real, copied = edge_module.copy_sparse, []

        def broken(src_path, dst_path, **kwargs):
            if len(copied) == 2:
                raise OSError("disk full")
            copied.append(src_path)
            return real(src_path, dst_path, **kwargs)

        monkeypatch.setattr(edge_module, "copy_sparse", broken)

    target = edge(tmp_path / "replica")
    with pytest.raises(OSError, match="disk full"):
        replicate_collection(primary, target, "c")
    assert not (tmp_path / "replica").exists()
    assert tree(tmp_path / "primary" / "collection") == files_before  # nothing written, nothing left open
    assert (tmp_path / "primary" / "meta.json").read_text() == meta_before
    src = get_client(primary)  # the primary's lock was released
    assert [top_k(src, "c", q) for q in queries()] == want


def build_served(root: Path, texts: dict[str, str], embedder) -> None:  # noqa: F811
    chunks = chunk_table(texts)
    TableStore(root / "tables").write(chunks, CHUNKS_TABLE, "t")
    settings = edge(root / "qdrant")
    try:
        sync_collection(get_client(settings), chunks, embedder, strategy="t", model="wordllama")
    finally:
        close_client(settings)


def served_index(root: Path, open_index, **options) -> ServingIndex:
    """What `rag serve` holds over build_served's chunk set "t", its answerer the opened Index itself."""
    return ServingIndex(
        root=root,
        strategy="t",
        model="wordllama",
        build=lambda index: index,
        open_index=open_index,
        qdrant=edge(root / "qdrant"),
        **options,
    )


@pytest.mark.parametrize("replica_engine", ["edge", "local"])
def test_serving_refreshes_onto_a_new_replica_after_a_reindex(tmp_path, embedder, monkeypatch, replica_engine):  # noqa: F811
    def point_by_point(*args, **kwargs):
        raise AssertionError("an edge-to-edge replica is copied file by file, not point by point")

    if replica_engine == "edge":
        monkeypatch.setattr(serving_module, "copy_collection", point_by_point)
    monkeypatch.setenv("RAG_QDRANT_ENGINE", replica_engine)  # the replicas' settings read it; the primary's is edge
    root = tmp_path / "data"
    build_served(root, TEXTS, embedder)

    def open_index(qdrant: QdrantSettings) -> Index:
        client = get_client(qdrant)
        return Index(
            chunk_table(TEXTS | {"tea": TEA}).set_index("chunk_id"),
            None,
            client,
            CollectionName("t", "wordllama").alias,
            embedder,
        )

    def top(index: Index, question: str) -> str:
        return ids(retrieve(index, question, "dense", RetrievalParams(k=1, mmr_lambda=1.0)))[0]

    serving = served_index(root, open_index)
    try:
        first = serving.info()["qdrant"]
        assert top(serving.current(), "how is green tea brewed") != "tea"
        assert serving.refresh() is True and serving.generation == 1
        build_served(root, TEXTS | {"tea": TEA}, embedder)  # the primary is free: a re-index takes it
        assert serving.refresh() is False  # first sight of the change: wait until it is stable
        assert serving.refresh() is True and serving.generation == 2
        assert serving.info()["qdrant"] != first
        assert top(serving.current(), "how is green tea brewed") == "tea"
        replica = Path(serving.info()["qdrant"].removeprefix("replica "))
        live = alias_target(get_client(edge(root / "qdrant")), CollectionName("t", "wordllama").alias)
        close_client(edge(root / "qdrant"))
        assert sorted(p.name for p in (replica / "collection").iterdir()) == [live]
        # Nothing changed since: no new replica, though taking one opened (edge: rewrote files in) the primary.
        assert serving.refresh() is True and serving.refresh() is True and serving.generation == 2
    finally:
        serving.close()
    assert not any(p.name.startswith("replica-") for p in (root / "serving").iterdir())


TEA = "Green tea is brewed from the leaves of Camellia sinensis."


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux only: /proc/self/maps")
def test_a_replica_past_its_mapped_pages_budget_unmaps_them_and_answers_the_same(tmp_path, embedder, monkeypatch):  # noqa: F811
    from rag.serving.residency import file_mappings

    monkeypatch.setenv("RAG_QDRANT_ENGINE", "edge")
    for part in ("VECTORS", "PAYLOAD", "SPARSE"):  # config/qdrant/1m.yaml's: parts the engine maps from disk
        monkeypatch.setenv(f"RAG_QDRANT_{part}_ON_DISK", "true")
    root = tmp_path / "data"
    build_served(root, TEXTS, embedder)
    asked = ["how is green tea brewed", "what do cats eat", "where is the river", "who wrote the book"]

    def open_index(qdrant: QdrantSettings) -> Index:
        return Index(chunk_table(TEXTS).set_index("chunk_id"), None, get_client(qdrant), "t__wordllama", embedder)

    answers, trims = {}, {}
    for budget in (None, 0.0):  # none, as before; 0: unmapped before every question
        serving = served_index(root, open_index, mapped_pages_mb=budget)
        try:
            params = RetrievalParams(k=3, mmr_lambda=1.0)
            answers[budget] = [ids(retrieve(serving.current(), q, "dense", params)) for q in asked]
            trims[budget] = serving.info()["mapped_pages_trims"]
            assert file_mappings(root / "serving"), "the replica maps no file: nothing here to unmap"
        finally:
            serving.close()
    assert answers[0.0] == answers[None]
    assert trims == {None: 0, 0.0: len(asked)}
