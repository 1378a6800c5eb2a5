"""Data-quality asset checks: Great Expectations suites mapped to Dagster check results.

They are blocking: a chunk set whose spans do not reproduce the canonical text must not feed indexes
or QA sets downstream.
"""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    Definitions,
    MetadataValue,
    asset_check,
)

from assets.chunking import chunk_sets
from orchestration.partitions import chunking_strategy_partitions, collection_partitions
from rag.evaluation.retrieval_eval import report_metrics
from rag.chunking import StrategyConfig
from rag.quality.gx import SuiteOutcome
from rag.quality.suites import check_chunks, check_documents, check_qa_set, check_report
from rag.store import CHUNK_FAILURES_TABLE, CHUNKS_TABLE, DOCUMENTS_TABLE
from resources.chunking import ChunkingStrategies
from resources.storage import DataStore


def to_check_result(outcome: SuiteOutcome) -> AssetCheckResult:
    per_expectation = {
        f"{e.expectation}{'[' + e.column + ']' if e.column else ''}": {
            "success": e.success,
            "unexpected_count": e.unexpected_count,
            "unexpected_percent": None if e.unexpected_percent is None else round(e.unexpected_percent, 3),
            "sample_unexpected": [str(v)[:80] for v in e.sample_unexpected],
        }
        for e in outcome.expectations
    }
    return AssetCheckResult(
        passed=outcome.success,
        severity=AssetCheckSeverity.ERROR,
        description=(
            f"{len(outcome.expectations) - len(outcome.failed)}/{len(outcome.expectations)} expectations met on "
            f"{outcome.rows} rows"
        ),
        metadata={
            "rows": outcome.rows,
            "failed_expectations": MetadataValue.json([f"{e.expectation}[{e.column}]" for e in outcome.failed]),
            "expectations": MetadataValue.json(per_expectation),
        },
    )


def chunk_length_bounds(config: StrategyConfig) -> tuple[int, int | None]:
    """Bounds a strategy promises by its own params; strategies without such params get only min 1."""
    params = config.params.model_dump()
    if "min_chars" in params and "max_chars" in params and config.kind == "sentence-window":
        return int(params["min_chars"]), int(params["max_chars"])
    if "chunk_size" in params:
        return 1, int(params["chunk_size"])
    return 1, None


@asset_check(
    asset=DOCUMENTS_TABLE, blocking=True, description="GX: unique ids, non-empty text, pages ≥ 1, sha256 hashes."
)
def parsed_documents_quality(data_store: DataStore) -> AssetCheckResult:
    documents = data_store.tables.read(DOCUMENTS_TABLE)
    if documents is None:
        return AssetCheckResult(passed=False, description="parsed_documents table is missing")
    return to_check_result(check_documents(documents))


@asset_check(
    asset=chunk_sets,
    blocking=True,
    partitions_def=chunking_strategy_partitions,
    description=(
        "GX: unique chunk ids, canonical_text[start:end] == text, non-empty text, length bounds of the strategy, "
        "page order."
    ),
)
def chunk_sets_quality(
    context: AssetCheckExecutionContext, data_store: DataStore, chunking: ChunkingStrategies
) -> AssetCheckResult:
    strategy = context.partition_key
    chunks = data_store.tables.read(CHUNKS_TABLE, strategy)
    documents = data_store.tables.read(DOCUMENTS_TABLE)
    if chunks is None or documents is None:
        return AssetCheckResult(passed=False, description=f"chunk set {strategy} or parsed_documents is missing")
    min_chars, max_chars = chunk_length_bounds(chunking.strategies()[strategy])
    result = to_check_result(check_chunks(chunks, documents, min_chars=min_chars, max_chars=max_chars))
    failures = data_store.tables.read(CHUNK_FAILURES_TABLE, strategy)
    failed = [] if failures is None else failures.to_dict("records")
    description = f"[{strategy}] {result.description}"
    if failed:
        kept = sum(int(f["kept_previous_chunks"]) for f in failed)
        description = (
            f"[{strategy}] chunking failed for {len(failed)} document(s) ({kept} previous chunks kept, "
            f"so search still has them): {failed[0]['doc_id']}: {failed[0]['error']}; " + result.description
        )
    return AssetCheckResult(
        passed=result.passed and not failed,
        severity=AssetCheckSeverity.ERROR if failed else result.severity,
        description=description,
        metadata={
            **result.metadata,
            "strategy": strategy,
            "min_chars": min_chars,
            "max_chars": max_chars or -1,
            "failed_documents": len(failed),
            "failures": MetadataValue.json(
                [{k: f[k] for k in ("doc_id", "error", "kept_previous_chunks")} for f in failed[:50]]
            ),
        },
    )


@asset_check(
    asset="synthetic_qa",
    blocking=True,
    description="GX: question length 5–50 words, evidence spans non-empty "
    "and inside their document, unique ids, share of documents in dev (the 80/20 split is by document; dev "
    "documents get more questions for the gate).",
)
def synthetic_qa_quality(data_store: DataStore) -> AssetCheckResult:
    qa, documents = data_store.tables.read("synthetic_qa"), data_store.tables.read(DOCUMENTS_TABLE)
    if qa is None or documents is None:
        return AssetCheckResult(passed=False, description="synthetic_qa or parsed_documents is missing")
    return to_check_result(check_qa_set(qa, documents))


@asset_check(
    asset="retrieval_evaluation",
    blocking=True,
    partitions_def=collection_partitions,
    description="GX: every metric of the report is present and within [0, 1].",
)
def retrieval_evaluation_quality(context: AssetCheckExecutionContext, data_store: DataStore) -> AssetCheckResult:
    keys = context.partition_key.keys_by_dimension
    report = data_store.tables.read("retrieval_evaluation", f"{keys['strategy']}__{keys['model']}")
    if report is None:
        return AssetCheckResult(passed=False, description="the report of this partition is missing")
    return to_check_result(check_report(report, report_metrics(report) + ["retrieval_score"]))


defs = Definitions(
    asset_checks=[parsed_documents_quality, chunk_sets_quality, synthetic_qa_quality, retrieval_evaluation_quality]
)
