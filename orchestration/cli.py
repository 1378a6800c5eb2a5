"""The `rag` command: library commands plus the ones that drive Dagster (demo, strategy sync, instance config)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestration.launch import cli_instance, sync_partitions
from rag.cli import add_library_commands, run_command

if TYPE_CHECKING:
    from dagster import DagsterInstance

    from orchestration.partitions import StrategyBackfill

# The instance settings `make dev` and `make demo` use: one run at a time holds the embedded Qdrant folder.
SHIPPED_INSTANCE = Path(__file__).resolve().parents[1] / "deploy" / "dagster-local.yaml"
# The job that materializes each asset of a StrategyBackfill; the others come with the job of the one before them.
JOB_OF = {
    "parsed_documents": "ingest_documents_job",
    "synthetic_qa": "synthetic_qa_job",
    "chunk_sets": "chunk_sets_job",
    "embedding_collections": "embedding_collections_job",
    "retrieval_evaluation": "retrieval_evaluation_job",
    "evaluation_summary": "evaluation_summary_job",
}
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def top_level_blocks(text: str) -> dict[str, str]:
    """A YAML file's top-level keys, each with its text (comments inside it kept), in file order."""
    blocks: dict[str, str] = {}
    key = None
    for line in text.splitlines(keepends=True):
        match = re.match(r"([A-Za-z_][\w-]*):", line)
        if match:
            key = match.group(1)
            blocks[key] = ""
        if key is not None:
            blocks[key] += line
    return blocks


def install_instance_config(home: Path | None = None) -> list[str]:
    """Add the top-level keys of deploy/dagster-local.yaml that $DAGSTER_HOME/dagster.yaml lacks (a key the file
    already sets is the operator's and stays as it is). Returns the keys added."""
    import yaml

    from rag.store import data_dir

    home = home or Path(os.environ.setdefault("DAGSTER_HOME", str(data_dir() / "dagster")))
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    text = config.read_text() if config.exists() else ""
    present = yaml.safe_load(text) or {}
    missing = {k: block for k, block in top_level_blocks(SHIPPED_INSTANCE.read_text()).items() if k not in present}
    if missing:
        added = "".join(block.rstrip("\n") + "\n\n" for block in missing.values())
        config.write_text(text + ("" if not text or text.endswith("\n") else "\n") + added)
    return list(missing)


def instance_note(home: Path) -> str | None:
    """What to change when the instance's own concurrency settings let two runs open the embedded Qdrant folder."""
    import yaml

    config = yaml.safe_load((home / "dagster.yaml").read_text()) or {}
    pools = (config.get("concurrency") or {}).get("pools") or {}
    if os.environ.get("QDRANT_URL") or (pools.get("granularity") == "run" and pools.get("default_limit") == 1):
        return None
    return (
        f"note: {home / 'dagster.yaml'} sets its own `concurrency`, without `pools: {{granularity: run, "
        "default_limit: 1}}`: runs opening the embedded Qdrant folder may meet and fail with QdrantLockedError "
        f"(see {SHIPPED_INSTANCE.relative_to(SHIPPED_INSTANCE.parents[1])})"
    )


def prepared_instance() -> tuple[DagsterInstance, list[str]]:
    """The CLI's instance, with the shipped settings added and the Qdrant pool's limit stored. Dagster stores a
    pool's default limit only once it dequeues a run of that pool: two such runs queued in that same pass both
    start (and the second fails with QdrantLockedError), so the limit is stored before any run is queued."""
    from resources.qdrant import QDRANT_POOL

    added = install_instance_config()
    instance = cli_instance()
    instance.event_log_storage.initialize_concurrency_limit_to_default(QDRANT_POOL)
    return instance, added


def cmd_instance_config(args: argparse.Namespace) -> int:
    instance, added = prepared_instance()
    home = Path(instance.root_directory)
    print(f"{home / 'dagster.yaml'}: " + (f"added {', '.join(added)}" if added else "nothing to add"))
    note = instance_note(home)
    if note:
        print(note, file=sys.stderr)
    return 0


