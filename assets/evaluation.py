"""Evaluation stage: a span-anchored synthetic QA set, a retrieval report per (strategy, model) for every
mode, and a summary comparing every evaluated configuration."""

import json
from typing import Any

import pandas as pd
from dagster import AssetExecutionContext, AssetKey, Config, Definitions, MaterializeResult, MetadataValue, asset
from pydantic import BaseModel, Field

from orchestration.partitions import collection_partitions
from rag.evaluation.plots import markdown_image, metric_bars, recall_curves
from rag.markdown import markdown_table
from rag.evaluation.qaset import Relevance, from_frame, to_frame
from rag.evaluation.retrieval_eval import (
    EvaluationSettings,
    best_vs_baseline,
    config_label,
    current_reports,
    describe_comparison,
    evaluate_index,
    summarize,
)
from rag.ingest import document_from_row
from rag.llm import LLMSettings, load_llm
from rag.retrieval import RETRIEVERS
from rag.retrieval.service import open_index
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE
from rag.synthetic import SynthSettings, generate_qa
from resources.llm import LLMResource
from resources.qdrant import QdrantResource, qdrant_pool
from resources.storage import DataStore

QA_TABLE = "synthetic_qa"
REPORTS_TABLE = "retrieval_evaluation"
SUMMARY_TABLE = "evaluation_summary"


def report_partition(strategy: str, model: str) -> str:
    return f"{strategy}__{model}"


def library_field(settings: type[BaseModel], name: str, description: str | None = None) -> Any:
    """A run-config field whose default (and, unless given, description) is the library setting's own: each default
    lives in one place, the library's pydantic settings, and the launchpad shows it."""
    info = settings.model_fields[name]
    return Field(info.get_default(call_default_factory=True), description=description or info.description)


class SyntheticQAConfig(Config):
    """Launchpad settings of synthetic_qa: the fields of rag.synthetic.SynthSettings a user tunes, plus an LLM for
    this run (a backend of rag.llm's registry, loaded as the llm resource loads its own)."""

    passages_per_document: int = library_field(SynthSettings, "passages_per_document")
    questions_per_passage: int = library_field(SynthSettings, "questions_per_passage")
    max_questions: int | None = library_field(SynthSettings, "max_questions")
    question_types: list[str] = library_field(SynthSettings, "question_types")
    question_mix: dict[str, float] | None = library_field(SynthSettings, "question_mix")
    multi_document_questions: int = library_field(SynthSettings, "multi_document_questions")
    dev_fraction: float = library_field(SynthSettings, "dev_fraction")
    dev_questions: int | None = library_field(SynthSettings, "dev_questions")
    seed: int = library_field(SynthSettings, "seed")
    seed_examples_path: str | None = library_field(SynthSettings, "seed_examples_path")
    llm_backend: str = Field(
        "",
        description="LLM backend for this run: none | local-gguf | openai; empty = the llm "
        "resource's (RAG_LLM_BACKEND)",
    )
    llm_model: str = Field(
        "",
        description="LLM model for this run (local-gguf: smollm2 | gemma3-270m | a .gguf path; "
        "openai: a model name); empty = the llm resource's (RAG_LLM_MODEL)",
    )

    def settings(self) -> SynthSettings:
        return SynthSettings(
            **{name: getattr(self, name) for name in type(self).model_fields if name in SynthSettings.model_fields}
        )

    def llm_settings(self, resource: LLMResource) -> LLMSettings:
        """The resource's settings with this run's backend and model, if any."""
        overrides = {key: value for key, value in (("backend", self.llm_backend), ("model", self.llm_model)) if value}
        return LLMSettings.model_validate({**resource.settings().model_dump(), **overrides})


