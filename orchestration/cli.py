"""The `rag` command: library commands plus the ones that drive Dagster (demo, strategy sync)."""

from __future__ import annotations

import argparse
import sys

from orchestration.launch import cli_instance, sync_partitions
from rag.cli import add_library_commands, run_command


def cmd_sync(args: argparse.Namespace) -> int:
    instance = cli_instance()
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

    return run_demo(cli_instance())


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
