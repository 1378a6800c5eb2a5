"""Candidate (question, passage) pairs: which questions, and what the served pipeline ranks for each.

Questions are what people ask (the feedback store's newest queries); before there is traffic, the synthetic QA set's
questions stand in, those written like questions first (a sentence copied out of a document is a poor thing to ask an
expert about). Each question's candidates are the served ranking's top k with what every list said about them: BM25
and dense ranks (the first stage's signals) and the reranker's probability and rank when one serves.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

from rag.retrieval import Hit

Source = Literal["production", "synthetic"]
# Synthetic kinds that are a document's own sentence (rag.training.data.COPIED_TYPES): asked last.
COPIED_KINDS = frozenset({"inverse-cloze"})


@dataclass(frozen=True)
class Question:
    text: str
    source: Source
    query_id: str | None = None  # the production query it came from


@dataclass
class Candidate:
    question: Question
    chunk: dict  # the chunk record: chunk_id, doc_id, text, page_start, page_end, ...
    rank: int  # in the served ranking, from 1
    score: float  # the served score (the reranker's probability when one reranked)
    ranks: dict[str, float] = field(
        default_factory=dict
    )  # bm25, dense, reranker: rank in that list (absent: not in it)
    probability: float | None = None  # the reranker's relevance probability; None without a reranker


def normalized(text: str) -> str:
    return " ".join(str(text).lower().split())


def production_questions(recent: pd.DataFrame | None, limit: int) -> list[Question]:
    """`recent`: rag.feedback.FeedbackStore.recent_queries (query_id, text, created_at; oldest first). The newest
    `limit` distinct questions, newest first; a question asked again counts once (its newest asking)."""
    if recent is None or recent.empty:
        return []
    out, seen = [], set()
    for row in recent.iloc[::-1].itertuples(index=False):
        key = normalized(row.text)
        if key and key not in seen:
            seen.add(key)
            out.append(Question(str(row.text), "production", str(row.query_id)))
        if len(out) >= limit:
            break
    return out


def synthetic_questions(qa: pd.DataFrame | None, limit: int, seed: int = 0) -> list[Question]:
    """Questions of the synthetic QA table (rag.evaluation.qaset.to_frame), seeded order, copied kinds last."""
    if qa is None or qa.empty or limit <= 0:
        return []
    rows = list(qa[["question", "qtype"]].itertuples(index=False))
    random.Random(seed).shuffle(rows)
    rows.sort(key=lambda r: r.qtype in COPIED_KINDS)  # stable: the seeded order holds within each side
    out, seen = [], set()
    for row in rows:
        key = normalized(row.question)
        if key and key not in seen:
            seen.add(key)
            out.append(Question(str(row.question), "synthetic"))
        if len(out) >= limit:
            break
    return out


def pick_questions(
    production: list[Question],
    synthetic: list[Question],
    limit: int,
    source: Literal["auto", "production", "synthetic"] = "auto",
) -> list[Question]:
    """production only, synthetic only, or (auto) production first, topped up with synthetic questions people did
    not ask already."""
    if source == "production":
        return production[:limit]
    if source == "synthetic":
        return synthetic[:limit]
    asked = {normalized(q.text) for q in production}
    return (production + [q for q in synthetic if normalized(q.text) not in asked])[:limit]


def candidates_of(question: Question, served: list[Hit], k: int, reranked: bool) -> list[Candidate]:
    """The served ranking's top k as candidates. `reranked`: the hits' scores are a reranker's probabilities (its
    order is the reranker list); the first stage's order is each hit's `first_stage_rank`."""
    out = []
    for hit in served[:k]:
        signals = hit.signals or {}
        ranks = {name: float(signals[f"{name}_rank"]) for name in ("bm25", "dense") if f"{name}_rank" in signals}
        if reranked:
            ranks["reranker"] = float(hit.rank)
        out.append(
            Candidate(
                question, hit.chunk, int(hit.rank), float(hit.score), ranks, float(hit.score) if reranked else None
            )
        )
    return out


def gather(questions: list[Question], rank: Callable[[str], list[Hit]], k: int, reranked: bool) -> list[Candidate]:
    """Every question's candidates; `rank(question)` is the served ranking (best first)."""
    out = []
    for question in questions:
        out.extend(candidates_of(question, rank(question.text), k, reranked))
    return out
