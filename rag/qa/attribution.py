"""Post-hoc source attribution (thesis §5.2.3): which retrieved passages support the generated answer.

Each passage is scored against the answer with sliding windows: windows of w_a consecutive answer sentences
(w_a in 2..4) against windows of w_p consecutive passage sentences (w_p in w_a..8); a passage's score is its
best pair. Texts shorter than a window are taken whole. The scorer is the trained cross-encoder when one is
registered (rag.rerank "production"), else embedding cosine. The top k passages scoring at least the threshold
are the attributed ones.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from rag.chunking.sentences import split_sentences
from rag.embedding import TextEmbedder

ANSWER_WINDOWS = range(2, 5)
MAX_PASSAGE_WINDOW = 8


class PairScorer(Protocol):
    name: str

    def score_pairs(self, queries: list[str], passages: list[str], pairs: list[tuple[int, int]]) -> np.ndarray:
        """One score in [0, 1] per (query index, passage index) pair."""
        ...


def passage_sentences(text: str) -> list[str]:
    """Sentences, each line apart first (a table row or list item is its own unit)."""
    out = []
    for line in text.split("\n"):
        out.extend(line[s:e] for s, e in split_sentences(line))
    return out or ([text.strip()] if text.strip() else [])


def windows(units: list[str], size: int) -> list[tuple[int, int]]:
    """Spans [i, i + size) over `units`; one span of everything when there are fewer units than `size`."""
    if len(units) <= size:
        return [(0, len(units))]
    return [(i, i + size) for i in range(len(units) - size + 1)]


def window_pairs(n_answer: int, n_passage: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Every (answer window, passage window) pair with w_a in 2..4 and w_p in w_a..8, deduplicated (short texts
    collapse many sizes onto the same whole-text window)."""
    answer_units, passage_units = list(range(n_answer)), list(range(n_passage))
    pairs: set[tuple[tuple[int, int], tuple[int, int]]] = set()
    for w_a in ANSWER_WINDOWS:
        for a in windows(answer_units, w_a):
            for w_p in range(w_a, MAX_PASSAGE_WINDOW + 1):
                for p in windows(passage_units, w_p):
                    pairs.add((a, p))
    return sorted(pairs)


def passage_scores(answer: str, passages: list[str], scorer: PairScorer) -> list[float]:
    """The best window-pair score of each passage against the answer."""
    answer_units = passage_sentences(answer)
    if not answer_units or not passages:
        return [0.0] * len(passages)
    a_texts: dict[tuple[int, int], int] = {}
    p_texts: dict[tuple[int, tuple[int, int]], int] = {}
    queries, docs, pairs, owner = [], [], [], []
    for j, passage in enumerate(passages):
        units = passage_sentences(passage)
        if not units:
            continue
        for a, p in window_pairs(len(answer_units), len(units)):
            if a not in a_texts:
                a_texts[a] = len(queries)
                queries.append(" ".join(answer_units[a[0]:a[1]]))
            if (j, p) not in p_texts:
                p_texts[(j, p)] = len(docs)
                docs.append(" ".join(units[p[0]:p[1]]))
            pairs.append((a_texts[a], p_texts[(j, p)]))
            owner.append(j)
    best = [0.0] * len(passages)
    if pairs:
        for j, score in zip(owner, scorer.score_pairs(queries, docs, pairs)):
            best[j] = max(best[j], float(score))
    return best


def attribute(answer: str, passages: list[str], scorer: PairScorer, *, top_k: int = 3, threshold: float = 0.5) -> tuple[list[int], list[float]]:
    """Indices of the attributed passages (best first) and every passage's score."""
    scores = passage_scores(answer, passages, scorer)
    order = sorted((i for i, s in enumerate(scores) if s >= threshold), key=lambda i: -scores[i])
    return order[:top_k], scores


class EmbeddingScorer:
    """Cosine of embeddings (clipped to [0, 1]); every distinct window is encoded once."""

    def __init__(self, embedder: TextEmbedder):
        self.embedder = embedder
        self.name = f"embedding:{getattr(embedder, 'name', '?')}"

    def score_pairs(self, queries: list[str], passages: list[str], pairs: list[tuple[int, int]]) -> np.ndarray:
        q = self.embedder.encode_passages(queries)  # answer text is a statement, not a query
        p = self.embedder.encode_passages(passages)
        return np.clip(np.array([float(q[i] @ p[j]) for i, j in pairs]), 0.0, 1.0)


class CrossEncoderScorer:
    """A rag.rerank Reranker (`.score(query, passages)`); scores outside [0, 1] (logits) go through a sigmoid."""

    def __init__(self, reranker):
        self.reranker = reranker
        self.name = f"cross-encoder:{getattr(reranker, 'name', '?')}"

    def score_pairs(self, queries: list[str], passages: list[str], pairs: list[tuple[int, int]]) -> np.ndarray:
        by_query: dict[int, list[int]] = {}
        for n, (i, _) in enumerate(pairs):
            by_query.setdefault(i, []).append(n)
        out = np.zeros(len(pairs))
        for i, positions in by_query.items():
            scores = np.asarray(self.reranker.score(queries[i], [passages[pairs[n][1]] for n in positions]), dtype=float)
            out[positions] = scores
        if out.size and (out.min() < 0.0 or out.max() > 1.0):
            out = 1.0 / (1.0 + np.exp(-out))
        return out
