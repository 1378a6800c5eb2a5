"""The model registry on MLflow (rag.registry): versions and aliases are MLflow's, read back through a plain
MlflowClient; a training is an MLflow run linked to its version, the gate's verdict and per-question scores go to that
run; a registration killed at any step leaves no half version; a folder registry migrates once and idempotently; a
new registry costs milliseconds (the template store). Fake model folders only: nothing is trained."""

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pandas as pd
import pytest

import rag.registry
from rag.registry import READY, STATE_TAG, ModelRegistry, RegistryError
from rag.registry.migrate import migrate_folder_registry
from rag.registry.backend import ui_url
from rag.registry.tracking import dagster_run, log_training, record_gate, run_url, training_run
from rag.training.config import GateSettings, TrainingConfig
from rag.training.embedder import TrainingRun
from rag.training.gate import gate_decision

REPO = Path(__file__).resolve().parents[1]

MANIFEST = {
    "base_model": "minilm",
    "training_data_hash": "abc123",
    "qa_set_version": "qa1",
    "strategy": "paragraph",
    "hyperparameters": {"learning_rate": 5e-5},
    "seed": 7,
    "metrics": {"dev_selection": {"ndcg@10": 0.5}},
}


@pytest.fixture(autouse=True)
def embedded(monkeypatch):
    """The embedded store under each test's tmp dir, whatever the developer's shell points MLflow and UI links at."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "RAG_MLFLOW_UI_URL", "RAG_DAGSTER_UI_URL"):
        monkeypatch.delenv(name, raising=False)


def fake_model(folder: Path, payload: bytes = b"weights") -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(payload)
    (folder / "config.json").write_text("{}")
    return folder


def plain_client(root: Path) -> mlflow.MlflowClient:
    uri = f"sqlite:///{root / 'mlflow.db'}"
    return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def new_process(monkeypatch) -> None:
    """What a restarted process has forgotten: which stores it already repaired."""
    monkeypatch.setattr(rag.registry, "_root_state", {})


def test_versions_and_aliases_are_mlflows_own(tmp_path):
    root = tmp_path / "models"
    registry = ModelRegistry(root)
    v1 = registry.register("embedder", fake_model(tmp_path / "a"), MANIFEST)
    v2 = registry.register("embedder", fake_model(tmp_path / "b"), {**MANIFEST, "base_model": v1.name})
    registry.set_alias("embedder", "production", "v1")
    registry.set_alias("embedder", "candidate", "v2")

    client = plain_client(root)
    versions = sorted(client.search_model_versions("name='rag-embedder'"), key=lambda v: int(v.version))
    assert [(v.version, v.source, v.tags[STATE_TAG], v.tags["rag.name"]) for v in versions] == [
        (1, str(v1.path.resolve()), READY, "ft-minilm-v1"),
        (2, str(v2.path.resolve()), READY, "ft-minilm-v2"),
    ]
    assert versions[0].tags["rag.training_data_hash"] == "abc123" and versions[0].tags["rag.qa_set_version"] == "qa1"
    assert client.get_registered_model("rag-embedder").aliases == {"production": 1, "candidate": 2}
    assert not list(root.rglob("aliases*.json"))  # no alias table beside MLflow

    # An alias moved in MLflow itself (the UI, another client) is what the registry resolves, and serving sees it.
    signature = registry.change_signature()
    client.set_registered_model_alias("rag-embedder", "production", "2")
    assert registry.resolve("embedder", "production").name == "ft-minilm-v2"
    assert registry.aliases()["embedder"] == {"production": "v2", "candidate": "v2"}
    assert registry.change_signature() != signature
    registry.set_alias("embedder", "candidate", None)
    assert client.get_registered_model("rag-embedder").aliases == {"production": 2}

    # The manifest's key records show as version tags: the gate's outcome, who approved a promotion.
    registry.update_metrics(
        "embedder",
        "v2",
        {
            "gate": {"outcome": "better", "passed": True, "against": "ft-minilm-v1"},
            "promotion": {"approved_by": "alice", "at": "2026-01-01T00:00:00+00:00"},
        },
    )
    tags = client.get_model_version("rag-embedder", "2").tags
    assert (tags["gate.outcome"], tags["gate.passed"], tags["promotion.approved_by"]) == ("better", "True", "alice")
    assert json.loads((v2.path / "manifest.json").read_text())["metrics"]["promotion"]["approved_by"] == "alice"


def test_nothing_registered_reads_without_creating_a_store(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    assert registry.versions("embedder") == [] and registry.resolve("reranker", "production") is None
    assert registry.aliases() == {"embedder": {}, "reranker": {}, "configuration": {}}
    assert not (tmp_path / "models").exists()


def training_like_run() -> TrainingRun:
    history = [
        {"step": 1, "loss": 0.9, "learning_rate": 5e-5, "epoch": 0.5},
        {"step": 2, "eval_dev_ndcg@10": 0.61, "epoch": 1.0},
        {"step": 2, "loss": 0.7, "epoch": 1.0},
    ]
    return TrainingRun(Path("unused"), 12.5, 2, 40, {"dev_ndcg@10": 0.61}, "checkpoint-2", history)


def light_run(registry: ModelRegistry, kind: str, seed: int = 1):
    """training_run for a test that trains nothing (no torch to import for the hardware tags)."""
    return training_run(
        registry,
        kind,
        seed=seed,
        training_data_hash="h",
        qa_set_version="q",
        strategy="paragraph",
        base_model="minilm",
        uses_torch=False,
    )


def test_a_training_run_records_what_went_in_and_links_its_version_and_gate(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("embedded mode reached for the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    root = tmp_path / "models"
    registry = ModelRegistry(root)
    with training_run(
        registry,
        "embedder",
        seed=7,
        training_data_hash="abc123",
        qa_set_version="qa1",
        strategy="paragraph",
        base_model="minilm",
    ) as run_id:
        log_training(
            registry,
            run_id,
            training_like_run(),
            {"learning_rate": 5e-5, "epochs": 1.0, "loss": "cached-mnrl"},
            {"train_pairs": 40, "training_data_hash": "abc123"},
        )
        mv = registry.register("embedder", fake_model(tmp_path / "m"), MANIFEST, run_id=run_id)

    client = plain_client(root)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {
        "learning_rate": "5e-05",
        "epochs": "1.0",
        "loss": "cached-mnrl",
    }
    tags = run.data.tags
    assert (tags["seed"], tags["training_data_hash"], tags["qa_set_version"], tags["strategy"]) == (
        "7",
        "abc123",
        "qa1",
        "paragraph",
    )
    assert (
        tags["lib.mlflow"] == mlflow.__version__
        and tags["hardware.cpus"]
        and tags["hardware.cpu"]
        and tags["rag.version"] == mv.name
    )
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval_dev_ndcg_at_10")] == [(2, 0.61)]
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2] and run.data.metrics[
        "data.train_pairs"
    ] == 40
    assert client.get_model_version("rag-embedder", "1").run_id == run_id and mv.run_id == run_id
    assert registry.resolve("embedder", "v1").run_id == run_id and "run_id" not in json.loads(
        (mv.path / "manifest.json").read_text()
    )
    experiment = run.info.experiment_id
    assert run_url(registry, mv) == f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{run_id}"
    assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(root.resolve() / "mlartifacts")

    # The gate's verdict: its figures and outcome on the run, the per-question scores as an artifact.
    def scores(values):
        return pd.DataFrame(
            {
                "qid": [f"q{i}" for i in range(len(values))],
                "ndcg@10": values,
                "mrr@10": values,
                "recall@20": [1.0] * len(values),
            }
        )

    production, candidate = [0.2, 0.4, 0.5, 0.1, 0.3, 0.6], [0.6, 0.7, 0.9, 0.5, 0.8, 0.9]
    result = gate_decision(scores(production), scores(candidate), GateSettings(resamples=500))
    verdict = {**result.metadata, "candidate_version": "v1", "production_version": None, "against": "minilm (base)"}
    assert record_gate(registry, mv, verdict, result) == run_id
    gated = client.get_run(run_id)
    assert gated.data.tags["gate.outcome"] == result.outcome and gated.data.metrics["gate.passed"] == float(
        result.passed
    )
    assert gated.data.metrics["gate.delta_ndcg_at_10"] == pytest.approx(verdict["delta_ndcg@10"])
    folder = client.list_artifacts(run_id, "gate")[0].path
    rows = json.loads(
        Path(client.download_artifacts(run_id, f"{folder}/per_question.json", str(tmp_path / "dl"))).read_text()
    )
    assert rows["decided_on"] == "plain" and [
        (r["qid"], r["production_ndcg@10"], r["candidate_ndcg@10"]) for r in rows["lists"]["plain"]
    ] == [(f"q{i}", p, c) for i, (p, c) in enumerate(zip(production, candidate))]


def test_hardware_imports_torch_so_a_run_opened_before_training_records_its_device(tmp_path):
    # A fresh interpreter: in this one an earlier test may have imported torch already, hiding the bug.
    code = (
        "import sys, json\n"
        "from rag.registry.tracking import hardware\n"
        "assert 'torch' not in sys.modules\n"
        "print(json.dumps([hardware(), hardware(uses_torch=False)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    with_torch, without = json.loads(done.stdout.splitlines()[-1])
    assert with_torch["hardware.torch_threads"].isdigit() and "not loaded" not in with_torch["hardware.gpu"]
    assert "hardware.torch_threads" not in without and without["hardware.gpu"].startswith("not used")


def test_a_failed_training_is_a_failed_run_and_registers_nothing(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    with pytest.raises(RuntimeError, match="out of memory"):
        with training_run(
            registry, "reranker", seed=1, training_data_hash="h", qa_set_version="q", strategy="s", base_model="minilm"
        ) as run_id:
            raise RuntimeError("out of memory")
    assert plain_client(tmp_path / "models").get_run(run_id).info.status == "FAILED"
    assert registry.versions("reranker") == []


def test_train_and_gate_candidate_record_into_mlflow(tmp_path, monkeypatch):
    """rag.training.pipeline's own train_candidate and gate_candidate, with a fake trainer and gate: the run, its
    version link, the candidate alias, the verdict in the manifest and on the run."""
    from rag.training import pipeline

    from rag.training.data import TrainingData

    data = TrainingData(positives=[(f"question {i}", "t") for i in range(40)])
    inputs = pipeline.Inputs("paragraph", pd.DataFrame({"chunk_id": ["c"], "text": ["t"]}), data, "qa1")
    monkeypatch.setattr(pipeline, "load_inputs", lambda tables, config: inputs)

    def fake_trainer(data, config, out, **kwargs):
        fake_model(out)
        run = training_like_run()
        run.model_dir = out
        return run

    monkeypatch.setattr(pipeline, "train_embedder", fake_trainer)
    registry = ModelRegistry(tmp_path / "models")
    mv, _, _ = pipeline.train_candidate(
        "embedder", SimpleNamespace(root=tmp_path / "tables"), registry, TrainingConfig(seed=3), log=lambda _: None
    )
    client = plain_client(tmp_path / "models")
    run = client.get_run(mv.run_id)
    assert (
        registry.aliases()["embedder"] == {"candidate": "v1"}
        and client.get_model_version("rag-embedder", "1").run_id == mv.run_id
    )
    assert (run.data.tags["seed"], run.data.tags["training_data_hash"], run.data.params["seed"]) == (
        "3",
        data.data_hash,
        "3",
    )
    # The device and threads torch trains with, read although the run opened before the trainer imported torch.
    assert run.data.tags["hardware.torch_threads"].isdigit() and run.data.tags["hardware.gpu"]
    assert "not loaded" not in run.data.tags["hardware.gpu"]

    settings = GateSettings(resamples=500)
    values = [0.1, 0.2, 0.3, 0.4, 0.5]
    scores = pd.DataFrame({"qid": list("abcde"), "ndcg@10": values, "mrr@10": values, "recall@20": [1.0] * 5})
    monkeypatch.setattr(pipeline, "decision_questions", lambda gate, chunks, settings: (None, chunks, 0))
    monkeypatch.setattr(pipeline, "load_embedder", lambda name: name)
    monkeypatch.setattr(pipeline, "embedder_gate", lambda *a, **k: gate_decision(scores, scores, settings))
    result = pipeline.gate_candidate("embedder", SimpleNamespace(root=tmp_path / "tables"), registry, mv, settings)
    # the same scores on every question: "unchanged" (no canary could tell them apart)
    assert registry.resolve("embedder", "v1").metrics["gate"]["outcome"] == result.outcome == "unchanged"
    assert client.get_run(mv.run_id).data.tags["gate.outcome"] == "unchanged"
    assert client.get_model_version("rag-embedder", "1").tags["gate.outcome"] == "unchanged"
    # Production stays, so the gate takes the alias back: MLflow's alias editor offers no refused candidate.
    assert client.get_registered_model("rag-embedder").aliases == {} and registry.aliases()["embedder"] == {}
    assert registry.resolve("embedder", "v1") is not None  # the version and its verdict stay


def rejected(registry, version: str, outcome: str) -> None:
    """A gate verdict on `version` as gate_candidate records it, with the flags each outcome carries."""
    registry.update_metrics(
        "embedder",
        version,
        {
            "gate": {
                "outcome": outcome,
                "better": outcome == "better",
                "not_worse": outcome in ("better", "inconclusive"),
                "passed": outcome == "better",
                "candidate_version": version,
                "production_version": None,
            }
        },
    )


@pytest.mark.parametrize(
    ("outcome", "keeps"),
    [("worse", False), ("unchanged", False), ("no verdict", False), ("inconclusive", True), ("better", True)],
)
def test_the_gate_takes_the_candidate_alias_only_from_a_version_it_kept_out(tmp_path, outcome, keeps):
    """Worse, unchanged or no verdict keep production: the version loses `candidate`. A candidate found no worse
    (inconclusive) may still get a canary, now or queued, and keeps it; so does a better one."""
    from rag.training.pipeline import withdraw_rejected

    registry = ModelRegistry(tmp_path / "models")
    mv = registry.register("embedder", fake_model(tmp_path / "m"), MANIFEST)
    registry.set_alias("embedder", "candidate", mv.version)
    rejected(registry, mv.version, outcome)
    verdict = registry.resolve("embedder", mv.version).metrics["gate"]
    assert withdraw_rejected(registry, "embedder", mv, verdict) is not keeps
    assert registry.aliases()["embedder"] == ({"candidate": "v1"} if keeps else {})


def test_a_rejected_version_leaves_a_newer_candidates_alias_alone(tmp_path):
    from rag.training.pipeline import withdraw_rejected

    registry = ModelRegistry(tmp_path / "models")
    old = registry.register("embedder", fake_model(tmp_path / "a"), MANIFEST)
    registry.set_alias(
        "embedder", "candidate", registry.register("embedder", fake_model(tmp_path / "b"), MANIFEST).version
    )
    rejected(registry, old.version, "worse")
    assert not withdraw_rejected(registry, "embedder", old, registry.resolve("embedder", "v1").metrics["gate"])
    assert registry.aliases()["embedder"] == {"candidate": "v2"}


def test_a_run_opened_inside_a_dagster_run_links_back_to_it(tmp_path, monkeypatch):
    registry = ModelRegistry(tmp_path / "models")

    def opened() -> dict[str, str]:
        with light_run(registry, "reranker") as run_id:
            return plain_client(tmp_path / "models").get_run(run_id).data.tags

    with dagster_run("3f2a9c1e-0000-4000-8000-000000000001"):
        tags = opened()
    url = "http://127.0.0.1:3000/runs/3f2a9c1e-0000-4000-8000-000000000001"
    assert (tags["dagster.run_id"], tags["dagster.run_url"]) == ("3f2a9c1e-0000-4000-8000-000000000001", url)
    # The run's description on its MLflow page, where a Markdown link is clickable (tags are plain text there).
    assert (
        tags["mlflow.note.content"] == f"Trained reranker by Dagster run [3f2a9c1e-0000-4000-8000-000000000001]({url})."
    )

    monkeypatch.setenv("RAG_DAGSTER_UI_URL", "https://dagster.example.org/prefix/")
    with dagster_run("r2"):
        assert opened()["dagster.run_url"] == "https://dagster.example.org/prefix/runs/r2"
    assert not {"dagster.run_id", "dagster.run_url", "mlflow.note.content"} & set(opened())  # outside a Dagster run


def test_a_training_asset_tags_its_mlflow_run_with_its_dagster_run(tmp_path, monkeypatch):
    """finetuned_embedder (trainer faked, the MLflow run real): the run links to the Dagster run, and the asset's
    metadata links to the MLflow run, both ways."""
    from dagster import DagsterInstance, materialize

    import assets.training as training
    from resources.storage import DataStore

    def fake_train(kind, tables, registry, config, **_):
        with light_run(registry, kind, config.seed) as run_id:
            mv = registry.register(kind, fake_model(tmp_path / "m"), MANIFEST, run_id=run_id)
        return mv, training_like_run(), SimpleNamespace(strategy="paragraph", data=SimpleNamespace(summary={}))

    monkeypatch.setattr(training, "train_candidate", fake_train)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [training.finetuned_embedder],
            instance=instance,
            resources={"data_store": DataStore(data_dir=str(tmp_path))},
        )
    (event,) = result.get_asset_materialization_events()
    link = event.materialization.metadata["mlflow_run"].value
    mv = ModelRegistry(tmp_path / "models").resolve("embedder", "v1")
    assert link.startswith("http://127.0.0.1:5000/#/experiments/") and link.endswith(f"/runs/{mv.run_id}")
    tags = plain_client(tmp_path / "models").get_run(mv.run_id).data.tags
    assert tags["dagster.run_id"] == result.run_id
    assert tags["dagster.run_url"] == f"http://127.0.0.1:3000/runs/{result.run_id}"


def test_the_gate_records_the_dagster_run_that_gated_the_version(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    mv = registry.register("reranker", fake_model(tmp_path / "m"), MANIFEST)  # no training run: the gate makes one
    with dagster_run("gate-run"):
        run_id = record_gate(registry, mv, {"outcome": "worse", "passed": False, "candidate_version": "v1"})
    tags = plain_client(tmp_path / "models").get_run(run_id).data.tags
    assert (tags["gate.dagster.run_id"], tags["dagster.run_id"]) == ("gate-run", "gate-run")
    assert tags["gate.dagster.run_url"] == "http://127.0.0.1:3000/runs/gate-run"
    assert tags["mlflow.note.content"].startswith("Gated ce-minilm-v1 by Dagster run [gate-run](")


def test_one_mlflow_ui_address_for_every_link(tmp_path, monkeypatch):
    """RAG_MLFLOW_UI_URL wins (a proxy, another port); else an http(s) tracking server's own address; else `make
    mlflow`'s for the embedded store; a database URL with no UI named has nothing to link to."""
    assert ui_url("sqlite:////data/models/mlflow.db", embedded=True) == "http://127.0.0.1:5000"
    assert ui_url("https://mlflow.team.example/", embedded=False) == "https://mlflow.team.example"
    assert ui_url("postgresql://db/mlflow", embedded=False) is None
    monkeypatch.setenv("RAG_MLFLOW_UI_URL", "https://mlflow.example.org/ui/")
    for uri, embedded in (("sqlite:////x.db", True), ("http://mlflow:5000", False), ("postgresql://db/m", False)):
        assert ui_url(uri, embedded) == "https://mlflow.example.org/ui"

    registry = ModelRegistry(tmp_path / "models")
    with light_run(registry, "embedder") as run_id:
        mv = registry.register("embedder", fake_model(tmp_path / "m"), MANIFEST, run_id=run_id)
    experiment = plain_client(tmp_path / "models").get_run(run_id).info.experiment_id
    assert run_url(registry, mv) == f"https://mlflow.example.org/ui/#/experiments/{experiment}/runs/{run_id}"


class Killed(BaseException):
    """A kill: nothing after it runs (BaseException: no `except Exception` of the code under test catches it)."""


def _raise(*args, **kwargs):
    raise Killed


def _then_raise(original):
    def wrapped(*args, **kwargs):
        original(*args, **kwargs)
        raise Killed

    return wrapped


def _half_copy(src, dst, *args, **kwargs):
    Path(dst).mkdir()
    (Path(dst) / "model.safetensors").write_bytes(b"hal")
    raise Killed


def _crash_points():
    """Each step of register, killed before or right after it: (step, install(monkeypatch), whether the version
    survives: once its folder is in place complete, the repair finishes it)."""
    client_cls = mlflow.MlflowClient
    os_replace = rag.registry.os.replace
    set_tag = client_cls.set_model_version_tag

    def on_ready(after):
        def tag(self, name, version, key, value):
            if key == STATE_TAG and value == READY:
                if after:
                    set_tag(self, name, version, key, value)
                raise Killed
            return set_tag(self, name, version, key, value)

        return tag

    def on_place(after):
        def replace(src, dst, *args, **kwargs):
            if Path(dst).name[:1] == "v" and Path(dst).name[1:].isdigit():
                if after:
                    os_replace(src, dst, *args, **kwargs)
                raise Killed
            return os_replace(src, dst, *args, **kwargs)

        return replace

    return [
        ("mid-copy", lambda mp: mp.setattr(rag.registry.shutil, "copytree", _half_copy), False),
        (
            "before creating the MLflow version",
            lambda mp: mp.setattr(client_cls, "create_model_version", _raise),
            False,
        ),
        (
            "after creating the MLflow version",
            lambda mp: mp.setattr(client_cls, "create_model_version", _then_raise(client_cls.create_model_version)),
            False,
        ),
        ("before writing the manifest", lambda mp: mp.setattr(rag.registry, "_write_json_atomic", _raise), False),
        ("before the rename into place", lambda mp: mp.setattr(rag.registry.os, "replace", on_place(False)), False),
        ("after the rename into place", lambda mp: mp.setattr(rag.registry.os, "replace", on_place(True)), True),
        ("before tagging it ready", lambda mp: mp.setattr(client_cls, "set_model_version_tag", on_ready(False)), True),
        ("after tagging it ready", lambda mp: mp.setattr(client_cls, "set_model_version_tag", on_ready(True)), True),
        ("before the change marker", lambda mp: mp.setattr(ModelRegistry, "_touch", _raise), True),
    ]


def test_a_registration_killed_at_any_step_leaves_no_half_version(tmp_path, monkeypatch):
    for i, (step, install, kept) in enumerate(_crash_points()):
        root = tmp_path / f"r{i}" / "models"
        registry = ModelRegistry(root)
        registry.register("reranker", fake_model(tmp_path / f"r{i}" / "first", b"one"), MANIFEST)
        registry.set_alias("reranker", "production", "v1")
        with monkeypatch.context() as mp:  # the kill's patch ends with the block, as the process would
            install(mp)
            with pytest.raises(Killed):
                registry.register("reranker", fake_model(tmp_path / f"r{i}" / "second", b"two"), MANIFEST)
        new_process(monkeypatch)
        reopened = ModelRegistry(root)
        seen = [mv.version for mv in reopened.versions("reranker")]
        assert seen == (["v1", "v2"] if kept else ["v1"]), step
        if kept:  # whole: its weights and manifest, as registered
            v2 = reopened.resolve("reranker", "v2")
            assert (v2.path / "model.safetensors").read_bytes() == b"two" and v2.name == "ce-minilm-v2", step
        assert reopened.resolve("reranker", "production").version == "v1", step
        after = reopened.register("reranker", fake_model(tmp_path / f"r{i}" / "third", b"three"), MANIFEST)
        assert (after.path / "model.safetensors").read_bytes() == b"three", step
        assert reopened.resolve("reranker", after.version).path == after.path, step
        left = plain_client(root).search_model_versions("name='rag-reranker'")
        assert all(v.tags.get(STATE_TAG) == READY for v in left), step  # the repair finished or removed the rest
        assert sorted(int(v.version) for v in left) == [int(mv.version[1:]) for mv in reopened.versions("reranker")], (
            step
        )
        assert not [p for p in (root / "reranker").iterdir() if p.name.startswith(".")], step  # staging reclaimed


def legacy_registry(root: Path) -> None:
    """A registry of the folder format: embedder v1 and v3 (v2 never completed: no manifest), reranker v1."""
    for kind, number, prefix in (("embedder", 1, "ft"), ("embedder", 3, "ft"), ("reranker", 1, "ce")):
        folder = fake_model(root / kind / f"v{number}", f"{kind}{number}".encode())
        manifest = {
            **MANIFEST,
            "kind": kind,
            "version": f"v{number}",
            "name": f"{prefix}-minilm-v{number}",
            "family": "minilm",
            "created_at": "2025-01-01T00:00:00+00:00",
            "metrics": {"gate": {"outcome": "better", "passed": True}},
        }
        (folder / "manifest.json").write_text(json.dumps(manifest))
    (root / "embedder" / "v2").mkdir()
    (root / "aliases.json").write_text(
        json.dumps({"embedder": {"production": "v1", "candidate": "v3"}, "reranker": {"production": "v1"}})
    )


def test_a_folder_registry_migrates_completely_once_and_a_killed_migration_completes(tmp_path, monkeypatch):
    from orchestration.cli import main

    root = tmp_path / "models"
    legacy_registry(root)
    with pytest.raises(RegistryError, match="rag models migrate-registry --root"):
        ModelRegistry(root).resolve("embedder", "production")  # refused, with the command that fixes it

    # Killed after both embedders were registered, before the aliases: the re-run completes it.
    with monkeypatch.context() as mp:
        mp.setattr(mlflow.MlflowClient, "set_registered_model_alias", _raise)
        with pytest.raises(Killed):
            migrate_folder_registry(root, log=lambda _: None)
    new_process(monkeypatch)
    assert main(["models", "migrate-registry", "--root", str(root)]) == 0

    registry = ModelRegistry(root)
    assert [(mv.version, mv.name) for mv in registry.versions("embedder")] == [
        ("v1", "ft-minilm-v1"),
        ("v3", "ft-minilm-v3"),
    ]
    assert registry.aliases() == {
        "embedder": {"production": "v1", "candidate": "v3"},
        "reranker": {"production": "v1"},
        "configuration": {},
    }
    v3 = registry.resolve("embedder", "ft-minilm-v3")
    assert (v3.path / "model.safetensors").read_bytes() == b"embedder3" and v3.metrics["gate"]["outcome"] == "better"
    client = plain_client(root)
    assert sorted(v.version for v in client.search_model_versions("name='rag-embedder'")) == [1, 3]
    assert client.get_model_version("rag-embedder", "3").tags["gate.outcome"] == "better"
    assert not (root / "aliases.json").exists()

    before = [
        (v.version, v.last_updated_timestamp, v.tags) for v in client.search_model_versions("name='rag-embedder'")
    ]
    assert migrate_folder_registry(root, log=lambda _: None) == {"versions": [], "aliases": [], "removed": False}
    assert [
        (v.version, v.last_updated_timestamp, v.tags) for v in client.search_model_versions("name='rag-embedder'")
    ] == before
    assert registry.register("embedder", fake_model(tmp_path / "next"), MANIFEST).version == "v4"


def test_a_migration_killed_before_a_version_was_ready_completes(tmp_path, monkeypatch):
    root = tmp_path / "models"
    legacy_registry(root)
    original = mlflow.MlflowClient.set_model_version_tag

    def killed_at_v3(self, name, version, key, value):
        if key == STATE_TAG and str(version) == "3":
            raise Killed
        return original(self, name, version, key, value)

    with monkeypatch.context() as mp:
        mp.setattr(mlflow.MlflowClient, "set_model_version_tag", killed_at_v3)
        with pytest.raises(Killed):
            migrate_folder_registry(root, log=lambda _: None)
    new_process(monkeypatch)
    migrate_folder_registry(root, log=lambda _: None)
    assert [mv.name for mv in ModelRegistry(root).versions("embedder")] == ["ft-minilm-v1", "ft-minilm-v3"]


def test_a_new_registry_starts_from_the_template_instead_of_migrating(tmp_path, monkeypatch):
    """Every MLflow migration on a fresh SQLite store takes seconds; each new registry root (every data dir, every
    test's tmp dir) must copy the migrated template instead. Checked by what runs, not by a clock."""
    from rag.registry import backend

    ModelRegistry(tmp_path / "warm").register("embedder", fake_model(tmp_path / "m0"), MANIFEST)  # template exists now

    def migrating(path):
        raise AssertionError(f"a new registry ran MLflow's migrations at {path} instead of copying the template")

    monkeypatch.setattr(backend, "_build", migrating)
    for i in range(2):
        fresh = ModelRegistry(tmp_path / f"fresh{i}")
        fresh.register("embedder", fake_model(tmp_path / f"m{i + 1}"), MANIFEST)
        assert [mv.name for mv in fresh.versions("embedder")] == ["ft-minilm-v1"]


def test_a_shared_store_carries_the_files_to_another_machine(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI set (a database URL here, a server in a team): weights and manifest travel as run
    artifacts, and a machine with an empty registry folder downloads them."""
    from rag.registry.backend import template_db

    monkeypatch.chdir(tmp_path)  # a database URL keeps MLflow's default artifact root, ./mlruns
    shutil.copyfile(template_db(), tmp_path / "shared.db")  # a migrated store, as a team's server has (seconds saved)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'shared.db'}")
    here, there = ModelRegistry(tmp_path / "here"), ModelRegistry(tmp_path / "there")
    mv = here.register("embedder", fake_model(tmp_path / "m", b"shared weights"), MANIFEST)
    here.set_alias("embedder", "production", mv.version)
    seen = there.resolve("embedder", "production")
    assert (
        seen.path == tmp_path / "there" / "embedder" / "v1"
        and (seen.path / "model.safetensors").read_bytes() == b"shared weights"
    )
    here.update_metrics("embedder", "v1", {"gate": {"outcome": "better"}})
    assert there.resolve("embedder", "v1").metrics["gate"] == {"outcome": "better"}
    assert (
        not (tmp_path / "here" / "mlflow.db").exists() and run_url(here, mv) is None
    )  # no UI address for a database URL
