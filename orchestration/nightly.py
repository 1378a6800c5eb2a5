"""Nightly incremental re-index: parse → chunk → BM25 → embed for every active partition, in order,
in one process (so an embedded Qdrant folder has a single writer)."""

import os

from dagster import (
    AssetMaterialization,
    DefaultScheduleStatus,
    Definitions,
    Failure,
    OpExecutionContext,
    Output,
    ScheduleDefinition,
    job,
    op,
)

from orchestration.partitions import (
    chunking_strategy_partitions,
    collection_key,
    embedding_model_partitions,
    indexed_models,
    unwanted,
)
from rag.pipeline import bm25_step, chunk_step, embed_step, ingest_step
from rag.progress import LogProgress
from rag.quality.suites import check_chunks
from rag.registry import ModelRegistry
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE, QUARANTINE_TABLE
from resources.chunking import ChunkingStrategies
from resources.documents import DocumentSource
from resources.models import EmbeddingModels
from resources.qdrant import QdrantResource, qdrant_pool
from resources.storage import DataStore


@op(
    description=(
        "Incrementally re-index every (strategy, model) partition that exists, but no trained model that neither "
        "serves, runs a canary nor is listed as active; records a materialization per partition."
    ),
    pool=qdrant_pool(),
)
def reindex_everything(
    context: OpExecutionContext,
    document_source: DocumentSource,
    data_store: DataStore,
    chunking: ChunkingStrategies,
    embedding_models: EmbeddingModels,
    qdrant: QdrantResource,
):
    tables, instance = data_store.tables, context.instance
    progress = LogProgress(context.log.info)
    parsed = ingest_step(tables, document_source.scan(), document_source.parse_settings(), progress=progress)
    context.log_event(
        AssetMaterialization(
            DOCUMENTS_TABLE, metadata={k: v for k, v in parsed.summary.items() if not k.startswith("quarantine")}
        )
    )
    context.log_event(AssetMaterialization(QUARANTINE_TABLE, metadata={"rows": len(parsed.quarantine)}))

    configured = chunking.strategies()
    strategies = [s for s in instance.get_dynamic_partitions(chunking_strategy_partitions.name) if s in configured]
    # Not every embedding_model partition: training adds one per candidate, and a rejected one is not re-indexed.
    wanted = indexed_models(ModelRegistry(data_store.root / "models"), embedding_models.active())
    models = [m for m in instance.get_dynamic_partitions(embedding_model_partitions.name) if not unwanted(m, wanted)]
    failed = []
    for strategy in strategies:
        chunk_run = chunk_step(tables, chunking.chunker(strategy), progress)
        context.log_event(AssetMaterialization(CHUNKS_TABLE, partition=strategy, metadata=chunk_run.summary))
        quality = check_chunks(chunk_run.chunks, parsed.documents)
        if not quality.success:  # the same gate as the blocking asset check: bad chunks are not indexed
            failed.append(strategy)
            context.log.error(f"{strategy}: chunk checks failed: {[e.expectation for e in quality.failed]}")
            continue
        context.log_event(
            AssetMaterialization(
                "bm25_indexes", partition=strategy, metadata=bm25_step(tables, data_store.root, strategy).summary
            )
        )
        for model in models:
            run = embed_step(
                tables, qdrant.client(), strategy, model, embedding_models.load(model), qdrant.distance, progress
            )
            context.log_event(
                AssetMaterialization(
                    "embedding_collections", partition=collection_key(strategy, model), metadata=run.summary
                )
            )
    if failed:
        raise Failure(f"chunk checks failed for {failed}; their indexes were left as they were")
    yield Output(len(strategies) * max(1, len(models)))


@job(description="Nightly incremental re-index of all partitions (see the nightly_reindex schedule).")
def nightly_reindex_job():
    reindex_everything()


nightly_reindex_schedule = ScheduleDefinition(
    name="nightly_reindex",
    job=nightly_reindex_job,
    cron_schedule=os.environ.get("RAG_REINDEX_CRON", "0 2 * * *"),
    execution_timezone=os.environ.get("RAG_REINDEX_TIMEZONE", "UTC"),
    default_status=DefaultScheduleStatus.STOPPED,
    description="Re-index new and changed documents every night (cron from RAG_REINDEX_CRON, default 02:00).",
)


defs = Definitions(jobs=[nightly_reindex_job], schedules=[nightly_reindex_schedule])