class RetrievalEvaluationConfig(Config):
    """Launchpad settings of retrieval_evaluation (rag.evaluation.retrieval_eval.EvaluationSettings). Compare
    configurations scored under the same settings: the summary warns when its reports mix relevance rules."""

    relevance: str = library_field(
        Relevance,
        "mode",
        "when a chunk is relevant: span (holds half of an evidence span, or "
        "is half evidence) | coverage (holds half of it) | any (any overlap)",
    )
    min_coverage: float = library_field(Relevance, "min_coverage", "the share 'half' stands for in span and coverage")
    ks: list[int] = library_field(EvaluationSettings, "ks")
    max_context_chars: int | None = library_field(EvaluationSettings, "max_context_chars")

    def settings(self) -> EvaluationSettings:
        return EvaluationSettings(
            relevance=Relevance(mode=self.relevance, min_coverage=self.min_coverage),
            ks=self.ks,
            max_context_chars=self.max_context_chars,
        )


@asset(
    deps=[AssetKey(DOCUMENTS_TABLE)],
    group_name="evaluation",
    kinds={"python", "parquet"},
    description="Questions with evidence spans in the canonical document text, generated per sampled passage by the "
    "configured LLM (few-shot, filtered) or, with no LLM, a mix of rule-based kinds (answer-aware wh-questions, "
    "keyword queries, inverse-cloze pseudo-queries; run config question_mix); split 80/20 by document.",
)
def synthetic_qa(
    context: AssetExecutionContext, config: SyntheticQAConfig, data_store: DataStore, llm: LLMResource
) -> MaterializeResult:
    documents = data_store.tables.read(DOCUMENTS_TABLE)
    if documents is None or documents.empty:
        raise FileNotFoundError("parsed_documents is empty: ingest documents first")
    settings, llm_settings = config.settings(), config.llm_settings(llm)
    result = generate_qa([document_from_row(r) for r in documents.to_dict("records")], load_llm(llm_settings), settings)
    path = data_store.tables.write(to_frame(result.items), QA_TABLE)
    samples = pd.DataFrame(result.samples)
    return MaterializeResult(
        metadata={
            **result.summary,
            "dagster/row_count": len(result.items),
            "path": MetadataValue.path(str(path)),
            "llm_backend": llm_settings.backend,
            "settings": MetadataValue.json(settings.model_dump(mode="json")),
            "question_mix": MetadataValue.json(result.mix),
            "questions_by_type": MetadataValue.json(result.by_type),
            "fallbacks_by_kind": MetadataValue.json(dict(result.fallbacks)),
            "samples": MetadataValue.md(markdown_table(samples, list(samples.columns))),
        }
    )


