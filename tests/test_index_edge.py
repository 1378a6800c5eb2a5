"""The Qdrant Edge engine (rag.index.edge): what it adds to the index behaviours that tests/test_retrieval.py and
tests/test_index_fixes.py already run on it (their `client` fixture has an "edge" param): state that survives a
reopen, an atomic alias pointer, deterministic ids, one process per folder, kill -9, HNSW that agrees with the
exact scan, and the serving replica and fingerprint working on an edge folder."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from qdrant_client.http import models

from rag.index import edge as edge_module
from rag.index.edge import EdgeClient, EdgeOptions, EdgeUnsupportedError
from rag.index.qdrant import (
    CollectionName,
    QdrantLockedError,
    QdrantSettings,
    alias_target,
    close_client,
    get_client,
    point_alias_to,
    point_id,
)
from rag.index.sync import sync_collection
from rag.retrieval import Index, RetrievalParams, retrieve
from tests.conftest import REPO
from tests.test_retrieval import TEXTS, chunk_table, embedder, ids  # noqa: F401 (fixture)


def edge_settings(path) -> QdrantSettings:
    return QdrantSettings(path=str(path), engine="edge")


@pytest.fixture
def settings(tmp_path):
    s = edge_settings(tmp_path / "qdrant")
    yield s
    close_client(s)


def vector_collection(client, name: str, dim: int, distance=models.Distance.COSINE) -> None:
    client.create_collection(name, vectors_config={"dense": models.VectorParams(size=dim, distance=distance)})


def test_engine_is_chosen_by_setting_and_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("RAG_QDRANT_ENGINE", raising=False)
    assert QdrantSettings().engine == "local" == QdrantSettings.from_env().engine  # not the default yet
    monkeypatch.setenv("RAG_QDRANT_ENGINE", "edge")
    assert QdrantSettings(path="x").engine == "edge" == QdrantSettings.from_env().engine
    settings = QdrantSettings(path=str(tmp_path / "q"))
    try:
        assert isinstance(get_client(settings), EdgeClient)
        with pytest.raises(ValueError, match="engine 'edge'"):
            get_client(settings.model_copy(update={"engine": "local"}))  # one engine per open folder
    finally:
        close_client(settings)
    with pytest.raises(ValueError):
        QdrantSettings(engine="faiss")


def test_aliases_and_points_survive_a_reopen(settings, embedder):  # noqa: F811
    run = sync_collection(get_client(settings), chunk_table(TEXTS), embedder, strategy="t", model="wordllama")
    close_client(settings)
    client = get_client(settings)
    assert alias_target(client, run.alias) == run.collection
    assert client.count(run.alias).count == len(TEXTS)
    index = Index(chunk_table(TEXTS).set_index("chunk_id"), None, client, run.alias, embedder)
    assert ids(retrieve(index, "which animal purrs and chases mice", "dense", RetrievalParams(k=1))) == ["cats"]
    assert client.get_collection(run.alias).config.params.vectors["dense"].size == embedder.dim


def test_memory_location_is_a_throwaway_folder():
    settings = QdrantSettings(path=":memory:", engine="edge")
    client = get_client(settings)
    vector_collection(client, "c", 2)
    root = client.root
    assert root.is_dir()
    close_client(settings)
    assert not root.exists()


def test_alias_pointer_swap_is_atomic(tmp_path, monkeypatch):
    client = EdgeClient(tmp_path / "q")
    for name in ("old", "new"):
        vector_collection(client, name, 2)
    point_alias_to(client, "live", "old")
    meta = tmp_path / "q" / "meta.json"
    before = meta.read_text()

    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(edge_module.os, "fsync", lambda fd: calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd))
    monkeypatch.setattr(edge_module.os, "replace", lambda a, b: calls.append(("replace", str(b))) or real_replace(a, b))
    point_alias_to(client, "live", "new")  # delete + create in one pointer write
    kinds = [(k, os.path.basename(p)) for k, p in calls]
    # The new content is durable before the rename publishes it, and the rename before the call returns.
    assert kinds[-3][0] == "fsync" and kinds[-3][1].startswith(".tmp-") and kinds[-2] == ("replace", "meta.json")
    assert kinds[-1] == ("fsync", "q")
    assert json.loads(meta.read_text())["aliases"] == {"live": "new"}

    def crash(a, b):
        raise OSError("disk gone")

    monkeypatch.setattr(edge_module.os, "replace", crash)
    with pytest.raises(OSError):
        point_alias_to(client, "live", "old")
    # Neither the file nor this process's view moved, and no temp file is left beside it.
    assert alias_target(client, "live") == "new" and json.loads(meta.read_text())["aliases"] == {"live": "new"}
    assert sorted(p.name for p in meta.parent.iterdir() if p.name.startswith((".meta", ".tmp-"))) == []
    client.close()
    assert before != meta.read_text()
    reopened = EdgeClient(tmp_path / "q")
    assert alias_target(reopened, "live") == "new"
    reopened.close()


def test_ids_are_deterministic_and_resync_is_idempotent(tmp_path, embedder):  # noqa: F811
    chunks = chunk_table(TEXTS)
    stored = []
    for folder in ("a", "b"):
        settings = edge_settings(tmp_path / folder)
        client = get_client(settings)
        run = sync_collection(client, chunks, embedder, strategy="t", model="wordllama")
        again = sync_collection(client, chunks, embedder, strategy="t", model="wordllama")
        assert (again.added, again.updated, again.deleted, again.rebuilt, again.points) == (0, 0, 0, False, len(TEXTS))
        points = client.scroll(run.alias, limit=100, with_payload=["chunk_id"])[0]
        stored.append({p.id: p.payload["chunk_id"] for p in points})
        close_client(settings)
    assert stored[0] == stored[1] == {point_id(cid): cid for cid in TEXTS}


OPEN_IN_CHILD = """
import sys
from rag.index.qdrant import QdrantLockedError, QdrantSettings, get_client
try:
    client = get_client(QdrantSettings(path=sys.argv[1], engine="edge"))
    print("opened", client.count(sys.argv[2]).count)
