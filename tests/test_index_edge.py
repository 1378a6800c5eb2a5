"""The Qdrant Edge engine (rag.index.edge): what it adds to the index behaviours that tests/test_retrieval.py and
tests/test_index_fixes.py already run on it (their `client` fixture has an "edge" param): state that survives a
reopen, an atomic alias pointer, deterministic ids, one process per folder, kill -9, HNSW that agrees with the
exact scan, the serving replica and fingerprint working on an edge folder, and sparse vectors and fused
(RRF, DBSF) queries that score as qdrant-client's local mode does."""

import json
import math
import os
import subprocess
import sys
import zlib

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
    assert QdrantSettings().engine == "auto" == QdrantSettings.from_env().engine
    fresh = QdrantSettings(path=str(tmp_path / "fresh"))
    try:
        assert isinstance(get_client(fresh), EdgeClient)  # the default for a new folder
    finally:
        close_client(fresh)
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


def top3(client, alias: str, embedder) -> list[str]:  # noqa: F811
    index = Index(chunk_table(TEXTS).set_index("chunk_id"), None, client, alias, embedder)
    return [h.chunk["chunk_id"] for h in retrieve(index, "cats purring", "dense", RetrievalParams(k=3))]


def local_mode_folder(path, embedder):  # noqa: F811
    """A folder as the product wrote it before edge was the default: qdrant-client's local mode."""
    local = QdrantSettings(path=str(path), engine="local")
    try:
        run = sync_collection(get_client(local), chunk_table(TEXTS), embedder, strategy="t", model="wordllama")
        point_alias_to(get_client(local), "t__production", run.collection)
        hits = top3(get_client(local), run.alias, embedder)
    finally:
        close_client(local)
    return run, hits


def test_a_local_mode_folder_stays_on_local_mode_under_auto_and_edge_refuses_it(
    tmp_path, embedder, monkeypatch, caplog
):  # noqa: F811
    from qdrant_client import QdrantClient

    monkeypatch.delenv("RAG_QDRANT_ENGINE", raising=False)
    run, _ = local_mode_folder(tmp_path / "qdrant", embedder)
    auto = QdrantSettings(path=str(tmp_path / "qdrant"))
    try:
        client = get_client(auto)
        assert isinstance(client, QdrantClient) and alias_target(client, run.alias) == run.collection
        assert "stays on local mode" in caplog.text and "rag migrate-engine" in caplog.text
    finally:
        close_client(auto)
    with pytest.raises(ValueError, match="rag migrate-engine --path"):
        get_client(QdrantSettings(path=str(tmp_path / "qdrant"), engine="edge"))


def test_migrate_engine_rebuilds_a_local_mode_folder_as_edge_and_keeps_the_old_one(tmp_path, embedder, monkeypatch):  # noqa: F811
    from rag.index.migrate import migrate_to_edge
    from rag.index.qdrant import is_edge_folder, is_local_mode_folder

    monkeypatch.delenv("RAG_QDRANT_ENGINE", raising=False)
    folder = tmp_path / "qdrant"
    run, before = local_mode_folder(folder, embedder)
    done = migrate_to_edge(folder, log=lambda _: None)
    assert is_edge_folder(folder) and is_local_mode_folder(done.backup)  # the original kept, untouched
    assert done.points == {run.collection: len(TEXTS)} and done.aliases == {
        run.alias: run.collection,
        "t__production": run.collection,
    }
    auto = QdrantSettings(path=str(folder))
    try:
        client = get_client(auto)
        assert isinstance(client, EdgeClient) and alias_target(client, "t__production") == run.collection
        assert top3(client, run.alias, embedder) == before
    finally:
        close_client(auto)
    with pytest.raises(ValueError, match="already a Qdrant Edge folder"):
        migrate_to_edge(folder, log=lambda _: None)


