"""Partitions shared by assets, jobs and sensors."""
from dagster import DynamicPartitionsDefinition

# One partition per chunking strategy named in config/chunking.yaml; added by the strategy sensor
# or `rag strategies sync`, so a new strategy is a partition to backfill rather than code.
chunking_strategy_partitions = DynamicPartitionsDefinition(name="chunking_strategy")
