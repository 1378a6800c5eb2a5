"""IR metrics with ranx, mean and per query, plus the research's aggregate scores."""

from __future__ import annotations

import numpy as np
import pandas as pd

KS = (1, 3, 5, 10, 20)
METRIC_NAMES = ("recall", "precision", "mrr", "ndcg", "map", "hit_rate")


def metrics_at(ks) -> list[str]:
    """Every metric of METRIC_NAMES at each cutoff of `ks`."""
    ks = list(ks)
    return [f"{m}@{k}" for m in METRIC_NAMES for k in ks]


METRICS = metrics_at(KS)


def evaluate_run(
    qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]], metrics: list[str] = METRICS
) -> tuple[dict[str, float], pd.DataFrame]:
    """Mean metrics and a per-query table over every query of `qrels`. A query the run lacks or returns nothing for,
    and a query with no relevant id (evidence no chunk holds), scores 0 on every metric."""
    from ranx import evaluate

    from rag.evaluation.ranx_input import ranx_lists

    if not qrels:
        raise ValueError(
            "no queries to evaluate: pass the questions' qrels (an empty dict per question without a relevant chunk)"
        )
    # ranx cannot build Qrels or a Run whose every query is empty (max() of nothing), and how it scores a query
    # with no relevant id is its own convention; such queries are 0 by definition here, so only the rest go to it.
    scored = [q for q in qrels if qrels[q] and run.get(q)]
    table = pd.DataFrame(0.0, index=pd.Index(list(qrels), name="qid"), columns=list(metrics))
    if scored:
        per_query = evaluate(*ranx_lists(qrels, run, scored), metrics, return_mean=False)
        for m in metrics:
            table.loc[scored, m] = per_query[m] if len(metrics) > 1 else per_query
    return {m: float(table[m].mean()) for m in metrics}, table.reset_index()


def run_from_hits(hits_by_query: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Ranked id lists → a ranx run with strictly decreasing scores (ties would reorder arbitrarily)."""
    return {q: {cid: float(len(ids) - i) for i, cid in enumerate(ids)} for q, ids in hits_by_query.items()}


def retrieval_score(mean: dict[str, float], k: int = 5) -> float:
    """RAGSmith's RetrievalScore: mean of Recall@k, MAP@k, nDCG@k and MRR@k."""
    return (mean[f"recall@{k}"] + mean[f"map@{k}"] + mean[f"ndcg@{k}"] + mean[f"mrr@{k}"]) / 4


WA_WEIGHTS = {
    "context_recall": 0.35,
    "faithfulness": 0.30,
    "context_precision_ref": 0.25,
    "context_precision_noref": 0.10,
}


def weighted_average(components: dict[str, float | None]) -> float | None:
    """The seed thesis's WA; None until every component exists (faithfulness needs generated answers)."""
    if any(components.get(name) is None for name in WA_WEIGHTS):
        return None
    return sum(w * float(components[name]) for name, w in WA_WEIGHTS.items())


def paired_comparison(
    treatment: pd.Series, control: pd.Series, *, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> dict:
    """treatment − control on the questions both were scored on (two per-question score Series indexed by question id):
    the mean difference, its paired-bootstrap confidence interval, the two-sided p-value of ranx's paired Student
    t-test, and how many questions got better, stayed tied or got worse. Deterministic for a seed."""
    from ranx.statistical_tests import paired_student_t_test

    both = pd.concat({"t": treatment, "c": control}, axis=1, join="inner").dropna()
    if both.empty:
        raise ValueError("no question was scored by both configurations: a paired comparison needs the same questions")
    t, c = both["t"].to_numpy(np.float64), both["c"].to_numpy(np.float64)
    diff = t - c
    # All differences equal (e.g. every question tied): the t statistic is undefined; there is no evidence of a
    # difference.
    p_value = float(paired_student_t_test(c, t)[0]) if np.ptp(diff) > 0 else (1.0 if not diff.any() else 0.0)
    idx = np.random.default_rng(seed).integers(0, len(diff), size=(resamples, len(diff)))
    low, high = np.quantile(diff[idx].mean(axis=1), [(1 - confidence) / 2, (1 + confidence) / 2])
    return {
        "n": len(diff),
        "delta": float(diff.mean()),
        "ci_low": float(low),
        "ci_high": float(high),
        "confidence": confidence,
        "p_value": p_value,
        "test": "paired t-test (ranx), paired bootstrap CI",
        "better": int((diff > 0).sum()),
        "tied": int((diff == 0).sum()),
        "worse": int((diff < 0).sum()),
    }
