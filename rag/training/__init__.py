"""Trained models: a fine-tuned embedder and a cross-encoder reranker from the QA set (+ user feedback),
registered in rag.registry; the gate (rag.training.gate) records a verdict and rag.lifecycle promotes on it."""

from __future__ import annotations

from rag.training.config import EmbedderTrainingConfig, GateSettings, RerankerTrainingConfig, TrainingConfig
from rag.training.data import ExpertPair, FeedbackSplit, IRSet, TrainingData, split_feedback, training_data
from rag.training.gate import GateResult, gate_decision, paired_p_value

__all__ = [
    "EmbedderTrainingConfig",
    "RerankerTrainingConfig",
    "TrainingConfig",
    "GateSettings",
    "GateResult",
    "IRSet",
    "TrainingData",
    "training_data",
    "gate_decision",
    "paired_p_value",
    "FeedbackSplit",
    "split_feedback",
    "ExpertPair",
]
