"""Score one index (a chunk set × model) with a span-anchored QA set, for each retrieval mode.

Two rules keep strategies comparable. Every question of the split is scored whatever the chunk set, so all
strategies share one question set: a question whose evidence no chunk holds is a miss. And the ranked chunks are
scored as the answer pipeline hands them to the generator, cut to its character budget (rag.qa.prompt.fit_context):
a chunk the size of a whole article is then a hit only when its evidence lies in the part the prompt holds, and
the characters that context costs are reported beside the metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from pydantic import BaseModel, Field, field_validator

from rag.evaluation.metrics import (
    KS,
    METRICS,
    evaluate_run,
    metrics_at,
    paired_comparison,
    retrieval_score,
    run_from_hits,
    weighted_average,
)
from rag.evaluation.qaset import QAItem, Relevance, context_chars, context_run, qrels_for_chunks
from rag.qa.models import AnswerSettings
from rag.qa.prompt import fit_context
from rag.retrieval import DENSE_MODES, Index, RetrievalParams, retrieve

REPORT_KEYS = ["strategy", "model", "mode"]
# The answer pipeline's own default budget, so the evaluation scores the context a default prompt gets.
CONTEXT_CHARS = AnswerSettings.model_fields["max_context_chars"].default
BASELINE = ("recursive-1000-200", "dense")  # (strategy, mode): the naive configuration every other is compared with
HEADLINE_KS = (5, 10)  # RetrievalScore is at 5; reports and the summary show recall@5, nDCG@10, MRR@10


class EvaluationSettings(BaseModel):
    """How retrieval_evaluation scores; the single home of these defaults (the asset's run config reads them)."""

    relevance: Relevance = Field(default_factory=Relevance)
    ks: list[int] = Field(
        default_factory=lambda: list(KS),
        description="cutoffs of every metric (recall, precision, "
        f"MRR, nDCG, MAP, hit rate); must include {' and '.join(map(str, HEADLINE_KS))}",
    )
    max_context_chars: int | None = Field(
        CONTEXT_CHARS,
        description="score the passages a prompt of this many characters "
        "holds (the answer pipeline's default); None = whole chunks, no budget",
    )

    @field_validator("ks")
    @classmethod
    def _headline_ks(cls, ks: list[int]) -> list[int]:
        if any(k < 1 for k in ks) or not set(HEADLINE_KS) <= set(ks):
            raise ValueError(
                f"ks {ks}: cutoffs are positive and include {list(HEADLINE_KS)} "
                "(RetrievalScore and the summary use them)"
            )
        return sorted(set(ks))


@dataclass
class ConfigReport:
    summary: pd.DataFrame  # one row per mode: metrics, RetrievalScore, counts, context characters, latency
    per_query: pd.DataFrame  # one row per (mode, question)


def evaluate_index(
    index: Index,
    items: list[QAItem],
    chunks: pd.DataFrame,
    *,
    strategy: str,
    model: str,
    modes: list[str],
    split: str = "all",
    relevance: Relevance | None = None,
    params: RetrievalParams | None = None,
    max_context_chars: int | None = CONTEXT_CHARS,
    ks: list[int] | tuple[int, ...] = KS,
) -> ConfigReport:
    """Metrics at each k of `ks` over the first k passages of the context within `max_context_chars` (None: whole
    chunks, no budget), and `context_chars@5`, the mean characters of the first five."""
    relevance = relevance or Relevance()
    metrics = metrics_at(ks)
    selected = [i for i in items if split == "all" or i.split == split]
    if not selected:
        raise ValueError(f"no question in split {split!r}: pick another split or generate questions (synthetic_qa)")
    found = qrels_for_chunks(selected, chunks, relevance)
    qrels = {i.qid: found.get(i.qid, {}) for i in selected}
    params = (params or RetrievalParams()).model_copy(update={"k": max(ks)})
    if DENSE_MODES.intersection(modes):
        index.embed_queries([q.question for q in selected])
    rows, tables = [], []
    for mode in modes:
        started = time.perf_counter()
        hits = {q.qid: retrieve(index, q.question, mode, params) for q in selected}
        seconds = time.perf_counter() - started
        contexts = {
            qid: [h.chunk for h in (fit_context(hs, max_context_chars) if max_context_chars else hs)]
            for qid, hs in hits.items()
        }
        mean, per_query = evaluate_run(qrels, run_from_hits(context_run(selected, contexts, qrels, relevance)), metrics)
        # The thesis's WA also needs faithfulness and reference-free precision, which come from generated
        # answers; until those exist it stays empty rather than being computed from half its terms.
        wa = weighted_average(
            {
                "context_recall": mean["recall@5"],
                "context_precision_ref": mean["precision@5"],
                "faithfulness": None,
                "context_precision_noref": None,
            }
        )
        rows.append(
            {
                "strategy": strategy,
                "model": model,
                "mode": mode,
                "split": split,
                "n_questions": len(selected),
                "n_without_relevant_chunk": len(selected) - len(found),
                "relevance": relevance.mode,
                "ks": ",".join(map(str, ks)),
                "max_context_chars": max_context_chars,
                "context_chars@5": context_chars(contexts, 5),
                "retrieval_score": retrieval_score(mean),
                "weighted_average": wa,
                "query_ms": 1000 * seconds / len(selected),
                **mean,
            }
        )
        per_query.insert(0, "mode", mode)
        per_query["question"] = per_query["qid"].map({q.qid: q.question for q in selected})
        per_query["top_chunk"] = per_query["qid"].map(
            {q: (hs[0].chunk["chunk_id"] if hs else None) for q, hs in hits.items()}
        )
        per_query["context_chars@5"] = per_query["qid"].map(
            {q: sum(len(c["text"]) for c in cs[:5]) for q, cs in contexts.items()}
        )
        tables.append(per_query)
    return ConfigReport(pd.DataFrame(rows), pd.concat(tables, ignore_index=True))


def report_metrics(report: pd.DataFrame) -> list[str]:
    """The metric columns a report was scored with: its `ks` (reports before the column: the default cutoffs)."""
    if "ks" not in report.columns or report.empty:
        return METRICS
    return metrics_at(int(k) for k in str(report["ks"].iloc[0]).split(","))


def current_reports(reports: dict[str, pd.DataFrame]) -> tuple[list[pd.DataFrame], list[str]]:
    """(reports written by this evaluation, names of stale ones). Reports without a `relevance` column were scored by
    any overlap over whole chunks on each strategy's own questions: beside current ones they would favour big chunks."""
    stale = sorted(name for name, frame in reports.items() if "relevance" not in frame.columns)
    return [frame for name, frame in reports.items() if name not in stale], stale


def config_label(row) -> str:
    """How people read a summary row: strategy · model · mode, without a model for modes that use none (BM25)."""
    return " · ".join(part for part in (row["strategy"], row["model"], row["mode"]) if part)


def _strongest_baseline_model(summary: pd.DataFrame, baseline: tuple[str, str]) -> str | None:
    """The model whose baseline scores highest: what a row without a model (BM25) is compared with, since any
    model's baseline would do and the strongest one is the conservative choice."""
    base = summary[(summary["strategy"] == baseline[0]) & (summary["mode"] == baseline[1]) & (summary["model"] != "")]
    return None if base.empty else str(base.sort_values("retrieval_score", ascending=False).iloc[0]["model"])


def summarize(reports: pd.DataFrame, baseline: tuple[str, str] = BASELINE) -> pd.DataFrame:
    """Every configuration side by side, best first, with deltas against the naive baseline of the same model.
    A mode without embeddings (BM25) scores the same in every model's report of a strategy, so it is listed once per
    strategy with an empty model, and its deltas are against the strongest baseline (see _strongest_baseline_model)."""
    if reports.empty:
        return reports
    lexical = ~reports["mode"].isin(DENSE_MODES)
    once = reports[lexical].drop_duplicates(["strategy", "mode"]).assign(model="")
    parts = [frame for frame in (reports[~lexical], once) if not frame.empty]  # concat warns on empty frames
    out = pd.concat(parts).sort_values("retrieval_score", ascending=False, ignore_index=True)
    out["best"] = False
    out.loc[0, "best"] = True
    base = out[(out["strategy"] == baseline[0]) & (out["mode"] == baseline[1])].set_index("model")
    strongest = _strongest_baseline_model(out, baseline)

    def delta(row: dict, metric: str) -> float | None:
        model = row["model"] or strongest
        return row[metric] - base.loc[model, metric] if model in base.index else None

    for metric in ("retrieval_score", "recall@5", "ndcg@10"):
        out[f"delta_{metric}"] = [delta(row, metric) for row in out.to_dict("records")]
    return out


def best_vs_baseline(
    summary: pd.DataFrame, per_query: Callable[[str, str], pd.DataFrame | None], baseline: tuple[str, str] = BASELINE
) -> dict:
    """How sure the summary's winner beats the baseline of its model (a winner without a model, BM25: the strongest
    baseline): a paired comparison of per-question RetrievalScore on the same questions. `per_query(strategy, model)`
    gives that index's per-question table. The winner is the best of many configurations, so a small p-value here is
    optimistic (no correction for that)."""
    best = summary.iloc[0]
    model = best["model"] or _strongest_baseline_model(summary, baseline)
    out = {
        "best": config_label(best),
        "baseline": f"{baseline[0]} · {model or '(no baseline)'} · {baseline[1]}",
        "n_questions": int(best["n_questions"]),
        "configurations": len(summary),
    }
    if (best["strategy"], best["mode"]) == baseline:
        return {**out, "note": "the best configuration is the baseline"}
    best_table = per_query(best["strategy"], model) if model else None
    base_table = per_query(baseline[0], model) if model else None
    if best_table is None or base_table is None or baseline[1] not in set(base_table["mode"]):
        return {**out, "note": "no per-question scores of the baseline: evaluate it to compare"}

    def scores(table: pd.DataFrame, mode: str) -> pd.Series:
        return retrieval_score(table[table["mode"] == mode].set_index("qid"))

    return {**out, **paired_comparison(scores(best_table, best["mode"]), scores(base_table, baseline[1]))}


def describe_comparison(comparison: dict) -> str:
    """One line for people: the difference, its interval, the p-value and the ties, on how many questions."""
    head = f"best {comparison['best']} vs baseline {comparison['baseline']}"
    if "note" in comparison:
        return f"{head}: {comparison['note']} ({comparison['n_questions']} questions)"
    c = comparison
    return (
        f"{head}: RetrievalScore {c['delta']:+.3f} "
        f"({c['confidence']:.0%} CI {c['ci_low']:+.3f} to {c['ci_high']:+.3f}) "
        f"on {c['n']} paired questions, two-sided p = {c['p_value']:.2g} ({c['test']}); "
        f"{c['better']} better, {c['tied']} tied, {c['worse']} worse; best of {c['configurations']} configurations, "
        "so p is optimistic"
    )


__all__ = [
    "BASELINE",
    "CONTEXT_CHARS",
    "ConfigReport",
    "EvaluationSettings",
    "best_vs_baseline",
    "config_label",
    "current_reports",
    "describe_comparison",
    "evaluate_index",
    "report_metrics",
    "summarize",
    "METRICS",
    "REPORT_KEYS",
]
