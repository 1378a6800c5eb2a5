"""Candidate (question, passage) pairs: which questions, and what the served pipeline ranks for each.

Questions are what people ask (the feedback store's newest queries); before there is traffic, the synthetic QA set's
questions stand in, those written like questions first (a sentence copied out of a document is a poor thing to ask an
expert about) and never a string of keywords ("pdfplumber test suite unstructured"): an expert cannot say what such a
string asks, so cannot grade a passage for it. Each question's candidates are the served ranking's top k with what
every list said about them: BM25 and dense ranks (the first stage's signals) and the reranker's probability and rank
when one serves. A passage that is mostly page furniture (running headers and footers its parse recorded,
rag.parsing.boilerplate) is no candidate: it answers nothing.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

from rag.parsing.boilerplate import line_key, recorded
from rag.retrieval import Hit

Source = Literal["production", "synthetic"]
# Synthetic kinds that are a document's own sentence (rag.training.data.COPIED_TYPES): asked last.
COPIED_KINDS = frozenset({"inverse-cloze"})
# A passage whose lines are this much (by characters) its document's recorded page furniture is furniture.
FURNITURE_SHARE = 0.5
_WORD = re.compile(r"[^\W\d_]+")
# A page label's line key (numbers and edge punctuation aside: "Page 12 of 205" → "page # of", "p. 4" → "p", "- 12 -"
# → "#"): furniture by its form alone, recorded or not (a one-page document's "Page 1 of 205" comes back on no other
# page, so its parse cannot tell it repeats).
_PAGE_LABEL = re.compile(r"(?:page|pg|p)(?:\s*#\s*(?:of|/))?|#")


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


def reads_as_a_question(text: str) -> bool:
    """Whether text is a question or a sentence rather than a string of keywords: it holds a function word ("what",
    "is", "the", "of"...). Keyword queries are content words alone (rag.synthetic.keywords drops every stop word),
    and so are ids and codes ("06aup1 4702"); what people write as a question, or a document as a sentence, is not."""
    from rag.synthetic.text import stop_words

    stops = stop_words()
    return any(word in stops for word in _WORD.findall(str(text).lower()))


def synthetic_questions(qa: pd.DataFrame | None, limit: int, seed: int = 0) -> list[Question]:
    """Questions of the synthetic QA table (rag.evaluation.qaset.to_frame), seeded order, copied kinds last, keyword
    strings left out."""
    if qa is None or qa.empty or limit <= 0:
        return []
    qa = qa[qa["question"].map(reads_as_a_question)]
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


def furniture_keys(documents: pd.DataFrame | None) -> dict[str, frozenset[str]]:
    """Per document, the line keys (rag.parsing.boilerplate.line_key: case, spacing and numbers aside) of the page
    furniture its parse set aside; `documents`: the parsed_documents table's doc_id and metadata_json."""
    if documents is None or documents.empty:
        return {}
    keys = {}
    for doc_id, metadata in zip(documents["doc_id"], documents["metadata_json"]):
        lines = recorded(json.loads(metadata or "{}"))
        if lines:
            keys[str(doc_id)] = frozenset(k for line in lines if (k := line_key(line["text"])))
    return keys


def _furniture_line(line: str, known: frozenset[str]) -> bool:
    key = line_key(line)
    return key in known or bool(_PAGE_LABEL.fullmatch(key))


def is_furniture(chunk: dict, keys: dict[str, frozenset[str]]) -> bool:
    """Whether a passage is mostly (FURNITURE_SHARE of its characters) page furniture: lines its document's parse
    recorded as such (a chunk set built before the parse set them aside) or page labels."""
    known = keys.get(str(chunk.get("doc_id")), frozenset())
    lines = [line for line in str(chunk.get("text", "")).splitlines() if line.strip()]
    total = sum(len(line) for line in lines)
    furniture = sum(len(line) for line in lines if _furniture_line(line, known))
    return total > 0 and furniture >= FURNITURE_SHARE * total


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
