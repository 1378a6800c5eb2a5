"""Per-query retrieval scores, the unit every paired test in the benches compares."""

from __future__ import annotations


def per_query_ndcg(qrels: dict, run: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """nDCG@10, MRR@10 and recall@10 per query of `run` (ranked chunk ids per query id), rounded to 4 places."""
    from rag.evaluation.metrics import evaluate_run

    scored = {q: {c: float(len(ids) - i) for i, c in enumerate(ids)} for q, ids in run.items()}
    table = evaluate_run(qrels, scored, ["ndcg@10", "mrr@10", "recall@10"])[1].set_index("qid")
    return {q: {m: round(float(table.at[q, m]), 4) for m in ("ndcg@10", "mrr@10", "recall@10")} for q in table.index}
