"""Model registry: MLflow versions with their folders and manifests, aliases, resolution by name; the reranker registry
(MLflow itself, crash safety and migration: tests/test_mlflow_registry.py)."""

import json
import threading

import numpy as np
import pytest

from rag.qa.pipeline import load_reranker_spec
from rag.registry import ModelRegistry, RegistryError, is_registry_name, registered_embedder
from rag.rerank import load_reranker, rerank
from rag.retrieval import Hit


def _model_dir(tmp_path, name="saved", payload=b"weights"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(payload)
    (folder / "config.json").write_text("{}")
    return folder


MANIFEST = {
    "base_model": "minilm",
    "training_data_hash": "abc123",
    "hyperparameters": {"learning_rate": 5e-5, "epochs": 1},
    "seed": 7,
    "library_versions": {"torch": "x"},
    "metrics": {"dev": {"mrr@5": 0.5}},
    "strategy": "paragraph",
}


def test_register_round_trips_the_manifest_and_numbers_versions(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("embedder", _model_dir(tmp_path), MANIFEST)
    v2 = registry.register(
        "embedder",
        _model_dir(tmp_path, "second", b"other"),
        {**MANIFEST, "base_model": v1.name, "parent_version": "v1"},
    )
    assert (v1.version, v1.name, v2.version, v2.name) == (
        "v1",
        "ft-minilm-v1",
        "v2",
        "ft-minilm-v2",
    )  # family follows the lineage
    reread = ModelRegistry(tmp_path / "models").resolve("embedder", "v2")
    assert reread.model_dump() == v2.model_dump()
    on_disk = json.loads((v2.path / "manifest.json").read_text())
    assert (
        on_disk["parent_version"] == "v1"
        and on_disk["hyperparameters"] == MANIFEST["hyperparameters"]
        and on_disk["seed"] == 7
    )
    assert on_disk["strategy"] == "paragraph" and on_disk["created_at"] and "path" not in on_disk
    assert (v1.path / "model.safetensors").read_bytes() == b"weights"  # old versions kept untouched
    assert [m.version for m in registry.versions("embedder")] == ["v1", "v2"] and registry.versions("reranker") == []
    r1 = registry.register("reranker", _model_dir(tmp_path, "ce"), MANIFEST)
    assert (r1.version, r1.name) == ("v1", "ce-minilm-v1")


def test_aliases_move_atomically_and_resolve_by_alias_version_or_name(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    assert registry.resolve("embedder", "production") is None
    v1 = registry.register("embedder", _model_dir(tmp_path), MANIFEST)
    v2 = registry.register("embedder", _model_dir(tmp_path, "b"), MANIFEST)
    registry.set_alias("embedder", "production", "v1")
    registry.set_alias("embedder", "candidate", "v2")
    assert registry.resolve("embedder", "production").version == "v1"
    assert registry.resolve("embedder", "ft-minilm-v2").path == v2.path
    assert registry.resolve("embedder", "ce-minilm-v2") is None  # a reranker name is not an embedder
    assert registry.resolve("reranker", "production") is None
    with pytest.raises(RegistryError, match="not registered"):
        registry.set_alias("embedder", "production", "v9")
    with pytest.raises(RegistryError, match="unknown alias"):
        registry.set_alias("embedder", "staging", "v1")
    assert registry.aliases()["embedder"] == {"production": "v1", "candidate": "v2"}  # failed calls changed nothing

    # Readers never see a torn alias table while writers flip production back and forth (each flip is one MLflow
    # transaction of tens of milliseconds beside the busy reader: 20 of them).
    seen, stop = set(), threading.Event()

    def reader():
        while not stop.is_set():
            seen.add(registry.resolve("embedder", "production").version)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(20):
        registry.set_alias("embedder", "production", "v2" if i % 2 == 0 else "v1")
    stop.set()
    thread.join()
    assert seen <= {"v1", "v2"}
    registry.set_alias("embedder", "candidate", None)
    assert registry.resolve("embedder", "candidate") is None and v1.path.exists()


def test_a_folder_mlflow_does_not_know_is_no_version_and_metrics_merge(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("embedder", _model_dir(tmp_path), MANIFEST)
    # A folder without an MLflow version (a number a repair took back, whose folder removal was cut short) is not a
    # version: the next registration takes the next number MLflow gives and its folder.
    stray = tmp_path / "models" / "embedder" / "v2"
    stray.mkdir()
    (stray / "leftover.bin").write_bytes(b"half")
    assert [m.version for m in registry.versions("embedder")] == ["v1"] and registry.resolve("embedder", "v2") is None
    v2 = registry.register("embedder", _model_dir(tmp_path, "second"), MANIFEST)
    assert (v1.version, v2.version) == ("v1", "v2") and sorted(p.name for p in v2.path.iterdir()) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
    ]
    registry.update_metrics("embedder", "v2", {"gate": {"passed": False}})
    assert registry.resolve("embedder", "v2").metrics == {"dev": {"mrr@5": 0.5}, "gate": {"passed": False}}
    with pytest.raises(RegistryError, match="not a directory"):
        registry.register("embedder", tmp_path / "missing", MANIFEST)
    with pytest.raises(RegistryError, match="unknown model kind"):
        registry.versions("llm")


def test_registered_embedder_names(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    assert registered_embedder("minilm", registry) is None and not is_registry_name("my-model")
    assert registered_embedder("production", registry) == ("minilm", None)  # nothing promoted: the base is v0
    with pytest.raises(RegistryError, match="no embedder 'candidate'"):
        registered_embedder("candidate", registry)
    v1 = registry.register("embedder", _model_dir(tmp_path), MANIFEST)
    registry.set_alias("embedder", "production", "v1")
    assert registered_embedder("production", registry) == ("ft-minilm-v1", str(v1.path))
    assert registered_embedder("ft-minilm-v1", registry) == ("ft-minilm-v1", str(v1.path))


class LengthReranker:
    name, scale = "length", "logit"

    def score(self, query, passages):
        return np.array([len(p) for p in passages], dtype=float)


def test_rerank_reorders_by_score_and_keeps_retrieval_order_on_ties(tmp_path):
    hits = [
        Hit(rank=i + 1, score=1.0 / (i + 1), chunk={"chunk_id": c, "text": t})
        for i, (c, t) in enumerate([("a", "xx"), ("b", "xxxx"), ("c", "xx"), ("d", "x")])
    ]
    out = rerank(LengthReranker(), "q", hits, k=3)
    sigmoid = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731 - the reranker declares logits: hits carry probabilities
    assert [(h.rank, h.chunk["chunk_id"]) for h in out] == [(1, "b"), (2, "a"), (3, "c")]
    assert [h.score for h in out] == pytest.approx([sigmoid(4.0), sigmoid(2.0), sigmoid(2.0)])
    assert rerank(LengthReranker(), "q", [], k=3) == []


def test_load_reranker_specs(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    assert load_reranker(None) is None and load_reranker("none") is None
    assert load_reranker("production", registry=registry) is None  # nothing trained yet: retrieval order stands
    # An answerer configured with `reranker: production` serves before the first promotion (retrieval order) ...
    assert load_reranker_spec("production", tmp_path) is None
    with pytest.raises(ValueError, match="no reranker 'candidate' is registered yet"):
        load_reranker_spec("candidate", tmp_path)  # ... but asking for a candidate that does not exist is an error
    with pytest.raises(ValueError, match="unknown reranker"):
        load_reranker("ce-minilm-v4", registry=registry)
    with pytest.raises(ValueError, match="unknown reranker"):
        load_reranker(str(tmp_path / "nowhere"), registry=registry)
