"""The whole indexing path as plain functions: parse → chunk → BM25 + dense collection.

`rag index` calls this directly; the Dagster assets call the same steps one asset at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rag.chunk_sets import update_chunk_set
from rag.chunking import get_chunker, load_strategies
from rag.embedding import load_embedder
from rag.index.qdrant import QdrantSettings, get_client
from rag.index.sync import sync_bm25, sync_collection
from rag.ingest import update_documents
from rag.parsing import ParseSettings
from rag.source import scan_folder
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE, QUARANTINE_TABLE, TableStore, bm25_root


@dataclass
class PipelineReport:
    parse: dict = field(default_factory=dict)
    chunks: dict[str, dict] = field(default_factory=dict)
    bm25: dict[str, dict] = field(default_factory=dict)
    collections: dict[str, dict] = field(default_factory=dict)


def index_folder(
    docs_dir: Path,
    data_dir: Path,
    *,
    strategies: list[str] | None = None,
    models: list[str] | None = None,
    parse_settings: ParseSettings | None = None,
    qdrant: QdrantSettings | None = None,
    distance: str = "cosine",
) -> PipelineReport:
    tables = TableStore(Path(data_dir) / "tables")
    report = PipelineReport()
    configs = load_strategies()
    strategies = strategies or list(configs)
    unknown = [s for s in strategies if s not in configs]
    if unknown:
        raise ValueError(f"unknown chunking strategies {unknown} (known: {', '.join(configs)})")
    embedders = {m: load_embedder(m) for m in (models or [])}  # fail fast on an unknown model

    parsed = update_documents(scan_folder(docs_dir), tables.read(DOCUMENTS_TABLE), tables.read(QUARANTINE_TABLE), parse_settings or ParseSettings())
    tables.write(parsed.documents, DOCUMENTS_TABLE)
    tables.write(parsed.quarantine, QUARANTINE_TABLE)
    report.parse = parsed.summary | {"quarantine": parsed.quarantine[["doc_id", "reason", "message"]].to_dict("records")}

    client = get_client(qdrant) if embedders else None
    for strategy in strategies:
        chunk_run = update_chunk_set(tables.read(CHUNKS_TABLE, strategy), parsed.documents, get_chunker(strategy, configs))
        tables.write(chunk_run.chunks, CHUNKS_TABLE, strategy)
        report.chunks[strategy] = chunk_run.summary
        report.bm25[strategy] = sync_bm25(chunk_run.chunks, bm25_root(data_dir, strategy)).summary
        for name, embedder in embedders.items():
            run = sync_collection(client, chunk_run.chunks, embedder, strategy=strategy, model=name, distance=distance)
            report.collections[f"{strategy}|{name}"] = run.summary
    return report
