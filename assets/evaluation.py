"""Evaluation stage: a span-anchored synthetic QA set, a retrieval report per (strategy, model) for every
mode, and a summary comparing every evaluated configuration."""
import json

import pandas as pd
from dagster import AssetExecutionContext, AssetKey, Definitions, MaterializeResult, MetadataValue, asset

from orchestration.partitions import collection_partitions
from rag.evaluation.plots import markdown_image, metric_bars, recall_curves
from rag.markdown import markdown_table
from rag.evaluation.qaset import from_frame, to_frame
from rag.evaluation.retrieval_eval import current_reports, evaluate_index, summarize
from rag.ingest import document_from_row
from rag.retrieval import RETRIEVERS
from rag.retrieval.service import open_index
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE
from rag.synthetic import SynthSettings, generate_qa
from resources.llm import LLMResource
from resources.qdrant import QdrantResource
from resources.storage import DataStore

QA_TABLE = "synthetic_qa"
REPORTS_TABLE = "retrieval_evaluation"
SUMMARY_TABLE = "evaluation_summary"


def report_partition(strategy: str, model: str) -> str:
    return f"{strategy}__{model}"


@asset(
    deps=[AssetKey(DOCUMENTS_TABLE)],
    group_name="evaluation",
    kinds={"python", "parquet"},
    description="Questions with evidence spans in the canonical document text, generated per sampled passage by the "
    "configured LLM (few-shot, filtered) or, with no LLM, inverse-cloze pseudo-queries; split 80/20 by document.",
)
def synthetic_qa(context: AssetExecutionContext, data_store: DataStore, llm: LLMResource) -> MaterializeResult:
    documents = data_store.tables.read(DOCUMENTS_TABLE)
    if documents is None or documents.empty:
        raise FileNotFoundError("parsed_documents is empty: ingest documents first")
    result = generate_qa([document_from_row(r) for r in documents.to_dict("records")], llm.load(), SynthSettings())
    path = data_store.tables.write(to_frame(result.items), QA_TABLE)
    samples = pd.DataFrame(result.samples)
    return MaterializeResult(metadata={
        **result.summary, "dagster/row_count": len(result.items), "path": MetadataValue.path(str(path)),
        "samples": MetadataValue.md(markdown_table(samples, list(samples.columns))),
    })


@asset(
    partitions_def=collection_partitions,
    deps=[AssetKey(QA_TABLE), AssetKey("embedding_collections"), AssetKey("bm25_indexes")],
    group_name="evaluation",
    kinds={"python", "ranx"},
    description="Retrieval metrics (ranx: recall/precision/MRR/nDCG/MAP/hit-rate at 1,3,5,10,20) of one chunk set × "
    "model for every retrieval mode, with chunk relevance derived from the QA set's evidence spans. Every strategy is "
    "scored on all questions (evidence no chunk holds is a miss) and on the passages a default prompt gets, cut to its "
    "character budget, with the context characters beside the scores.",
)
def retrieval_evaluation(context: AssetExecutionContext, data_store: DataStore, qdrant: QdrantResource) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    strategy, model = keys["strategy"], keys["model"]
    items = from_frame(data_store.tables.read(QA_TABLE))
    index = open_index(strategy, model, root=data_store.root, qdrant=qdrant.settings())
    report = evaluate_index(index, items, data_store.tables.read(CHUNKS_TABLE, strategy), strategy=strategy, model=model, modes=list(RETRIEVERS))
    part = report_partition(strategy, model)
    data_store.tables.write(report.summary, REPORTS_TABLE, part)
    data_store.tables.write(report.per_query, f"{REPORTS_TABLE}_per_query", part)
    best = report.summary.sort_values("retrieval_score", ascending=False).iloc[0]
    columns = ["mode", "retrieval_score", "recall@5", "ndcg@10", "mrr@10", "hit_rate@5", "context_chars@5", "query_ms"]
    return MaterializeResult(metadata={
        "questions": int(best["n_questions"]), "questions_without_relevant_chunk": int(best["n_without_relevant_chunk"]),
        "relevance": str(best["relevance"]), "max_context_chars": MetadataValue.int(int(best["max_context_chars"])),
        "best_mode": str(best["mode"]), "best_retrieval_score": float(best["retrieval_score"]),
        "report": MetadataValue.md(markdown_table(report.summary, columns)),
        "recall_at_k": MetadataValue.md(markdown_image(recall_curves(report.summary, f"{strategy} · {model}"), "recall@k")),
    })


@asset(
    deps=[AssetKey(REPORTS_TABLE)],
    group_name="evaluation",
    kinds={"python", "parquet"},
    description="Every evaluated configuration side by side, best marked, with deltas against the naive baseline "
    "(recursive-1000-200 + dense) of the same model.",
)
def evaluation_summary(context: AssetExecutionContext, data_store: DataStore) -> MaterializeResult:
    folder = data_store.tables.root / REPORTS_TABLE
    reports = {p.parent.name: pd.read_parquet(p) for p in sorted(folder.glob("*/data.parquet"))} if folder.exists() else {}
    frames, stale = current_reports(reports)
    if stale:
        context.log.warning(f"left out, scored under the old overlap rule: {', '.join(stale)}; re-materialize retrieval_evaluation for them")
    if not frames:
        raise FileNotFoundError("no current retrieval_evaluation partitions: materialize some first"
                                + (f" (re-materialize {', '.join(stale)})" if stale else ""))
    summary = summarize(pd.concat(frames, ignore_index=True))
    path = data_store.tables.write(summary, SUMMARY_TABLE)
    best = summary.iloc[0]
    columns = ["strategy", "model", "mode", "retrieval_score", "recall@5", "ndcg@10", "context_chars@5", "delta_retrieval_score",
               "n_questions", "n_without_relevant_chunk"]
    return MaterializeResult(metadata={
        "configurations": len(summary), "stale_partitions_left_out": ", ".join(stale) or "none",
        "best": f"{best['strategy']} · {best['model']} · {best['mode']}",
        "best_retrieval_score": float(best["retrieval_score"]), "path": MetadataValue.path(str(path)),
        "summary": MetadataValue.md(markdown_table(summary.head(40), columns)),
        "retrieval_score_plot": MetadataValue.md(markdown_image(metric_bars(summary, "retrieval_score", "RetrievalScore (k=5)"), "scores")),
        "recall_at_k": MetadataValue.md(markdown_image(recall_curves(summary.head(8), "recall@k, top configurations"), "recall@k")),
        "configurations_json": MetadataValue.json(json.loads(summary[["strategy", "model", "mode", "retrieval_score"]].to_json(orient="records"))),
    })


defs = Definitions(assets=[synthetic_qa, retrieval_evaluation, evaluation_summary])
