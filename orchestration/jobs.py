"""Jobs: ingestion (parse the folder) and chunking (one strategy partition per run)."""
from dagster import AssetSelection, define_asset_job

from orchestration.partitions import chunking_strategy_partitions

ingest_job = define_asset_job(
    "ingest_documents_job",
    selection=AssetSelection.assets("parsed_documents", "document_quarantine"),
    description="Parse new and changed documents; quarantine what cannot be parsed.",
)

chunk_job = define_asset_job(
    "chunk_sets_job",
    selection=AssetSelection.assets("chunk_sets"),
    partitions_def=chunking_strategy_partitions,
    description="Build (incrementally) the chunk set of one chunking strategy.",
)
