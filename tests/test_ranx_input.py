"""rag.evaluation.ranx_input hands ranx's metrics what ranx's own Qrels and Run would: same rows, same order, so
the same scores. The comparison with ranx's classes is slow: building them compiles numba's typed dicts (~11 s here)."""

import numpy as np
import pytest

from rag.evaluation.metrics import METRICS
from rag.evaluation.ranx_input import ranx_lists


def test_rows_follow_the_queries_given_and_descend_by_score_with_one_code_per_document():
    qrels = {"b": {"d2": 2, "d1": 1}, "a": {"d9": 1}}
    run = {"a": {"d1": 1.0, "d9": 3.0, "d5": 2.0}}  # "b" retrieved nothing
    judged, ranked = ranx_lists(qrels, run, ["b", "a"])
    assert len(judged) == len(ranked) == 2
    codes = {d: code for d, code in zip(["d2", "d1", "d9"], judged[0][:, 0].tolist() + judged[1][:, 0].tolist())}
    assert judged[0][:, 1].tolist() == [2.0, 1.0] and judged[1][:, 1].tolist() == [1.0]
    assert ranked[0].shape == (0, 2)
    assert ranked[1][:, 1].tolist() == [3.0, 2.0, 1.0]
    # The same document has the same code on both sides (a hit), and another document another code.
    assert ranked[1][0, 0] == codes["d9"] and ranked[1][2, 0] == codes["d1"] and ranked[1][1, 0] not in codes.values()
    with pytest.raises(ValueError, match="no queries"):
        ranx_lists(qrels, run, [])


@pytest.mark.slow
def test_every_reported_metric_equals_ranx_own_qrels_and_run_on_tied_scores():
    from ranx import Qrels, Run, evaluate

    rng = np.random.default_rng(0)
    qrels, run = {}, {}
    for i in range(200):
        q = f"q{rng.integers(0, 10**6)}-{i}"
        qrels[q] = {f"d{rng.integers(0, 300)}": int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 6)))}
        # Scores from five values: many ties, whose order ranx's builder decides (argsort need not keep them in place).
        ranked = {f"d{rng.integers(0, 300)}": float(rng.integers(0, 5)) for _ in range(int(rng.integers(0, 30)))}
        if ranked:
            run[q] = ranked
    queries = sorted(qrels)
    ours = evaluate(*ranx_lists(qrels, run, queries), METRICS, return_mean=False)
    theirs = evaluate(
        Qrels(qrels), Run({q: run.get(q, {}) for q in qrels}), METRICS, return_mean=False, make_comparable=True
    )
    assert sum(np.ptp(ours[m]) > 0 for m in METRICS) > 20  # scores that vary, not all zeros
    assert [m for m in METRICS if not np.array_equal(ours[m], theirs[m])] == []
