"""The argument parser every benchmark script starts from, and the options most of them take.

The option names and destinations are those the result files already record under "args": a script keeps its own
spelling (--json or --out) by passing it to `add_output`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.lib.datasets import SCIFACT


def parser(doc: str | None, *, summary_only: bool = False) -> argparse.ArgumentParser:
    """A parser whose --help shows the script's docstring as written (or its first paragraph with `summary_only`)."""
    if summary_only:
        return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_output(
    p: argparse.ArgumentParser,
    default: Path | None = None,
    flags: tuple[str, ...] = ("--json", "--out"),
    help: str | None = None,
) -> None:
    """Where the result JSON goes; the destination is the first flag's name (what the result files record)."""
    p.add_argument(
        *flags,
        dest=flags[0].lstrip("-").replace("-", "_"),
        type=Path,
        default=default,
        help=help or (f"result JSON (default {default})" if default else "result JSON"),
    )


def add_seed(p: argparse.ArgumentParser, default: int = 0) -> None:
    p.add_argument("--seed", type=int, default=default)


def add_quick(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--quick", action="store_true", help=help)


def add_markdown(p: argparse.ArgumentParser) -> None:
    """--markdown FILE: print the table of an existing result file, measure nothing (provenance.rendered_or_skipped)."""
    p.add_argument("--markdown", type=Path, help="print the table of an existing result file and exit")


def add_scifact(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scifact", type=Path, default=SCIFACT, help="SciFact in BEIR layout (default %(default)s)")


def add_vectors_cache(p: argparse.ArgumentParser) -> None:
    """The SciFact passage vectors cache that edge.corpus_vectors fills (shared by the edge benches)."""
    p.add_argument("--cache", type=Path, help="corpus vectors cache (default <data dir>/bench/edge-latency)")
