"""Records the feedback store accepts and returns; the HTTP API uses the same models, so limits live in one place."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_COMMENT_CHARS = 2_000
MAX_CORRECTION_CHARS = 4_000
MAX_PASSAGE_RATINGS = 100
MAX_KEY_CHARS = 128
MAX_EXPERT_CHARS = 128
MAX_ITEM_ID_CHARS = 64
SESSION_DESCRIPTION = (
    "the session token a previous /ask returned (or the rag_session cookie): only signals sent under the session "
    "that was shown an answer count for a canary (session_id is the client's own label and counts for nothing there)"
)

Score = Literal[-1, 1]
Grade = Literal[0, 1, 2]  # irrelevant, partially relevant, relevant


class FeedbackError(ValueError):
    """Feedback that cannot be stored; nothing was written. `status` is the HTTP status it maps to."""

    status = 422


class UnknownQueryError(FeedbackError):
    status = 404


class UnknownPassageError(FeedbackError):
    status = 422


class IdempotencyConflictError(FeedbackError):
    status = 409


class NothingToUndoError(FeedbackError):
    """An undo of an item without a label, or of another expert's label."""

    status = 409


class PassageRating(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chunk_id: str = Field(min_length=1, max_length=512)
    score: Score


class FeedbackSubmission(BaseModel):
    """One user action: a rating of the answer and/or of passages, and/or a corrected answer."""

    model_config = ConfigDict(extra="forbid")
    query_id: str = Field(min_length=1, max_length=36)
    idempotency_key: str = Field(
        min_length=1,
        max_length=MAX_KEY_CHARS,
        description="the same key submitted twice is stored once (retries are safe)",
    )
    answer_score: Score | None = None
    passages: list[PassageRating] = Field(default_factory=list, max_length=MAX_PASSAGE_RATINGS)
    correction: str | None = Field(None, min_length=1, max_length=MAX_CORRECTION_CHARS)
    correction_source: Literal["user", "expert"] = "user"
    comment: str | None = Field(None, max_length=MAX_COMMENT_CHARS)
    session_id: str | None = Field(None, max_length=128)
    session: str | None = Field(None, max_length=128, description=SESSION_DESCRIPTION)

    @model_validator(mode="after")
    def _says_something(self) -> FeedbackSubmission:
        if self.answer_score is None and not self.passages and self.correction is None:
            raise ValueError("empty feedback: give answer_score, passages or correction")
        ids = [p.chunk_id for p in self.passages]
        if len(ids) != len(set(ids)):
            raise ValueError("a passage is rated twice in one submission")
        return self

    def payload_hash(self) -> str:
        # The token says who sent it, not what was said: a retry under a renewed session is the same feedback.
        body = self.model_dump(exclude={"idempotency_key", "session"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class ImplicitEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query_id: str = Field(min_length=1, max_length=36)
    kind: Literal["click"] = "click"  # reformulations are detected by the store itself when a session asks again
    chunk_id: str = Field(min_length=1, max_length=512)
    idempotency_key: str | None = Field(None, max_length=MAX_KEY_CHARS)
    session_id: str | None = Field(None, max_length=128)
    # A canary counts a click only from the session that was shown the query (rag.rollout.evidence).
    session: str | None = Field(None, max_length=128, description=SESSION_DESCRIPTION)


class FeedbackAck(BaseModel):
    submission_id: int
    event_ids: list[int]
    duplicate: bool = False
    answer_id: str | None = None  # the corrected answer, when one was given


class StoredQuery(BaseModel):
    query_id: str
    answer_id: str
    reformulation_of: str | None = None


class _ExpertAction(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    item_id: str = Field(min_length=1, max_length=MAX_ITEM_ID_CHARS, description="the annotation queue item")
    expert: str = Field(min_length=1, max_length=MAX_EXPERT_CHARS, description="who labels: the name the expert gives")
    idempotency_key: str = Field(
        min_length=1,
        max_length=MAX_KEY_CHARS,
        description="the same key submitted twice is stored once (retries are safe)",
    )

    def payload_hash(self) -> str:
        body = {"action": type(self).__name__, **self.model_dump(exclude={"idempotency_key"})}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class ExpertLabel(_ExpertAction):
    """An expert's graded judgment of one (question, passage) pair of the annotation queue."""

    grade: Grade = Field(description="2 relevant, 1 partially relevant, 0 irrelevant")
    expert_answer: str | None = Field(
        None, max_length=MAX_CORRECTION_CHARS, description="the answer the expert expects to the question (optional)"
    )

    @model_validator(mode="after")
    def _blank_answer_is_none(self) -> ExpertLabel:
        if not self.expert_answer:
            self.expert_answer = None  # an emptied field in the page is no answer, not an empty one
        return self


class ExpertUndo(_ExpertAction):
    """Retract the item's current label (given by the same expert): the item is unlabelled again."""


class ExpertAck(BaseModel):
    label_id: int
    item_id: str
    grade: Grade | None  # None: an undo
    duplicate: bool = False
