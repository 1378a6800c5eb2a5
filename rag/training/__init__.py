"""Trained models: a fine-tuned embedder and a cross-encoder reranker from the QA set (+ user feedback),
registered in rag.registry and promoted only through the gate in rag.training.gate."""
from __future__ import annotations

from pathlib import Path

from rag.training.config import EmbedderTrainingConfig, GateSettings, RerankerTrainingConfig, TrainingConfig
from rag.training.data import IRSet, TrainingData, training_data
from rag.training.gate import GateResult, gate_decision, paired_p_value


def feedback_pairs(dataset_dir: str | Path | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(positives, hard negatives) from an exported feedback RAG-Dataset; nothing when there is none yet.
    Imported lazily: the feedback package is optional for training."""
    if not dataset_dir or not Path(dataset_dir).exists():
        return [], []
    from rag.feedback import training_pairs

    return training_pairs(Path(dataset_dir))


__all__ = ["EmbedderTrainingConfig", "RerankerTrainingConfig", "TrainingConfig", "GateSettings", "GateResult", "IRSet",
           "TrainingData", "training_data", "gate_decision", "paired_p_value", "feedback_pairs"]