def test_a_failed_migration_leaves_the_local_mode_folder_as_it_was(tmp_path, embedder, monkeypatch):  # noqa: F811
    from rag.index import migrate
    from rag.index.qdrant import is_local_mode_folder

    folder = tmp_path / "qdrant"
    run, before = local_mode_folder(folder, embedder)
    listing = sorted(p.name for p in tmp_path.iterdir())

    def broken(source, target, collection, batch=512, **_):
        raise OSError("disk full")

    monkeypatch.setattr(migrate, "copy_collection", broken)
    with pytest.raises(OSError, match="disk full"):
        migrate.migrate_to_edge(folder, log=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == listing and is_local_mode_folder(folder)  # no staging left
    local = QdrantSettings(path=str(folder), engine="local")
    try:
        assert top3(get_client(local), run.alias, embedder) == before
    finally:
        close_client(local)


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
    monkeypatch.setattr(
        edge_module.os,
        "fsync",
        lambda fd: calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd),
    )
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
import zlib
from rag.index.qdrant import QdrantLockedError, QdrantSettings, get_client
try:
    client = get_client(QdrantSettings(path=sys.argv[1], engine="edge"))
    print("opened", client.count(sys.argv[2]).count)
except QdrantLockedError as exc:
    print("locked:", exc)
"""


def open_in_child(path, collection: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", OPEN_IN_CHILD, str(path), collection],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
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
client.upsert("c", models.Batch(ids=list(range(1, 101)),
                               vectors={"dense": [[float(i), 1.0, 0.0] for i in range(1, 101)]},
                               payloads=[{"n": i} for i in range(1, 101)]))
client.update_collection_aliases(change_aliases_operations=[
    models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name="c", alias_name="live"))])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_writes_acknowledged_before_a_kill_9_are_there_on_reopen(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path / "q")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
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


KILLED_DELETE = """
import os, signal, sys
from qdrant_client.http import models
from rag.index import edge
client = edge.EdgeClient(sys.argv[1])
for name in ("keep", "gone"):
    client.create_collection(name, vectors_config={"dense": models.VectorParams(size=2, distance=models.Distance.DOT)})
    client.upsert(name, models.Batch(ids=list(range(1, 51)),
                                     vectors={"dense": [[float(i), 1.0] for i in range(1, 51)]}))
client.update_collection_aliases(change_aliases_operations=[
    models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name="keep", alias_name="live"))])
