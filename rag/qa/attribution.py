"""Post-hoc source attribution (thesis §5.2.3): which retrieved passages support the generated answer.

Each passage is scored against the answer with sliding windows: windows of w_a consecutive answer sentences
(w_a in 2..4) against windows of w_p consecutive passage sentences (w_p in w_a..8); a passage's score is its
best pair. Texts shorter than a window are taken whole. The scorer is the trained cross-encoder when one is
registered (rag.rerank "production"), else embedding cosine. The top k passages scoring at least the threshold
are the attributed ones.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Protocol

import numpy as np

from rag.chunking.sentences import split_sentences
from rag.embedding import TextEmbedder, normalize_rows
from rag.parsing.models import TABLE_CELL_SEPARATOR
from rag.rerank import probabilities

ANSWER_WINDOWS = range(2, 5)
MAX_PASSAGE_WINDOW = 8


class PairScorer(Protocol):
    name: str

    def score_pairs(
        self, queries: list[list[str]], passages: list[list[str]], pairs: list[tuple[int, int]]
    ) -> np.ndarray:
        """One score in [0, 1] per (query window, passage window) pair; a window is a list of sentences."""
        ...


def passage_sentences(text: str) -> list[str]:
    """Sentences of a passage. PDF text wraps lines mid-sentence, so lines are joined before splitting, except
    table rows (cells joined by " | "), each of which is a unit of its own."""
    return list(_passage_sentences(text))


# A footnote mark glued to a sentence's full stop ("... trustees./  This Handbook is issued ...", a superscript in
# the source) hides the sentence end from the splitter, and the next sentence rode along in answers.
_MARKED_END = re.compile(r"(?<=[.!?])[/*\u2020\u2021\u00a7]+\s+(?=[A-Z])")


def _split_marked(sentence: str) -> list[str]:
    return [part.strip() for part in _MARKED_END.split(sentence) if part.strip()]


# The same passages come back question after question (the generator and attribution each split them too).
@lru_cache(maxsize=8192)
def _passage_sentences(text: str) -> tuple[str, ...]:
    units: list[str] = []
    block: list[str] = []

    def flush() -> None:
        joined = " ".join(block)
        units.extend(part for s, e in split_sentences(joined) for part in _split_marked(joined[s:e]))
        block.clear()

    for line in text.split("\n"):
        if TABLE_CELL_SEPARATOR in line:
            flush()
            units.append(line.strip())
        elif line.strip():
            block.append(line.strip())
        else:
            flush()
    flush()
    return tuple(u for u in units if u)


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
    a_index: dict[tuple[int, int], int] = {}
    p_index: dict[tuple[int, tuple[int, int]], int] = {}
    queries: list[list[str]] = []
    docs: list[list[str]] = []
    pairs: list[tuple[int, int]] = []
    owner: list[int] = []
    for j, passage in enumerate(passages):
        units = passage_sentences(passage)
        for a, p in window_pairs(len(answer_units), len(units)) if units else ():
            if a not in a_index:
                a_index[a] = len(queries)
                queries.append(answer_units[a[0] : a[1]])
            if (j, p) not in p_index:
                p_index[(j, p)] = len(docs)
                docs.append(units[p[0] : p[1]])
            pairs.append((a_index[a], p_index[(j, p)]))
            owner.append(j)
    best = [0.0] * len(passages)
    if pairs:
        for j, score in zip(owner, scorer.score_pairs(queries, docs, pairs)):
            best[j] = max(best[j], float(score))
    return best


def attribute(
    answer: str, passages: list[str], scorer: PairScorer, *, top_k: int = 3, threshold: float = 0.5
) -> tuple[list[int], list[float]]:
    """Indices of the attributed passages (best first) and every passage's score."""
    scores = passage_scores(answer, passages, scorer)
    order = sorted((i for i, s in enumerate(scores) if s >= threshold), key=lambda i: -scores[i])
    return order[:top_k], scores


class EmbeddingScorer:
    """Cosine of embeddings, clipped to [0, 1]. Each distinct sentence is encoded once and a window's vector is the
    normalised mean of its sentences' vectors: windows overlap heavily, and encoding every window text apart cost
    seconds per answer with MiniLM on a CPU."""

    def __init__(self, embedder: TextEmbedder):
        self.embedder = embedder
        self.name = f"embedding:{getattr(embedder, 'name', '?')}"

    def score_pairs(
        self, queries: list[list[str]], passages: list[list[str]], pairs: list[tuple[int, int]]
    ) -> np.ndarray:
        texts = sorted({t for window in queries + passages for t in window})
        position = {t: i for i, t in enumerate(texts)}
        vectors = self.embedder.encode_passages(texts)  # the answer is a statement, not a query: no query prefix

        def pooled(windows: list[list[str]]) -> np.ndarray:
            # Every window's mean in one product: (windows x sentences) weights 1/len(window), times the vectors.
            sizes = [len(w) for w in windows]
            weights = np.zeros((len(windows), len(texts)), dtype=np.float32)
            np.add.at(
                weights,
                (np.repeat(np.arange(len(windows)), sizes), [position[t] for w in windows for t in w]),
                np.repeat(1.0 / np.asarray(sizes, dtype=np.float32), sizes),
            )
            return normalize_rows(weights @ vectors)

        q, p = pooled(queries), pooled(passages)
        return np.clip(np.einsum("ij,ij->i", q[[i for i, _ in pairs]], p[[j for _, j in pairs]]), 0.0, 1.0)


class CrossEncoderScorer:
    """A rag.rerank Reranker (`.score(query, passages)`) on the window texts, on the [0, 1] scale
    (rag.rerank.probabilities: a reranker declaring logits is squashed, always), so one threshold serves both
    scorers."""

    def __init__(self, reranker):
        self.reranker = reranker
        self.name = f"cross-encoder:{getattr(reranker, 'name', '?')}"

    def score_pairs(
        self, queries: list[list[str]], passages: list[list[str]], pairs: list[tuple[int, int]]
    ) -> np.ndarray:
        by_query: dict[int, list[int]] = {}
        for n, (i, _) in enumerate(pairs):
            by_query.setdefault(i, []).append(n)
        out = np.zeros(len(pairs))
        for i, positions in by_query.items():
            scores = self.reranker.score(" ".join(queries[i]), [" ".join(passages[pairs[n][1]]) for n in positions])
            out[positions] = probabilities(self.reranker, scores)
        return out