def sync_models(instance: DagsterInstance) -> dict[str, list[str]]:
    """The embedding_model partitions made exactly the indexed models (orchestration.partitions.indexed_models)."""
    from dagster import AddDynamicPartitionsRequest

    from orchestration.partitions import apply_partition_requests, indexed_models, model_partition_requests
    from rag.registry import ModelRegistry
    from resources.models import EmbeddingModels
    from resources.storage import DataStore

    models = indexed_models(ModelRegistry(DataStore().root / "models"), EmbeddingModels().active())
    requests = model_partition_requests(instance, models)
    apply_partition_requests(instance, requests)
    added = [k for r in requests if isinstance(r, AddDynamicPartitionsRequest) for k in r.partition_keys]
    removed = [k for r in requests if not isinstance(r, AddDynamicPartitionsRequest) for k in r.partition_keys]
    return {"models": models, "added": added, "removed": removed}


def materialize(instance: DagsterInstance, plan: StrategyBackfill) -> int:
    """Run the plan's jobs here, upstream first, printing each; a strategy whose chunk set fails (or fails its
    blocking check) is not indexed. Returns the number of failed runs."""
    from orchestration.launch import run_job

    failures, broken = 0, set()
    for asset, partition in plan.asset_partitions():
        strategy = partition if asset == "chunk_sets" else getattr(partition, "keys_by_dimension", {}).get("strategy")
        if asset not in JOB_OF or strategy in broken:
            continue
        ok = run_job(instance, JOB_OF[asset], partition_key=partition, run_config=QUIET).success
        where = f" [{partition}]" if partition else ""
        print(f"  {asset}{where}: {'materialized' if ok else 'FAILED (see dagster logs)'}")
        failures += 0 if ok else 1
        if not ok and asset == "chunk_sets":
            broken.add(strategy)
    return failures


def cmd_sync(args: argparse.Namespace) -> int:
    from orchestration.partitions import StrategyBackfill, strategies_to_build
    from rag.chunking import strategy_fingerprint
    from resources.chunking import ChunkingStrategies
    from resources.storage import DataStore

    instance, _ = prepared_instance()
    added = sync_partitions(instance)
    print(f"chunking_strategy: added {', '.join(added['chunking_strategy']) or 'nothing (all present)'}")
    models = sync_models(instance)
    new_models = [*added["embedding_model"], *models["added"]]
    print(
        f"embedding_model: {', '.join(models['models'])} (added {', '.join(new_models) or 'nothing'}; removed "
        f"{', '.join(models['removed']) or 'nothing'}: models that neither serve, run a canary nor are active)"
    )
    if not args.materialize:
        return 0
    fingerprints = {name: strategy_fingerprint(cfg) for name, cfg in ChunkingStrategies().strategies().items()}
    todo = strategies_to_build(instance, fingerprints, tables=DataStore().tables)
    if not todo:
        print("every chunk set is built with its strategy's current parameters: nothing to materialize")
        return 0
    plan = StrategyBackfill.of(instance, todo, models["models"])
    print(f"materializing: {plan.describe()}")
    return 1 if materialize(instance, plan) else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestration.demo import run_demo

    return run_demo(prepared_instance()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rag", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_library_commands(sub)
    s = sub.add_parser(
        "sync-strategies",
        help="add partitions for new strategies (chunking YAML); keep model partitions to the models that serve, "
        "run a canary or are active",
    )
    s.add_argument(
        "--materialize",
        action="store_true",
        help="also build what is missing now: chunks, BM25, collections of those models, evaluation, summary",
    )
    s.set_defaults(func=cmd_sync)
    d = sub.add_parser("demo", help="materialize the whole asset graph on the document source and summarize")
    d.set_defaults(func=cmd_demo)
    i = sub.add_parser(
        "instance-config",
        help=f"add {SHIPPED_INSTANCE.name}'s settings (one run at a time on the embedded Qdrant) to "
        "$DAGSTER_HOME/dagster.yaml",
    )
    i.set_defaults(func=cmd_instance_config)
    from orchestration.retrain_cli import add_retrain_command

    add_retrain_command(sub)
    # `rag serve` (feedback loop): the API and web page.
    from rag.serving.cli import add_serve_command

    add_serve_command(sub)
    args = parser.parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
