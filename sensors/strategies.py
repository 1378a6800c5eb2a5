"""Chunking strategies and embedding models kept in step with Dagster's partitions. A strategy new in the YAML (or
with new parameters) becomes one backfill that chunks it, BM25-indexes it, embeds it with every indexed model (the
served ones and those listed as active, never a candidate the gate rejected), evaluates it and refreshes
evaluation_summary. A model newly indexed (a promotion, a canary, a new `active:` entry) gets the same over every
chunk set. Only what is missing runs: a strategy whose chunk set was last built with its current parameters is left
alone, so a first tick after `make demo` launches nothing, nor one on a new Dagster instance over a data dir that holds
the chunk sets (their fingerprints are read there).

dynamic_partitions_sensor, running by default, gives a new instance its partitions back without launching anything."""

from __future__ import annotations

import json

from dagster import (
    AddDynamicPartitionsRequest,
    AssetKey,
    AssetSelection,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.definitions.events import AssetKeyPartitionKey

from orchestration.partitions import (
    StrategyBackfill,
    built_fingerprints,
    indexed_models,
    partition_requests,
    strategies_to_build,
)
from rag.chunking import strategy_fingerprint
from rag.registry import ModelRegistry
from resources.chunking import ChunkingStrategies
from resources.models import EmbeddingModels
from resources.storage import DataStore

# What a strategy or model backfill may target (StrategyBackfill.asset_partitions): a sensor launching a backfill
# must name its assets.
BACKFILLED = AssetSelection.assets(
    "parsed_documents",
    "document_quarantine",
    "synthetic_qa",
    "chunk_sets",
    "bm25_indexes",
    "embedding_collections",
    "retrieval_evaluation",
    "evaluation_summary",
)


def backfill_request(context: SensorEvaluationContext, plan: StrategyBackfill, trigger: str) -> RunRequest:
    """One backfill of the plan's asset partitions (the daemon orders them along the lineage; the embedded Qdrant
    folder's pool keeps its runs one at a time), like a backfill launched from the UI."""
    pairs = {AssetKeyPartitionKey(AssetKey(asset), partition) for asset, partition in plan.asset_partitions()}
    if context.repository_def is None:
        raise ValueError("the sensor needs its code location's asset graph: evaluate it with definitions=defs")
    subset = AssetGraphSubset.from_asset_partition_set(pairs, context.repository_def.asset_graph)
    return RunRequest.for_asset_graph_subset(subset, tags={"trigger": trigger})


def _indexed(data_store: DataStore, embedding_models: EmbeddingModels) -> list[str]:
    return indexed_models(ModelRegistry(data_store.root / "models"), embedding_models.active())


@sensor(
    asset_selection=BACKFILLED,
    minimum_interval_seconds=30,
    description="Every 30 seconds: adds a chunk_sets partition for every strategy in config/chunking.yaml "
    "(RAG_CHUNKING_CONFIG) and, for a strategy whose chunk set is missing or was built with other parameters, "
    "launches one backfill: chunks, BM25 index, a collection for each model that serves (or runs a canary, or is "
    "listed as active), their evaluation and evaluation_summary. Removes the embedding_model partitions of trained "
    "models that are none of these.",
)
def chunking_strategy_sensor(
    context: SensorEvaluationContext,
    chunking: ChunkingStrategies,
    embedding_models: EmbeddingModels,
    data_store: DataStore,
):
    instance = context.instance
    fingerprints = {name: strategy_fingerprint(cfg) for name, cfg in chunking.strategies().items()}
    requested: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    todo = strategies_to_build(instance, fingerprints, requested, data_store.tables)
    models = _indexed(data_store, embedding_models)
    partitions = partition_requests(instance, fingerprints, models)
    # A requested backfill is not requested again when it fails: re-execute it from its page, or change the params.
    cursor = json.dumps({**requested, **fingerprints}, sort_keys=True)
    if not todo:
        return SensorResult(
            skip_reason=f"{len(fingerprints)} strategies, each chunk set built with its current parameters",
            dynamic_partitions_requests=partitions,
            cursor=cursor,
        )
    plan = StrategyBackfill.of(instance, todo, models)
    context.log.info(f"launching a backfill: {plan.describe()}")
    return SensorResult(
        run_requests=[backfill_request(context, plan, "chunking_strategy_sensor")],
        dynamic_partitions_requests=partitions,
        cursor=cursor,
    )


@sensor(
    asset_selection=BACKFILLED,
    minimum_interval_seconds=60,
    description="Every minute: adds an embedding_model partition for each model that serves (production, or the base "
    "minilm before any promotion), runs a canary or is listed as active in config/embedders.yaml, and removes those of "
    "trained models that are none of these (a candidate the gate rejected); for a model newly among them, launches "
    "one backfill of its collection and evaluation over every chunk set built, and evaluation_summary.",
)
def embedding_model_sensor(
    context: SensorEvaluationContext,
    chunking: ChunkingStrategies,
    embedding_models: EmbeddingModels,
    data_store: DataStore,
):
    instance = context.instance
    models = _indexed(data_store, embedding_models)
    # Without a cursor (never ticked, no demo set one, or a new instance) the models are taken as found: a promotion
    # and a canary's start build their own collections, and nightly_reindex fills any other gap incrementally.
    seen = json.loads(context.cursor) if context.cursor else models
    new = [m for m in models if m not in seen]
    partitions = partition_requests(instance, chunking.strategies(), models)
    built = [
        s for s, fp in built_fingerprints(instance, chunking.strategies(), data_store.tables).items() if fp is not None
    ]
    cursor = json.dumps(models)
    if not new or not built:
        reason = f"{len(models)} indexed models ({', '.join(models)}), none new" if not new else "no chunk set yet"
        return SensorResult(skip_reason=reason, dynamic_partitions_requests=partitions, cursor=cursor)
    plan = StrategyBackfill.of(instance, built, new, with_chunks=False)
    context.log.info(f"launching a backfill: {plan.describe()}")
    return SensorResult(
        run_requests=[backfill_request(context, plan, "embedding_model_sensor")],
        dynamic_partitions_requests=partitions,
        cursor=cursor,
    )


@sensor(
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Running by default, launches nothing: keeps the dynamic partitions what the product knows, so a new "
    "Dagster instance (storage moved to Postgres, DAGSTER_HOME wiped) gets them back within a minute: a "
    "chunking_strategy partition per strategy of config/chunking.yaml, an embedding_model partition per model that "
    "serves, runs a canary or is listed as active, and none for a trained model that is none of these.",
)
def dynamic_partitions_sensor(
    context: SensorEvaluationContext,
    chunking: ChunkingStrategies,
    embedding_models: EmbeddingModels,
    data_store: DataStore,
):
    strategies, models = list(chunking.strategies()), _indexed(data_store, embedding_models)
    requests = partition_requests(context.instance, strategies, models)
    changes = [
        f"{'adds' if isinstance(r, AddDynamicPartitionsRequest) else 'removes'} {', '.join(r.partition_keys)}"
        for r in requests
    ]
    return SensorResult(
        skip_reason=f"{len(strategies)} strategies, models {', '.join(models)}"
        + (f"; {'; '.join(changes)}" if changes else ": partitions already in step"),
        dynamic_partitions_requests=requests,
    )


defs = Definitions(sensors=[chunking_strategy_sensor, embedding_model_sensor, dynamic_partitions_sensor])
