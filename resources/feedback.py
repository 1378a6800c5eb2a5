"""The feedback loop's settings: where the store is, when feedback volume or query drift starts a retrain."""

import json
import os
from pathlib import Path

import pandas as pd
from dagster import ConfigurableResource
from pydantic import Field, field_validator

from rag.feedback import FeedbackStore
from rag.feedback.drift import DriftThresholds
from rag.store import TableStore, data_dir


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


class FeedbackLoop(ConfigurableResource):
    db_url: str | None = Field(
        None, description="SQLAlchemy URL of the store; None: FEEDBACK_DB_URL, else `<data dir>/feedback.sqlite`"
    )
    data_dir: str = Field(default_factory=lambda: str(data_dir()))
    volume_threshold: int = Field(
        default_factory=lambda: _env_int("RAG_RETRAIN_FEEDBACK_THRESHOLD", 100),
        description="new feedback events since the last successful retrain that start one",
    )
    retrain_run_config: dict = Field(
        default_factory=dict,
        description="extra config for the training assets of "
        "retrain_job (e.g. {'max_steps': 50}); the exported feedback dataset is added",
    )
    learners: list[str] = Field(
        default_factory=lambda: ["embedder", "reranker", "configuration"],
        description="what a feedback retrain trains, gates and releases: the fine-tuned embedder, the learned "
        "reranker, the serving configuration (each with its release step); fewer saves a CPU's time",
    )

    @field_validator("learners")
    @classmethod
    def _known_learners(cls, learners: list[str]) -> list[str]:
        unknown = sorted(set(learners) - {"embedder", "reranker", "configuration"})
        if unknown or not learners:
            raise ValueError(f"learners must name some of embedder, reranker, configuration; got {learners}")
        return learners
    drift_window: int = Field(200, description="recent queries compared with the reference")
    drift_reference_window: int = Field(
        200,
        ge=5,
        description="production queries in the reference: the first ones "
        "asked after the latest promotion (or finished retrain)",
    )
    drift_reference: str | None = Field(
        None,
        description="reference queries: a .jsonl (`text` per line) or .txt "
        "file, used instead of production queries; None: the production queries, "
        "with the QA set as the fallback until there are enough of them",
    )
    drift_embedder: str = Field("minilm", description="embedding model the drift tests compare queries with")
    drift_consecutive_ticks: int = Field(3, ge=1, description="ticks in a row over a threshold before a retrain")
    drift_mmd_p_value: float = 0.01
    drift_classifier_auc: float = 0.7
    drift_positive_ratio_drop: float = 0.2
    drift_permutations: int = 200
    drift_min_queries: int = 30
    drift_min_votes: int = Field(
        DriftThresholds.model_fields["min_votes"].default,
        ge=1,
        description="answer votes each window needs before a drop in the up-vote share "
        "counts as drift (fewer: 'not enough votes', no feedback verdict)",
    )

    def thresholds(self) -> DriftThresholds:
        return DriftThresholds(
            mmd_p_value=self.drift_mmd_p_value,
            classifier_auc=self.drift_classifier_auc,
            positive_ratio_drop=self.drift_positive_ratio_drop,
            permutations=self.drift_permutations,
            min_queries=self.drift_min_queries,
            min_votes=self.drift_min_votes,
        )

    @property
    def root(self) -> Path:
        return Path(self.data_dir)

    def store(self) -> FeedbackStore:
        return FeedbackStore(self.db_url, root=self.root)

    def reference_file(self) -> list[str]:
        """The operator's own reference (drift_reference)."""
        path = Path(self.drift_reference)
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [json.loads(line)["text"] for line in lines] if path.suffix == ".jsonl" else lines

    def qa_reference(self) -> tuple[list[str], str]:
        """The fallback reference: the QA set's questions, without those copied out of the documents. Without
        an LLM every question is such a sentence (inverse cloze), and real questions always look drifted from
        sentences: a reference of them would start a retrain every few ticks. (questions, what is missing)."""
        tables = TableStore(self.root / "tables")
        try:
            qa = tables.read("synthetic_qa", columns=["question", "qtype", "source"])
        except (KeyError, ValueError):  # a QA table from before qtype/source were recorded
            qa = tables.read("synthetic_qa", columns=["question"])
        if qa is None or not len(qa):
            return [], "there is no QA set"
        copied = pd.Series(False, index=qa.index)
        for column in ("qtype", "source"):
            if column in qa:
                copied |= qa[column].astype(str).eq("inverse-cloze")
        questions = qa.loc[~copied, "question"]
        if len(questions) < self.drift_min_queries:
            why = f"the QA set has {len(questions)} written questions (need {self.drift_min_queries})"
            if copied.any():
                why += (
                    f": its other {int(copied.sum())} are sentences copied from the documents, which real questions "
                    "always look drifted from"
                )
            return [], why
        return questions.sample(min(len(questions), self.drift_reference_window), random_state=0).tolist(), ""
