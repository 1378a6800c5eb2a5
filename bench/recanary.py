"""A canary rerun on a finished bench/self_improvement.py run: the same trained candidate, the same simulated users
(the run's users' questions, click model and seed), today's code. For what changed since that run in how a canary
serves and decides, without retraining: e.g. the learned ranker's warm-up (the SciFact run's reranker canary was
rolled back by the latency guardrail after 51 queries) and the harm test (CanarySettings.rollback_alpha).

1. The run's data dir is copied (--work-dir, emptied first), so the finished run stays as it was and this can be
   repeated.
2. The candidate's canary starts through rag.lifecycle.rollout.start, the step start_canary_job runs: its gate
   verdict from that run stands, as production has not moved since (the start refuses otherwise).
3. The users ask through the API with the defaults `rag serve` uses, one fresh session per question, until
   canary_sensor decides (bench.lib.canary.users_decide: the sensor and its promote or rollback job run in-process).
   The users start their question list afresh, so the order differs from the run's own canary.

What the candidate serves people is not measured again: the run's result file holds it (candidates_served).

    .venv/bin/python bench/recanary.py --data-dir /tmp/self-improvement-scifact-XXXX \\
        --run-result bench/results/self-improvement-scifact.json --kind reranker

Writes bench/results/recanary-<corpus>-<kind>.json (arguments, commit, date, machine); asserts nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from bench.lib import cli
from bench.lib.canary import STRATEGY, load_corpus, split_users, users_decide
from bench.lib.datasets import RESULTS
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import log, write


def main() -> int:
    p = cli.parser(__doc__)
    p.add_argument("--data-dir", type=Path, required=True, help="the finished self_improvement run's data dir")
    p.add_argument("--run-result", type=Path, required=True, help="that run's result JSON")
    p.add_argument("--kind", choices=["embedder", "reranker"], required=True)
    p.add_argument("--candidate", help="version or name (default: the candidate that run canaried for --kind)")
    p.add_argument("--work-dir", type=Path, help="where the copy goes (default: a new temporary folder)")
    cli.add_output(p)
    args = p.parse_args()
    run = json.loads(args.run_result.read_text())
    (corpus, figures), *_ = run["corpora"].items()
    before = next((c for c in figures.get("canaries", []) if c["kind"] == args.kind), None)
    if before is None and not args.candidate:
        print(f"{args.run_result} ran no {args.kind} canary: name one with --candidate")
        return 2
    out_path = args.json or RESULTS / f"recanary-{corpus}-{args.kind}.json"
    record = run_record(args)
    # The truth the canary is judged against: the candidate served on the run's scored human questions, paired.
    served = next(
        (c for label, c in figures.get("candidates_served", {}).items() if label.startswith(f"{args.kind} ")), None
    )
    record |= {
        "corpus": corpus,
        "run_commit": run.get("commit"),
        "run_canary": before,
        "candidate_served": served and {"versions": served["versions"], **served["paired_vs_before_training"]},
    }

    root = args.work_dir or Path(tempfile.mkdtemp(prefix=f"recanary-{corpus}-"))
    source, target = args.data_dir.resolve(), root.resolve()
    if source == target or source in target.parents or target in source.parents:
        print(f"--work-dir {root} overlaps --data-dir {args.data_dir}: it is emptied first, so give a folder apart")
        return 2
    shutil.rmtree(root, ignore_errors=True)
    t = time.perf_counter()
    shutil.copytree(args.data_dir, root)
    log(f"copied {args.data_dir} to {root} in {time.perf_counter() - t:.0f} s")
    os.environ["RAG_DATA_DIR"] = str(root)  # the rollout resource and the serving defaults read the data dir
    record["outcome"] = rerun(root, corpus, run["args"], args, before)
    write(stamp_end(record), out_path)
    print(json.dumps({k: record["outcome"].get(k) for k in ("start", "canaries")}, indent=1)[:4000])
    return 0


def rerun(root: Path, corpus: str, run_args: dict, args, before: dict | None) -> dict:
    from dagster import DagsterInstance

    from rag.evaluation.qaset import Relevance, qrels_for_chunks
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.lifecycle.rollout import start
    from rag.lifecycle.target import ServingTarget
    from rag.registry import ModelRegistry
    from rag.store import CHUNKS_TABLE, TableStore
    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore

    ran = SimpleNamespace(**run_args)
    _, items = load_corpus(corpus, ran)
    chunks = TableStore(root / "tables").read(CHUNKS_TABLE, STRATEGY)
    all_qrels = qrels_for_chunks(items, chunks, Relevance())
    users_items, _ = split_users(items, ran.users_share, ran.seed)

    registry = ModelRegistry(root / "models")
    candidate = args.candidate or before["candidate_version"]
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    # An embedder's collections as start_canary_job builds them (already there from the run: nothing is re-embedded).
    target = ServingTarget(TableStore(root / "tables"), lambda: get_client(qdrant)) if args.kind == "embedder" else None
    state = start(
        args.kind,
        registry,
        candidate=candidate,
        traffic_share=ran.canary_share,
        target=target,
        approved_by="bench/recanary.py",
        log=lambda m: log(f"  {m}"),
    )
    close_client(qdrant)  # the API's replica and the sensor's jobs open the folder themselves
    out: dict = {"start": {"candidate_version": state.candidate_version, "reason": state.reason}}
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", [STRATEGY])
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "qdrant": QdrantResource(path=str(root / "qdrant")),
        "rollout": Rollout(promotion="auto", traffic_share=ran.canary_share),
        "feedback_loop": FeedbackLoop(data_dir=str(root)),
    }
    # Sessions (and the feedback idempotency keys made from them) named apart from the run's own users'.
    users_decide(
        root, users_items, all_qrels, instance, resources, ran, save_into=out, strategy=STRATEGY, session_prefix="r"
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
