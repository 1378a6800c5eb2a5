"""Questions → candidates → uncertainty → selection → the queue: what the `annotation_queue` asset and
bench/active_learning.py both run."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from rag.annotation.candidates import Candidate, Question, gather, normalized
from rag.annotation.config import AnnotationSettings
from rag.annotation.pool import GatePool
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


def pooled_items(
    pools: list[GatePool],
    limit: int,
    *,
    labelled: Collection[str] = (),
    furniture: Callable[[dict], bool] | None = None,
) -> list[QueueItem]:
    """The gate pools' pairs as queue items (rag.annotation.pool), newest pool first, without those already labelled,
    the page furniture and repeats; at most `limit`. Whole questions first: a question's pairs settle its judgments
    only together, so a pool's items stay grouped by question."""
    done, out, seen = set(labelled), [], set()
    for pool in pools:
        by_question: dict[str, list] = {}
        for item in pool.items:
            by_question.setdefault(normalized(item.question), []).append(item)
        for items in by_question.values():
            for item in items:
                key = item_id(item.question, item.chunk_id)
                chunk = {"chunk_id": item.chunk_id, "doc_id": item.doc_id, "text": item.text}
                if key in done or key in seen or (furniture is not None and furniture(chunk)):
                    continue
                seen.add(key)
                out.append(
                    QueueItem(
                        item_id=key,
                        question=item.question,
                        source="gate",
                        chunk_id=item.chunk_id,
                        doc_id=item.doc_id,
                        text=item.text,
                        page_start=item.page_start,
                        page_end=item.page_end,
                        uncertainty=1.0,
                        signals={"gate_pool": 1.0, f"{pool.kind}_{item.side}_rank": float(item.rank)},
                    )
                )
    return out[:limit]


def with_pool(queue: AnnotationQueue, pooled: list[QueueItem]) -> AnnotationQueue:
    """The queue with the gate's pairs first; a pair active learning picked too keeps its place among them."""
    first = {item.item_id for item in pooled}
    rest = [item for item in queue.items if item.item_id not in first]
    return queue.model_copy(update={"items": [*pooled, *rest]})


__all__ = ["QueueBuild", "build_queue", "pooled_items", "question_vectors", "queue_item", "with_pool"]
