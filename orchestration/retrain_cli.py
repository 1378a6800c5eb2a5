"""`rag retrain`: launch retrain_job as the feedback sensors request it, then print each trained model's gate
report and what changed. It drives Dagster, so it lives here, not in rag/ (rag.registry.cli has the rest of the
model commands and the report it prints)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from rag.registry import KINDS
from rag.registry.cli import _print_changes, _registry, gate_report, snapshot


def add_retrain_command(sub) -> None:
    rt = sub.add_parser(
        "retrain",
        help="run retrain_job (fine-tune → gate → release) as the feedback sensors request it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Launch retrain_job, the job feedback_volume_sensor, drift_sensor and weekly_retrain request:\n"
        "the feedback store is exported first (a versioned RAG-Dataset under <data dir>/feedback_dataset/) and\n"
        "handed to finetuned_embedder and trained_reranker, so users' ratings become positives and hard negatives.\n"
        "Each candidate is gated against production; what passes is released by the rollout resource's policy\n"
        "(RAG_PROMOTION_POLICY: 'auto', the default, promotes a significant gain and starts a canary for a\n"
        "candidate found no worse; 'direct' only promotes; 'canary' always starts a canary). Refused while a\n"
        "canary runs: its online test decides first (or `rag models rollout rollback --kind K` ends it).\n\n"
        "Default: the run executes in this process (execute_in_process with the repository's Definitions and\n"
        "resources) on the Dagster instance under $DAGSTER_HOME (default <data dir>/dagster), tagged with the\n"
        "code location so `dagster dev` lists it under retrain_job; the aliases and versions it changed are\n"
        "printed at the end. Training takes minutes.\n"
        "--print-command: export the dataset, then print the `dagster job launch` line that launches the same\n"
        "run on a running Dagster deployment instead (nothing is trained).",
    )
    rt.add_argument("--print-command", action="store_true", help="print the `dagster job launch` line; do not run")
    rt.add_argument("--no-feedback", action="store_true", help="train on the QA set only (no feedback export)")
    rt.set_defaults(func=cmd_retrain)


def _retrain_request(no_feedback: bool):
    """(run_config, tags) as feedback_volume_sensor builds them (sensors.feedback.retrain_request), or without the
    feedback dataset; refused while a canary runs, as the sensors wait then."""
    from resources.feedback import FeedbackLoop
    from sensors.feedback import TRAINING_ASSETS, canary_running, retrain_request

    loop = FeedbackLoop()
    waiting = canary_running(loop)
    if waiting:
        raise ValueError(f"not retraining: {waiting}. Roll it back first (`rag models rollout rollback`) or wait")
    if no_feedback:
        config = {"ops": {name: {"config": dict(loop.retrain_run_config)} for name in TRAINING_ASSETS}}
        return (config if loop.retrain_run_config else {}), {"trigger": "cli"}
    store = loop.store()
    try:
        request, _ = retrain_request(loop, store, reason="cli", run_key=None)
    finally:
        store.close()
    folder = Path(next(iter(request.run_config["ops"].values()))["config"]["feedback_dataset"])
    stats = json.loads((folder / "stats.json").read_text())
    print(
        f"exported the feedback dataset to {folder} ({stats['queries']} queries, {stats['feedback_events']} feedback "
        f"events, version {stats['version']})",
        file=sys.stderr,
    )
    return request.run_config, request.tags


def cmd_retrain(args: argparse.Namespace) -> int:
    from orchestration.launch import cli_instance
    from orchestration.training import retrain_job

    run_config, tags = _retrain_request(args.no_feedback)
    instance = cli_instance()  # sets DAGSTER_HOME (default <data dir>/dagster) for the printed command too
    if args.print_command:
        import os

        workspace = Path(__file__).resolve().parents[1] / "workspace.yaml"
        command = ["dagster", "job", "launch", "-w", str(workspace), "-j", retrain_job.name]
        if run_config:
            command += ["--config-json", json.dumps(run_config, sort_keys=True)]
        command += ["--tags", json.dumps(tags, sort_keys=True)]
        print(f"DAGSTER_HOME={shlex.quote(os.environ['DAGSTER_HOME'])} {shlex.join(command)}")
        return 0
    from orchestration.launch import run_job
    from sensors.feedback import active_retrain

    running = active_retrain(instance)
    if running:
        raise ValueError(f"not retraining: retrain run {running} is in progress")
    registry = _registry()
    before = snapshot(registry)
    result = run_job(instance, retrain_job.name, run_config=run_config, tags=tags)
    print(
        f"{retrain_job.name} run {result.run_id}: "
        f"{'succeeded' if result.success else 'FAILED (see its logs in dagster dev)'}"
    )
    for kind in KINDS:
        for mv in registry.versions(kind):
            if mv.version not in before[kind]["versions"]:
                print("\n".join(gate_report(registry, mv)))
    _print_changes(registry, before)
    return 0 if result.success else 1