edge.shutil.rmtree = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # dies between the rename and the removal
client.delete_collection("gone")
"""


def test_deleted_folders_left_by_a_crash_are_reclaimed_on_the_next_open(tmp_path):
    root = tmp_path / "q"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_DELETE, str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == -9, proc.stderr
    left = list((root / "collection").glob(".deleted-gone-*"))
    assert len(left) == 1 and (left[0] / "shard").is_dir()  # the crash left the renamed collection behind
    partial = root / "collection" / ".partial-keep-0123"  # a replica copy killed midway leaves one of these
    (partial / "shard").mkdir(parents=True)

    client = EdgeClient(root)
    assert not left[0].exists() and not partial.exists()
    assert sorted(p.name for p in (root / "collection").iterdir()) == ["keep"]  # live data untouched
    assert alias_target(client, "live") == "keep" and client.count("live").count == 50
    # While a process holds the folder, its own removal in progress is not another opener's to take.
    doomed = root / "collection" / ".deleted-keep-in-progress"
    doomed.mkdir()
    with pytest.raises(QdrantLockedError):
        EdgeClient(root)
    assert doomed.exists()
    client.close()


def clustered(rng, n: int, dim: int, centers: np.ndarray) -> np.ndarray:
    return (centers[rng.integers(0, len(centers), n)] + 0.3 * rng.normal(size=(n, dim))).astype(np.float32)


def test_hnsw_agrees_with_the_exact_scan(tmp_path):
    # Tiny thresholds, so that 2,000 points get an HNSW graph and queries really walk it.
    client = EdgeClient(
        tmp_path / "q", EdgeOptions(indexing_threshold_kb=10, full_scan_threshold_kb=1, max_indexing_threads=1)
    )
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
                return {
                    p.id
                    for p in client.query_points(name, q.tolist(), using="dense", limit=10, search_params=params).points
                }

            overlap.append(len(top(models.SearchParams(hnsw_ef=hnsw_ef)) & top(models.SearchParams(exact=True))) / 10)
        return float(np.mean(overlap))

    assert recall("clustered", None) >= 0.95
    # The graph is what answers: starved of candidates it loses neighbours the exact scan finds.
    assert recall("noise", 1) < 0.9
    client.close()


def test_unsupported_features_say_what_to_do(tmp_path):
    client = EdgeClient(tmp_path / "q")
    with pytest.raises(EdgeUnsupportedError, match="datatype"):
        client.create_collection(
            "s",
            vectors_config={"dense": models.VectorParams(size=2, distance=models.Distance.COSINE)},
            sparse_vectors_config={
                "bm25": models.SparseVectorParams(index=models.SparseIndexParams(datatype=models.Datatype.FLOAT16))
            },
        )
    with pytest.raises(EdgeUnsupportedError, match="shard_number"):  # a server's: int8 quantization is mapped
        client.create_collection(
            "h", vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE), shard_number=2
        )
    with pytest.raises(EdgeUnsupportedError, match="ProductQuantization"):
        client.create_collection(
            "p",
            vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE),
            quantization_config=models.ProductQuantization(
                product=models.ProductQuantizationConfig(compression=models.CompressionRatio.X16)
            ),
        )
    vector_collection(client, "c", 2)
    with pytest.raises(EdgeUnsupportedError, match="geo"):
        client.count(
            "c",
            count_filter=models.Filter(
                must=[
                    models.FieldCondition(
                        key="where", geo_radius=models.GeoRadius(center=models.GeoPoint(lon=0, lat=0), radius=1.0)
                    )
                ]
            ),
        )
    dense = models.Prefetch(query=[1.0, 0.0], using="dense", limit=5)
    for kwargs, says in [
        (
            {"query": models.RecommendQuery(recommend=models.RecommendInput(positive=[1]))},
            "RecommendQuery.*engine local",
        ),
        ({"query": models.NearestQuery(nearest=[1.0, 0.0], mmr=models.Mmr())}, "mmr"),
        ({"query": models.FusionQuery(fusion=models.Fusion.RRF)}, "without prefetches"),
        ({"query": [1.0, 0.0], "prefetch": [dense]}, "over prefetches"),  # re-scoring prefetches is not mapped
        (
            {
                "query": models.FusionQuery(fusion=models.Fusion.RRF),
                "prefetch": [models.Prefetch(prefetch=[dense], query=models.FusionQuery(fusion=models.Fusion.RRF))],
            },
            "nested",
        ),
        ({"query": models.SparseVector(indices=[1], values=[1.0])}, "needs `using`"),
    ]:
        with pytest.raises(EdgeUnsupportedError, match=says):
            client.query_points("c", using=kwargs.pop("using", None), **kwargs)
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
        changed = sync_collection(
            client, chunk_table(dict(TEXTS, cats="Cats nap all day.")), embedder, strategy="t", model="wordllama"
        )
        assert (changed.updated, changed.rebuilt) == (1, False)
        assert source_fingerprint(tmp_path, "t", settings) != first  # the in-place write is visible to serving
        assert alias_target(client, CollectionName("t", "wordllama").alias) == changed.collection
    finally:
        close_client(settings)


@pytest.mark.parametrize("target_engine", ["edge", "local"])
def test_serving_fingerprint_does_not_change_when_a_replica_is_taken(tmp_path, embedder, target_engine):  # noqa: F811
    from rag.serving.index import replicate_collection, source_fingerprint

    settings = edge_settings(tmp_path / "qdrant")
    sync_collection(get_client(settings), chunk_table(TEXTS), embedder, strategy="t", model="wordllama")
    close_client(settings)
    before = source_fingerprint(tmp_path, "t", settings)
    target = QdrantSettings(path=str(tmp_path / "replica"), engine=target_engine)
    try:
        # Point by point (local target) loads the primary's shard, and Edge rewrites its config on every load.
        replicate_collection(settings, target, CollectionName("t", "wordllama").alias)
    finally:
        close_client(target)
    assert source_fingerprint(tmp_path, "t", settings) == before  # else a server would re-replicate every tick


def test_scroll_pages_through_every_point_by_string_offsets(tmp_path):
    # Edge hands UUID ids and offsets back as uuid.UUID; callers get (and pass back) strings, as from qdrant-client.
    client = EdgeClient(tmp_path / "q")
    vector_collection(client, "c", 2)
    chunk_ids = [f"chunk-{i}" for i in range(50)]
    client.upsert(
        "c",
        models.Batch(
            ids=[point_id(c) for c in chunk_ids],
            vectors={"dense": [[1.0, i] for i in range(50)]},
            payloads=[{"chunk_id": c} for c in chunk_ids],
        ),
    )
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


# --- sparse vectors and fusion, against qdrant-client's local mode ----------------------------------------------

DENSE_DIM = 16
IDF = models.SparseVectorParams(modifier=models.Modifier.IDF)
WORDS = [f"w{i}" for i in range(120)]


def hashed_bag(words: list[str], weight: float) -> models.SparseVector:
    """A hashed bag of words; `weight` is a per-document factor (a stand-in for BM25's length normalisation) that
    keeps scores of different documents apart, so a ranking has no ties to order."""
    counts: dict[int, int] = {}
    for word in words:
        index = zlib.crc32(word.encode()) % (1 << 20)
        counts[index] = counts.get(index, 0) + 1
    indices = sorted(counts)
    return models.SparseVector(indices=indices, values=[counts[i] * weight for i in indices])


def hybrid_corpus(n: int = 300, seed: int = 5) -> list[models.PointStruct]:
    rng = np.random.default_rng(seed)
    zipf = 1 / np.arange(1, len(WORDS) + 1)
    points = []
    for i in range(n):
        words = list(rng.choice(WORDS, size=int(rng.integers(4, 25)), p=zipf / zipf.sum()))
        points.append(
            models.PointStruct(
                id=i + 1,
                payload={"group": i % 3},
                vector={
                    "dense": rng.normal(size=DENSE_DIM).tolist(),
                    "bm25": hashed_bag(words, float(rng.uniform(0.5, 1.5))),
                },
            )
        )
    return points


def hybrid_collection(client, name: str = "h", points: list[models.PointStruct] | None = None) -> None:
    client.create_collection(
        name,
        vectors_config={"dense": models.VectorParams(size=DENSE_DIM, distance=models.Distance.COSINE)},
        sparse_vectors_config={"bm25": IDF},
    )
    client.upsert(name, hybrid_corpus() if points is None else points)


@pytest.fixture
def engines(tmp_path):
    """The same hybrid collection on qdrant-client's local mode and on the edge engine."""
    from qdrant_client import QdrantClient

    local, edge = QdrantClient(location=":memory:"), EdgeClient(tmp_path / "q")
    for client in (local, edge):
        hybrid_collection(client)
    yield local, edge
    edge.close()
    local.close()


def sparse_query(rng, terms: int = 3) -> models.SparseVector:
    return hashed_bag(list(rng.choice(WORDS[:60], size=terms, replace=False)), 1.0)


def scored(response) -> list[tuple[int, float]]:
    return [(p.id, p.score) for p in response.points]


def test_sparse_queries_rank_as_local_mode_with_idf(engines):
    local, edge = engines
    rng = np.random.default_rng(11)
    for _ in range(20):
        query = sparse_query(rng)
        want = scored(local.query_points("h", query=query, using="bm25", limit=10))
        got = scored(edge.query_points("h", query=query, using="bm25", limit=10))
        assert len(want) == 10 and [i for i, _ in got] == [i for i, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-5)  # Edge scores in float32


def test_idf_over_a_corpus_filter_ranks_as_local_mode(engines):
    local, edge = engines
    group = models.Filter(must=[models.FieldCondition(key="group", match=models.MatchValue(value=2))])
    scoped = models.SearchParams(idf=models.IdfCorpusParams(corpus=group))
    rng = np.random.default_rng(17)
    changed = 0
    for _ in range(10):
        query = sparse_query(rng, terms=4)
        want = scored(local.query_points("h", query=query, using="bm25", search_params=scoped, limit=10))
        got = scored(edge.query_points("h", query=query, using="bm25", search_params=scoped, limit=10))
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-5)
        changed += got != scored(edge.query_points("h", query=query, using="bm25", limit=10))
    assert changed  # the corpus filter reached Edge: statistics over a third of the points score differently


