"""A learning-to-rank reranker: LightGBM LambdaRank over the features of rag.rerank.features.

Saved as a directory:
    model.txt   the LightGBM booster (text format, readable by any LightGBM)
    ltr.json    feature names, corpus statistics, feedback priors, the score calibration, training settings

Score scale: the probability that the passage is relevant, in [0, 1]: the raw LambdaRank margin (the booster's
output, plus the first-stage start when it was trained to boost from the first stage's order) mapped through a
logistic calibration fitted on held-out selection questions (Platt scaling). The order is the margin's;
`min_score` and attribution thresholds for this reranker are probabilities.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from rag.rerank.features import FEATURES, CorpusStats, FeedbackPriors, PassageTerms, feature_matrix

LTR_FILE = "ltr.json"
BOOSTER_FILE = "model.txt"


@dataclass
class _Candidate:
    """A passage with no first-stage information (reranking plain texts): its signals are missing."""

    rank: int
    chunk: dict
    signals: dict


def first_stage_margin(rows: np.ndarray, prior: float) -> np.ndarray:
    """Each candidate's starting margin when the ranker boosts from the first stage's order: `prior` times
    -ln(first-stage rank), so rank 1 starts at 0 and every e-fold further down costs `prior` (0: no start)."""
    if not prior or not len(rows):
        return np.zeros(len(rows), dtype=np.float64)
    ranks = np.maximum(np.nan_to_num(rows[:, FEATURES.index("first_stage_rank")], nan=1.0), 1.0)
    return -prior * np.log(ranks)


def margins(
    booster, rows: np.ndarray, prior: float, num_iteration: int | None = None, columns: list[int] | None = None
) -> np.ndarray:
    """The ranker's raw margin: the trees' output plus the first-stage start they were trained on top of. `rows`
    hold every column of FEATURES; `columns`, the ones the booster was trained on (None: all of them)."""
    given = rows[:, columns] if columns is not None and len(rows) else rows
    trees = booster.predict(given, num_iteration=num_iteration) if len(rows) else np.zeros(0)
    return np.asarray(trees, dtype=np.float64) + first_stage_margin(rows, prior)


def is_ltr_dir(path: str | Path) -> bool:
    return (Path(path) / LTR_FILE).exists() and (Path(path) / BOOSTER_FILE).exists()


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


class LearnedRanker:
    """Re-scores first-stage hits with a trained LambdaRank booster; see the module doc for the score scale."""

    needs_hits = True
    scale = "probability"

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        self.path = Path(path)
        if not is_ltr_dir(self.path):
            raise ValueError(f"no learning-to-rank model at {self.path}: train one (the trained_reranker asset) first")
        self.name = name or self.path.name
        meta, self._booster = _load(str(self.path.resolve()))
        unknown = [f for f in meta["features"] if f not in FEATURES]
        if unknown:
            raise ValueError(
                f"{self.path} was trained on features this version does not compute ({', '.join(unknown)}): "
                "retrain the reranker"
            )
        # A ranker trained before features were added keeps serving on the columns it learned from.
        self._columns = None if meta["features"] == FEATURES else [FEATURES.index(f) for f in meta["features"]]
        self.stats = CorpusStats.from_json(meta["corpus_stats"])
        self.priors = FeedbackPriors.from_json(meta.get("feedback_priors"))
        self.calibration = meta.get("calibration") or {"slope": 1.0, "intercept": 0.0}
        self.meta = meta
        self.first_stage_prior = float(meta.get("settings", {}).get("first_stage_prior", 0.0))
        self._passage_terms = PassageTerms()

    def raw_scores(self, query: str, hits) -> np.ndarray:
        if not len(hits):
            return np.zeros(0, dtype=np.float64)
        rows = feature_matrix(query, hits, self.stats, self.priors.serving, passage_terms=self._passage_terms)
        return margins(self._booster, rows, self.first_stage_prior, columns=self._columns)

    def warm(self, passages) -> int:
        """Learn the passages' terms ahead of the questions (PassageTerms.warm); the number added."""
        return self._passage_terms.warm(str(p) for p in passages)

    def score_hits(self, query: str, hits) -> np.ndarray:
        raw = self.raw_scores(query, hits)
        return sigmoid(self.calibration["slope"] * raw + self.calibration["intercept"]).astype(np.float32)

    def score(self, query: str, passages: list[str]) -> np.ndarray:
        """Plain texts: the given order stands in for the first-stage rank; dense and BM25 list signals are missing."""
        return self.score_hits(query, [_Candidate(i + 1, {"text": p}, {}) for i, p in enumerate(passages)])


@lru_cache(maxsize=8)
def _load(path: str):
    """Once per process and directory (registry versions are immutable, so the path is the identity)."""
    import lightgbm as lgb

    meta = json.loads((Path(path) / LTR_FILE).read_text())
    return meta, lgb.Booster(model_file=str(Path(path) / BOOSTER_FILE))


def save_ltr(
    folder: Path, booster, stats: CorpusStats, priors: FeedbackPriors, calibration: dict, settings: dict
) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(folder / BOOSTER_FILE))
    meta = {
        "kind": "lambdamart",
        "features": FEATURES,
        "corpus_stats": stats.to_json(),
        "feedback_priors": priors.to_json(),
        "calibration": calibration,
        "settings": settings,
        "score_scale": LearnedRanker.scale,
    }
    (folder / LTR_FILE).write_text(json.dumps(meta))
    return folder


__all__ = ["LearnedRanker", "first_stage_margin", "is_ltr_dir", "margins", "save_ltr", "sigmoid"]
