"""IR metrics with ranx, mean and per query, plus the research's aggregate scores."""
from __future__ import annotations

import pandas as pd

KS = (1, 3, 5, 10, 20)
METRIC_NAMES = ("recall", "precision", "mrr", "ndcg", "map", "hit_rate")
METRICS = [f"{m}@{k}" for m in METRIC_NAMES for k in KS]


def evaluate_run(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]], metrics: list[str] = METRICS) -> tuple[dict[str, float], pd.DataFrame]:
    """Mean metrics and a per-query table. Queries in qrels that the run lacks count as total misses."""
    from ranx import Qrels, Run, evaluate

    if not qrels:
        raise ValueError("no query has a relevant chunk: nothing to evaluate")
    run = {q: (run.get(q) or {}) for q in qrels}
    per_query = evaluate(Qrels(qrels), Run(run), metrics, return_mean=False, make_comparable=True)
    table = pd.DataFrame({m: per_query[m] for m in metrics}, index=list(Qrels(qrels).keys())) if len(metrics) > 1 else \
        pd.DataFrame({metrics[0]: per_query}, index=list(Qrels(qrels).keys()))
    table.index.name = "qid"
    return {m: float(table[m].mean()) for m in metrics}, table.reset_index()


def run_from_hits(hits_by_query: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Ranked id lists → a ranx run with strictly decreasing scores (ties would reorder arbitrarily)."""
    return {q: {cid: float(len(ids) - i) for i, cid in enumerate(ids)} for q, ids in hits_by_query.items()}


def retrieval_score(mean: dict[str, float], k: int = 5) -> float:
    """RAGSmith's RetrievalScore: mean of Recall@k, MAP@k, nDCG@k and MRR@k."""
    return (mean[f"recall@{k}"] + mean[f"map@{k}"] + mean[f"ndcg@{k}"] + mean[f"mrr@{k}"]) / 4


WA_WEIGHTS = {"context_recall": 0.35, "faithfulness": 0.30, "context_precision_ref": 0.25, "context_precision_noref": 0.10}


def weighted_average(components: dict[str, float | None]) -> float | None:
    """The seed thesis's WA; None until every component exists (faithfulness needs generated answers)."""
    if any(components.get(name) is None for name in WA_WEIGHTS):
        return None
    return sum(w * float(components[name]) for name, w in WA_WEIGHTS.items())