def test_idf_modifier_weighs_rare_terms_up(tmp_path):
    # The modifier reaches Edge, not just config.json: with it the rare term's document comes first, without it a
    # document repeating the common term does.
    client = EdgeClient(tmp_path / "q")
    for name, modifier in (("idf", models.Modifier.IDF), ("plain", None)):
        client.create_collection(
            name, vectors_config={}, sparse_vectors_config={"bm25": models.SparseVectorParams(modifier=modifier)}
        )
        common = [
            models.PointStruct(id=i, vector={"bm25": models.SparseVector(indices=[1], values=[3.0])})
            for i in range(1, 20)
        ]
        client.upsert(
            name, common + [models.PointStruct(id=20, vector={"bm25": models.SparseVector(indices=[2], values=[1.0])})]
        )
    query = models.SparseVector(indices=[1, 2], values=[1.0, 1.0])
    assert client.query_points("idf", query=query, using="bm25", limit=1).points[0].id == 20
    assert client.query_points("plain", query=query, using="bm25", limit=1).points[0].id != 20
    client.close()


def fused(
    client,
    dense: list[float],
    sparse: models.SparseVector,
    fusion,
    limit: int,
    prefetch_limit: int = 20,
    query_filter: models.Filter | None = None,
    exact: bool = False,
) -> list[tuple[int, float]]:
    params = models.SearchParams(exact=True) if exact else None
    return scored(
        client.query_points(
            "h",
            prefetch=[
                models.Prefetch(query=dense, using="dense", limit=prefetch_limit, params=params),
                models.Prefetch(query=sparse, using="bm25", limit=prefetch_limit),
            ],
            query=fusion,
            query_filter=query_filter,
            limit=limit,
            with_payload=True,
        )
    )