except QdrantLockedError as exc:
    print("locked:", exc)
"""


def open_in_child(path, collection: str) -> str:
    out = subprocess.run([sys.executable, "-c", OPEN_IN_CHILD, str(path), collection], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_second_process_gets_a_clear_lock_error(tmp_path):
    from rag.serving.index import drop_stale_replicas

    settings = edge_settings(tmp_path / "serving" / "replica-1")  # where serving keeps its replicas
    client = get_client(settings)
    vector_collection(client, "c", 2)
    client.upsert("c", models.Batch(ids=[1], vectors={"dense": [[1.0, 0.0]]}))
    answer = open_in_child(settings.location, "c")
    assert answer.startswith("locked:") and "QDRANT_URL" in answer
    with pytest.raises(QdrantLockedError):  # a second opener in this process, bypassing the cache, too
        EdgeClient(settings.location)
    assert drop_stale_replicas(tmp_path / "serving") == []  # serving's sweep sees the folder as live
    close_client(settings)
    assert open_in_child(settings.location, "c") == "opened 1"
    assert drop_stale_replicas(tmp_path / "serving") == [tmp_path / "serving" / "replica-1"]  # and now as stale


KILLED_WRITER = """
import os, signal, sys
from qdrant_client.http import models
from rag.index.edge import EdgeClient
client = EdgeClient(sys.argv[1])
client.create_collection("c", vectors_config={"dense": models.VectorParams(size=3, distance=models.Distance.DOT)})
client.upsert("c", models.Batch(ids=list(range(1, 101)), vectors={"dense": [[float(i), 1.0, 0.0] for i in range(1, 101)]},
                               payloads=[{"n": i} for i in range(1, 101)]))
