"""How unsure the served pipeline is about each candidate pair: three signals in [0, 1] (higher = less sure) and
their weighted combination.

- probability: the reranker's relevance probability near 0.5 (1 at 0.5, 0 at 0 or 1); absent without a reranker.
- margin: how close the pair's served score comes to the top score, against the spread of the top k (for the top
  pair: how close the runner-up comes to it). 1: a contender for the first place, a label decides which passage
  leads; 0: far below. Measured on SciFact and SQuAD (bench/active_learning.py's pools, base pipeline): the 100
  pairs with the smallest margin to the top were relevant 36-41 % of the time, against 10-15 % for any top-10 pair;
  a gap to the nearest neighbour instead picked the crowded tail (ranks 6-8, 1-3 % relevant), where a label moves
  neither the ranking's head nor nDCG@10.
- disagreement: how differently BM25, dense retrieval and the reranker place the pair, as the spread of their
  rank gains 1/log2(1 + rank) (the weight nDCG gives a rank); a list that did not retrieve it counts as rank
  depth + 1.

Signals live on different scales (most pairs have a small margin, few a large disagreement), so the combination
ranks each signal over all candidates first (its percentile) and takes the weighted mean of the percentiles: a
weight then means what it says. A signal absent for every candidate drops out.
"""

from __future__ import annotations

import math

import numpy as np

from rag.annotation.candidates import Candidate
from rag.annotation.config import SIGNALS

LISTS = ("bm25", "dense", "reranker")  # the rankings whose disagreement counts


def _gain(rank: float) -> float:
    return 1.0 / math.log2(1.0 + rank)


def probability_signal(candidate: Candidate) -> float | None:
    if candidate.probability is None:
        return None
    return float(1.0 - 2.0 * abs(min(max(candidate.probability, 0.0), 1.0) - 0.5))


def margin_signals(scores: list[float]) -> list[float]:
    """One question's served scores, in served order: 1 - (the top score - this one) / spread of the list; for the top
    pair, 1 - (its lead over the runner-up) / spread."""
    if len(scores) < 2:
        return [0.0] * len(scores)
    s = np.asarray(scores, dtype=np.float64)
    spread = float(s.max() - s.min())
    if spread <= 0:
        return [1.0] * len(scores)  # all tied: every order is a guess
    behind = np.r_[s[0] - s[1], s[0] - s[1:]]
    return [float(1.0 - min(max(gap, 0.0), spread) / spread) for gap in behind]


def disagreement_signal(candidate: Candidate, lists: list[str], depth: int) -> float | None:
    """Spread of rank gains over `lists` (the lists that ranked this question's candidates); None with fewer than
    two lists."""
    if len(lists) < 2:
        return None
    gains = [_gain(candidate.ranks.get(name, depth + 1)) for name in lists]
    return float(max(gains) - min(gains))


def pair_signals(candidates: list[Candidate], depth: int = 100) -> list[dict[str, float]]:
    """Every candidate's raw signals (absent ones left out), in the order given. `depth`: how deep the first stage's
    lists went (a pair missing from one counts as just below it)."""
    by_question: dict[str, list[int]] = {}
    for i, c in enumerate(candidates):
        by_question.setdefault(c.question.text, []).append(i)
    margins: dict[int, float] = {}
    lists: dict[str, list[str]] = {}
    for text, idx in by_question.items():
        ordered = sorted(idx, key=lambda i: candidates[i].rank)
        margins.update(zip(ordered, margin_signals([candidates[i].score for i in ordered])))
        lists[text] = [name for name in LISTS if any(name in candidates[i].ranks for i in idx)]
    out = []
    for i, c in enumerate(candidates):
        raw = {
            "probability": probability_signal(c),
            "margin": margins[i],
            "disagreement": disagreement_signal(c, lists[c.question.text], depth),
        }
        out.append({name: round(value, 6) for name, value in raw.items() if value is not None})
    return out


def _percentiles(values: np.ndarray) -> np.ndarray:
    """Mid-rank percentiles in [0, 1]: ties share a value; one value alone is 0.5."""
    from scipy.stats import rankdata

    if len(values) == 1:
        return np.array([0.5])
    return (rankdata(values, method="average") - 1.0) / (len(values) - 1.0)


def combine(signals: list[dict[str, float]], weights: dict[str, float]) -> list[float]:
    """Weighted mean of each signal's percentile over all candidates; a signal a candidate lacks leaves its weight out
    of that candidate's mean."""
    if not signals:
        return []
    total = np.zeros(len(signals))
    weight_sum = np.zeros(len(signals))
    for name in SIGNALS:
        w = float(weights.get(name, 0.0))
        present = np.array([name in s for s in signals])
        if w <= 0 or not present.any():
            continue
        pct = np.zeros(len(signals))
        pct[present] = _percentiles(np.array([s[name] for s in signals if name in s], dtype=np.float64))
        total += w * pct * present
        weight_sum += w * present
    return [float(t / ws) if ws > 0 else 0.0 for t, ws in zip(total, weight_sum)]
