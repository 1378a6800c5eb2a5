"""Trained models: a fine-tuned embedder and a cross-encoder reranker from the QA set (+ user feedback),
registered in rag.registry and promoted only through the gate in rag.training.gate."""
from __future__ import annotations

from rag.training.config import EmbedderTrainingConfig, GateSettings, RerankerTrainingConfig, TrainingConfig
from rag.training.data import ExpertPair, FeedbackSplit, IRSet, TrainingData, split_feedback, training_data
from rag.training.gate import GateResult, PromotionRefused, gate_decision, paired_p_value

__all__ = ["EmbedderTrainingConfig", "RerankerTrainingConfig", "TrainingConfig", "GateSettings", "GateResult", "IRSet",
           "TrainingData", "training_data", "gate_decision", "paired_p_value", "FeedbackSplit",
           "split_feedback", "PromotionRefused", "ExpertPair"]
