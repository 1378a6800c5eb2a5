"""A new chunking strategy, end to end, from one action (issue 49, item 1):

- the strategy sensor backfills only what is missing (a strategy whose chunk set was built with its current
  parameters is left alone, with or without a cursor), with the served embedder only: production, the base model
  before any promotion, a running canary's candidate, and the models listed as active; never a rejected candidate,
  whose embedding_model partition is removed (a built-in one added by hand stays) and whose collection
  embedding_collections refuses;
- the instance config `make dev` and `make demo` use holds runs that open the embedded Qdrant folder to one at a
  time, and adds nothing over an operator's own settings;
- the demo's sensor starting points;
- (slow) `rag sync-strategies --materialize` on a fresh data dir, then a new strategy: the sensor's first tick asks
  for it alone, and materializing builds its chunk set, BM25 index, the served model's collection, its evaluation
  and its row in evaluation_summary, running nothing for the other strategies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    MultiPartitionKey,
    SensorResult,
    build_sensor_context,
)

from orchestration.definitions import defs
from orchestration.partitions import indexed_models, model_partition_requests
from rag.chunking import load_strategies, strategy_fingerprint
from rag.lifecycle.journal import state_path
from rag.registry import ModelRegistry
from rag.rollout.state import RolloutState
from resources.chunking import ChunkingStrategies
from resources.models import EmbeddingModels
from resources.storage import DataStore
from sensors.strategies import chunking_strategy_sensor
from tests.conftest import REPO
from tests.test_dagster import backfilled
from tests.test_rollout_serving import fake_model

STRATEGIES = {
    "paragraph": {"kind": "paragraph"},
    "page": {"kind": "page"},
    "recursive-1000-200": {"kind": "recursive", "chunk_size": 1000, "chunk_overlap": 200},
}
NEW = {"sentence-window-6-3": {"kind": "sentence-window", "window": 6, "stride": 3}}


@pytest.fixture
def setup(tmp_path):
    """A data dir whose registry holds ft-minilm-v1, a candidate nothing serves (as after a rejected gate), with its
    embedding_model partition (training adds one per candidate); the embedders YAML lists the base model as active,
    as shipped; chunk_sets of three strategies recorded as built with their current parameters."""
    root = tmp_path / "data"
    registry = ModelRegistry(root / "models")
    v1 = registry.register("embedder", fake_model(tmp_path / "v1"), {"base_model": "minilm"})
    registry.set_alias("embedder", "candidate", v1.version)
    config = tmp_path / "chunking.yaml"
    config.write_text(yaml.safe_dump({"strategies": STRATEGIES}))
    (tmp_path / "embedders.yaml").write_text("active: [minilm]\n")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", list(STRATEGIES))
    instance.add_dynamic_partitions("embedding_model", ["minilm", v1.name])
    for name, cfg in load_strategies(config).items():
        instance.report_runless_asset_event(
            AssetMaterialization(
                "chunk_sets", partition=name, metadata={"strategy_fingerprint": strategy_fingerprint(cfg)}
            )
        )
    for asset in ("parsed_documents", "synthetic_qa"):
        instance.report_runless_asset_event(AssetMaterialization(asset))
    resources = {
        "chunking": ChunkingStrategies(config_path=str(config)),
        "embedding_models": EmbeddingModels(config_path=str(tmp_path / "embedders.yaml")),
        "data_store": DataStore(data_dir=str(root)),
    }
    yield {"root": root, "registry": registry, "v1": v1, "config": config, "instance": instance, "resources": resources}
    instance.dispose()


def tick(setup, sensor_name: str, cursor: str | None = None):
    from sensors import strategies

    sensor = getattr(strategies, sensor_name)
    context = build_sensor_context(
        instance=setup["instance"], cursor=cursor, resources=setup["resources"], definitions=defs
    )
    return sensor(context)


def canary(setup, version: str) -> None:
    """An embedder canary of `version` serving now, as rag.lifecycle.rollout.start leaves its state."""
    path = state_path(setup["registry"], "embedder")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RolloutState(stage="canary", candidate_version=version).model_dump_json())


def test_model_partitions_hold_only_served_canaried_or_active_models(setup):
    registry, v1, instance = setup["registry"], setup["v1"], setup["instance"]
    assert indexed_models(registry, ["minilm"]) == ["minilm"]  # the base model serves; the candidate does not
    instance.add_dynamic_partitions("embedding_model", ["wordllama"])  # a built-in added by hand stays
    (delete,) = model_partition_requests(instance, ["minilm"])
    assert delete.partition_keys == [v1.name] and type(delete).__name__ == "DeleteDynamicPartitionsRequest"

    canary(setup, v1.version)
    assert indexed_models(registry, ["minilm"]) == ["minilm", v1.name]
    assert model_partition_requests(instance, ["minilm", v1.name]) == []

    state_path(registry, "embedder").unlink()
    registry.set_alias("embedder", "production", v1.version)
    assert indexed_models(registry, []) == [v1.name]  # served only: production
    assert indexed_models(registry, ["minilm", "wordllama"]) == [v1.name, "minilm", "wordllama"]


def test_sensor_backfills_only_the_new_strategy_with_the_served_model(setup):
    raw = yaml.safe_load(setup["config"].read_text())
    setup["config"].write_text(yaml.safe_dump({"strategies": {**raw["strategies"], **NEW}}))
    result = tick(setup, "chunking_strategy_sensor")  # no cursor: the built fingerprints are the starting point
    assert isinstance(result, SensorResult) and len(result.run_requests) == 1
    planned = backfilled(result)
    new = "sentence-window-6-3"
    key = MultiPartitionKey({"strategy": new, "model": "minilm"})
    assert planned == {
        "chunk_sets": {new},
        "bm25_indexes": {new},
        "embedding_collections": {key},
        "retrieval_evaluation": {key},
        "evaluation_summary": {None},
    }
    requests = {(type(r).__name__, tuple(r.partition_keys)) for r in result.dynamic_partitions_requests}
    assert requests == {
        ("AddDynamicPartitionsRequest", (new,)),
        ("DeleteDynamicPartitionsRequest", (setup["v1"].name,)),  # the rejected candidate's partition goes
    }
    assert "sentence-window-6-3" in json.loads(result.cursor)
    again = tick(setup, "chunking_strategy_sensor", result.cursor)
    assert again.skip_reason is not None and not again.run_requests  # under way: not requested twice

    # New parameters for a strategy built before: it alone is rebuilt.
    raw = yaml.safe_load(setup["config"].read_text())
    raw["strategies"]["page"] = {"kind": "page", "tokenizer": "wordpiece"}
    setup["config"].write_text(yaml.safe_dump(raw))
    changed = tick(setup, "chunking_strategy_sensor", result.cursor)
    assert backfilled(changed)["chunk_sets"] == {"page"}


def test_a_canary_is_indexed_and_a_promoted_model_backfilled_over_every_chunk_set(setup):
    v1 = setup["v1"]
    canary(setup, v1.version)
    result = tick(setup, "embedding_model_sensor", json.dumps(["minilm"]))
    planned = backfilled(result)
    assert "chunk_sets" not in planned  # the chunk sets exist: only the new model's collections and evaluations
    assert planned["embedding_collections"] == {
        MultiPartitionKey({"strategy": s, "model": v1.name}) for s in STRATEGIES
    }
    assert planned["evaluation_summary"] == {None}
    assert json.loads(result.cursor) == ["minilm", v1.name]
    assert tick(setup, "embedding_model_sensor", result.cursor).skip_reason is not None


def test_embedding_collections_refuses_a_model_that_neither_serves_nor_is_active(setup):
    from orchestration.launch import run_job

    key = MultiPartitionKey({"strategy": "paragraph", "model": setup["v1"].name})
    result = run_job(
        setup["instance"],
        "embedding_collections_job",
        partition_key=key,
        resources=setup["resources"],
        run_config={"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}},
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.error.message
    assert "neither serves, runs a canary nor is listed as active" in message and "active:" in message


def test_instance_config_limits_embedded_qdrant_runs_to_one_and_keeps_the_operators_keys(tmp_path, monkeypatch):
    from orchestration.cli import install_instance_config, instance_note, prepared_instance
    from resources.qdrant import qdrant_pool

    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance, added = prepared_instance()
    assert added == ["concurrency"] and install_instance_config(home) == []  # idempotent
    pools = instance.get_concurrency_config().pool_config
    assert (pools.pool_granularity.value, pools.default_pool_limit) == ("run", 1)
    # stored before any run is queued: the run queue's first pass that sees the pool already holds it to one run
    assert [(p.name, p.limit) for p in instance.event_log_storage.get_pool_limits()] == [("qdrant", 1)]
    instance.dispose()
    assert instance_note(home) is None

    graph = defs.resolve_asset_graph()
    for asset in ("embedding_collections", "retrieval_evaluation"):
        assert graph.get(AssetKey(asset)).pools == {"qdrant"}
    monkeypatch.setenv("QDRANT_URL", "http://qdrant:6333")
    assert qdrant_pool() is None  # a server takes parallel writers

    own = tmp_path / "own"
    own.mkdir()
    (own / "dagster.yaml").write_text("concurrency:\n  runs:\n    max_concurrent_runs: 3\n")
    assert install_instance_config(own) == ["telemetry"]
    assert yaml.safe_load((own / "dagster.yaml").read_text())["concurrency"] == {"runs": {"max_concurrent_runs": 3}}
    monkeypatch.delenv("QDRANT_URL")
    assert "QdrantLockedError" in instance_note(own)


def test_demo_sets_the_sensors_starting_points(setup, tmp_path):
    from orchestration.demo import sensor_starts, set_sensor_cursor
    from resources.documents import DocumentSource

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("A document.")
    source = DocumentSource(path=str(docs), passwords_file=str(tmp_path / "none.yaml"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAG_CHUNKING_CONFIG", str(setup["config"]))
        starts = sensor_starts(setup["instance"], source, ["minilm"])
    assert set(json.loads(starts["chunking_strategy_sensor"])) == set(STRATEGIES)
    assert json.loads(starts["embedding_model_sensor"]) == ["minilm"]
    from sensors.documents import new_documents_sensor

    unchanged = new_documents_sensor(
        build_sensor_context(
            cursor=starts["new_documents_sensor"], resources={"document_source": source, **setup["resources"]}
        )
    )
    assert unchanged.skip_message.endswith("unchanged since the last re-index request")

    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))  # sensor states need schedule storage
    set_sensor_cursor(instance, "chunking_strategy_sensor", "first")
    set_sensor_cursor(instance, "chunking_strategy_sensor", starts["chunking_strategy_sensor"])
    states = [s for s in instance.all_instigator_state() if s.name == "chunking_strategy_sensor"]
    assert [s.instigator_data.cursor for s in states] == [starts["chunking_strategy_sensor"]]
    assert not states[0].is_running  # a stopped sensor stays stopped: the toggle starts it from this cursor


def rag(env: dict, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def strategy_env(
    tmp_path: Path, shared_mixed: Path, strategies: tuple[str, ...] = ("paragraph", "recursive-1000-200")
) -> dict:
    """The environment of `rag` and `dagster dev` over three small documents, a chunking YAML of `strategies` and
    the shipped embedders YAML's `active: [minilm]`, everything under tmp_path."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("norwich-city.txt", "book-war-and-peace-1p.txt", "fake-html.html"):
        shutil.copy(shared_mixed / name, docs)
    (tmp_path / "chunking.yaml").write_text(yaml.safe_dump({"strategies": {k: STRATEGIES[k] for k in strategies}}))
    (tmp_path / "embedders.yaml").write_text("active: [minilm]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QDRANT_", "RAG_", "DAGSTER_"))}
    return {
        **env,
        "DAGSTER_HOME": str(tmp_path / "dagster"),
        "RAG_DATA_DIR": str(tmp_path / "data"),
        "RAG_DOCS_DIR": str(docs),
        "RAG_CHUNKING_CONFIG": str(tmp_path / "chunking.yaml"),
        "RAG_EMBEDDERS_CONFIG": str(tmp_path / "embedders.yaml"),
        "RAG_PDF_PASSWORDS_FILE": str(tmp_path / "none.yaml"),
        "RAG_ONNX_CACHE": os.environ.get("RAG_ONNX_CACHE", ""),
    }


