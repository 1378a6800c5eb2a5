"""The bake-off: answer a QA set with every (retrieval mode × chunking strategy) and score each with the
generation metrics. Rows: mode (none = no retrieval, the closed-book baseline) × strategy; columns: answer
accuracy, source accuracy, coverage, latency (and EM / F1 / ROUGE-L / semantic similarity / judge metrics)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from rag.evaluation.generation import score_answers, summarize_answers
from rag.evaluation.qaset import QAItem
from rag.llm import LLM
from rag.qa.encoding import CachedEmbedder
from rag.qa.models import AnswerSettings
from rag.qa.pipeline import NO_RETRIEVAL, Answerer
from rag.retrieval import Index

# hybrid-cc is the serving default (rag.qa.models.DEFAULT_MODE): the bake-off scores what users are answered with.
BAKEOFF_MODES = (NO_RETRIEVAL, "bm25", "dense", "hybrid-rrf", "hybrid-cc")
COLUMNS = [
    "strategy",
    "mode",
    "generator",
    "answer_accuracy",
    "source_accuracy",
    "coverage",
    "latency_p50_ms",
    "latency_p95_ms",
    "exact_match",
    "f1",
    "rouge_l",
    "semantic_similarity",
    "attributed_source_accuracy",
    "retrieved_evidence",
    "faithfulness",
    "answer_relevancy",
    "n_questions",
]


@dataclass
class BakeoffResult:
    summary: pd.DataFrame  # one row per (strategy, mode)
    per_question: pd.DataFrame


def run_bakeoff(
    items: list[QAItem],
    indexes: dict[str, Index],
    base: AnswerSettings,
    *,
    modes: tuple[str, ...] = BAKEOFF_MODES,
    llm: LLM | None = None,
    judge: LLM | None = None,
    progress: Callable[[str], None] | None = None,
) -> BakeoffResult:
    """`indexes` maps strategy → an open Index (BM25 and dense parts). The no-retrieval row does not depend on the
    chunking, so it is run once (strategy "-")."""
    summaries, details = [], []
    runs = [("-", NO_RETRIEVAL)] if NO_RETRIEVAL in modes else []
    runs += [(strategy, mode) for strategy in indexes for mode in modes if mode != NO_RETRIEVAL]
    embedders: dict[int, CachedEmbedder] = {}  # one sentence-vector cache per index embedder, shared by the modes
    for strategy, mode in runs:
        index = indexes[strategy] if strategy in indexes else next(iter(indexes.values()), None)
        settings = base.model_copy(update={"mode": mode, "strategy": strategy if strategy != "-" else base.strategy})
        embedder = None
        if index is not None and index.embedder is not None:
            embedder = embedders.setdefault(id(index.embedder), CachedEmbedder(index.embedder))
        answerer = Answerer(settings, llm=llm, index=index, embedder=embedder)
        results = [answerer.ask(item.question) for item in items]
        per_q = score_answers(items, results, embedder=answerer.embedder, judge=judge)
        summary = summarize_answers(per_q)
        summaries.append({"strategy": strategy, "mode": mode, "generator": answerer.generator.name, **summary})
        details.append(per_q.assign(strategy=strategy, mode=mode))
        if progress:
            progress(
                f"{strategy} · {mode}: accuracy {summary['answer_accuracy']}, source {summary['source_accuracy']}, "
                f"coverage {summary['coverage']}, p50 {summary['latency_p50_ms']} ms"
            )
    return BakeoffResult(
        pd.DataFrame(summaries).reindex(columns=COLUMNS),
        pd.concat(details, ignore_index=True) if details else pd.DataFrame(),
    )


def bakeoff_plot(summary: pd.DataFrame, title: str) -> bytes:
    """Left: answer accuracy, source accuracy and coverage per (strategy · mode); right: p50 latency."""
    from rag.evaluation.plots import _png, _pyplot

    plt = _pyplot()
    labels = [f"{r['strategy']} · {r['mode']}" for r in summary.to_dict("records")]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10, max(2.2, 0.32 * len(summary) + 1.2)), gridspec_kw={"width_ratios": [3, 1]}
    )
    height = 0.27
    for n, metric in enumerate(["answer_accuracy", "source_accuracy", "coverage"]):
        values = pd.to_numeric(summary[metric], errors="coerce").fillna(0.0)
        left.barh([i + (n - 1) * height for i in range(len(summary))], values, height=height, label=metric)
    left.set_yticks(range(len(summary)), labels, fontsize=7), left.set_xlim(0, 1), left.invert_yaxis()
    left.legend(fontsize=7, loc="lower right"), left.set_title(title, fontsize=9)
    right.barh(
        range(len(summary)), pd.to_numeric(summary["latency_p50_ms"], errors="coerce").fillna(0.0), color="tab:gray"
    )
    (
        right.set_yticks(range(len(summary)), [""] * len(summary)),
        right.invert_yaxis(),
        right.set_xlabel("p50 latency (ms)"),
    )
    return _png(fig)
