"""Every training is an MLflow run in the registry's store: what went in (hyperparameters, seed, the training data's
content hash, the QA set version, library versions, hardware, the code's commit), the trainer's step metrics, the
version it registered, and the gate's verdict with its per-question scores.

    with training_run(registry, kind, seed=..., training_data_hash=..., ...) as run_id:   # FAILED if training raises
        run = train(...)
        log_training(registry, run_id, run, hyperparameters, data_summary)
        registry.register(kind, run.model_dir, manifest, run_id=run_id)   # the version links to the run
    record_gate(registry, candidate, verdict, result)   # the verdict, onto the candidate's run
    run_url(registry, mv)                               # a link for Dagster metadata

    with dagster_run(context.run_id):                   # in a Dagster asset: the runs opened inside are tagged
        train_candidate(...)                            # with that run's id and link back to its page

Used by rag.training.pipeline; nothing here trains or decides.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path

from rag.registry import GATE_RUN_TAG, ModelRegistry, ModelVersion, library_versions
from rag.registry.backend import MODEL_NAME, key, ui_url

MAX_PARAM = 6000  # MLflow's longest parameter value
MAX_TAG = 5000
DAGSTER_UI_ENV = "RAG_DAGSTER_UI_URL"
DAGSTER_LOCAL_UI = "http://127.0.0.1:3000"  # what `make dev` serves
DAGSTER_RUN_TAG = "dagster.run_id"
DAGSTER_URL_TAG = "dagster.run_url"
NOTE_TAG = "mlflow.note.content"  # the run's description on its MLflow page, rendered as Markdown

_dagster_run: ContextVar[str | None] = ContextVar("dagster_run", default=None)


def dagster_run_url(run_id: str) -> str:
    """The Dagster UI page of a run: RAG_DAGSTER_UI_URL (default `make dev`'s address) + /runs/<id>."""
    base = os.environ.get(DAGSTER_UI_ENV, "").strip() or DAGSTER_LOCAL_UI
    return f"{base.rstrip('/')}/runs/{run_id}"


@contextlib.contextmanager
def dagster_run(run_id: str | None) -> Iterator[None]:
    """Within the block, the MLflow runs this module opens or gates are tagged with this Dagster run and link back
    to its page. A context, not an argument: the trainers between a Dagster asset and its MLflow run (rag.training)
    know nothing of Dagster."""
    token = _dagster_run.set(run_id)
    try:
        yield
    finally:
        _dagster_run.reset(token)


def dagster_tags(prefix: str = "") -> dict[str, str]:
    """The current Dagster run's id and page as MLflow tags (none outside dagster_run())."""
    run_id = _dagster_run.get()
    if not run_id:
        return {}
    return {f"{prefix}{DAGSTER_RUN_TAG}": run_id, f"{prefix}{DAGSTER_URL_TAG}": dagster_run_url(run_id)}


def _note(action: str) -> dict[str, str]:
    """The run's description with a clickable link to the Dagster run that did `action` (none outside one)."""
    tags = dagster_tags()
    if not tags:
        return {}
    return {NOTE_TAG: f"{action} by Dagster run [{tags[DAGSTER_RUN_TAG]}]({tags[DAGSTER_URL_TAG]})."}


def hardware(uses_torch: bool = True) -> dict[str, str]:
    """CPU model and count, platform and, for a training on torch, the device torch gets and its thread count.

    torch is imported here rather than looked up: a run records its hardware when it opens, before the trainer
    imports torch, so a lookup always found none. Every rag.training run uses torch (a LightGBM ranker's features
    come from the production embedder); `uses_torch=False` is for one that does not."""
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    out = {
        "hardware.cpu": cpu or "unknown",
        "hardware.cpus": str(os.cpu_count()),
        "hardware.platform": platform.platform(),
        "hardware.python": sys.version.split()[0],
    }
    if not uses_torch:
        return {**out, "hardware.gpu": "not used (no torch in this training)"}
    import torch

    cuda = torch.cuda.is_available()
    out["hardware.gpu"] = torch.cuda.get_device_name(0) if cuda else "none (CPU)"
    out["hardware.torch_threads"] = str(torch.get_num_threads())
    return out


def code_version() -> dict[str, str]:
    """The commit the code ran from, and whether the checkout had uncommitted changes (absent outside a checkout)."""
    repo = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if commit.returncode != 0:
        return {}
    return {"git.commit": commit.stdout.strip(), "git.dirty": str(bool(dirty.stdout.strip()))}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {f"lib.{name}": v for name, v in library_versions().items()}
    for pkg in ("lightgbm", "mlflow"):
        with contextlib.suppress(PackageNotFoundError):
            out[f"lib.{pkg}"] = version(pkg)
    return out


@contextlib.contextmanager
def training_run(
    registry: ModelRegistry,
    kind: str,
    *,
    seed: int | None,
    training_data_hash: str,
    qa_set_version: str,
    strategy: str,
    base_model: str,
    uses_torch: bool = True,
) -> Iterator[str]:
    """An MLflow run around one training, in the kind's experiment: its id is yielded; the run ends FINISHED, or
    FAILED when the block raises (the run stays, with what went in, for the post-mortem). `uses_torch`: see
    hardware()."""
    client = registry.mlflow_client()
    tags = {
        "rag.kind": kind,
        "seed": str(seed),
        "training_data_hash": training_data_hash,
        "qa_set_version": qa_set_version,
        "strategy": strategy,
        "base_model": base_model,
        **_versions(),
        **hardware(uses_torch),
        **code_version(),
        **dagster_tags(),
        **_note(f"Trained {kind}"),
    }
    run = client.create_run(
        registry.experiment_id(kind),
        run_name=f"train {kind} {datetime.now(UTC):%Y-%m-%d %H:%M}",
        tags={k: str(v)[:MAX_TAG] for k, v in tags.items()},
    )
    run_id = run.info.run_id
    try:
        yield run_id
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def log_training(
    registry: ModelRegistry, run_id: str, run, hyperparameters: dict, data_summary: dict | None = None
) -> None:
    """Parameters, the trainer's step metrics (rag.training's TrainingRun.log_history: loss, learning rate and the
    selection evaluations per step, or a learned ranker's selection nDCG per boosting round) and the run summary."""
    from mlflow.entities import Metric, Param, RunTag

    client = registry.mlflow_client()
    params = [
        Param(key(k), (v if isinstance(v, str) else json.dumps(v, default=str))[:MAX_PARAM])
        for k, v in sorted(hyperparameters.items())
    ]
    now = int(time.time() * 1000)
    metrics = []
    for i, entry in enumerate(getattr(run, "log_history", None) or []):
        step = int(entry.get("step", i))
        metrics += [
            Metric(key(k), value, now, step)
            for k, v in entry.items()
            if k != "step" and (value := _number(v)) is not None
        ]
    summary = {**(run.summary or {}), **{f"data.{k}": v for k, v in (data_summary or {}).items()}}
    metrics += [Metric(key(k), value, now, 0) for k, v in summary.items() if (value := _number(v)) is not None]
    tags = [RunTag(key(k), str(v)[:MAX_TAG]) for k, v in summary.items() if _number(v) is None and v is not None]
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start : start + 100])
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])
    if tags:
        client.log_batch(run_id, tags=tags[:100])


