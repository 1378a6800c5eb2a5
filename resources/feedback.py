"""The feedback loop's settings: where the store is, when feedback volume or query drift starts a retrain."""
import json
import os
from pathlib import Path

import pandas as pd
from dagster import ConfigurableResource
from pydantic import Field

from rag.feedback import FeedbackStore
from rag.feedback.drift import DriftThresholds
from rag.store import TableStore, data_dir


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


class FeedbackLoop(ConfigurableResource):
    db_url: str | None = Field(None, description="SQLAlchemy URL of the store; None: FEEDBACK_DB_URL, else "
                               "<data dir>/feedback.sqlite")
    data_dir: str = Field(default_factory=lambda: str(data_dir()))
    volume_threshold: int = Field(default_factory=lambda: _env_int("RAG_RETRAIN_FEEDBACK_THRESHOLD", 100),
                                  description="new feedback events since the last successful retrain that start one")
    retrain_run_config: dict = Field(default_factory=dict, description="extra config for both training assets of "
                                     "retrain_job (e.g. {'max_steps': 50}); the exported feedback dataset is added")
    drift_window: int = Field(200, description="recent queries compared with the reference")
    drift_reference: str | None = Field(None, description="reference queries: a .jsonl (`text` per line) or .txt "
                                        "file; None: the QA set the models were trained and evaluated on")
    drift_embedder: str = Field("minilm", description="embedding model the drift tests compare queries with")
    drift_consecutive_ticks: int = Field(3, ge=1, description="ticks in a row over a threshold before a retrain")
    drift_mmd_p_value: float = 0.01
    drift_classifier_auc: float = 0.7
    drift_positive_ratio_drop: float = 0.2
    drift_permutations: int = 200
    drift_min_queries: int = 30

    def thresholds(self) -> DriftThresholds:
        return DriftThresholds(mmd_p_value=self.drift_mmd_p_value, classifier_auc=self.drift_classifier_auc,
                               positive_ratio_drop=self.drift_positive_ratio_drop, permutations=self.drift_permutations,
                               min_queries=self.drift_min_queries)

    @property
    def root(self) -> Path:
        return Path(self.data_dir)

    def store(self) -> FeedbackStore:
        return FeedbackStore(self.db_url, root=self.root)

    def reference_queries(self, store: FeedbackStore) -> list[str]:
        """The drift reference: the configured file, else the QA set's questions, else the oldest stored queries."""
        if self.drift_reference:
            path = Path(self.drift_reference)
            lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            return [json.loads(line)["text"] for line in lines] if path.suffix == ".jsonl" else lines
        qa = TableStore(self.root / "tables").read("synthetic_qa", columns=["question"])
        if qa is not None and len(qa):
            return qa["question"].sample(min(len(qa), self.drift_window), random_state=0).tolist()
        oldest: pd.DataFrame = store.oldest_queries(self.drift_window)
        newest = set(store.recent_queries(self.drift_window)["query_id"])
        return oldest.loc[~oldest["query_id"].isin(newest), "text"].tolist()