def assert_same_fusion(
    edge_hits: list[tuple[int, float]], local_hits: list[tuple[int, float]], local_all: list[tuple[int, float]]
) -> None:
    """The same fused scores rank by rank, and each id edge returns has that score in local mode's whole fused
    list: the same top-k up to the order of tied points (see rag.index.edge's docstring)."""
    assert [s for _, s in edge_hits] == pytest.approx([s for _, s in local_hits], rel=1e-5)
    everything = dict(local_all)
    assert all(everything[i] == pytest.approx(s, rel=1e-5) for i, s in edge_hits)
    assert len({i for i, _ in edge_hits}) == len(edge_hits)


@pytest.mark.parametrize(
    "fusion",
    [
        models.FusionQuery(fusion=models.Fusion.RRF),
        models.FusionQuery(fusion=models.Fusion.DBSF),
        models.RrfQuery(rrf=models.Rrf(k=60, weights=[1.0, 3.0])),
    ],
    ids=["rrf", "dbsf", "rrf-k60-weighted"],
)
def test_fused_queries_rank_as_local_mode(engines, fusion):
    local, edge = engines
    rng = np.random.default_rng(12)
    ties = 0
    for _ in range(15):
        dense, sparse = rng.normal(size=DENSE_DIM).tolist(), sparse_query(rng)
        local_all = fused(local, dense, sparse, fusion, limit=40)
        assert dict(fused(edge, dense, sparse, fusion, limit=40)) == pytest.approx(dict(local_all), rel=1e-5)
        got, want = fused(edge, dense, sparse, fusion, limit=10), fused(local, dense, sparse, fusion, limit=10)
        assert_same_fusion(got, want, local_all)
        ties += [i for i, _ in got] != [i for i, _ in want]
    if isinstance(fusion, models.FusionQuery) and fusion.fusion == models.Fusion.DBSF:
        assert ties == 0  # DBSF scores are continuous: no ties, so the very same order


def test_fusion_over_an_hnsw_index_with_exact_prefetch(tmp_path):
    # Past the indexing threshold the dense prefetch walks HNSW; exact=True in the prefetch makes it the scan
    # local mode does, so fused results agree after optimize too (the sparse index is exact either way).
    from qdrant_client import QdrantClient

    local = QdrantClient(location=":memory:")
    edge = EdgeClient(
        tmp_path / "q", EdgeOptions(indexing_threshold_kb=1, full_scan_threshold_kb=1, max_indexing_threads=1)
    )
    for client in (local, edge):
        hybrid_collection(client)
    edge.optimize("h")
    assert edge.get_collection("h").indexed_vectors_count > 0
    rng = np.random.default_rng(13)
    rrf = models.FusionQuery(fusion=models.Fusion.RRF)
    for _ in range(10):
        dense, sparse = rng.normal(size=DENSE_DIM).tolist(), sparse_query(rng)
        local_all = fused(local, dense, sparse, rrf, limit=40, exact=True)
        assert dict(fused(edge, dense, sparse, rrf, limit=40, exact=True)) == pytest.approx(dict(local_all), rel=1e-5)
        assert_same_fusion(
            fused(edge, dense, sparse, rrf, limit=10, exact=True),
            fused(local, dense, sparse, rrf, limit=10, exact=True),
            local_all,
        )
    edge.close()
    local.close()