def _gate_run(registry: ModelRegistry, mv: ModelVersion) -> str:
    """The run a version's verdicts go to: the one that trained it, else one made for its gate (named in a tag)."""
    current = registry.resolve(mv.kind, mv.version) or mv
    if current.run_id:
        return current.run_id
    if current._tags.get(GATE_RUN_TAG):
        return current._tags[GATE_RUN_TAG]
    client = registry.mlflow_client()
    tags = {"rag.kind": mv.kind, "rag.version": mv.name, **dagster_tags(), **_note(f"Gated {mv.name}")}
    run_id = client.create_run(registry.experiment_id(mv.kind), run_name=f"gate {mv.name}", tags=tags).info.run_id
    client.set_terminated(run_id)
    client.set_model_version_tag(MODEL_NAME[mv.kind], mv.version[1:], GATE_RUN_TAG, run_id)
    return run_id


def record_gate(registry: ModelRegistry, mv: ModelVersion, verdict: dict, result=None) -> str:
    """The gate's verdict on `mv` in MLflow: its figures as metrics (gate.*), outcome and reasons as tags, the whole
    verdict and the per-question scores (rag.training.gate.GateResult.per_question, both models on every decisive
    question) as artifacts under gate/<time>/. Returns the run it went to."""
    from mlflow.entities import Metric, RunTag

    client = registry.mlflow_client()
    run_id = _gate_run(registry, mv)
    now = int(time.time() * 1000)
    metrics = [Metric(key(f"gate.{k}"), value, now, 0) for k, v in verdict.items() if (value := _number(v)) is not None]
    tags = [
        RunTag(key(f"gate.{k}"), str(verdict[k])[:MAX_TAG])
        for k in (
            "outcome",
            "passed",
            "against",
            "production_version",
            "candidate_version",
            "qa_set_version",
            "reasons",
        )
        if verdict.get(k) is not None
    ]
    tags += [RunTag(k, v) for k, v in dagster_tags("gate.").items()]  # the Dagster run that gated it
    client.log_batch(run_id, metrics=metrics[:1000], tags=tags)
    folder = f"gate/{datetime.now(UTC):%Y%m%dT%H%M%S}"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "verdict.json").write_text(json.dumps(verdict, indent=2, default=str))
        views = [result, getattr(result, "other", None)] if result is not None else []
        rows = {
            view.lists: view.per_question.to_dict("records")
            for view in views
            if view is not None and getattr(view, "per_question", None) is not None
        }
        if rows:
            (Path(tmp) / "per_question.json").write_text(
                json.dumps({"decided_on": result.lists, "lists": rows}, indent=2, default=str)
            )
        client.log_artifacts(run_id, tmp, folder)
    return run_id


def run_url(registry: ModelRegistry, mv: ModelVersion) -> str | None:
    """Where the version's run shows in the MLflow UI (mlflow_ui_url); None for a version without a run or a store
    without a UI."""
    current = registry.resolve(mv.kind, mv.version) or mv
    run_id = current.run_id or current._tags.get(GATE_RUN_TAG)
    base = mlflow_ui_url(registry)
    if run_id is None or base is None:
        return None
    experiment = registry.mlflow_client().get_run(run_id).info.experiment_id
    return f"{base}/#/experiments/{experiment}/runs/{run_id}"


def mlflow_ui_url(registry: ModelRegistry) -> str | None:
    """The one MLflow UI address links use: RAG_MLFLOW_UI_URL, else an http(s) tracking server's own, else `make
    mlflow`'s for the embedded store (rag.registry.backend.ui_url)."""
    return ui_url(registry.tracking_uri, registry.embedded)
