"""The Dagster code location (loaded by workspace.yaml)."""
from dagster import Definitions

from assets.checks import chunk_sets_quality, parsed_documents_quality
from assets.chunking import chunk_sets
from assets.ingestion import ingest_documents
from orchestration.jobs import chunk_job, ingest_job
from resources.chunking import ChunkingStrategies
from resources.documents import DocumentSource
from resources.storage import DataStore
from sensors.documents import new_documents_sensor
from sensors.strategies import chunking_strategy_sensor

defs = Definitions(
    assets=[ingest_documents, chunk_sets],
    asset_checks=[parsed_documents_quality, chunk_sets_quality],
    jobs=[ingest_job, chunk_job],
    sensors=[chunking_strategy_sensor, new_documents_sensor],
    resources={
        "document_source": DocumentSource(),
        "data_store": DataStore(),
        "chunking": ChunkingStrategies(),
    },
)