@asset(
    partitions_def=collection_partitions,
    deps=[AssetKey(QA_TABLE), AssetKey("embedding_collections"), AssetKey("bm25_indexes")],
    group_name="evaluation",
    kinds={"python", "ranx"},
    pool=qdrant_pool(),  # reads the collection: an embedded Qdrant folder takes one process at a time
    description="Retrieval metrics (ranx: recall/precision/MRR/nDCG/MAP/hit-rate at 1,3,5,10,20) of one chunk set × "
    "model for every retrieval mode, with chunk relevance derived from the QA set's evidence spans. Every strategy is "
    "scored on all questions (evidence no chunk holds is a miss) and on the passages a default prompt gets, cut to its "
    "character budget, with the context characters beside the scores.",
)
def retrieval_evaluation(
    context: AssetExecutionContext, config: RetrievalEvaluationConfig, data_store: DataStore, qdrant: QdrantResource
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    strategy, model = keys["strategy"], keys["model"]
    items = from_frame(data_store.tables.read(QA_TABLE))
    index = open_index(strategy, model, root=data_store.root, qdrant=qdrant.settings())
    settings = config.settings()
    report = evaluate_index(
        index,
        items,
        data_store.tables.read(CHUNKS_TABLE, strategy),
        strategy=strategy,
        model=model,
        modes=list(RETRIEVERS),
        relevance=settings.relevance,
        ks=settings.ks,
        max_context_chars=settings.max_context_chars,
    )
    part = report_partition(strategy, model)
    data_store.tables.write(report.summary, REPORTS_TABLE, part)
    data_store.tables.write(report.per_query, f"{REPORTS_TABLE}_per_query", part)
    best = report.summary.sort_values("retrieval_score", ascending=False).iloc[0]
    columns = ["mode", "retrieval_score", "recall@5", "ndcg@10", "mrr@10", "hit_rate@5", "context_chars@5", "query_ms"]
    return MaterializeResult(
        metadata={
            "questions": int(best["n_questions"]),
            "questions_without_relevant_chunk": int(best["n_without_relevant_chunk"]),
            "relevance": str(best["relevance"]),
            "max_context_chars": MetadataValue.int(int(best["max_context_chars"])),
            "best_mode": str(best["mode"]),
            "best_retrieval_score": float(best["retrieval_score"]),
            "report": MetadataValue.md(markdown_table(report.summary, columns)),
            "recall_at_k": MetadataValue.md(
                markdown_image(recall_curves(report.summary, f"{strategy} · {model}"), "recall@k")
            ),
        }
    )


@asset(
    deps=[AssetKey(REPORTS_TABLE)],
    group_name="evaluation",
    kinds={"python", "parquet"},
    description="Every evaluated configuration side by side, best marked, with deltas against the naive baseline "
    "(recursive-1000-200 + dense) of the same model, and how sure the best beats it: a paired test over the same "
    "questions (mean difference, bootstrap confidence interval, p-value, questions better / tied / worse). BM25 uses "
    "no embedding model: it is listed once per strategy, with an empty model, against the strongest baseline.",
)
def evaluation_summary(context: AssetExecutionContext, data_store: DataStore) -> MaterializeResult:
    folder = data_store.tables.root / REPORTS_TABLE
    reports = (
        {p.parent.name: pd.read_parquet(p) for p in sorted(folder.glob("*/data.parquet"))} if folder.exists() else {}
    )
    frames, stale = current_reports(reports)
    if stale:
        context.log.warning(
            f"left out, scored under the old overlap rule: {', '.join(stale)}; "
            "re-materialize retrieval_evaluation for them"
        )
    if not frames:
        raise FileNotFoundError(
            "no current retrieval_evaluation partitions: materialize some first"
            + (f" (re-materialize {', '.join(stale)})" if stale else "")
        )
    summary = summarize(pd.concat(frames, ignore_index=True))
    if summary["relevance"].nunique() > 1 or summary["n_questions"].nunique() > 1:
        context.log.warning(
            "the reports were scored under different relevance rules or on different QA sets: "
            "re-materialize retrieval_evaluation with one run config before comparing them"
        )
    path = data_store.tables.write(summary, SUMMARY_TABLE)
    best = summary.iloc[0]
    per_query = f"{REPORTS_TABLE}_per_query"
    comparison = best_vs_baseline(
        summary, lambda strategy, model: data_store.tables.read(per_query, report_partition(strategy, model))
    )
    context.log.info(describe_comparison(comparison))
    columns = [
        "strategy",
        "model",
        "mode",
        "retrieval_score",
        "recall@5",
        "ndcg@10",
        "context_chars@5",
        "delta_retrieval_score",
        "n_questions",
        "n_without_relevant_chunk",
    ]
    return MaterializeResult(
        metadata={
            "configurations": len(summary),
            "stale_partitions_left_out": ", ".join(stale) or "none",
            "best": config_label(best),
            "best_retrieval_score": float(best["retrieval_score"]),
            "path": MetadataValue.path(str(path)),
            "questions": int(best["n_questions"]),
            "best_vs_baseline": describe_comparison(comparison),
            "best_vs_baseline_json": MetadataValue.json(comparison),
            "summary": MetadataValue.md(markdown_table(summary.head(40), columns)),
            "retrieval_score_plot": MetadataValue.md(
                markdown_image(metric_bars(summary, "retrieval_score", "RetrievalScore (k=5)"), "scores")
            ),
            "recall_at_k": MetadataValue.md(
                markdown_image(recall_curves(summary.head(8), "recall@k, top configurations"), "recall@k")
            ),
            "configurations_json": MetadataValue.json(
                json.loads(summary[["strategy", "model", "mode", "retrieval_score"]].to_json(orient="records"))
            ),
        }
    )


defs = Definitions(assets=[synthetic_qa, retrieval_evaluation, evaluation_summary])
