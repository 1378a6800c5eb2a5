"""Offline evidence from feedback without production's bias: condensed lists.

Feedback judges only what production showed. A candidate that ranks an unseen (and so unjudged) relevant
passage first would be scored as if that passage were irrelevant, so plain metrics favour production. Condensed
lists (Sakai 2007) drop every unjudged passage from each ranking before scoring: both models are compared on
the passages someone judged, whatever label they got.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

Ranking = Mapping[str, float] | Sequence[str]
DEFAULT_METRICS = ("ndcg@10", "mrr@10")


def as_scored(ranking: Ranking) -> dict[str, float]:
    """A ranked id list (best first) or a {doc: score} dict → {doc: score} with the same order.

    Lists get strictly decreasing scores: ranx orders equal scores arbitrarily."""
    if isinstance(ranking, Mapping):
        return {str(d): float(s) for d, s in ranking.items()}
    if isinstance(ranking, str):
        raise TypeError("a ranking is a list of doc ids or a {doc_id: score} dict, not one string")
    ids = list(dict.fromkeys(ranking))  # a repeated id keeps its best rank
    return {d: float(len(ids) - i) for i, d in enumerate(ids)}


def condensed_run(
    run: Mapping[str, Ranking], judgments: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, float]]:
    """Every ranking with its unjudged docs removed; the judged ones keep their scores, so their order.

    judged = the doc has any label for that query in `judgments` (0 and negative labels included: a passage shown
    and rated down was judged irrelevant, which is evidence). A query without judgments keeps an empty ranking."""
    return {q: {d: s for d, s in as_scored(ranking).items() if d in judgments.get(q, {})} for q, ranking in run.items()}


@dataclass(frozen=True)
class RunScores:
    """One model's scores: the mean of each metric and a table with one row per query (`qid` + metric columns,
    the layout rag.training.gate.gate_decision compares)."""

    mean: dict[str, float]
    per_query: pd.DataFrame


@dataclass(frozen=True)
class OfflineComparison:
    """Production and candidate on the same queries, scored on plain and on condensed rankings."""

    production: RunScores
    candidate: RunScores
    production_condensed: RunScores
    candidate_condensed: RunScores
    queries: int  # queries with at least one positive judgment: the ones scored


def positive_qrels(judgments: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Graded relevance for the metrics: labels <= 0 carry no gain. Queries without a positive label are dropped:
    their nDCG and MRR are 0 for every ranking, so they cannot tell two models apart."""
    qrels = {q: {d: int(label) for d, label in docs.items() if label > 0} for q, docs in judgments.items()}
    return {q: docs for q, docs in qrels.items() if docs}


def score_run(
    qrels: dict[str, dict[str, int]], run: Mapping[str, Ranking], metrics: Sequence[str] = DEFAULT_METRICS
) -> RunScores:
    """ranx metrics of `run` on the queries of `qrels`; a query the run lacks scores 0."""
    from ranx import evaluate

    from rag.evaluation.ranx_input import ranx_lists

    if not qrels:
        raise ValueError(
            "no query has a positive judgment: nothing to score. Collect rated feedback (+1 passages) "
            "for the held-out questions first"
        )
    metrics = list(metrics)
    scored = {q: as_scored(run.get(q) or {}) for q in qrels}
    queries = sorted(qrels)
    values = evaluate(*ranx_lists(qrels, scored, queries), metrics, return_mean=False)
    if len(metrics) == 1:  # ranx returns the bare array for a single metric
        values = {metrics[0]: values}
    table = pd.DataFrame({m: values[m] for m in metrics}, index=pd.Index(queries, name="qid"))
    return RunScores({m: float(table[m].mean()) for m in metrics}, table.reset_index())


def compare_offline(
    production: Mapping[str, Ranking],
    candidate: Mapping[str, Ranking],
    judgments: Mapping[str, Mapping[str, int]],
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> OfflineComparison:
    """Both runs scored plain and condensed (default nDCG@10, MRR@10), per query too, for a paired test by the caller.

    Judge the candidate by the condensed scores: the plain ones are reported to show how large production's
    advantage from having chosen what was judged is."""
    qrels = positive_qrels(judgments)
    return OfflineComparison(
        production=score_run(qrels, production, metrics),
        candidate=score_run(qrels, candidate, metrics),
        production_condensed=score_run(qrels, condensed_run(production, judgments), metrics),
        candidate_condensed=score_run(qrels, condensed_run(candidate, judgments), metrics),
        queries=len(qrels),
    )
