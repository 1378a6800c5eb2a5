"""Qrels and runs in the form ranx's metrics compute on, built without ranx's Qrels and Run classes.

ranx's Qrels and Run keep numba typed dicts keyed by strings. Each process that builds them compiles numba's
typed-dict and typed-list operations again (numba cannot cache those) and the builders once more for each length of
document id, each time a CLI, a Dagster step or a test worker starts: a first evaluation in a fresh process took
15.8 s here (5.9 s through this module; 5 s of either is importing ranx), and ids of another length 4.0 s more
(0.05 s through this module).
ranx's `evaluate` also takes what those classes hand to its metrics: a typed list with one float64 array of (document,
score) rows per query, sorted as they sort. This module builds that list with one compiled function that numba keeps
in its cache, so the metrics are still ranx's and a process only loads them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numba import njit
from numba.typed import List


@njit(cache=True)
def _ranked_arrays(codes, scores, offsets, sorts):
    """One (n, 2) array of [document code, score] per query, rows ordered by descending score the way ranx's own
    builder orders them: numba's argsort of the negated scores, from the order given, `sorts` times (a Run that
    ranx makes comparable is sorted twice, and argsort need not keep ties in place)."""
    out = List()
    for i in range(len(offsets) - 1):
        c = codes[offsets[i] : offsets[i + 1]].copy()
        s = scores[offsets[i] : offsets[i + 1]].copy()
        for _ in range(sorts):
            order = np.argsort(-s)
            c = c[order]
            s = s[order]
        rows = np.empty((len(c), 2), dtype=np.float64)
        rows[:, 0] = c
        rows[:, 1] = s
        out.append(rows)
    return out


def _flatten(table: Sequence[Mapping[str, float]], codes: dict[str, int]) -> tuple[np.ndarray, ...]:
    sizes = np.fromiter((len(docs) for docs in table), dtype=np.int64, count=len(table))
    offsets = np.zeros(len(table) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    doc_codes = np.fromiter(
        (codes.setdefault(d, len(codes)) for docs in table for d in docs), dtype=np.float64, count=int(offsets[-1])
    )
    scores = np.fromiter((float(v) for docs in table for v in docs.values()), dtype=np.float64, count=len(doc_codes))
    return doc_codes, scores, offsets


def ranx_lists(
    qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]], queries: Sequence[str]
) -> tuple[List, List]:
    """`qrels` and `run` restricted to `queries` (in that order; a query the run lacks has no results), as ranx's
    Qrels and Run (made comparable) would hand them to its metrics. Pass both to `ranx.evaluate`; its per-query
    scores come back in the order of `queries`."""
    if not queries:
        raise ValueError("no queries to score: ranx needs at least one (an empty typed list has no type)")
    codes: dict[str, int] = {}  # exact per-call document codes (ranx hashes the strings)
    judged = _flatten([qrels[q] for q in queries], codes)
    ranked = _flatten([run.get(q) or {} for q in queries], codes)
    return _ranked_arrays(*judged, 1), _ranked_arrays(*ranked, 2)
