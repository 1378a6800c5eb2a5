"""Chunking stage: one chunk set per strategy, each a partition of `chunk_sets`."""

from dagster import AssetExecutionContext, AssetKey, Definitions, MaterializeResult, MetadataValue, asset

from orchestration.partitions import chunking_strategy_partitions
from rag.markdown import markdown_table
from rag.pipeline import chunk_step
from rag.progress import LogProgress
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE
from resources.chunking import ChunkingStrategies
from resources.storage import DataStore


def _length_histogram(lengths) -> str:
    edges = [0, 100, 250, 500, 1000, 2000, 4000, 10**9]
    rows = ["| chars | chunks |", "|---|---|"]
    for lo, hi in zip(edges, edges[1:]):
        count = int(((lengths >= lo) & (lengths < hi)).sum())
        label = f"{lo}+" if hi == 10**9 else f"{lo}–{hi - 1}"
        rows.append(f"| {label} | {count} {'█' * round(40 * count / max(1, len(lengths)))} |")
    return "\n".join(rows)


def _failure_table(failures) -> str:
    if failures.empty:
        return "_no failures_"
    rows = ["| document | previous chunks kept | error |", "|---|---|---|"]
    rows += [
        f"| {f['doc_id']} | {f['kept_previous_chunks']} | {f['error'].replace('|', '/')} |"
        for f in failures.to_dict("records")[:50]
    ]
    return "\n".join(rows)


@asset(
    name=CHUNKS_TABLE,
    partitions_def=chunking_strategy_partitions,
    deps=[AssetKey(DOCUMENTS_TABLE)],
    group_name="chunking",
    kinds={"python", "parquet"},
    description="Chunks of every parsed document for one chunking strategy (the partition key). Every "
    "chunk records its document, page span and character span in the canonical text. Incremental: only "
    "documents whose content or strategy params changed are re-chunked. A document with more chunks than the "
    "cap (RAG_MAX_CHUNKS_PER_DOCUMENT) is left out whole and listed in the partition's chunk_quarantine table.",
)
def chunk_sets(
    context: AssetExecutionContext, data_store: DataStore, chunking: ChunkingStrategies
) -> MaterializeResult:
    strategy = context.partition_key
    tables = data_store.tables
    chunker = chunking.chunker(strategy)
    run = chunk_step(tables, chunker, LogProgress(context.log.info))
    path = tables.path(CHUNKS_TABLE, strategy)
    for doc_id, error in run.failed.items():
        kept = run.kept_after_failure.get(doc_id, 0)
        context.log.error(f"chunking failed for {doc_id}: {error} (kept its {kept} previous chunks; retried next run)")
    for refusal in run.quarantine[run.quarantine["doc_id"].isin(run.quarantined)].to_dict("records"):
        context.log.warning(f"{refusal['doc_id']} left out of chunk set {strategy}: {refusal['message']}")
    summary = run.summary
    context.log.info(f"chunk set {strategy}: {summary}")
    lengths = run.chunks["text"].str.len() if len(run.chunks) else None
    return MaterializeResult(
        metadata={
            **summary,
            "strategy": strategy,
            "kind": chunker.config.kind,
            "strategy_fingerprint": chunker.fingerprint,
            "dagster/row_count": len(run.chunks),
            "path": MetadataValue.path(str(path)),
            "length_histogram": MetadataValue.md(_length_histogram(lengths) if lengths is not None else "_no chunks_"),
            "failures": MetadataValue.md(_failure_table(run.failures)),
            "quarantine": MetadataValue.md(markdown_table(run.quarantine, ["doc_id", "n_chunks", "message"])),
        }
    )


defs = Definitions(assets=[chunk_sets])