def test_a_filter_applies_to_fused_results_and_inside_each_prefetch(engines):
    local, edge = engines
    rng = np.random.default_rng(14)
    group = models.Filter(must=[models.FieldCondition(key="group", match=models.MatchValue(value=1))])
    rrf = models.FusionQuery(fusion=models.Fusion.RRF)
    for _ in range(10):
        dense, sparse = rng.normal(size=DENSE_DIM).tolist(), sparse_query(rng, terms=6)
        hits = edge.query_points(
            "h",
            prefetch=[
                models.Prefetch(query=dense, using="dense", limit=20),
                models.Prefetch(query=sparse, using="bm25", limit=20),
            ],
            query=rrf,
            query_filter=group,
            limit=40,
            with_payload=True,
        ).points
        assert hits and all(p.payload["group"] == 1 for p in hits)
        # Filtered after fusion, 40 candidates would leave about a third; filtered inside, the dense prefetch
        # alone brings 20 points of group 1.
        assert len(hits) >= 20
        local_all = fused(local, dense, sparse, rrf, limit=40, query_filter=group)
        assert {p.id: p.score for p in hits} == pytest.approx(dict(local_all), rel=1e-5)
        assert_same_fusion(
            fused(edge, dense, sparse, rrf, limit=5, query_filter=group),
            fused(local, dense, sparse, rrf, limit=5, query_filter=group),
            local_all,
        )


def test_sparse_vectors_and_config_survive_a_reopen(tmp_path):
    points = hybrid_corpus(n=50)
    client = EdgeClient(tmp_path / "q")
    hybrid_collection(client, points=points)
    query = sparse_query(np.random.default_rng(15), terms=5)
    before = scored(client.query_points("h", query=query, using="bm25", limit=10))
    client.close()
    client = EdgeClient(tmp_path / "q")
    params = client.get_collection("h").config.params
    assert params.sparse_vectors == {"bm25": IDF}
    assert params.vectors["dense"].size == DENSE_DIM
    assert scored(client.query_points("h", query=query, using="bm25", limit=10)) == before
    (record,) = client.retrieve("h", [7], with_vectors=True)
    assert isinstance(record.vector["bm25"], models.SparseVector)
    assert record.vector["bm25"].indices == points[6].vector["bm25"].indices
    assert record.vector["bm25"].values == pytest.approx(points[6].vector["bm25"].values, rel=1e-6)
    scrolled, _ = client.scroll("h", limit=100, with_vectors=["bm25"])
    assert len(scrolled) == 50 and all(set(r.vector) == {"bm25"} for r in scrolled)
    assert {r.id: r.vector["bm25"].indices for r in scrolled} == {p.id: p.vector["bm25"].indices for p in points}
    client.close()


