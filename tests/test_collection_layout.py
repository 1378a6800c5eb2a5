"""Collection layout from config (rag.index.layout): placement on disk, int8 quantization, shards and replicas. The
embedded engine (Qdrant Edge) is built with what it supports and keeps it through a reopen and a replica's copy; a
server's options are checked as the request qdrant-client would send; nothing set leaves every collection as before."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from qdrant_client import models

from rag.index.bm25_sparse import SPARSE, PassageTerms, query_vector
from rag.index.edge import EdgeClient
from rag.index.layout import CollectionLayout
from rag.index.qdrant import DENSE, QdrantSettings, close_client, copy_collection, create_collection, get_client
from rag.index.sync import point_batch
from tests.test_retrieval import TEXTS, chunk_table

CONFIGS = Path(__file__).resolve().parent.parent / "config" / "qdrant"
LARGE = CollectionLayout(
    vectors_on_disk=True,
    payload_on_disk=True,
    sparse_on_disk=True,
    hnsw_on_disk=True,
    payload_indexes_on_disk=True,
    quantization="int8",
    quantile=0.99,
    quantization_always_ram=True,
)


def test_a_layout_comes_from_a_yaml_file_and_each_variable_overrides_it(tmp_path, monkeypatch):
    assert CollectionLayout.from_env() == CollectionLayout()  # nothing set: every engine's own defaults
    path = tmp_path / "layout.yaml"
    path.write_text("vectors_on_disk: true\nquantization: int8\nshards: 3\n")
    monkeypatch.setenv("RAG_QDRANT_LAYOUT", str(path))
    monkeypatch.setenv("RAG_QDRANT_SHARDS", "6")
    monkeypatch.setenv("RAG_QDRANT_QUANTIZATION_ALWAYS_RAM", "1")
    assert CollectionLayout.from_env() == CollectionLayout(
        vectors_on_disk=True, quantization="int8", shards=6, quantization_always_ram=True
    )
    monkeypatch.setenv("RAG_QDRANT_VECTORS_ON_DISK", "maybe")
    with pytest.raises(ValueError, match="RAG_QDRANT_VECTORS_ON_DISK='maybe': give 1 or 0"):
        CollectionLayout.from_env()
    monkeypatch.delenv("RAG_QDRANT_VECTORS_ON_DISK")
    monkeypatch.setenv("RAG_QDRANT_QUANTIZATION", "int4")
    with pytest.raises(ValueError, match="quantization"):
        CollectionLayout.from_env()
    monkeypatch.setenv("RAG_QDRANT_LAYOUT", str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="no such file"):
        CollectionLayout.from_env()
    sizes = {p.stem: CollectionLayout.from_file(p) for p in sorted(CONFIGS.glob("*.yaml"))}
    assert set(sizes) == {"1m", "10m", "100m"}
    assert all(s.vectors_on_disk and s.payload_on_disk and s.sparse_on_disk for s in sizes.values())
    assert all(s.payload_indexes_on_disk for s in sizes.values())
    assert [sizes[size].quantization for size in ("1m", "10m", "100m")] == ["none", "int8", "int8"]


def write_points(client, collection: str, dim: int = 8) -> None:
    chunks = chunk_table(TEXTS)
    rows = chunks.to_dict("records")
    terms = PassageTerms.of([r["text"] for r in rows])
    vectors = np.random.default_rng(0).standard_normal((len(rows), dim)).astype(np.float32)
    client.upsert(collection, point_batch(rows, vectors, terms, float(terms.lengths.mean())))


def searches(client, collection: str) -> list[list[str]]:
    dense = client.query_points(collection, query=[0.1] * 8, using=DENSE, limit=3, with_payload=["chunk_id"])
    sparse = client.query_points(collection, query=query_vector("rockets orbit"), using=SPARSE, limit=3)
    in_one_document = client.query_points(
        collection,
        query=[0.1] * 8,
        using=DENSE,
        limit=3,
        with_payload=["doc_id"],
        query_filter=models.Filter(
            must=[models.FieldCondition(key="doc_id", match=models.MatchValue(value="doc-bread"))]
        ),
    )
    assert {p.payload["doc_id"] for p in in_one_document.points} == {"doc-bread"}
    return [
        [p.payload["chunk_id"] for p in dense.points],
        [str(p.id) for p in sparse.points],
        [str(p.id) for p in in_one_document.points],
    ]


def indexes_on_disk(client, collection: str) -> dict[str, bool]:
    return {
        field: bool(info.params and info.params.on_disk)
        for field, info in client.get_collection(collection).payload_schema.items()
    }


def test_an_edge_collection_is_built_with_the_layout_and_keeps_it_through_a_reopen_and_a_copy(tmp_path):
    settings = QdrantSettings(path=str(tmp_path / "edge"), engine="edge")
    client = get_client(settings)
    name = "t__x__v1__cosine"
    create_collection(client, name, 8, "cosine", layout=LARGE)
    shard_config = json.loads((tmp_path / "edge" / "collection" / name / "shard" / "edge_config.json").read_text())
    assert shard_config["vectors"][DENSE]["on_disk"] and shard_config["on_disk_payload"]  # what the engine got
    assert shard_config["sparse_vectors"][SPARSE]["on_disk"] and shard_config["hnsw_config"]["on_disk"]
    assert shard_config["quantization_config"] == {"scalar": {"type": "int8", "quantile": 0.99, "always_ram": True}}
    write_points(client, name)
    client.optimize(name)
    before = searches(client, name)
    assert before[0] and before[1]

    close_client(settings)  # a new process opens the folder: the shard is loaded with the same layout
    client = get_client(settings)
    assert searches(client, name) == before
    config = client.get_collection(name).config
    assert config.params.vectors[DENSE].on_disk and config.params.on_disk_payload
    assert config.params.sparse_vectors[SPARSE].index.on_disk and config.hnsw_config.on_disk
    assert config.quantization_config == LARGE.quantization_config()
    on_disk = {"doc_id": True, "page_start": True, "page_end": True}
    assert indexes_on_disk(client, name) == on_disk

    replica = EdgeClient(tmp_path / "replica")  # a replica copied point by point builds the same layout
    try:
        assert copy_collection(client, replica, name) == len(TEXTS)
        copied = replica.get_collection(name).config
        assert (copied.params, copied.quantization_config) == (config.params, config.quantization_config)
        assert indexes_on_disk(replica, name) == on_disk
        assert searches(replica, name) == before
    finally:
        replica.close()
        close_client(settings)


def test_nothing_set_builds_collections_as_before(tmp_path):
    client = EdgeClient(tmp_path / "edge")
    try:
        create_collection(client, "t__x__v1__cosine", 8, "cosine", layout=CollectionLayout())
        config = json.loads((tmp_path / "edge" / "collection" / "t__x__v1__cosine" / "config.json").read_text())
        assert config == {
            "vectors": {DENSE: {"size": 8, "distance": "Cosine"}},
            "sparse_vectors": {SPARSE: {"modifier": "idf"}},
        }
    finally:
        client.close()


class Recording:
    """Stands in for a QdrantClient of a server: records what create_collection would send."""

    def __init__(self):
        self.created: dict = {}
        self.indexes: dict = {}

    def create_collection(self, collection_name, **kwargs):
        self.created = {"collection_name": collection_name, **kwargs}

    def create_payload_index(self, collection_name, field_name, field_schema):
        self.indexes[field_name] = field_schema


def test_a_server_collection_is_requested_with_shards_replicas_placement_and_quantization():
    client = Recording()
    layout = LARGE.model_copy(update={"shards": 6, "replication_factor": 2, "write_consistency_factor": 2})
    create_collection(client, "t__x__v1__cosine", 384, "cosine", layout=layout)
    sent = client.created
    assert (sent["shard_number"], sent["replication_factor"], sent["write_consistency_factor"]) == (6, 2, 2)
    assert sent["vectors_config"][DENSE] == models.VectorParams(size=384, distance=models.Distance.COSINE, on_disk=True)
    assert sent["on_disk_payload"] is True
    assert sent["sparse_vectors_config"][SPARSE].index == models.SparseIndexParams(on_disk=True)
    assert sent["hnsw_config"].on_disk is True
    assert all(schema.on_disk for schema in client.indexes.values()) and set(client.indexes) == {
        "doc_id",
        "page_start",
        "page_end",
    }
    assert sent["quantization_config"] == models.ScalarQuantization(
        scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.99, always_ram=True)
    )

    create_collection(client, "t__x__v1__cosine", 384, "cosine", layout=CollectionLayout())
    assert set(client.created) == {"collection_name", "vectors_config", "sparse_vectors_config", "hnsw_config"}
    assert client.created["hnsw_config"] is None and client.created["vectors_config"][DENSE].on_disk is None


def test_an_embedded_engine_leaves_the_server_options_out_and_says_so(tmp_path, caplog):
    client = EdgeClient(tmp_path / "edge")
    try:
        with caplog.at_level(logging.WARNING, logger="rag.index.layout"):
            create_collection(client, "t__x__v1__cosine", 8, "cosine", layout=CollectionLayout(shards=3))
        assert "RAG_QDRANT_SHARDS apply to a Qdrant server only" in caplog.text
        assert client.collection_exists("t__x__v1__cosine")
    finally:
        client.close()
    local = QdrantSettings(path=str(tmp_path / "local"), engine="local")  # local mode takes the layout and ignores it
    try:
        create_collection(get_client(local), "t__x__v1__cosine", 8, "cosine", layout=LARGE)
        write_points(get_client(local), "t__x__v1__cosine")
        assert searches(get_client(local), "t__x__v1__cosine")[0]
    finally:
        close_client(local)
