"""Feedback: the store of queries, answers and ratings, and its export as a RAG-Dataset for training.

store = FeedbackStore()                       # data_dir()/feedback.sqlite, or FEEDBACK_DB_URL
q = store.record_query("question", answer="...", chunks=[...], model_version="minilm@abc")
store.submit_feedback(FeedbackSubmission(query_id=q.query_id, idempotency_key="k1", answer_score=1))
export_rag_dataset(store, out_dir); positives, negatives = training_pairs(out_dir)
# an expert grades an annotation queue item (0/1/2); exports carry it in qrels/expert_qrels.tsv
store.record_expert_label(ExpertLabel(item_id=item.item_id, grade=2, expert="ann", idempotency_key="k2"),
                          question=item.question, passage=item.model_dump(), query_id=item.query_id)
"""

from rag.feedback.dataset import (
    Judgments,
    export_rag_dataset,
    export_versioned,
    judgments,
    latest_dataset,
    training_pairs,
)
from rag.feedback.models import (
    ExpertAck,
    ExpertLabel,
    ExpertUndo,
    FeedbackAck,
    FeedbackError,
    FeedbackSubmission,
    IdempotencyConflictError,
    ImplicitEvent,
    NothingToUndoError,
    PassageRating,
    StoredQuery,
    UnknownPassageError,
    UnknownQueryError,
)
from rag.feedback.store import FeedbackStore, default_url

__all__ = [
    "FeedbackStore",
    "default_url",
    "export_rag_dataset",
    "export_versioned",
    "latest_dataset",
    "training_pairs",
    "Judgments",
    "judgments",
    "FeedbackSubmission",
    "PassageRating",
    "ImplicitEvent",
    "FeedbackAck",
    "StoredQuery",
    "FeedbackError",
    "UnknownQueryError",
    "UnknownPassageError",
    "IdempotencyConflictError",
    "ExpertLabel",
    "ExpertUndo",
    "ExpertAck",
    "NothingToUndoError",
]
