"""Feedback: the store of queries, answers and ratings, and its export as a RAG-Dataset for training.

    store = FeedbackStore()                       # data_dir()/feedback.sqlite, or FEEDBACK_DB_URL
    q = store.record_query("question", answer="...", chunks=[...], model_version="minilm@abc")
    store.submit_feedback(FeedbackSubmission(query_id=q.query_id, idempotency_key="k1", answer_score=1))
    export_rag_dataset(store, out_dir); positives, negatives = training_pairs(out_dir)
"""
from rag.feedback.dataset import Judgments, export_rag_dataset, export_versioned, judgments, latest_dataset, training_pairs
from rag.feedback.models import (
    FeedbackAck,
    FeedbackError,
    FeedbackSubmission,
    IdempotencyConflictError,
    ImplicitEvent,
    PassageRating,
    StoredQuery,
    UnknownPassageError,
    UnknownQueryError,
)
from rag.feedback.store import FeedbackStore, default_url

__all__ = [
    "FeedbackStore", "default_url", "export_rag_dataset", "export_versioned", "latest_dataset", "training_pairs", "Judgments", "judgments", "FeedbackSubmission", "PassageRating",
    "ImplicitEvent", "FeedbackAck", "StoredQuery", "FeedbackError", "UnknownQueryError", "UnknownPassageError",
    "IdempotencyConflictError",
]