@pytest.mark.slow
def test_a_new_strategy_from_one_command_builds_only_its_partitions(tmp_path, shared_mixed):
    import pandas as pd
    from dagster import RunsFilter

    env = strategy_env(tmp_path, shared_mixed)
    rag(env, "sync-strategies", "--materialize")  # a fresh data dir: ingestion, the QA set, both strategies
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        before = {r.run_id for r in instance.get_runs()}
    summary = pd.read_parquet(tmp_path / "data" / "tables" / "evaluation_summary" / "data.parquet")
    assert set(summary["strategy"]) == {"paragraph", "recursive-1000-200"}

    config = Path(env["RAG_CHUNKING_CONFIG"])
    config.write_text(yaml.safe_dump({"strategies": {**yaml.safe_load(config.read_text())["strategies"], **NEW}}))
    new = "sentence-window-6-3"
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        resources = {
            "chunking": ChunkingStrategies(config_path=str(config)),
            "embedding_models": EmbeddingModels(config_path=env["RAG_EMBEDDERS_CONFIG"]),
            "data_store": DataStore(data_dir=env["RAG_DATA_DIR"]),
        }
        first = chunking_strategy_sensor(build_sensor_context(instance=instance, resources=resources, definitions=defs))
        assert backfilled(first)["chunk_sets"] == {new}  # the first tick, no cursor: the new strategy alone

    out = rag(env, "sync-strategies", "--materialize").stdout
    assert f"materializing: chunk, BM25-index, embed with minilm, evaluate and summarize {new}" in out
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        runs = [r for r in instance.get_runs(RunsFilter()) if r.run_id not in before]
    partitions = sorted((r.job_name, r.tags.get("dagster/partition", "")) for r in runs)
    assert partitions == [
        ("chunk_sets_job", new),
        ("embedding_collections_job", f"minilm|{new}"),
        ("evaluation_summary_job", ""),
        ("retrieval_evaluation_job", f"minilm|{new}"),
    ]
    assert all(r.is_success for r in runs)
    summary = pd.read_parquet(tmp_path / "data" / "tables" / "evaluation_summary" / "data.parquet")
    assert new in set(summary["strategy"]) and set(summary.loc[summary["mode"] != "bm25", "model"]) == {"minilm"}
    assert "nothing to materialize" in rag(env, "sync-strategies", "--materialize").stdout