client.update_collection_aliases(change_aliases_operations=[
    models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name="c", alias_name="live"))])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_writes_acknowledged_before_a_kill_9_are_there_on_reopen(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "q")], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -9, proc.stderr
    client = EdgeClient(tmp_path / "q")  # the dead process's flock went with it
    assert alias_target(client, "live") == "c" and client.count("live").count == 100
    top = client.query_points("live", [1.0, 0.0, 0.0], using="dense", limit=1, with_payload=True).points
    assert top[0].payload == {"n": 100}
    client.close()


def test_a_create_that_crashed_midway_is_no_collection(tmp_path):
    client = EdgeClient(tmp_path / "q")
    half = tmp_path / "q" / "collection" / "half"
    (half / "shard").mkdir(parents=True)  # a create killed before its config.json was written
    assert not client.collection_exists("half") and client.get_collections().collections == []
    vector_collection(client, "half", 2)  # and creating it again replaces the leftover
    assert [c.name for c in client.get_collections().collections] == ["half"]
    assert client.delete_collection("half") and not half.exists() and not client.delete_collection("half")
    client.close()


def clustered(rng, n: int, dim: int, centers: np.ndarray) -> np.ndarray:
    return (centers[rng.integers(0, len(centers), n)] + 0.3 * rng.normal(size=(n, dim))).astype(np.float32)


def test_hnsw_agrees_with_the_exact_scan(tmp_path):
    # Tiny thresholds, so that 2,000 points get an HNSW graph and queries really walk it.
    client = EdgeClient(tmp_path / "q", EdgeOptions(indexing_threshold_kb=10, full_scan_threshold_kb=1, max_indexing_threads=1))
    rng = np.random.default_rng(3)
    dim = 32
    centers = rng.normal(size=(40, dim))
    data = {"clustered": clustered(rng, 2000, dim, centers), "noise": rng.normal(size=(2000, dim)).astype(np.float32)}
    queries = {"clustered": clustered(rng, 30, dim, centers), "noise": rng.normal(size=(30, dim)).astype(np.float32)}
    for name, vectors in data.items():
        vector_collection(client, name, dim)
        client.upsert(name, models.Batch(ids=list(range(1, len(vectors) + 1)), vectors={"dense": vectors.tolist()}))
        assert client.get_collection(name).indexed_vectors_count == 0  # nothing is indexed until optimize
        assert client.optimize(name)
        assert client.get_collection(name).indexed_vectors_count == len(vectors)

    def recall(name: str, hnsw_ef: int | None) -> float:
        overlap = []
        for q in queries[name]:
            def top(params):
                return {p.id for p in client.query_points(name, q.tolist(), using="dense", limit=10, search_params=params).points}
            overlap.append(len(top(models.SearchParams(hnsw_ef=hnsw_ef)) & top(models.SearchParams(exact=True))) / 10)
        return float(np.mean(overlap))

    assert recall("clustered", None) >= 0.95
    # The graph is what answers: starved of candidates it loses neighbours the exact scan finds.
    assert recall("noise", 1) < 0.9
    client.close()


def test_unsupported_features_say_what_to_do(tmp_path):
    client = EdgeClient(tmp_path / "q")
    with pytest.raises(EdgeUnsupportedError, match="sparse"):
        client.create_collection("s", vectors_config={"dense": models.VectorParams(size=2, distance=models.Distance.COSINE)},
                                 sparse_vectors_config={"bm25": models.SparseVectorParams()})
    with pytest.raises(EdgeUnsupportedError, match="hnsw_config"):
        client.create_collection("h", vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE),
                                 hnsw_config=models.HnswConfigDiff(m=8))
    vector_collection(client, "c", 2)
    with pytest.raises(EdgeUnsupportedError, match="geo"):
        client.count("c", count_filter=models.Filter(must=[models.FieldCondition(
            key="where", geo_radius=models.GeoRadius(center=models.GeoPoint(lon=0, lat=0), radius=1.0))]))
    client.close()


