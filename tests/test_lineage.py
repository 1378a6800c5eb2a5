"""The model loop in the lineage graph (issue 49, item 2): people's feedback → the three learners → their release
steps → what serves (`model_rollout`); the edges add nothing to any job's selection; and the demo ends with the
release steps and `model_rollout` recording what serves, so none reads "Never materialized"."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from orchestration.definitions import defs
from orchestration.training import TRAINING_ASSETS
from rag.registry import BASE_V0, PRODUCTION_TAG, ModelRegistry
from rag.registry.backend import EXPERIMENT, MODEL_NAME
from tests.test_rollout_serving import fake_model

LEARNERS = ("finetuned_embedder", "trained_reranker", "trained_configuration")
RELEASES = ("production_embedder", "production_reranker", "production_configuration")
REPO = Path(__file__).resolve().parents[1]
LOOP_ONLY = {"feedback_dataset", "model_rollout"}  # the two ends the new edges join to training


def parents(name: str) -> set[str]:
    return {key.to_user_string() for key in defs.resolve_asset_graph().get(AssetKey(name)).parent_keys}


def test_feedback_feeds_every_learner_and_every_release_feeds_what_serves():
    for learner in LEARNERS:
        assert "feedback_dataset" in parents(learner), learner
    assert parents("model_rollout") == set(RELEASES)
    # Each release step still follows its own learner: training → release → serving reads as one path.
    assert {release: parents(release) for release in RELEASES} == {
        "production_embedder": {"finetuned_embedder"},
        "production_reranker": {"trained_reranker"},
        "production_configuration": {"trained_configuration"},
    }


def test_the_new_edges_add_no_asset_to_any_job():
    """retrain_job names its assets; no other job may start exporting feedback or materializing model_rollout."""
    retrain = defs.resolve_job_def("retrain_job")
    assert {k.to_user_string() for k in retrain.asset_layer.selected_asset_keys} == set(TRAINING_ASSETS)
    for job in defs.resolve_all_job_defs():
        if job.name.startswith("__ASSET_JOB") or job.asset_layer is None:
            continue  # Dagster's implicit job holds every materializable asset by construction
        selected = {k.to_user_string() for k in job.asset_layer.selected_asset_keys}
        assert not selected & LOOP_ONLY, job.name


def test_dagster_validates_the_code_location_with_the_new_edges(tmp_path):
    """What `make validate` runs: the workspace loads as `dagster dev` loads it (in its own process)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "All code locations passed validation" in done.stdout + done.stderr


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


def latest(instance, name: str) -> dict:
    event = instance.get_latest_materialization_event(AssetKey(name))
    assert event is not None, f"{name} was never materialized"
    materialization = event.asset_materialization
    return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}


def test_the_demo_records_the_base_models_serving_before_any_retrain(instance, tmp_path):
    from orchestration.demo import record_serving

    lines = record_serving(instance, tmp_path)

    embedder, reranker, configuration = (latest(instance, name) for name in RELEASES)
    assert (embedder["production"], embedder["production_version"]) == ("minilm (base, implicit v0)", "v0 (implicit)")
    assert reranker["production"] == "no reranker (implicit v0)" and reranker["action"] == "serving"
    assert configuration["production"] == "the server's own settings (implicit v0)"
    loop = latest(instance, "model_rollout")
    assert loop["embedder_production"] == "minilm (base, implicit v0)" and loop["canary"] == "none running"
    assert lines[:3] == [
        "minilm (base, implicit v0) serves (recorded by rag demo)",
        "no reranker (implicit v0) serves (recorded by rag demo)",
        "the server's own settings (implicit v0) serves (recorded by rag demo)",
    ]
    assert "embedder v0 · minilm" in lines[3], lines[3]
    # MLflow from the first minute: the training experiments, and each registered model tagged with what serves,
    # the built-in base as v0 (MLflow's own versions start at 1, so no alias can name it), no version made up.
    client = ModelRegistry(tmp_path / "models").mlflow_client()
    for kind, model in MODEL_NAME.items():
        assert client.get_experiment_by_name(EXPERIMENT[kind]) is not None
        tags = client.get_registered_model(model).tags
        assert tags[PRODUCTION_TAG] == BASE_V0[kind]
        assert tags[PRODUCTION_TAG].startswith("v0 · ")
        assert list(client.search_model_versions(f"name='{model}'")) == []
    # Idempotent: a second demo records the same.
    assert record_serving(instance, tmp_path) == lines


def test_the_demo_records_a_promoted_model_on_a_data_dir_that_has_one(instance, tmp_path):
    from orchestration.demo import record_serving

    registry = ModelRegistry(tmp_path / "models")
    e1 = registry.register("embedder", fake_model(tmp_path / "e1"), {"base_model": "minilm"})
    registry.set_alias("embedder", "production", e1.version)

    record_serving(instance, tmp_path)

    embedder = latest(instance, "production_embedder")
    assert (embedder["production"], embedder["production_version"]) == (e1.name, "v1")
    assert latest(instance, "production_reranker")["production"] == "no reranker (implicit v0)"
    assert latest(instance, "model_rollout")["embedder_production"] == e1.name
    tags = registry.mlflow_client().get_registered_model(MODEL_NAME["embedder"]).tags
    assert tags[PRODUCTION_TAG] == f"v1 · {e1.name}"


def test_the_production_tag_follows_promotion_and_rollback(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    e1 = registry.register("embedder", fake_model(tmp_path / "e1"), {"base_model": "minilm"})
    e2 = registry.register("embedder", fake_model(tmp_path / "e2"), {"base_model": "minilm"})

    def tag() -> str:
        return registry.mlflow_client().get_registered_model(MODEL_NAME["embedder"]).tags.get(PRODUCTION_TAG)

    registry.set_alias("embedder", "candidate", e2.version)
    assert tag() is None  # a candidate serves nobody: only production moves the tag
    registry.set_alias("embedder", "production", e1.version)
    assert tag() == f"v1 · {e1.name}"
    registry.set_alias("embedder", "production", e2.version)
    assert tag() == f"v2 · {e2.name}"
    registry.set_alias("embedder", "production", None)  # rolled back to the base
    assert tag() == BASE_V0["embedder"]
