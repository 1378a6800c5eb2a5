"""The `rag` command: library commands plus the ones that drive Dagster (demo, strategy sync)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rag.cli import add_library_commands, run_command
from rag.store import data_dir


def _instance():
    """The persistent Dagster instance under the data dir, so `dagster dev` shows what the CLI ran."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(data_dir() / "dagster")))
    home.mkdir(parents=True, exist_ok=True)
    disable_telemetry(home / "dagster.yaml")
    from dagster import DagsterInstance

    return DagsterInstance.get()


def disable_telemetry(config: Path) -> None:
    """Telemetry off in the instance's dagster.yaml (which also drops Dagster's telemetry banner), unless the file
    already says either way."""
    import yaml

    text = config.read_text() if config.exists() else ""
    if "telemetry" not in (yaml.safe_load(text) or {}):
        config.write_text(text + ("" if not text or text.endswith("\n") else "\n") + "telemetry:\n  enabled: false\n")


def sync_partitions(instance) -> dict[str, list[str]]:
    """Add partitions for strategies in the chunking YAML and active models that have none yet."""
    from orchestration.partitions import chunking_strategy_partitions, embedding_model_partitions
    from resources.chunking import ChunkingStrategies
    from resources.models import EmbeddingModels

    added = {}
    for partitions, wanted in (
        (chunking_strategy_partitions, list(ChunkingStrategies().strategies())),
        (embedding_model_partitions, EmbeddingModels().active()),
    ):
        existing = set(instance.get_dynamic_partitions(partitions.name))
        new = [name for name in wanted if name not in existing]
        if new:
            instance.add_dynamic_partitions(partitions.name, new)
        added[partitions.name] = new
    return added


def cmd_sync(args: argparse.Namespace) -> int:
    instance = _instance()
    added = sync_partitions(instance)
    for name, new in added.items():
        print(f"{name}: added {', '.join(new) or 'nothing (all present)'}")
    if args.materialize and added["chunking_strategy"]:
        from orchestration.launch import run_job

        for name in added["chunking_strategy"]:
            ok = run_job(instance, "chunk_sets_job", partition_key=name).success
            print(f"  {name}: {'materialized' if ok else 'FAILED (see dagster logs)'}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestration.demo import run_demo

    return run_demo(_instance())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rag", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_library_commands(sub)
    s = sub.add_parser(
        "sync-strategies", help="add partitions for new strategies (chunking YAML) and active models (embedders YAML)"
    )
    s.add_argument("--materialize", action="store_true", help="also build the new partitions now")
    s.set_defaults(func=cmd_sync)
    d = sub.add_parser("demo", help="materialize the whole asset graph on the document source and summarize")
    d.set_defaults(func=cmd_demo)
    from orchestration.retrain_cli import add_retrain_command

    add_retrain_command(sub)
    # `rag serve` (feedback loop): the API and web page.
    from rag.serving.cli import add_serve_command

    add_serve_command(sub)
    args = parser.parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
