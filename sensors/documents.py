"""New, changed or deleted files in the document folder trigger an ingestion run."""

import hashlib

from dagster import RunRequest, SensorEvaluationContext, SkipReason, sensor

from orchestration.jobs import ingest_job
from resources.documents import DocumentSource


@sensor(job=ingest_job, minimum_interval_seconds=60, description="Watches the document folder (paths, sizes, "
        "mtimes) and requests an ingestion run when it changes.")
def new_documents_sensor(context: SensorEvaluationContext, document_source: DocumentSource):
    scan = document_source.scan(with_hashes=False)  # cheap listing: the asset hashes what it parses
    state = "\n".join(f"{f.doc_id}\t{f.size}\t{f.path.stat().st_mtime_ns}" for f in scan.files)
    digest = hashlib.sha256(state.encode()).hexdigest()[:16]
    if digest == context.cursor:
        return SkipReason(f"{len(scan.files)} files, unchanged since the last ingestion request")
    context.update_cursor(digest)
    return RunRequest(run_key=f"documents:{digest}", tags={"documents": str(len(scan.files))})