def test_idf_keeps_counting_deleted_points_until_a_vacuum(tmp_path):
    # The documented difference (rag.index.edge docstring): local mode's IDF forgets a deleted point at once,
    # Edge's (as a server's) only once optimize vacuums the segment.
    from qdrant_client import QdrantClient

    def term(i: int, t: int) -> models.PointStruct:
        return models.PointStruct(id=i, vector={"bm25": models.SparseVector(indices=[t], values=[1.0])})

    def top_score(client) -> float:
        return (
            client.query_points("s", query=models.SparseVector(indices=[1], values=[1.0]), using="bm25", limit=1)
            .points[0]
            .score
        )

    n = 2000  # past the vacuum's minimum segment size
    local, edge = QdrantClient(location=":memory:"), EdgeClient(tmp_path / "q")
    for client in (local, edge):
        client.create_collection("s", vectors_config={}, sparse_vectors_config={"bm25": IDF})
        client.upsert("s", [term(i, 1 if i % 2 else 2) for i in range(1, n + 1)])
    assert top_score(edge) == pytest.approx(top_score(local), rel=1e-5)
    doomed = [i for i in range(3, n + 1, 2)]  # every term-1 point but id 1
    for client in (local, edge):
        client.delete("s", models.PointIdsList(points=doomed))

    def idf(points: int, df: int) -> float:  # Qdrant's IDF, which both engines use
        return math.log((points - df + 0.5) / (df + 0.5) + 1)

    live = n - len(doomed)
    assert top_score(local) == pytest.approx(idf(live, 1), rel=1e-5)  # term 1 is in one of the live points
    assert top_score(edge) == pytest.approx(idf(n, n // 2), rel=1e-5)  # the statistics from before the delete
    assert edge.optimize("s")
    assert top_score(edge) == pytest.approx(idf(live, 1), rel=1e-5)
    edge.close()
    local.close()


@pytest.mark.parametrize("source_engine,target_engine", [("edge", "edge"), ("edge", "local"), ("local", "edge")])
def test_serving_replica_copies_sparse_vectors(tmp_path, source_engine, target_engine):
    from rag.serving.index import replicate_collection

    source = QdrantSettings(path=str(tmp_path / "primary"), engine=source_engine)
    target = QdrantSettings(path=str(tmp_path / "replica"), engine=target_engine)
    hybrid_collection(get_client(source), "h_v1", points=hybrid_corpus(n=60))
    point_alias_to(get_client(source), "h", "h_v1")
    query = sparse_query(np.random.default_rng(16), terms=5)
    want = scored(get_client(source).query_points("h", query=query, using="bm25", limit=10))
    try:
        assert replicate_collection(source, target, "h") == "h_v1"
        replica = get_client(target)
        assert replica.get_collection("h").config.params.sparse_vectors["bm25"].modifier == models.Modifier.IDF
        got = scored(replica.query_points("h", query=query, using="bm25", limit=10))
        assert [i for i, _ in got] == [i for i, _ in want]
    finally:
        close_client(target)
        close_client(source)


def test_graph_build_parameters_reach_the_engine_and_outlive_a_reopen(tmp_path, monkeypatch):
    from rag.index.qdrant import HnswBuild, copy_collection, create_collection

    rng = np.random.default_rng(5)
    dim = 32
    vectors, queries = rng.normal(size=(2000, dim)).astype(np.float32), rng.normal(size=(40, dim)).astype(np.float32)
    options = EdgeOptions(indexing_threshold_kb=10, full_scan_threshold_kb=1, max_indexing_threads=1)
    client = EdgeClient(tmp_path / "q", options)
    monkeypatch.setenv("RAG_HNSW_M", "4")
    monkeypatch.setenv("RAG_HNSW_EF_CONSTRUCT", "8")
    create_collection(client, "thin", dim, "cosine", bm25=False)  # from the environment, as the sync path builds
    create_collection(client, "dense", dim, "cosine", bm25=False, graph=HnswBuild(m=32, ef_construct=200))
    for name in ("thin", "dense"):
        client.upsert(name, models.Batch(ids=list(range(1, len(vectors) + 1)), vectors={"dense": vectors.tolist()}))
        client.optimize(name)

    def recall(c, name: str) -> float:
        def top(params):
            return [
                {p.id for p in c.query_points(name, q.tolist(), using="dense", limit=10, search_params=params).points}
                for q in queries
            ]

        return float(
            np.mean(
                [
                    len(a & b) / 10
                    for a, b in zip(top(models.SearchParams(hnsw_ef=10)), top(models.SearchParams(exact=True)))
                ]
            )
        )

    thin, dense = recall(client, "thin"), recall(client, "dense")
    assert dense >= thin + 0.1, (thin, dense)  # the graph really was built with the parameters given
    client.close()

    client = EdgeClient(tmp_path / "q", options)  # every load passes the kept parameters to Edge again
    assert client.get_collection("thin").config.hnsw_config == models.HnswConfigDiff(m=4, ef_construct=8)
    assert recall(client, "thin") == thin and recall(client, "dense") == dense
    client.create_collection(
        "more", vectors_config={"dense": models.VectorParams(size=dim, distance=models.Distance.COSINE)}
    )
    assert client.get_collection("more").config.hnsw_config is None  # none given: Edge's defaults, nothing kept
    replica = EdgeClient(tmp_path / "r", options)
    copy_collection(client, replica, "dense")  # the point-by-point copy builds the same graph
    assert replica.get_collection("dense").config.hnsw_config == models.HnswConfigDiff(m=32, ef_construct=200)
    monkeypatch.setenv("RAG_HNSW_M", "many")
    with pytest.raises(ValueError, match="RAG_HNSW_M='many': give a whole number"):
        HnswBuild.from_env()
    with pytest.raises(EdgeUnsupportedError, match="full_scan_threshold"):
        client.create_collection(
            "h",
            vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE),
            hnsw_config=models.HnswConfigDiff(m=8, full_scan_threshold=5),
        )
    replica.close()
    client.close()
