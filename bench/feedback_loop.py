"""The feedback loop end to end on SciFact, driven by the sensor (no manual step):

1. a SciFact slice is indexed; a QA set of inverse-cloze pseudo-queries stands in for synthetic_qa; the base
   MiniLM is registered and deployed as production (v1, serving alias <strategy>__production);
2. SciFact **train** queries are asked through the API (`/ask`, model "production"); feedback derived from the
   train qrels is posted (`/feedback`: a retrieved relevant passage +1, every other retrieved passage -1);
3. after every batch, feedback_volume_sensor is evaluated (Dagster test utilities) until it requests a retrain;
   the requested run of retrain_job is executed in-process: fine-tune, gate, promote (only if the gate passes);
4. the API picks up the new index, and SciFact **test** nDCG@10 (dense, production) is compared before/after.

    nice -n 15 .venv/bin/python bench/feedback_loop.py [--train-queries 809] [--threshold 2800] [--max-steps 150]

A held-out 30 % of the rated questions (by text) never trains: it selects the checkpoint and, once there are 20 of
them, is what the gate scores (rag.training.data.training_data).

tests/test_feedback_loop.py runs the same loop at toy size.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import SCIFACT, absent
from bench.lib.feedback import (
    STRATEGY,
    TOKEN,
    USER_HEADER,
    ask_and_rate,
    build_slice,
    candidate_ndcg_at_10,
    deploy_base,
    gate_figures,
    ndcg_at_10,
    retrain_definitions,
)
from bench.lib.provenance import commit
from bench.lib.results import log


def run_loop(
    root: Path,
    *,
    n_train: int,
    n_test: int,
    n_distractors: int,
    n_pseudo: int,
    threshold: int,
    batch: int,
    training: dict,
    log=print,
) -> dict:
    from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context
    from fastapi.testclient import TestClient

    from rag.feedback import FeedbackStore
    from rag.registry import ModelRegistry
    from rag.serving.server import build_app
    from rag.serving.settings import ServeSettings
    from resources.feedback import FeedbackLoop
    from sensors.feedback import feedback_volume_sensor

    root = Path(root)
    started = time.perf_counter()
    data = build_slice(root, n_train=n_train, n_test=n_test, n_distractors=n_distractors, n_pseudo=n_pseudo)
    log(
        f"slice: {data['chunks']} abstracts, {len(data['train_queries'])} train / {len(data['test_queries'])} test "
        "queries, "
        f"{data['qa_items']} pseudo-queries in the QA set"
    )
    out: dict = {
        "chunks": data["chunks"],
        "train_queries": len(data["train_queries"]),
        "test_queries": len(data["test_queries"]),
        "threshold": threshold,
        "training": training,
        "ticks": [],
    }
    loop = FeedbackLoop(data_dir=str(root), volume_threshold=threshold, retrain_run_config=training)
    registry = ModelRegistry(root / "models")
    with DagsterInstance.ephemeral() as instance:
        out["deployed"] = deploy_base(root, instance)
        out["ndcg@10_before"] = ndcg_at_10(root, data["test_queries"], data["test_qrels"])
        log(f"deployed {out['deployed']}; test nDCG@10 before: {out['ndcg@10_before']:.4f}")
        store = FeedbackStore(root=root)
        app = build_app(
            ServeSettings(api_token=TOKEN, refresh_seconds=0, client_header=USER_HEADER),
            root=root,
            store=store,
            strategy=STRATEGY,
            model="production",
            mode="dense",
            k=10,
            top_k=10,
            attribution=False,
        )

        def tick():
            with build_sensor_context(instance=instance, resources={"feedback_loop": loop}) as context:
                return feedback_volume_sensor(context)

        request = None
        with TestClient(app) as http:
            events, served = 0, None
            queries = list(data["train_queries"].items())
            for start in range(0, len(queries), batch):
                for qid, question in queries[start : start + batch]:
                    n, served = ask_and_rate(http, qid, question, data["train_qrels"][qid])
                    events += n
                result = tick()
                if isinstance(result, SkipReason):
                    out["ticks"].append(result.skip_message)
                    continue
                assert isinstance(result, SensorResult) and result.run_requests
                request = result.run_requests[0]
                out["ticks"].append(f"RunRequest {request.run_key}")
                break
            out["served_before"], out["feedback_events"], out["queries_replayed"] = (
                served,
                events,
                min(start + batch, len(queries)),
            )
            log(
                f"{out['queries_replayed']} train queries replayed, {events} feedback events; sensor ticks: "
                f"{out['ticks']}"
            )
            if request is None:
                out["fired"] = False
                return out
            out["fired"] = True
            train_started = time.perf_counter()
            run = (
                retrain_definitions(root, loop)
                .resolve_job_def("retrain_job")
                .execute_in_process(
                    run_config=request.run_config, tags=request.tags, instance=instance, raise_on_error=False
                )
            )
            out["retrain_seconds"] = round(time.perf_counter() - train_started, 1)
            out["run_success"] = run.success
            out["gates"] = gate_figures(run)
            production = registry.resolve("embedder", "production")
            out["production_after"] = production.version if production else None
            log(
                f"retrain run {'succeeded' if run.success else 'failed'} in {out['retrain_seconds']} s; gates: "
                f"{out['gates']}; "
                f"production embedder now {out['production_after']}"
            )
            app.state.serving.refresh(force=True)
            out["served_after"] = ask_and_rate(
                http, "after", data["test_queries"][next(iter(data["test_queries"]))], None
            )[1]
            out["tick_after"] = tick().skip_message
        store.close()
        out["ndcg@10_after"] = ndcg_at_10(root, data["test_queries"], data["test_qrels"])
        candidate = registry.versions("embedder")[-1]
        if candidate.version != out["production_after"]:  # rejected: what it would have scored on the test queries
            out["rejected_candidate"] = candidate.name
            out["rejected_candidate_ndcg@10"] = candidate_ndcg_at_10(
                root, candidate.version, data["test_queries"], data["test_qrels"]
            )
            log(f"rejected candidate {candidate.name}: test nDCG@10 {out['rejected_candidate_ndcg@10']:.4f}")
        log(
            f"test nDCG@10 after: {out['ndcg@10_after']:.4f} (before {out['ndcg@10_before']:.4f}); next tick: "
            f"{out['tick_after']}"
        )
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def main() -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--train-queries", type=int, default=809, help="SciFact train queries to replay (809 = all)")
    parser.add_argument("--test-queries", type=int, default=150)
    parser.add_argument("--distractors", type=int, default=1000)
    parser.add_argument("--pseudo", type=int, default=600, help="inverse-cloze questions in the QA set")
    parser.add_argument(
        "--threshold",
        type=int,
        default=2800,
        help="feedback events that start a retrain (about 3.6 per replayed query)",
    )
    parser.add_argument("--batch", type=int, default=50, help="queries replayed between sensor ticks")
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--data-dir", type=Path, help="default: a temporary folder")
    cli.add_output(parser, flags=("--json",))
    args = parser.parse_args()
    if absent(SCIFACT, "SciFact in BEIR layout"):
        return 0
    import tempfile

    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"})
    with tempfile.TemporaryDirectory(prefix="feedback-loop-") as tmp:
        root = args.data_dir or Path(tmp)
        os.environ["RAG_DATA_DIR"] = str(root)  # "production" resolves through this data dir's registry
        training = {"max_steps": args.max_steps, "max_seq_length": 128, "batch_size": 32, "max_pairs": 4000}
        result = run_loop(
            root,
            n_train=args.train_queries,
            n_test=args.test_queries,
            n_distractors=args.distractors,
            n_pseudo=args.pseudo,
            threshold=args.threshold,
            batch=args.batch,
            training=training,
            log=log,
        )
    result = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **result,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
