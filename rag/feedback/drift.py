"""Query drift: are recent questions still like the ones the models were trained and evaluated on?

Two tests on query embeddings (recent window vs reference window): the kernel two-sample test (MMD² with an
RBF kernel at the median-distance bandwidth, p-value by permutation) and a classifier two-sample test (the
cross-validated ROC AUC of a logistic regression telling the windows apart: 0.5 = indistinguishable). Beside
them, two signals from the feedback: the share of answers rated up, and how many passages a query retrieves.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field


class DriftThresholds(BaseModel):
    mmd_p_value: float = Field(0.01, description="MMD permutation p-value below this counts as a shift")
    classifier_auc: float = Field(0.7, description="...and the windows must be this separable")
    positive_ratio_drop: float = Field(0.2, description="answers rated up: recent share this far below the reference")
    # At 50 votes a side, a drop of 0.2 (the default above) is two standard errors of the difference of two shares
    # near one half: a handful of votes swings the share by that much on noise alone.
    min_votes: int = Field(
        50,
        ge=1,
        description="answer votes each window needs before its up-vote share is judged; "
        "fewer: no feedback verdict ('not enough votes'), the embedding tests still decide",
    )
    permutations: int = Field(200, ge=20)
    min_queries: int = Field(30, ge=5, description="fewer recent queries than this: no verdict")


class DriftReport(BaseModel):
    n_recent: int
    n_reference: int
    mmd2: float
    mmd_p_value: float
    classifier_auc: float
    positive_ratio_recent: float | None
    positive_ratio_reference: float | None
    retrieved_per_query_recent: float | None
    retrieved_per_query_reference: float | None
    retrieved_ks_p_value: float | None
    embedding_shift: bool
    feedback_shift: bool
    feedback_note: str | None = None  # why the up-vote share was not judged, e.g. "not enough votes (4 of 50 ...)"

    @property
    def drifted(self) -> bool:
        return self.embedding_shift or self.feedback_shift


def _rbf_kernel(x: np.ndarray) -> np.ndarray:
    sq = np.sum(x * x, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0.0)
    bandwidth = np.median(d2[np.triu_indices_from(d2, k=1)]) or 1.0  # median heuristic
    return np.exp(-d2 / bandwidth)


def _mmd2(kernel: np.ndarray, in_a: np.ndarray) -> float:
    """Biased MMD² estimate for the split `in_a` (boolean mask) of the pooled kernel matrix."""
    a, b = in_a, ~in_a
    return float(kernel[np.ix_(a, a)].mean() + kernel[np.ix_(b, b)].mean() - 2 * kernel[np.ix_(a, b)].mean())


def mmd_test(x: np.ndarray, y: np.ndarray, permutations: int = 200, seed: int = 0) -> tuple[float, float]:
    """(MMD², permutation p-value) of samples x and y (rows are vectors)."""
    pooled = np.vstack([x, y]).astype(np.float64)
    kernel = _rbf_kernel(pooled)
    labels = np.zeros(len(pooled), dtype=bool)
    labels[: len(x)] = True
    observed = _mmd2(kernel, labels)
    rng = np.random.default_rng(seed)
    exceed = sum(_mmd2(kernel, rng.permutation(labels)) >= observed for _ in range(permutations))
    return observed, (exceed + 1) / (permutations + 1)


def classifier_auc(x: np.ndarray, y: np.ndarray, seed: int = 0) -> float:
    """Cross-validated ROC AUC of a logistic regression separating x from y."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    features = np.vstack([x, y])
    labels = np.r_[np.ones(len(x)), np.zeros(len(y))]
    folds = max(2, min(5, len(x), len(y)))
    scores = cross_val_score(
        LogisticRegression(max_iter=1000),
        features,
        labels,
        scoring="roc_auc",
        cv=StratifiedKFold(folds, shuffle=True, random_state=seed),
    )
    return float(np.mean(scores))


def _ratio(scores: list[int]) -> float | None:
    return sum(1 for s in scores if s > 0) / len(scores) if scores else None


def drift_report(
    recent: np.ndarray,
    reference: np.ndarray,
    *,
    recent_scores: list[int],
    reference_scores: list[int],
    recent_retrieved: list[int],
    reference_retrieved: list[int],
    thresholds: DriftThresholds,
    seed: int = 0,
) -> DriftReport:
    from scipy.stats import ks_2samp

    mmd2, p_value = mmd_test(recent, reference, thresholds.permutations, seed)
    auc = classifier_auc(recent, reference, seed)
    ratio_recent, ratio_reference = _ratio(recent_scores), _ratio(reference_scores)
    ks_p = (
        float(ks_2samp(recent_retrieved, reference_retrieved).pvalue)
        if recent_retrieved and reference_retrieved
        else None
    )
    short = [
        f"{n} of {thresholds.min_votes} in {window}"
        for n, window in ((len(recent_scores), "the recent window"), (len(reference_scores), "the reference"))
        if n < thresholds.min_votes
    ]
    note = f"not enough votes ({', '.join(short)})" if short else None
    feedback_shift = (
        note is None
        and ratio_recent is not None
        and ratio_reference is not None
        and ratio_reference - ratio_recent >= thresholds.positive_ratio_drop
    )
    return DriftReport(
        n_recent=len(recent),
        n_reference=len(reference),
        mmd2=round(mmd2, 6),
        mmd_p_value=round(p_value, 4),
        classifier_auc=round(auc, 4),
        positive_ratio_recent=ratio_recent,
        positive_ratio_reference=ratio_reference,
        retrieved_per_query_recent=float(np.mean(recent_retrieved)) if recent_retrieved else None,
        retrieved_per_query_reference=float(np.mean(reference_retrieved)) if reference_retrieved else None,
        retrieved_ks_p_value=ks_p,
        embedding_shift=p_value < thresholds.mmd_p_value and auc >= thresholds.classifier_auc,
        feedback_shift=feedback_shift,
        feedback_note=note,
    )
