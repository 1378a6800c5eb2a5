"""Compile ranx's metrics once, at install time, into numba's on-disk cache beside ranx.

ranx compiles every metric with numba the first time a process uses it and keeps the machine code in its package's
__pycache__. In a fresh environment a first `evaluate` waited 72 s here (6 s once cached), and every process that
evaluated before the cache was written compiled again. A fresh checkout's tests took 939 s on their first run, 759 s
with this step in `make install` (deploy/image/install-python.sh), and 595 s on a second run. The inputs the metrics
take are built by rag.evaluation.ranx_input's compiled function, cached the same way (in rag/evaluation/__pycache__).

    python -m rag.evaluation.warmup"""

from __future__ import annotations

import time


def compile_metrics() -> float:
    """Evaluate a two-question run with every metric the product reports, through the product's own function (so with
    the argument types numba compiles for), and run the paired t-test. Returns the seconds it took."""
    import pandas as pd

    from rag.evaluation.metrics import METRICS, evaluate_run, paired_comparison
    from rag.quiet import quiet_known_noise

    quiet_known_noise()
    started = time.perf_counter()
    qrels = {"q1": {"a": 1}, "q2": {"b": 2, "c": 1}}
    run = {"q1": {"a": 2.0, "b": 1.0}, "q2": {"a": 3.0, "c": 2.0, "b": 1.0}}
    _, per_query = evaluate_run(qrels, run, METRICS)
    scores = per_query.set_index("qid")["ndcg@10"]
    paired_comparison(scores, pd.Series([0.1, 0.2], index=scores.index), resamples=10)
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"ranx metrics compiled into numba's cache in {compile_metrics():.0f} s")
