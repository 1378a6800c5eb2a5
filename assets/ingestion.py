"""Ingestion stage: the document folder becomes parsed documents and a quarantine table."""

from dagster import AssetExecutionContext, AssetSpec, Definitions, MaterializeResult, MetadataValue, multi_asset

from rag.markdown import markdown_table
from rag.pipeline import ingest_step
from rag.progress import LogProgress
from rag.store import DOCUMENTS_TABLE, QUARANTINE_TABLE
from resources.documents import DocumentSource
from resources.storage import DataStore


@multi_asset(
    specs=[
        AssetSpec(
            DOCUMENTS_TABLE,
            group_name="ingestion",
            kinds={"python", "parquet", "pdfplumber"},
            description="One row per parsed document: canonical text, ordered elements (tables as HTML), "
            "pages. Incremental: only new or changed files (by sha256) are parsed.",
        ),
        AssetSpec(
            QUARANTINE_TABLE,
            group_name="ingestion",
            kinds={"python", "parquet"},
            description="Files that could not be read or parsed, with the reason (encrypted, malformed, empty, "
            "no text layer, unsupported, too large, outside the root, unreadable, broken link, not a file) and the "
            "exception class.",
        ),
    ],
    can_subset=False,
)
def ingest_documents(context: AssetExecutionContext, document_source: DocumentSource, data_store: DataStore):
    tables = data_store.tables
    run = ingest_step(
        tables,
        document_source.scan(),
        document_source.parse_settings(),
        on_progress=lambda doc_id: context.log.debug(f"parsing {doc_id}"),
        progress=LogProgress(context.log.info),
    )
    docs_path, quarantine_path = tables.path(DOCUMENTS_TABLE), tables.path(QUARANTINE_TABLE)
    summary = run.summary
    parsed_pages = int(run.documents[run.documents["doc_id"].isin(run.parsed)]["n_pages"].sum()) if run.parsed else 0
    context.log.info(f"ingestion: {summary}")
    yield MaterializeResult(
        asset_key=DOCUMENTS_TABLE,
        metadata={
            **{k: v for k, v in summary.items() if not k.startswith("quarantine")},
            "dagster/row_count": len(run.documents),
            "path": MetadataValue.path(str(docs_path)),
            "source": MetadataValue.path(document_source.path),
            "parsed_pages_per_second": round(parsed_pages / run.seconds, 2) if run.seconds else 0.0,
            "documents_preview": MetadataValue.md(
                markdown_table(run.documents, ["doc_id", "parser", "n_pages", "n_elements", "n_tables", "n_chars"])
            ),
        },
    )
    yield MaterializeResult(
        asset_key=QUARANTINE_TABLE,
        metadata={
            "dagster/row_count": len(run.quarantine),
            "quarantined_new": len(run.quarantined),
            **{k: v for k, v in summary.items() if k.startswith("quarantine_")},
            "path": MetadataValue.path(str(quarantine_path)),
            "quarantine": MetadataValue.md(
                markdown_table(run.quarantine, ["doc_id", "reason", "exception_class", "message"])
            ),
        },
    )


defs = Definitions(assets=[ingest_documents])
