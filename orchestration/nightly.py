"""Nightly incremental re-index, fanned out: one run per (strategy, model) partition that serves.

The `nightly_reindex` schedule (and new_documents_sensor when the folder changes) requests one run of
nightly_reindex_job per strategy of config/chunking.yaml × model that serves, runs a canary or is listed as active
(orchestration.partitions.indexed_models): never a trained candidate the gate rejected, whatever partitions the
instance holds. It first gives the instance those partitions (a new instance has none). Run keys name the tick and the
partition, so a tick evaluated twice requests nothing twice.

Each run brings its partition up to date in lineage order, through the step functions `rag index` and the assets
share (rag.pipeline): parse → chunk (checked) → BM25 → embed. Parsing happens once per tick and chunking + BM25 once
per tick and strategy: the first run to take the step's lock (rag.state: a flock, or a PostgreSQL advisory lock that
pods share) does it and records the tick on its materialization; the runs after it find it done. A strategy whose
chunks fail their checks is not indexed. On the embedded Qdrant folder the embedding step's `qdrant` pool keeps runs
one at a time; with a Qdrant server the partitions embed in parallel."""

import os
from datetime import UTC, datetime

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterInstance,
    DefaultScheduleStatus,
    Definitions,
    Failure,
    In,
    MultiPartitionKey,
    Nothing,
    OpExecutionContext,
    Out,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    job,
    op,
    schedule,
)

from orchestration.partitions import (
    FINGERPRINT_KEY,
    apply_partition_requests,
    collection_key,
    collection_partitions,
    indexed_models,
    partition_requests,
    unwanted,
)
from rag.pipeline import bm25_step, chunk_step, embed_step, ingest_step
from rag.progress import LogProgress
from rag.quality.suites import check_chunks
from rag.registry import ModelRegistry
from rag.state import for_registry
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE, QUARANTINE_TABLE
from resources.chunking import ChunkingStrategies
from resources.documents import DocumentSource
from resources.models import EmbeddingModels
from resources.qdrant import QdrantResource, qdrant_pool
from resources.storage import DataStore

TICK_TAG = "rag/nightly_tick"  # on each run a tick requested: which tick it belongs to
TICK_KEY = "nightly_tick"  # on the materializations a run records: the tick that brought the table up to date


def _tick(context: OpExecutionContext) -> str:
    """The tick this run belongs to; a run launched by hand is a tick of its own."""
    return context.run.tags.get(TICK_TAG) or context.run_id


def _done_in(instance: DagsterInstance, asset: str, partition: str | None, tick: str) -> bool:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition] if partition else None), limit=1
    ).records
    value = records[0].asset_materialization.metadata.get(TICK_KEY) if records else None
    return getattr(value, "value", value) == tick


def _partition(context: OpExecutionContext) -> tuple[str, str]:
    keys = collection_partitions.get_partition_key_from_str(context.partition_key).keys_by_dimension
    return keys["strategy"], keys["model"]


def _held(data_store: DataStore, name: str):
    """The lock `name` of the data dir's state backend, across processes and pods."""
    return for_registry(ModelRegistry(data_store.root / "models")).hold(name)


@op(out=Out(Nothing), description="Parse new and changed documents, once per tick (the tick's first run does it).")
def parse_documents_once(context: OpExecutionContext, document_source: DocumentSource, data_store: DataStore):
    tick = _tick(context)
    with _held(data_store, "nightly-parse"):
        if _done_in(context.instance, DOCUMENTS_TABLE, None, tick):
            context.log.info(f"documents already parsed in tick {tick}")
            return
        parsed = ingest_step(
            data_store.tables,
            document_source.scan(),
            document_source.parse_settings(),
            progress=LogProgress(context.log.info),
        )
        summary = {k: v for k, v in parsed.summary.items() if not k.startswith("quarantine")}
        context.log_event(AssetMaterialization(QUARANTINE_TABLE, metadata={"rows": len(parsed.quarantine)}))
        context.log_event(AssetMaterialization(DOCUMENTS_TABLE, metadata={**summary, TICK_KEY: tick}))


