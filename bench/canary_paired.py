"""Paired test of what a finished bench/canary_loop.py run changed for users: per SciFact test query, nDCG@10 of the
ranking the API served at the start (base MiniLM v1, dense, no reranker) against the one it serves at the end
(the production embedder's dense top --first-stage-depth reordered by the production reranker, top 10), and the
embedder's share alone (the production embedder, dense, no reranker). Every ranking comes from rag.qa.Answerer.rank,
the code the API's production arm runs, over the run's own data dir (the start model's collection is kept after a
promotion, for rollbacks). The test queries are re-drawn from the loop's arguments (same seed, same counts), and the
means are checked against the loop's own result file. Writes its own JSON; asserts nothing.

    .venv/bin/python bench/canary_paired.py --data-dir /tmp/canary6 \\
        --loop-result bench/results/canary-scifact-reranker.json \\
        --json bench/results/canary-scifact-reranker-paired.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.feedback import STRATEGY, answerer_ndcg_at_10, slice_queries
from bench.lib.provenance import commit


def main() -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--data-dir", type=Path, required=True, help="the finished canary_loop run's --data-dir")
    parser.add_argument("--loop-result", type=Path, required=True, help="that run's result JSON")
    parser.add_argument("--start-model", default="ft-minilm-v1", help="the embedder served at the start")
    cli.add_output(parser, flags=("--json",))
    args = parser.parse_args()
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAG_DATA_DIR": str(args.data_dir)})
    os.environ.pop("QDRANT_URL", None)
    from rag.evaluation.metrics import paired_comparison
    from rag.index.qdrant import QdrantSettings, close_client
    from rag.qa import Answerer, AnswerSettings
    from rag.registry import ModelRegistry

    loop = json.loads(args.loop_result.read_text())
    loop_args = loop["args"]
    depth = int(loop_args.get("first_stage_depth", 50))
    _, test, _, test_q, _ = slice_queries(loop_args["train_queries"], loop_args["test_queries"], loop_args["seed"])
    queries, qrels = {q: test.queries[q] for q in test_q}, {q: test.qrels[q] for q in test_q}
    registry = ModelRegistry(args.data_dir / "models")
    production = {
        kind: (mv.name if (mv := registry.resolve(kind, "production")) else None) for kind in ("embedder", "reranker")
    }
    qdrant = QdrantSettings(path=str(args.data_dir / "qdrant"))
    common = {"strategy": STRATEGY, "mode": "dense", "k": depth, "top_k": 10, "attribution": False}
    arms = {
        "start": AnswerSettings(model=args.start_model, reranker=None, **common),
        "end_embedder_only": AnswerSettings(model="production", reranker=None, **common),
        "end_served": AnswerSettings(model="production", reranker="production", **common),
    }
    means, scores, opened = {}, {}, {}
    try:
        for name, settings in arms.items():
            # The two end arms search the same production index: opened (and its embedder loaded) once.
            answerer = Answerer(settings, root=args.data_dir, qdrant=qdrant, index=opened.get(settings.model))
            opened[settings.model] = answerer.index
            means[name], scores[name] = answerer_ndcg_at_10(answerer, queries, qrels)
            print(f"{name}: test nDCG@10 {means[name]:.4f}", flush=True)
    finally:
        close_client(qdrant)
    comparisons = {
        "served_end_vs_start": paired_comparison(scores["end_served"], scores["start"]),
        "embedder_only_vs_start": paired_comparison(scores["end_embedder_only"], scores["start"]),
        "reranker_on_end_embedder": paired_comparison(scores["end_served"], scores["end_embedder_only"]),
    }
    loop_figures = {
        "served_start": loop.get("served_ndcg@10_start"),
        "served_after_phase_1": loop["phases"]["retrain_canary"].get("served_ndcg@10_after"),
        "dense_after_phase_1": loop["phases"]["retrain_canary"].get("ndcg@10_after"),
    }
    for name, c in comparisons.items():
        print(
            f"{name}: {c['delta'] * 100:+.2f} points (95% CI {c['ci_low'] * 100:+.2f} .. {c['ci_high'] * 100:+.2f}, "
            f"p {c['p_value']:.4f}; better {c['better']} / tied {c['tied']} / worse {c['worse']})"
        )
    result = {
        "bench": "bench/canary_paired.py",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "commit": commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loop_commit": loop.get("commit"),
        "production": production,
        "first_stage_depth": depth,
        "test_queries": len(queries),
        "arms": {name: s.model_dump(include={"model", "mode", "k", "top_k", "reranker"}) for name, s in arms.items()},
        "ndcg@10": means,
        "loop_result_figures": loop_figures,
        # Served figures only: the loop's dense figure encodes questions with the float model, every arm here with
        # what serving uses (AnswerSettings.query_encoder, the int8 twin by default), so those two need not agree.
        "matches_loop_result": all(
            abs(a - b) < 1e-9
            for a, b in (
                (means["start"], loop_figures["served_start"]),
                (means["end_served"], loop_figures["served_after_phase_1"]),
            )
            if b is not None
        ),
        "paired": comparisons,
    }
    print(json.dumps({k: result[k] for k in ("ndcg@10", "loop_result_figures", "matches_loop_result")}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
