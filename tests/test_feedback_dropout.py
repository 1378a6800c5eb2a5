"""RerankerTrainingConfig.feedback_dropout: a share of the training questions is seen as if nobody had rated any of
their candidates, as every passage of a new document is seen, so the learned ranker also learns to rank without likes
(trained only where likes are dense, it trusted them alone and ranked new reports' passages far below its first
stage)."""

from __future__ import annotations

import numpy as np

from rag.rerank.features import FEATURES, FEEDBACK
from rag.training.ltr import unrated

COLUMNS = [FEATURES.index(name) for name in FEEDBACK]


def _rows(groups: list[int]) -> np.ndarray:
    rng = np.random.default_rng(0)
    X = rng.random((sum(groups), len(FEATURES)))
    X[:, COLUMNS] = [3.0, 1.0, 0.8]  # every candidate rated: 3 likes, 1 dislike
    return X


def test_hidden_questions_read_as_unrated_whole_and_every_other_column_is_kept():
    groups = [5, 3, 4, 6, 2, 5, 5, 4]
    X = _rows(groups)
    out = unrated(X, groups, 0.5, seed=7)
    starts = np.cumsum([0, *groups[:-1]])
    hidden = [bool((out[s : s + n][:, COLUMNS] == [0.0, 0.0, 0.5]).all()) for s, n in zip(starts, groups)]
    kept = [bool((out[s : s + n][:, COLUMNS] == [3.0, 1.0, 0.8]).all()) for s, n in zip(starts, groups)]
    assert all(h != k for h, k in zip(hidden, kept))  # a question is hidden whole or not at all
    assert 0 < sum(hidden) < len(groups)
    others = [i for i in range(len(FEATURES)) if i not in COLUMNS]
    assert np.array_equal(out[:, others], X[:, others])
    assert (X[:, COLUMNS] == [3.0, 1.0, 0.8]).all()  # the input is not changed
    assert np.array_equal(unrated(X, groups, 0.5, seed=7), out)  # seeded


def test_no_dropout_changes_nothing_and_full_dropout_hides_every_rating():
    groups = [4, 4, 4]
    X = _rows(groups)
    assert unrated(X, groups, 0.0, seed=1) is X
    assert (unrated(X, groups, 1.0, seed=1)[:, COLUMNS] == [0.0, 0.0, 0.5]).all()
