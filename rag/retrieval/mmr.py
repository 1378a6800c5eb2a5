"""Maximal marginal relevance (Carbonell & Goldstein 1998) over unit-length vectors."""

from __future__ import annotations

import numpy as np


def mmr(query: np.ndarray, candidates: np.ndarray, k: int, lambda_: float) -> list[int]:
    """Indices of `candidates` in MMR order: λ·sim(query) − (1−λ)·max sim(already chosen)."""
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"MMR lambda must be in [0, 1], got {lambda_}")
    n = len(candidates)
    if n == 0:
        return []
    relevance = candidates @ query
    similarity = candidates @ candidates.T
    chosen: list[int] = []
    redundancy = np.full(n, -np.inf)
    available = np.ones(n, dtype=bool)
    for _ in range(min(k, n)):
        penalty = np.where(np.isfinite(redundancy), redundancy, 0.0)
        score = np.where(available, lambda_ * relevance - (1 - lambda_) * penalty, -np.inf)
        best = int(np.argmax(score))
        chosen.append(best)
        available[best] = False
        redundancy = np.maximum(redundancy, similarity[best])
    return chosen
