"""Questions → candidates → uncertainty → selection → the queue: what the `annotation_queue` asset and
bench/active_learning.py both run."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from rag.annotation.candidates import Candidate, Question, gather, normalized
from rag.annotation.config import AnnotationSettings
from rag.annotation.queue import AnnotationQueue, QueueItem, item_id
from rag.annotation.select import Pool, select_preferred
from rag.annotation.signals import combine, pair_signals
from rag.retrieval import Hit


@dataclass
class QueueBuild:
    queue: AnnotationQueue
    questions: list[Question]  # the questions whose candidates were scored
    candidates: int  # pairs scored
    skipped_labelled: int  # pairs left out because an expert labelled them already
    skipped_furniture: int = 0  # pairs left out because the passage is page furniture


def question_vectors(texts: list[str], embed: Callable[[list[str]], np.ndarray] | None) -> np.ndarray | None:
    """One embedding per row of `texts`, each distinct text encoded once (None without an encoder)."""
    if embed is None or not texts:
        return None
    distinct = list(dict.fromkeys(texts))
    encoded = np.asarray(embed(distinct), dtype=np.float32)
    row = {t: i for i, t in enumerate(distinct)}
    return encoded[[row[t] for t in texts]]


def queue_item(candidate: Candidate, uncertainty: float, signals: dict[str, float]) -> QueueItem:
    chunk, question = candidate.chunk, candidate.question
    page = lambda key: None if chunk.get(key) is None else int(chunk[key])  # noqa: E731
    return QueueItem(
        item_id=item_id(question.text, chunk["chunk_id"]),
        question=question.text,
        query_id=question.query_id,
        source=question.source,
        chunk_id=str(chunk["chunk_id"]),
        doc_id=str(chunk["doc_id"]),
        text=str(chunk.get("text", "")),
        page_start=page("page_start"),
        page_end=page("page_end"),
        uncertainty=round(float(uncertainty), 6),
        signals=signals,
    )


def build_queue(
    questions: list[Question],
    rank: Callable[[str], list[Hit]],
    settings: AnnotationSettings,
    *,
    strategy: str,
    reranked: bool,
    embed: Callable[[list[str]], np.ndarray] | None = None,
    labelled: Collection[str] = (),
    depth: int = 100,
    served: dict | None = None,
    furniture: Callable[[dict], bool] | None = None,
) -> QueueBuild:
    """`rank(question)`: the served ranking, best first (hits with their first-stage signals); `reranked`: a reranker
    produced it (scores are probabilities); `embed`: question texts → vectors for the diversity of `active`;
    `labelled`: item ids experts have labelled; `depth`: the first stage's list depth; `served`: what served (kept in
    the queue's config); `furniture(chunk)`: the passage is page furniture (left out). Pairs of questions people
    asked fill the queue first (select_preferred); generated questions top it up."""
    candidates = gather(questions, rank, settings.k, reranked)
    signals = pair_signals(candidates, depth)
    uncertainty = combine(signals, settings.weights)
    ids = [item_id(c.question.text, c.chunk["chunk_id"]) for c in candidates]
    done = set(labelled) if settings.skip_labelled else set()
    unlabelled = [i for i, key in enumerate(ids) if key not in done]
    rows = [i for i in unlabelled if furniture is None or not furniture(candidates[i].chunk)]
    texts = [normalized(candidates[i].question.text) for i in rows]
    diverse = settings.method == "active"  # only active reads the question vectors: encode nothing otherwise
    pool = Pool(
        np.array([uncertainty[i] for i in rows], dtype=np.float64),
        texts,
        [str(candidates[i].chunk["doc_id"]) for i in rows],
        question_vectors([candidates[i].question.text for i in rows], embed if diverse else None),
    )
    asked = np.array([candidates[i].question.source == "production" for i in rows], dtype=bool)
    picked = [rows[j] for j in select_preferred(pool, settings.size, settings.method, settings, asked)]
    config = settings.model_dump(mode="json") | ({"served": served} if served else {})
    items = [queue_item(candidates[i], uncertainty[i], signals[i]) for i in picked]
    queue = AnnotationQueue(strategy=strategy, selection=settings.method, config=config, items=items)
    skipped = len(candidates) - len(unlabelled)
    return QueueBuild(queue, questions, len(candidates), skipped, len(unlabelled) - len(rows))


__all__ = ["QueueBuild", "build_queue", "question_vectors", "queue_item"]
