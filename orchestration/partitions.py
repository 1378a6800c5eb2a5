"""Partitions shared by assets, jobs and sensors."""

from dagster import DynamicPartitionsDefinition, MultiPartitionKey, MultiPartitionsDefinition

# One partition per chunking strategy named in config/chunking.yaml; added by the strategy sensor
# or `rag sync-strategies`, so a new strategy is a partition to backfill rather than code.
chunking_strategy_partitions = DynamicPartitionsDefinition(name="chunking_strategy")

# One partition per embedding model (`active:` in config/embedders.yaml, or a newly trained model).
embedding_model_partitions = DynamicPartitionsDefinition(name="embedding_model")

collection_partitions = MultiPartitionsDefinition(
    {"strategy": chunking_strategy_partitions, "model": embedding_model_partitions}
)


def collection_key(strategy: str, model: str) -> MultiPartitionKey:
    return MultiPartitionKey({"strategy": strategy, "model": model})
