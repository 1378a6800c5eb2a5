"""Partitions shared by assets, jobs and sensors, and which of them are worth building: the embedding models that
serve (or are canaried, or the operator lists as active), and the chunking strategies whose chunk set is missing or
was built with other parameters.

The dynamic partitions are derived from what the product knows (the strategies of config/chunking.yaml, the indexed
models of the registry and the embedders YAML), never kept only in Dagster's instance: a new instance (Dagster's
storage moved to Postgres, a wiped DAGSTER_HOME) gets them back from partition_requests, which dynamic_partitions_sensor
(running by default), the strategy sensors, the nightly_reindex schedule, `rag demo` and `rag sync-strategies` apply.
What was built is read from the data dir when the instance has no record of it (built_fingerprints), so a new
instance does not rebuild chunk sets that exist."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import (
    AddDynamicPartitionsRequest,
    AssetKey,
    AssetRecordsFilter,
    DeleteDynamicPartitionsRequest,
    DynamicPartitionsDefinition,
    MultiPartitionKey,
    MultiPartitionsDefinition,
)

if TYPE_CHECKING:
    from dagster import DagsterInstance

    from rag.registry import ModelRegistry
    from rag.store import TableStore

# One partition per chunking strategy named in config/chunking.yaml; added by the strategy sensor
# or `rag sync-strategies`, so a new strategy is a partition to backfill rather than code.
chunking_strategy_partitions = DynamicPartitionsDefinition(name="chunking_strategy")

# One partition per embedding model worth a collection per strategy: see indexed_models. Training adds every
# candidate it registers; the sensors, `rag demo` and `rag sync-strategies` remove the trained models that neither
# serve, run a canary nor are listed as active, so "All" in a backfill never means a model the gate rejected.
embedding_model_partitions = DynamicPartitionsDefinition(name="embedding_model")

collection_partitions = MultiPartitionsDefinition(
    {"strategy": chunking_strategy_partitions, "model": embedding_model_partitions}
)

# The chunk_sets materialization records the fingerprint of the parameters it was built with (assets/chunking.py).
FINGERPRINT_KEY = "strategy_fingerprint"


def collection_key(strategy: str, model: str) -> MultiPartitionKey:
    return MultiPartitionKey({"strategy": strategy, "model": model})


def served_models(registry: ModelRegistry) -> list[str]:
    """The embedders that answer questions: production (the base model before any promotion) and, while one runs,
    the embedder canary's candidate."""
    from rag.lifecycle.rollout import running_canary
    from rag.registry import registered_embedder

    served = [registered_embedder("production", registry)[0]]
    running = running_canary(registry)
    if running is not None and running[0] == "embedder":
        candidate = registry.resolve("embedder", running[1].candidate_version)
        if candidate is not None:
            served.append(candidate.name)
    return served


def indexed_models(registry: ModelRegistry, active: Iterable[str]) -> list[str]:
    """Models that get a collection per chunk set: the served ones, then the ones the embedders YAML lists as
    `active:` (an operator's explicit choice, e.g. to compare models; by default the base model, which is what
    serves before any promotion). A trained candidate the gate rejected is in neither."""
    return list(dict.fromkeys([*served_models(registry), *active]))


def unwanted(model: str, indexed: list[str]) -> bool:
    """A trained model (a registry name such as ft-minilm-v3) that is not indexed: a candidate the gate rejected, a
    canary rolled back, a production replaced. Built-in and configured models are the operator's to add or drop."""
    from rag.registry import is_registry_name

    return model not in indexed and is_registry_name(model, "embedder")


def model_partition_requests(
    instance: DagsterInstance, models: list[str]
) -> list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest]:
    """What makes the embedding_model partitions hold `models` and no unwanted trained model: add the missing,
    delete those. Deleting a partition keeps its collections and history; it only stops backfills from selecting
    it."""
    existing = instance.get_dynamic_partitions(embedding_model_partitions.name)
    missing = [m for m in models if m not in existing]
    stale = [m for m in existing if unwanted(m, models)]
    requests: list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest] = []
    if missing:
        requests.append(embedding_model_partitions.build_add_request(missing))
    if stale:
        requests.append(embedding_model_partitions.build_delete_request(stale))
    return requests


def partition_requests(
    instance: DagsterInstance, strategies: Iterable[str], models: list[str]
) -> list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest]:
    """What makes the partitions hold what the product knows: a chunking_strategy partition per configured strategy
    (one removed from the YAML keeps its partition and history), and the embedding_model partitions of
    model_partition_requests."""
    existing = set(instance.get_dynamic_partitions(chunking_strategy_partitions.name))
    new = [name for name in strategies if name not in existing]
    requests: list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest] = (
        [chunking_strategy_partitions.build_add_request(new)] if new else []
    )
    return [*requests, *model_partition_requests(instance, models)]


