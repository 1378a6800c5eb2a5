"""Answers people corrected, served back: the answer example a correction becomes for the answer stage.

A correction trains the embedder and the reranker (a labelled question-passage pair, rag.training.data) and keys a
held-out question of the gate. It also answers the question it corrects: when the same question (case and spacing
aside) is asked again and a passage retrieved for it holds the corrected answer, `rag serve` answers with that
answer, cited from that passage, instead of what the answer stage made of the passages.

What keeps one client from steering what everybody reads:
- agreement: an answer is served only once `min_clients` different clients (the keyed client identity of
  rag.serving.sessions, so one client's many sessions count once) wrote the same answer, case and spacing aside;
  a corrected answer's `correction_source` is the client's own claim and earns nothing here;
- the documents: the answer must stand, word for word, in one of at most MAX_ANSWER_DOCUMENTS of the passages
  retrieved for the question now (rag.training.answers' rule, so "yes" or "2019" never qualifies), and it is cited
  from there; a document that changed or a retrieval that moved on drops it without anybody removing it;
- among agreed answers to one question, the one the most clients wrote serves (the newest on a tie).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pandas as pd

from rag.training.answers import answer_chunks
from rag.training.data import normalized_question

log = logging.getLogger(__name__)
GENERATOR = "correction"  # AnswerResult.generator of an answer served from a correction


@dataclass(frozen=True)
class AgreedAnswer:
    answer: str
    clients: int


def agreed_answers(rows: Iterable[tuple[str, str, str]], min_clients: int) -> dict[str, AgreedAnswer]:
    """(question, answer, sender) rows, oldest first -> per normalized question, the answer at least `min_clients`
    senders wrote (the most senders wins; the newest on a tie)."""
    senders: dict[tuple[str, str], set[str]] = {}
    written: dict[tuple[str, str], tuple[str, int]] = {}  # the answer as last written, and when (row order)
    for order, (question, answer, sender) in enumerate(rows):
        key = (normalized_question(question), " ".join(str(answer).lower().split()))
        if not key[0] or not key[1]:
            continue
        senders.setdefault(key, set()).add(str(sender))
        written[key] = (" ".join(str(answer).split()), order)
    best: dict[str, tuple[int, int, str]] = {}
    for key, who in senders.items():
        if len(who) < min_clients:
            continue
        text, order = written[key]
        if key[0] not in best or (len(who), order) > best[key[0]][:2]:
            best[key[0]] = (len(who), order, text)
    return {question: AgreedAnswer(text, clients) for question, (clients, _, text) in best.items()}


def answer_with_correction(result, agreed: AgreedAnswer):
    """The answer stage's AnswerResult answered instead by `agreed`, cited from the first shown passage that holds
    it; None when no shown passage does (the answer stage's own answer stands)."""
    chunks = list(result.chunks)
    holding = answer_chunks(agreed.answer, {c["chunk_id"]: str(c.get("text") or "") for c in chunks})
    if not holding:
        return None
    cited = min(holding, key=lambda cid: next(c["rank"] for c in chunks if c["chunk_id"] == cid))
    return result.model_copy(
        update={
            "answer": agreed.answer,
            "cited_chunk_ids": [cited],
            "attributed_chunk_ids": [cited],
            "not_in_context": False,
            "chunks": [{**c, "cited": c["chunk_id"] == cited, "attributed": c["chunk_id"] == cited} for c in chunks],
            "generator": GENERATOR,
            "warnings": [
                *result.warnings,
                f"answered with the correction {agreed.clients} people agreed on, found in passage {cited} "
                f"(the answer stage said: {result.answer[:200]!r})",
            ],
        }
    )


class CorrectedAnswers:
    """The agreed corrections of a feedback store, read at most once per `seconds` (a query of the answers people
    wrote, which grow slowly), shared by every request; `min_clients` 0 turns serving them off."""

    def __init__(self, read: Callable[[], pd.DataFrame], min_clients: int, seconds: float, clock=time.monotonic):
        self.read, self.min_clients, self.seconds, self.clock = read, min_clients, seconds, clock
        self._lock = threading.Lock()
        self._agreed: dict[str, AgreedAnswer] | None = None
        self._at = 0.0

    def agreed(self) -> dict[str, AgreedAnswer]:
        with self._lock:
            if self._agreed is None or self.clock() - self._at >= self.seconds:
                frame = self.read()
                rows = zip(frame["question"], frame["answer"], frame["sender"], strict=True)
                self._agreed, self._at = agreed_answers(rows, self.min_clients), self.clock()
            return self._agreed

    def apply(self, result):
        """`result`, or the same answer given by an agreed correction of its question when a shown passage holds
        it. A store that cannot be read leaves the answer as the answer stage gave it."""
        if self.min_clients <= 0 or getattr(result, "generator", None) is None:
            return result
        try:
            agreed = self.agreed().get(normalized_question(result.question))
        except Exception as exc:  # noqa: BLE001 - the corrections are a bonus; the answer must not fail with them
            log.warning("corrected answers not read (%s: %s); answering without them", type(exc).__name__, exc)
            return result
        if agreed is None:
            return result
        return answer_with_correction(result, agreed) or result
