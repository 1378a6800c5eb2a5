"""Which scored candidates go into the queue: a registry of selection methods, all seeded.

- active: uncertainty and diversity. Greedy, one pair at a time: MMR (lambda * uncertainty + (1 - lambda) *
  novelty, novelty = 1 - the highest cosine between the pair's question and another question already picked) or
  k-center (uncertainty * that distance), within quotas per document and per question (which alone spread the
  picks when no question vectors are given). Labels spent on ten phrasings of one
  question, or on one document, teach a model less than the same labels spread over what people ask.
- uncertainty: the most uncertain pairs first, nothing else (the baseline active learning has to beat).
- random: a seeded uniform sample (what labelling without a queue amounts to).
Ties are broken by a seeded permutation, so the same seed gives the same queue. select_preferred runs a method on the
preferred rows first (questions people asked) and tops the queue up from the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Pool:
    """The scored candidates, one row each."""

    uncertainty: np.ndarray  # (n,) in [0, 1]
    questions: list[str]  # each row's question (normalized text)
    documents: list[str]  # each row's document id
    vectors: np.ndarray | None = (
        None  # (n, d) each row's question embedding; None: questions are similar only to themselves
    )

    def __len__(self) -> int:
        return len(self.questions)

    def subset(self, rows: np.ndarray) -> Pool:
        """The pool of these rows only, in their order."""
        return Pool(
            self.uncertainty[rows],
            [self.questions[i] for i in rows],
            [self.documents[i] for i in rows],
            None if self.vectors is None else np.asarray(self.vectors)[rows],
        )


Selector = Callable[..., list[int]]
SELECTORS: dict[str, Selector] = {}


def register_selector(name: str) -> Callable[[Selector], Selector]:
    def decorator(fn: Selector) -> Selector:
        SELECTORS[name] = fn
        return fn

    return decorator


def selector(method: str) -> Selector:
    if method not in SELECTORS:
        raise ValueError(f"unknown selection method {method!r}: use {', '.join(SELECTORS)}")
    return SELECTORS[method]


def select(pool: Pool, size: int, method: str, settings) -> list[int]:
    """Row indexes of the chosen pairs, in queue order. `settings`: rag.annotation.config.AnnotationSettings."""
    chosen = selector(method)
    return [int(i) for i in chosen(pool, size, settings)] if size > 0 and len(pool) else []


def select_preferred(pool: Pool, size: int, method: str, settings, preferred: np.ndarray) -> list[int]:
    """Row indexes in queue order: `method` over the preferred rows first, then over the rest for what is left of
    `size`. Quotas and diversity hold within each part: a label of a question people asked is worth more than any
    label of a generated one, which only stands in for what people ask."""
    preferred = np.asarray(preferred, dtype=bool)
    chosen: list[int] = []
    for rows in (np.flatnonzero(preferred), np.flatnonzero(~preferred)):
        if len(chosen) < size and len(rows):
            chosen += [int(rows[i]) for i in select(pool.subset(rows), size - len(chosen), method, settings)]
    return chosen


def _tiebreak(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n)


@register_selector("random")
def _random(pool: Pool, size: int, settings) -> list[int]:
    return np.random.default_rng(settings.seed).choice(len(pool), size=min(size, len(pool)), replace=False).tolist()


@register_selector("uncertainty")
def _uncertainty(pool: Pool, size: int, settings) -> list[int]:
    return np.lexsort((_tiebreak(len(pool), settings.seed), -pool.uncertainty))[:size].tolist()


def _unit(vectors: np.ndarray) -> np.ndarray:
    v = np.asarray(vectors, dtype=np.float64)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


@register_selector("active")
def _active(pool: Pool, size: int, settings) -> list[int]:
    n = len(pool)
    u = np.asarray(pool.uncertainty, dtype=np.float64)
    tiebreak = _tiebreak(n, settings.seed)
    documents, questions = np.asarray(pool.documents, dtype=object), np.asarray(pool.questions, dtype=object)
    # Novelty is between questions: a question's own second pair is held back by per_question, not by being similar
    # to itself (the two contenders for its first place are often the pair worth labelling together).
    distinct, of_row = np.unique(questions, return_inverse=True)
    vectors = None
    if pool.vectors is not None:
        row_of = np.empty(len(distinct), dtype=np.int64)
        row_of[of_row[::-1]] = np.arange(n)[::-1]  # a row of each question (its vector is the question's)
        vectors = _unit(np.asarray(pool.vectors)[row_of])
    closest = np.zeros(len(distinct))  # per question: the highest cosine to another question picked so far
    eligible = np.ones(n, dtype=bool)
    per_document, per_question = Counter(), Counter()
    chosen: list[int] = []
    while len(chosen) < size and eligible.any():
        novelty = 1.0 - np.clip(closest[of_row], 0.0, 1.0)
        if settings.diversity == "k-center":
            score = u * novelty
        else:
            score = settings.mmr_lambda * u + (1.0 - settings.mmr_lambda) * novelty
        best = int(np.lexsort((tiebreak, -np.where(eligible, score, -np.inf)))[0])
        chosen.append(best)
        eligible[best] = False
        q = of_row[best]
        if vectors is not None:
            similar = vectors @ vectors[q]
            similar[q] = 0.0  # leaves its own closest as it was
            closest = np.maximum(closest, similar)
        doc, question = pool.documents[best], pool.questions[best]
        per_document[doc] += 1
        per_question[question] += 1
        if settings.per_document is not None and per_document[doc] >= settings.per_document:
            eligible &= documents != doc
        if settings.per_question is not None and per_question[question] >= settings.per_question:
            eligible &= questions != question
    return chosen


__all__ = ["SELECTORS", "Pool", "register_selector", "select", "select_preferred", "selector"]