def apply_partition_requests(
    instance: DagsterInstance, requests: Iterable[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest]
) -> None:
    """Carry out dynamic-partition requests here, as the sensor daemon does with a sensor's (CLI, demo)."""
    for request in requests:
        for key in request.partition_keys:
            if isinstance(request, AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(request.partitions_def_name, [key])
            else:
                instance.delete_dynamic_partition(request.partitions_def_name, key)


def built_fingerprints(
    instance: DagsterInstance, strategies: Iterable[str], tables: TableStore | None = None
) -> dict[str, str | None]:
    """The parameters' fingerprint each strategy's chunk set was last materialized with (None: never built). With
    `tables`, a strategy the instance has no record of (a new instance) is read from its chunk set in the data dir."""
    out: dict[str, str | None] = {}
    for name in strategies:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("chunk_sets"), asset_partitions=[name]), limit=1
        ).records
        value = records[0].asset_materialization.metadata.get(FINGERPRINT_KEY) if records else None
        out[name] = getattr(value, "value", value)
        if not records and tables is not None:
            out[name] = fingerprint_on_disk(tables, name)
    return out


def fingerprint_on_disk(tables: TableStore, strategy: str) -> str | None:
    """The fingerprint every chunk of the strategy's chunk set in the data dir was made with (rag.chunk_sets writes
    it on each chunk); None when there is no chunk set, it is empty, or its chunks were made with several."""
    from rag.store import CHUNKS_TABLE

    try:
        chunks = tables.read(CHUNKS_TABLE, strategy, columns=[FINGERPRINT_KEY])
    except ValueError:  # pyarrow's ArrowInvalid: a chunk set written before chunks recorded their fingerprint
        return None
    if chunks is None:
        return None
    found = chunks[FINGERPRINT_KEY].unique()
    return str(found[0]) if len(found) == 1 else None


def strategies_to_build(
    instance: DagsterInstance,
    fingerprints: Mapping[str, str],
    requested: Mapping[str, str] | None = None,
    tables: TableStore | None = None,
) -> list[str]:
    """Strategies whose chunk set is missing or built with other parameters than the YAML's `fingerprints`, less
    those already `requested` with these parameters (a sensor's cursor: a backfill under way). `tables`: see
    built_fingerprints."""
    requested = requested or {}
    pending = [name for name, fp in fingerprints.items() if requested.get(name) != fp]
    built = built_fingerprints(instance, pending, tables)
    return [name for name in pending if built[name] != fingerprints[name]]


def materialized(instance: DagsterInstance, asset: str) -> bool:
    return instance.get_latest_materialization_event(AssetKey(asset)) is not None


@dataclass(frozen=True)
class StrategyBackfill:
    """Everything that makes chunking strategies searchable and scored: their chunk sets and BM25 indexes (unless
    `with_chunks` is off: a new model over chunk sets already built), a collection and a retrieval report per
    strategy × model, and the summary; plus ingestion and the QA set when they were never materialized (a data dir
    the demo did not fill)."""

    strategies: tuple[str, ...]
    models: tuple[str, ...]
    with_chunks: bool = True
    with_ingestion: bool = False
    with_qa_set: bool = False

    @classmethod
    def of(
        cls, instance: DagsterInstance, strategies: Iterable[str], models: Iterable[str], with_chunks: bool = True
    ) -> StrategyBackfill:
        return cls(
            tuple(strategies),
            tuple(models),
            with_chunks=with_chunks,
            with_ingestion=not materialized(instance, "parsed_documents"),
            with_qa_set=not materialized(instance, "synthetic_qa"),
        )

    def asset_partitions(self) -> list[tuple[str, str | MultiPartitionKey | None]]:
        """(asset, partition) pairs, upstream first."""
        pairs: list[tuple[str, str | MultiPartitionKey | None]] = []
        if self.with_ingestion:
            pairs += [("parsed_documents", None), ("document_quarantine", None)]
        if self.with_qa_set:
            pairs.append(("synthetic_qa", None))
        if self.with_chunks:
            pairs += [(asset, s) for s in self.strategies for asset in ("chunk_sets", "bm25_indexes")]
        keys = [collection_key(s, m) for s in self.strategies for m in self.models]
        pairs += [(asset, key) for key in keys for asset in ("embedding_collections", "retrieval_evaluation")]
        return [*pairs, ("evaluation_summary", None)]

    def describe(self) -> str:
        steps = "chunk, BM25-index, " if self.with_chunks else ""
        extra = [what for flag, what in ((self.with_ingestion, "ingestion"), (self.with_qa_set, "the QA set")) if flag]
        return (
            f"{steps}embed with {', '.join(self.models) or 'no model'}, evaluate and summarize "
            f"{', '.join(self.strategies)}" + (f" (and {' and '.join(extra)}, never materialized)" if extra else "")
        )
