"""The feedback loop with a gradual rollout, no manual step, on SciFact with simulated users.

Phase 1, retrain → canary → decision:
1. a SciFact slice is indexed and the base MiniLM deployed as production v1 (bench.lib.feedback: build_slice,
   deploy_base); SciFact TEST nDCG@10 is measured (dense, and served: see 6);
2. simulated users ask SciFact **train** queries through the API (`/ask` with a `session_id`, one fresh session per
   asked query, so the canary share applies per session) and react to what they are shown with the click model
   below (`/events` clicks, `/feedback` passage ratings);
3. after every batch feedback_volume_sensor ticks; its RunRequest's run of retrain_job is executed in-process
   (fine-tune, gate, and, under the rollout resource's policy promotion="canary", production_embedder STARTS A
   CANARY of the gate-passed candidate on --canary-share of sessions instead of promoting it);
4. the users keep asking train queries (the list reshuffled and re-used from the start when exhausted, always in
   fresh sessions); canary sessions see production's and the candidate's rankings team-draft interleaved;
   canary_sensor ticks after every batch and its promote_canary_job or rollback_canary_job runs in-process; the
   API refreshes;
5. retrain_job also trained and gated a reranker, which waited behind the embedder's canary (one canary at a time):
   canary_sensor now requests start_canary_job for it, the job runs in-process and the same users decide its canary;
6. TEST nDCG@10 is measured again, two ways: dense retrieval with the production embedder (the embedder's own
   gain), and what the API serves (`served`): the production embedder's dense top --first-stage-depth reordered by
   the production reranker (none before one is promoted), top 10 — the figure the loop's goal is judged on.

Phase 2, a deliberately worse candidate: a copy of today's production embedder with Gaussian noise on every weight
tensor (--worse-noise x the tensor's own standard deviation; its own test nDCG@10 is measured and recorded) is
registered and started as a canary by an operator's override (start(force_reason=...): it has no gate verdict);
the same users ask until canary_sensor decides. Goal: rolled back within 500 canary queries.

Click model (position-based examination, Craswell et al. 2008; parameters recorded in the result file): a user
examines the passage shown at rank r with probability r^-eta (--eta, default 0.7), independently per rank. An
examined passage that the train qrels mark relevant is clicked (POST /events) and rated +1 (POST /feedback) with
probability --p-relevant (default 1.0); an examined non-relevant passage is rated -1 with probability --p-negative
(default 0.1) and clicked without a rating with probability --p-click-noise (default 0.0). Nothing else is
rated, so the gate's user-judged questions hold a relevant passage and a few down-rated ones.

Offline gate under the canary policy: it only asks whether the candidate is no worse than production (neither
nDCG@10 nor MRR@10 significantly lower, nor lower by more than 0.02; recall@20 kept), because held-out feedback
questions favour production; the canary's online test must then show it is better before promote_canary_job runs.
--override-rejected: when even that gate rejects phase 1's candidate, an operator's override starts its canary
anyway (force_reason, recorded as canary_started_by); that is no longer the loop without a manual step.

Latency guardrail (--max-latency-ratio, product default 1.5, and the product's 25 ms allowance): each arm's own
ranking time (retrieve → rerank),
both timed back to back inside the same canary requests; the whole request (two rankings, and the candidate's
answerer starting with a cold passage-vector cache) is recorded as latency_p95_ms but not judged.

Caveat: the canary replays the train queries, 70 % of whose rated questions the candidate was trained on (the
other 30 % are the gate's held-out questions), so its online edge is larger than on unseen questions; the test
nDCG@10 is on SciFact test queries nobody asked.

    nice -n 15 .venv/bin/python bench/canary_loop.py --data-dir /tmp/canary --json bench/results/canary-scifact.json
    nice -n 15 .venv/bin/python bench/canary_loop.py --quick --data-dir /tmp/canary-quick
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import SCIFACT, absent
from bench.lib.feedback import (
    USER_HEADER,
    STRATEGY,
    TOKEN,
    answerer_ndcg_at_10,
    build_slice,
    candidate_ndcg_at_10,
    deploy_base,
    gate_figures,
    ndcg_at_10,
    retrain_definitions,
)
from bench.lib.canary import Users, add_click_model, canary_phase, click_model, queued_canaries
from bench.lib.provenance import commit
from bench.lib.results import log
from rag.rollout.drill import noisy_copy


def served_ndcg_at_10(app, queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> float:
    """Test nDCG@10 of what the API serves its production arm (the production reranker, none before one is
    promoted), on test queries nobody asked."""
    return answerer_ndcg_at_10(app.state.serving.current(), queries, qrels)[0]


def run(
    root: Path,
    *,
    n_train: int,
    n_test: int,
    n_distractors: int,
    n_pseudo: int,
    threshold: int,
    batch: int,
    canary_batch: int,
    training: dict,
    share: float,
    alpha: float,
    max_queries: int,
    max_latency_ratio: float,
    click: dict,
    worse_noise: float,
    first_stage_depth: int,
    max_canary_asked: int,
    seed: int,
    override_rejected: bool = False,
    log=print,
) -> dict:
    from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context
    from fastapi.testclient import TestClient

    from rag.feedback import FeedbackStore
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.registry import ModelRegistry
    from rag.lifecycle.rollout import history, read_state, running_canary, start
    from rag.lifecycle.target import ServingTarget
    from rag.serving.server import build_app
    from rag.serving.settings import ServeSettings
    from rag.store import TableStore
    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore
    from sensors.feedback import feedback_volume_sensor

    root = Path(root)
    started = time.perf_counter()
    data = build_slice(root, n_train=n_train, n_test=n_test, n_distractors=n_distractors, n_pseudo=n_pseudo, seed=seed)
    log(
        f"slice: {data['chunks']} abstracts, {len(data['train_queries'])} train / {len(data['test_queries'])} test "
        "queries"
    )
    out: dict = {
        "chunks": data["chunks"],
        "train_queries": len(data["train_queries"]),
        "test_queries": len(data["test_queries"]),
        "threshold": threshold,
        "training": training,
        "canary": {
            "traffic_share": share,
            "alpha": alpha,
            "max_queries": max_queries,
            "max_latency_p95_ratio": max_latency_ratio,
        },
        "phases": {},
    }
    loop = FeedbackLoop(data_dir=str(root), volume_threshold=threshold, retrain_run_config=training)
    rollout = Rollout(
        promotion="canary",
        traffic_share=share,
        alpha=alpha,
        max_queries=max_queries,
        max_latency_p95_ratio=max_latency_ratio,
    )
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "qdrant": QdrantResource(url=None, path=str(root / "qdrant")),
        "feedback_loop": loop,
        "rollout": rollout,
    }
    registry = ModelRegistry(root / "models")
    test = (data["test_queries"], data["test_qrels"])

    def forced_start(version: str, reason: str) -> None:
        """An operator's canary start over the gate (its collections built in the bench's embedded Qdrant)."""
        qdrant = QdrantSettings(path=str(root / "qdrant"))
        try:
            start(
                "embedder",
                registry,
                version,
                share,
                force_reason=reason,
                target=ServingTarget.of_client(TableStore(root / "tables"), get_client(qdrant), [STRATEGY]),
                log=lambda m: log(f"  {m}"),
            )
        finally:
            close_client(qdrant)

    with DagsterInstance.ephemeral() as instance:
        out["deployed"] = deploy_base(root, instance)
        out["ndcg@10_start"] = ndcg_at_10(root, *test)
        store = FeedbackStore(root=root)
        # Served as a user would configure the product: the production embedder's dense top --first-stage-depth,
        # reordered by the production reranker (none until one is promoted), the top 10 shown.
        app = build_app(
            ServeSettings(api_token=TOKEN, refresh_seconds=0, client_header=USER_HEADER),
            root=root,
            store=store,
            strategy=STRATEGY,
            model="production",
            mode="dense",
            k=first_stage_depth,
            top_k=10,
            reranker="production",
            attribution=False,
        )
        with TestClient(app) as http:
            out["served_ndcg@10_start"] = served_ndcg_at_10(app, *test)
            log(
                f"deployed {out['deployed']}; test nDCG@10 at the start: dense {out['ndcg@10_start']:.4f}, served "
                f"{out['served_ndcg@10_start']:.4f}"
            )
            users = Users(http, data["train_queries"], data["train_qrels"], seed=seed, **click)

            # Phase 1: feedback until the volume sensor fires, the retrain run, its canary, the canary's decision.
            phase: dict = {"ndcg@10_before": out["ndcg@10_start"], "ticks": []}
            phase_started, request = time.perf_counter(), None
            while request is None and users.passes <= 3:
                for _ in range(batch):
                    users.ask()
                with build_sensor_context(instance=instance, resources={"feedback_loop": loop}) as context:
                    result = feedback_volume_sensor(context)
                if isinstance(result, SkipReason):
                    phase["ticks"].append(result.skip_message)
                else:
                    assert isinstance(result, SensorResult) and result.run_requests
                    request = result.run_requests[0]
                    phase["ticks"].append(f"RunRequest {request.run_key}")
            phase["before_retrain"] = users.snapshot()
            log(f"{users.asked} queries asked, {users.stats}; last tick: {phase['ticks'][-1]}")
            if request is None:
                out["phases"]["retrain_canary"] = phase
                raise SystemExit("the feedback sensor never fired: lower --threshold")
            train_started = time.perf_counter()
            retrain = (
                retrain_definitions(root, loop, rollout)
                .resolve_job_def("retrain_job")
                .execute_in_process(
                    run_config=request.run_config, tags=request.tags, instance=instance, raise_on_error=False
                )
            )
            phase["retrain_seconds"] = round(time.perf_counter() - train_started, 1)
            phase["retrain_success"] = retrain.success
            phase["gates"] = gate_figures(retrain)
            phase["released"] = {
                e.asset_key.to_user_string(): {
                    k: v.value
                    for k, v in e.materialization.metadata.items()
                    if k in ("action", "summary", "production")
                }
                for e in retrain.get_asset_materialization_events()
                if e.asset_key.to_user_string() in ("production_embedder", "production_reranker")
            }
            phase["failed_steps"] = [e.step_key for e in retrain.all_events if e.is_step_failure]
            candidate = registry.versions("embedder")[-1]
            phase["candidate"] = candidate.name
            log(
                f"retrain run {'succeeded' if retrain.success else 'failed'} in {phase['retrain_seconds']} s; gates "
                f"{ {k: g['passed'] for k, g in phase['gates'].items()} }; released {phase['released']}; "
                f"failed steps {phase['failed_steps']}"
            )
            phase["canary_started_by"] = "retrain_job (promotion policy canary)" if running_canary(registry) else None
            if (
                phase["canary_started_by"] is None
                and override_rejected
                and candidate.metrics.get("gate", {}).get("passed") is False
            ):
                # Not the loop any more: an operator's override, so the online test of this candidate is measured too.
                log(
                    f"no canary started: the gate rejected {candidate.name}; --override-rejected starts it with "
                    "force_reason"
                )
                forced_start(
                    candidate.version,
                    "benchmark --override-rejected: the offline gate rejected it; measure the online decision",
                )
                phase["canary_started_by"] = "operator override (--override-rejected) after the gate rejected it"
            if phase["canary_started_by"] is not None:
                phase.update(
                    canary_phase(
                        root,
                        http,
                        app,
                        users,
                        instance,
                        resources,
                        batch=canary_batch,
                        max_asked=max_canary_asked,
                        log=log,
                    )
                )
                phase["queued_canaries"] = queued_canaries(
                    root, http, app, users, instance, resources, batch=canary_batch, max_asked=max_canary_asked, log=log
                )
            else:
                phase["decision"] = None
                log("no canary started (the gate did not pass, or the release step failed)")
            phase["production_after"] = registry.resolve("embedder", "production").name
            phase["ndcg@10_after"] = ndcg_at_10(root, *test)
            phase["reranker_production_after"] = mv.name if (mv := registry.resolve("reranker", "production")) else None
            phase["served_ndcg@10_after"] = served_ndcg_at_10(app, *test)
            if phase["production_after"] != candidate.name:
                phase["candidate_ndcg@10"] = candidate_ndcg_at_10(root, candidate.version, *test)
            else:
                phase["candidate_ndcg@10"] = phase["ndcg@10_after"]
            phase["seconds"] = round(time.perf_counter() - phase_started, 1)
            out["phases"]["retrain_canary"] = phase
            log(
                f"phase 1: production {phase['production_after']}, test nDCG@10 {phase['ndcg@10_before']:.4f} -> "
                f"{phase['ndcg@10_after']:.4f} (candidate {candidate.name}: {phase['candidate_ndcg@10']:.4f}); served "
                f"(reranker {phase['reranker_production_after']}) {out['served_ndcg@10_start']:.4f} -> "
                f"{phase['served_ndcg@10_after']:.4f}"
            )

            # Phase 2: a deliberately worse candidate, started over the gate, decided by the same users.
            worse_started = time.perf_counter()
            production = registry.resolve("embedder", "production")
            scratch = root / "worse-model"
            shutil.rmtree(scratch, ignore_errors=True)
            noisy_copy(Path(production.path), scratch, worse_noise, seed=seed)
            worse = registry.register(
                "embedder",
                scratch,
                {
                    "base_model": "minilm",
                    "strategy": STRATEGY,
                    "parent_version": production.version,
                    "note": f"benchmark: {production.name} + Gaussian noise {worse_noise} x each tensor's std",
                },
                move=True,
            )
            phase2: dict = {
                "candidate": worse.name,
                "noise": worse_noise,
                "production": production.name,
                "ndcg@10_before": ndcg_at_10(root, *test),
            }
            phase2["candidate_ndcg@10"] = candidate_ndcg_at_10(root, worse.version, *test)
            log(
                f"worse candidate {worse.name}: test nDCG@10 {phase2['candidate_ndcg@10']:.4f} "
                f"(production {phase2['ndcg@10_before']:.4f})"
            )
            forced_start(
                worse.version,
                "benchmark: a deliberately worse candidate (production + weight noise) to measure the rollback",
            )
            phase2.update(
                canary_phase(
                    root, http, app, users, instance, resources, batch=canary_batch, max_asked=max_canary_asked, log=log
                )
            )
            phase2["production_after"] = registry.resolve("embedder", "production").name
            phase2["ndcg@10_after"] = ndcg_at_10(root, *test)
            phase2["seconds"] = round(time.perf_counter() - worse_started, 1)
            out["phases"]["worse_candidate"] = phase2
            log(
                f"phase 2: {phase2.get('decision')} after {phase2.get('canary_queries')} canary queries "
                f"({phase2.get('decisive_canary_queries')} decisive); production {phase2['production_after']}"
            )
            out["users"] = users.snapshot()
            out["served_ndcg@10_end"] = served_ndcg_at_10(app, *test)
        store.close()
        out["rollout_log"] = [
            {k: e[k] for k in ("at", "kind", "step", "candidate", "from", "to", "reason")} for e in history(registry)
        ]
        out["final_state"] = {
            k: (s.stage if (s := read_state(registry, k)) else None) for k in ("embedder", "reranker")
        }
    out["ndcg@10_end"] = ndcg_at_10(root, *test)
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def main() -> int:
    parser = cli.parser(__doc__)
    cli.add_quick(parser, "toy sizes (minutes): mechanics, not figures")
    parser.add_argument(
        "--train-queries", type=int, default=809, help="SciFact train queries the users ask (809 = all)"
    )
    parser.add_argument("--test-queries", type=int, default=150)
    parser.add_argument("--distractors", type=int, default=1000)
    parser.add_argument("--pseudo", type=int, default=600, help="inverse-cloze questions in the QA set")
    parser.add_argument("--threshold", type=int, default=700, help="feedback events that start a retrain")
    parser.add_argument("--batch", type=int, default=50, help="queries asked between feedback-sensor ticks")
    parser.add_argument("--canary-batch", type=int, default=20, help="queries asked between canary-sensor ticks")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="embedder training steps of the retrain (default: the product's, one epoch)",
    )
    parser.add_argument(
        "--max-seq-length",
        type=int,
        default=None,
        help="training sequence length (default: the "
        "product's, the model's serving length; shorter trains faster on passages it then truncates)",
    )
    parser.add_argument(
        "--canary-share",
        type=float,
        default=0.5,
        help="share of sessions a canary serves (the product default is 0.1; 0.5 lets the run fit in time)",
    )
    parser.add_argument("--alpha", type=float, default=0.05, help="the sequential test's error rate")
    parser.add_argument("--max-queries", type=int, default=2000, help="canary horizon: rolled back when undecided")
    parser.add_argument(
        "--max-latency-ratio",
        type=float,
        default=1.5,
        help="latency guardrail: canary p95 at most this "
        "multiple of production's (product default 1.5). A canary request ranks twice and its answerer's "
        "sentence-embedding cache starts cold while production's is warm from the replayed queries; a "
        "large value leaves the decision to the sequential test",
    )
    parser.add_argument("--max-canary-asked", type=int, default=6000, help="cap on queries asked per canary phase")
    add_click_model(parser)
    parser.add_argument(
        "--first-stage-depth",
        type=int,
        default=50,
        help="dense hits the production reranker reorders "
        "before the top 10 are shown (without a reranker the top 10 are the dense top 10)",
    )
    parser.add_argument("--worse-noise", type=float, default=0.3, help="phase 2: weight noise x each tensor's std")
    parser.add_argument(
        "--override-rejected",
        action="store_true",
        help="phase 1: when the gate rejects the candidate, "
        "start its canary anyway with force_reason (an operator's step, recorded) to measure the online test",
    )
    cli.add_seed(parser)
    parser.add_argument("--data-dir", type=Path, help="default: a temporary folder (emptied first when given)")
    cli.add_output(parser, flags=("--json",))
    args = parser.parse_args()
    if absent(SCIFACT, "SciFact in BEIR layout"):
        return 0
    if args.quick:
        args.train_queries, args.test_queries, args.distractors, args.pseudo = 60, 30, 60, 120
        args.threshold, args.batch, args.canary_batch, args.max_steps = 40, 10, 10, 4
    import tempfile

    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"})
    os.environ.pop("QDRANT_URL", None)
    click = click_model(args)
    with tempfile.TemporaryDirectory(prefix="canary-loop-") as tmp:
        root = args.data_dir or Path(tmp)
        if args.data_dir:
            shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        os.environ["RAG_DATA_DIR"] = str(
            root
        )  # "production" and the candidate resolve through this data dir's registry
        # The product's retrain defaults (one epoch at the serving length, cached MNRL) with batch 32, the recipe
        # bench/training.py's ceiling stage measured on SciFact (+4.9 nDCG@10 from 730 qrels pairs); --quick shrinks it.
        training = {
            "max_steps": args.max_steps,
            "max_seq_length": args.max_seq_length if not args.quick else 64,
            "batch_size": 32 if not args.quick else 16,
            "max_pairs": 4000 if not args.quick else 300,
        }
        training = {k: v for k, v in training.items() if v is not None}
        result = run(
            root,
            n_train=args.train_queries,
            n_test=args.test_queries,
            n_distractors=args.distractors,
            n_pseudo=args.pseudo,
            threshold=args.threshold,
            batch=args.batch,
            canary_batch=args.canary_batch,
            training=training,
            share=args.canary_share,
            alpha=args.alpha,
            max_queries=args.max_queries,
            max_latency_ratio=args.max_latency_ratio,
            click=click,
            worse_noise=args.worse_noise,
            first_stage_depth=args.first_stage_depth,
            max_canary_asked=args.max_canary_asked,
            seed=args.seed,
            override_rejected=args.override_rejected,
            log=log,
        )
    result = {
        "bench": "bench/canary_loop.py",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "click_model": {
            "examination": "P(examine rank r) = r^-eta",
            **click,
            "relevant": "examined relevant passage: click + rating +1 with p_relevant",
            "non_relevant": "examined non-relevant passage: rating -1 with p_negative, else a click "
            "without rating with p_click_noise",
            "sessions": "one fresh session per asked query",
        },
        **result,
    }
    print(json.dumps(result, indent=2, default=str))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
