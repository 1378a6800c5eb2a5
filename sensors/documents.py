"""New, changed or deleted files in the document folder trigger an incremental parse → chunk → index run."""

import hashlib

from dagster import Definitions, SensorEvaluationContext, SensorResult, SkipReason, sensor

from orchestration.nightly import nightly_plan, nightly_reindex_job, run_requests
from rag.source import SourceScan
from resources.chunking import ChunkingStrategies
from resources.documents import DocumentSource
from resources.models import EmbeddingModels
from resources.storage import DataStore


def _state_digest(scan: SourceScan) -> str:
    """Changes when a file is added, removed, resized or touched, or an entry the scan refused appears, goes or
    changes reason (a broken link mended, a FIFO dropped in). Only what the scan read: a file vanishing meanwhile
    must not crash the sensor."""
    lines = [f"{f.doc_id}\t{f.size}\t{f.mtime_ns}" for f in scan.files]
    lines += [f"{r.doc_id}\t!{r.reason.value}" for r in scan.rejected]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


# The incremental re-index job rather than ingestion alone: a new file should become searchable, and only the
# changed documents are parsed, re-chunked and embedded, so a small change costs a small run.
@sensor(
    job=nightly_reindex_job,
    minimum_interval_seconds=60,
    description="Every minute: lists the document folder (file names, sizes, modification times) and, when anything "
    "was added, changed or removed, starts nightly_reindex_job for every chunk set × model that serves, as the "
    "nightly schedule does: only what changed is parsed, chunked, BM25-indexed and embedded again.",
)
def new_documents_sensor(
    context: SensorEvaluationContext,
    document_source: DocumentSource,
    chunking: ChunkingStrategies,
    embedding_models: EmbeddingModels,
    data_store: DataStore,
):
    scan = document_source.scan(with_hashes=False)  # cheap listing: the asset hashes what it parses
    digest = _state_digest(scan)
    if digest == context.cursor:
        return SkipReason(
            f"{len(scan.files)} files ({len(scan.rejected)} refused), unchanged since the last re-index request"
        )
    keys, partitions = nightly_plan(context.instance, chunking, embedding_models, data_store)
    return SensorResult(
        run_requests=run_requests(keys, f"documents:{digest}"), dynamic_partitions_requests=partitions, cursor=digest
    )


defs = Definitions(sensors=[new_documents_sensor])
