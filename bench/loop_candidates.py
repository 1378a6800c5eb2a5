"""Would any model the loop trained have served people better, or worse? Every reranker a finished `bench/loop.py`
run registered, served as its canary arm is (the run's production answerer with it in place), and every embedder
whose collection a canary built, served from it, scored on that run's test split and paired against the untrained
default. An oracle view that decides nothing: it tells a learner that made no gain from a gate or a canary that missed
one, and a harmful update from one that was not harmful. `bench/loop.py` records the same view at the end of new runs
(`rerankers_on_test`, `embedders_on_test`); this script reads a run that finished before, from the work folder its
result file names.

    .venv/bin/python bench/loop_candidates.py --result bench/results/loop-scifact-reranker+configuration.json

Writes bench/results/<that result's name>-rerankers-on-test.json where the run trained rerankers only, else
<name>-candidates-on-test.json (arguments, commit, date, machine, the source result with its commit). Refused where
the run promoted anything: its production is then no untrained default.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import log, write


def rescored(result: dict) -> dict:
    from fastapi.testclient import TestClient

    from bench.lib.loop import Judge, embedders_on_test, rerankers_on_test, served_app, served_versions
    from bench.lib.loop_data import load
    from rag.feedback import FeedbackStore
    from rag.registry import ModelRegistry
    from rag.store import TableStore

    corpus_record, run_args = result["corpus"], argparse.Namespace(**result["args"])
    work = Path(corpus_record["work_dir"])
    root = work / "data"
    if not (root / "tables").is_dir():
        raise SystemExit(f"{work}: the run's work folder is gone; run bench/loop.py again (it records this view)")
    os.environ["RAG_DATA_DIR"] = str(root)
    registry = ModelRegistry(root / "models")
    if any(served_versions(registry).values()):
        raise SystemExit(f"the run promoted {served_versions(registry)}: its production is no untrained default")
    corpus = load(run_args.corpus, work / "rescored", run_args)  # the run's split: same seed, same questions
    judge = Judge(TableStore(root / "tables"), corpus.test)
    store = FeedbackStore(root=root)
    app = served_app(root, store)
    with TestClient(app):
        default = judge.score(app.state.serving.current())["scores"]
        log(f"untrained default: {default}")
        rows = rerankers_on_test(app, judge, registry)
        embedders = embedders_on_test(app, judge, registry) if registry.versions("embedder") else []
    for row in rows + embedders:
        log(f"{row['name']}: {row['scores'] or row.get('not_scored')}")
    out = {"untrained_default": default, "rerankers_on_test": rows, "test_questions": len(corpus.test)}
    return out | ({"embedders_on_test": embedders} if embedders else {})


def main() -> int:
    p = cli.parser(__doc__)
    p.add_argument("--result", type=Path, required=True, help="a finished bench/loop.py result file")
    cli.add_output(
        p, flags=("--out",), help="result JSON (default: bench/results/<its name>-{rerankers,candidates}-on-test.json)"
    )
    args = p.parse_args()
    source = json.loads(args.result.read_text())
    record = run_record(args)
    record["source"] = {"file": args.result.name, "commit": source.get("commit"), "date": source.get("date")}
    record["corpus"] = {"corpus": source["corpus"]["corpus"], "headline": source["corpus"].get("headline")}
    record["corpus"] |= rescored(source)
    which = "candidates" if record["corpus"].get("embedders_on_test") else "rerankers"
    out = args.out or RESULTS / f"{args.result.stem}-{which}-on-test.json"
    write(stamp_end(record), out, indent=2, default=str)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
