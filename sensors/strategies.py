"""New chunking strategies in the YAML become partitions and are materialized."""

import json

from dagster import Definitions, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from orchestration.jobs import chunk_job, index_job
from orchestration.partitions import chunking_strategy_partitions, collection_key, embedding_model_partitions
from rag.chunking import strategy_fingerprint
from resources.chunking import ChunkingStrategies
from resources.models import EmbeddingModels


@sensor(
    job=chunk_job,
    minimum_interval_seconds=30,
    description="Adds a chunk_sets partition for every strategy in "
    "config/chunking.yaml and requests a run when a strategy is new or its params changed.",
)
def chunking_strategy_sensor(context: SensorEvaluationContext, chunking: ChunkingStrategies):
    strategies = chunking.strategies()
    fingerprints = {name: strategy_fingerprint(cfg) for name, cfg in strategies.items()}
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    existing = set(context.instance.get_dynamic_partitions(chunking_strategy_partitions.name))
    new_partitions = sorted(set(strategies) - existing)
    changed = sorted(name for name, fp in fingerprints.items() if seen.get(name) != fp)
    if not new_partitions and not changed:
        return SkipReason(f"{len(strategies)} strategies, all partitions present and unchanged since the last check")
    return SensorResult(
        run_requests=[
            RunRequest(partition_key=name, run_key=f"{name}:{fingerprints[name]}", tags={"chunking_strategy": name})
            for name in changed
        ],
        dynamic_partitions_requests=[chunking_strategy_partitions.build_add_request(new_partitions)]
        if new_partitions
        else [],
        cursor=json.dumps(fingerprints, sort_keys=True),
    )


@sensor(
    job=index_job,
    minimum_interval_seconds=60,
    description="Adds an embedding_model partition for every "
    "model listed as active in config/embedders.yaml and requests its collections for every strategy.",
)
def embedding_model_sensor(context: SensorEvaluationContext, embedding_models: EmbeddingModels):
    active = embedding_models.active()
    existing = set(context.instance.get_dynamic_partitions(embedding_model_partitions.name))
    new = [m for m in active if m not in existing]
    if not new:
        return SkipReason(f"{len(active)} active models, all already partitions")
    strategies = context.instance.get_dynamic_partitions(chunking_strategy_partitions.name)
    return SensorResult(
        run_requests=[
            RunRequest(partition_key=collection_key(s, m), run_key=f"collection:{s}:{m}")
            for m in new
            for s in strategies
        ],
        dynamic_partitions_requests=[embedding_model_partitions.build_add_request(new)],
    )


defs = Definitions(sensors=[chunking_strategy_sensor, embedding_model_sensor])