@op(
    ins={"parsed": In(Nothing)},
    out=Out(Nothing),
    description="Re-chunk (incrementally) the partition's strategy, check the chunks, re-index its BM25: once per tick "
    "and strategy (the strategy's first run does it). Chunks that fail their checks stop the run: nothing is indexed.",
)
def chunk_and_bm25_once(context: OpExecutionContext, data_store: DataStore, chunking: ChunkingStrategies):
    strategy, _ = _partition(context)
    tick, tables = _tick(context), data_store.tables
    with _held(data_store, f"nightly-chunk-{strategy}"):
        if _done_in(context.instance, "bm25_indexes", strategy, tick):  # recorded last: the chunk set came first
            context.log.info(f"chunk set and BM25 index of {strategy} already brought up to date in tick {tick}")
            return
        chunker = chunking.chunker(strategy)
        chunked = chunk_step(tables, chunker, LogProgress(context.log.info))
        context.log_event(
            AssetMaterialization(
                CHUNKS_TABLE,
                partition=strategy,
                metadata={**chunked.summary, FINGERPRINT_KEY: chunker.fingerprint, TICK_KEY: tick},
            )
        )
        quality = check_chunks(chunked.chunks, tables.read(DOCUMENTS_TABLE))
        if not quality.success:  # the same gate as the blocking asset check: bad chunks are not indexed
            raise Failure(
                f"{strategy}: chunk checks failed ({[e.expectation for e in quality.failed]}); its indexes were left "
                "as they were"
            )
        bm25 = bm25_step(tables, data_store.root, strategy)
        context.log_event(
            AssetMaterialization("bm25_indexes", partition=strategy, metadata={**bm25.summary, TICK_KEY: tick})
        )


@op(
    ins={"chunked": In(Nothing)},
    description="Embed (incrementally) the partition's chunk set with its model, unless the model stopped serving "
    "since the tick (a canary rolled back).",
    pool=qdrant_pool(),
)
def embed_once(
    context: OpExecutionContext, data_store: DataStore, embedding_models: EmbeddingModels, qdrant: QdrantResource
):
    strategy, model = _partition(context)
    wanted = indexed_models(ModelRegistry(data_store.root / "models"), embedding_models.active())
    if unwanted(model, wanted):
        context.log.warning(f"{model} no longer serves, runs a canary nor is listed as active: not indexed")
        return
    run = embed_step(
        data_store.tables,
        qdrant.client(),
        strategy,
        model,
        embedding_models.load(model),
        qdrant.distance,
        LogProgress(context.log.info),
    )
    context.log_event(
        AssetMaterialization("embedding_collections", partition=collection_key(strategy, model), metadata=run.summary)
    )


@job(
    partitions_def=collection_partitions,
    description="Incremental re-index of one (strategy, model) partition: parse (once per tick), chunk and BM25 (once "
    "per tick and strategy), embed. The nightly_reindex schedule requests one run per partition that serves.",
)
def nightly_reindex_job():
    embed_once(chunked=chunk_and_bm25_once(parsed=parse_documents_once()))


def nightly_plan(
    instance: DagsterInstance, chunking: ChunkingStrategies, embedding_models: EmbeddingModels, data_store: DataStore
) -> tuple[list[MultiPartitionKey], list]:
    """The partitions a tick re-indexes (every configured strategy × every indexed model), and the dynamic-partition
    requests that give the instance those partitions (and remove those of trained models nothing serves)."""
    strategies = list(chunking.strategies())
    models = indexed_models(ModelRegistry(data_store.root / "models"), embedding_models.active())
    keys = [collection_key(strategy, model) for strategy in strategies for model in models]
    return keys, partition_requests(instance, strategies, models)


def run_requests(keys: list[MultiPartitionKey], tick: str) -> list[RunRequest]:
    return [RunRequest(run_key=f"{tick}:{key}", partition_key=key, tags={TICK_TAG: tick}) for key in keys]


@schedule(
    name="nightly_reindex",
    job=nightly_reindex_job,
    cron_schedule=os.environ.get("RAG_REINDEX_CRON", "0 2 * * *"),
    execution_timezone=os.environ.get("RAG_REINDEX_TIMEZONE", "UTC"),
    default_status=DefaultScheduleStatus.STOPPED,
    description="Re-index new and changed documents every night (cron from RAG_REINDEX_CRON, default 02:00): one run "
    "per chunking strategy × model that serves, runs a canary or is listed as active.",
)
def nightly_reindex_schedule(
    context: ScheduleEvaluationContext,
    chunking: ChunkingStrategies,
    embedding_models: EmbeddingModels,
    data_store: DataStore,
):
    keys, partitions = nightly_plan(context.instance, chunking, embedding_models, data_store)
    apply_partition_requests(context.instance, partitions)  # a schedule cannot hand them to the daemon as sensors do
    tick = f"nightly:{(context.scheduled_execution_time or datetime.now(UTC)).isoformat()}"
    return run_requests(keys, tick) or SkipReason("no chunking strategy in config/chunking.yaml")


defs = Definitions(jobs=[nightly_reindex_job], schedules=[nightly_reindex_schedule])
