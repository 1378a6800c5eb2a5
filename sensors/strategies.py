"""New chunking strategies in the YAML become partitions and are materialized."""

import json

from dagster import RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from orchestration.jobs import chunk_job
from orchestration.partitions import chunking_strategy_partitions
from rag.chunking import strategy_fingerprint
from resources.chunking import ChunkingStrategies


@sensor(job=chunk_job, minimum_interval_seconds=30, description="Adds a chunk_sets partition for every strategy in "
        "config/chunking.yaml and requests a run when a strategy is new or its params changed.")
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
        dynamic_partitions_requests=[chunking_strategy_partitions.build_add_request(new_partitions)] if new_partitions else [],
        cursor=json.dumps(fingerprints, sort_keys=True),
    )
