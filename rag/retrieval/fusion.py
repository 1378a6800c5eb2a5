"""Rank fusion, the only place hybrid scores are computed."""

from __future__ import annotations

from collections.abc import Sequence

Ranked = Sequence[tuple[str, float]]  # (id, score), best first


def reciprocal_rank_fusion(rankings: Sequence[Ranked], k: int = 60) -> list[tuple[str, float]]:
    """RRF (Cormack et al. 2009): score = Σ 1 / (k + rank), ranks from 1; ties broken by first appearance (the first
    list's order, then the next's), so the order does not depend on what the ids are: retrieval fuses point ids or
    chunk ids (rag.retrieval.chunks), configuration search chunk ids, and all must serve the same order."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, (item, _) in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])  # stable: ties keep first appearance


def min_max(ranking: Ranked) -> dict[str, float]:
    if not ranking:
        return {}
    values = [s for _, s in ranking]
    lo, hi = min(values), max(values)
    if hi == lo:
        return {item: 1.0 for item, _ in ranking}
    return {item: (s - lo) / (hi - lo) for item, s in ranking}


def convex_combination(dense: Ranked, sparse: Ranked, alpha: float) -> list[tuple[str, float]]:
    """α·dense + (1-α)·sparse over min-max normalised scores; an item missing from one list gets 0 there. Ties are
    broken by first appearance (dense, then sparse), as reciprocal_rank_fusion's."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    d, s = min_max(dense), min_max(sparse)
    fused = {item: alpha * d.get(item, 0.0) + (1 - alpha) * s.get(item, 0.0) for item in dict.fromkeys([*d, *s])}
    return sorted(fused.items(), key=lambda kv: -kv[1])