def test_a_local_mode_folder_and_an_edge_folder_are_not_confused(tmp_path):
    local = QdrantSettings(path=str(tmp_path / "local"), engine="local")
    vector_collection(get_client(local), "c", 2)
    close_client(local)
    with pytest.raises(ValueError, match="RAG_QDRANT_ENGINE=local"):
        get_client(edge_settings(tmp_path / "local"))
    edge = edge_settings(tmp_path / "edge")
    vector_collection(get_client(edge), "c", 2)
    close_client(edge)
    with pytest.raises(ValueError, match="RAG_QDRANT_ENGINE=edge"):
        get_client(QdrantSettings(path=str(tmp_path / "edge"), engine="local"))


@pytest.mark.parametrize("source_engine,target_engine", [("edge", "edge"), ("edge", "local"), ("local", "edge")])
def test_serving_replica_copies_between_engines(tmp_path, embedder, source_engine, target_engine):  # noqa: F811
    from rag.serving.index import replicate_collection

    source = QdrantSettings(path=str(tmp_path / "primary"), engine=source_engine)
    target = QdrantSettings(path=str(tmp_path / "replica"), engine=target_engine)
    run = sync_collection(get_client(source), chunk_table(TEXTS), embedder, strategy="t", model="wordllama")
    try:
        assert replicate_collection(source, target, run.alias) == run.collection
        replica = get_client(target)
        assert replica.count(run.alias).count == len(TEXTS)
        index = Index(chunk_table(TEXTS).set_index("chunk_id"), None, replica, run.alias, embedder)
        hits = retrieve(index, "rockets launch satellites into orbit", "dense", RetrievalParams(k=2, mmr_lambda=0.5))
        assert ids(hits)[0] == "rockets"
    finally:
        close_client(target)
        close_client(source)


def test_serving_fingerprint_sees_an_in_place_update(tmp_path, embedder):  # noqa: F811
    from rag.serving.index import source_fingerprint

    settings = edge_settings(tmp_path / "qdrant")
    client = get_client(settings)
    try:
        sync_collection(client, chunk_table(TEXTS), embedder, strategy="t", model="wordllama")
        first = source_fingerprint(tmp_path, "t", settings)
        assert source_fingerprint(tmp_path, "t", settings) == first
        changed = sync_collection(client, chunk_table(dict(TEXTS, cats="Cats nap all day.")), embedder, strategy="t",
                                  model="wordllama")
        assert (changed.updated, changed.rebuilt) == (1, False)
        assert source_fingerprint(tmp_path, "t", settings) != first  # the in-place write is visible to serving
        assert alias_target(client, CollectionName("t", "wordllama").alias) == changed.collection
    finally:
        close_client(settings)


def test_scroll_pages_through_every_point_by_string_offsets(tmp_path):
    # Edge hands UUID ids and offsets back as uuid.UUID; callers get (and pass back) strings, as from qdrant-client.
    client = EdgeClient(tmp_path / "q")
    vector_collection(client, "c", 2)
    chunk_ids = [f"chunk-{i}" for i in range(50)]
    client.upsert("c", models.Batch(ids=[point_id(c) for c in chunk_ids], vectors={"dense": [[1.0, i] for i in range(50)]},
                                    payloads=[{"chunk_id": c} for c in chunk_ids]))
    seen, offset, pages = [], None, 0
    while True:
        points, offset = client.scroll("c", limit=7, offset=offset, with_payload=["chunk_id"])
        pages += 1
        seen += [(p.id, p.payload["chunk_id"]) for p in points]
        if offset is None:
            break
        assert isinstance(offset, str)
    assert pages == 8 and sorted(seen) == sorted((point_id(c), c) for c in chunk_ids)
    client.close()
