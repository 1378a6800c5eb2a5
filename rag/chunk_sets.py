"""Incremental chunk sets: one table per strategy, rebuilt only for documents that changed.

A document whose chunking fails keeps its previous chunks (if it had any): the next index sync deletes points
whose chunks are gone, so dropping them would take a document out of search over a transient failure (a model
that failed to load). The failure is recorded and retried on the next run, because the kept chunks still carry
the old content hash or strategy fingerprint.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import pandas as pd

from rag.chunking import Chunker
from rag.chunking.models import Chunk
from rag.ingest import document_from_row
from rag.progress import Progress, counter

log = logging.getLogger(__name__)

CHUNK_COLUMNS = list(Chunk.model_fields) + ["doc_content_hash", "strategy_fingerprint"]
FAILURE_COLUMNS = ["doc_id", "error", "kept_previous_chunks"]


@dataclass
class ChunkRun:
    chunks: pd.DataFrame
    rechunked: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    kept_after_failure: dict[str, int] = field(default_factory=dict)  # doc id -> previous chunks kept
    seconds: float = 0.0

    @property
    def failures(self) -> pd.DataFrame:
        rows = [
            {"doc_id": d, "error": e, "kept_previous_chunks": self.kept_after_failure.get(d, 0)}
            for d, e in sorted(self.failed.items())
        ]
        return pd.DataFrame(rows, columns=FAILURE_COLUMNS).astype({"kept_previous_chunks": "int64"})

    @property
    def summary(self) -> dict[str, int | float]:
        lengths = self.chunks["text"].str.len() if len(self.chunks) else pd.Series(dtype=float)
        return {
            "chunks": len(self.chunks),
            "documents": int(self.chunks["doc_id"].nunique()) if len(self.chunks) else 0,
            "rechunked_documents": len(self.rechunked),
            "unchanged_documents": len(self.unchanged),
            "removed_documents": len(self.removed),
            "failed_documents": len(self.failed),
            "chunks_kept_after_failure": sum(self.kept_after_failure.values()),
            "mean_chars": round(float(lengths.mean()), 1) if len(lengths) else 0.0,
            "median_chars": float(lengths.median()) if len(lengths) else 0.0,
            "max_chars": int(lengths.max()) if len(lengths) else 0,
            "mean_tokens": round(float(self.chunks["n_tokens"].mean()), 1) if len(self.chunks) else 0.0,
            "chunks_with_tables": int(self.chunks["table_html"].notna().sum()) if len(self.chunks) else 0,
            "seconds": round(self.seconds, 3),
        }


def update_chunk_set(
    previous: pd.DataFrame | None, documents: pd.DataFrame, chunker: Chunker, progress: Progress | None = None
) -> ChunkRun:
    """Keep the chunks of documents whose content and strategy params are unchanged; redo the rest.
    `progress` counts the documents to re-chunk."""
    started = time.perf_counter()
    fingerprint = chunker.fingerprint
    kept: dict[str, pd.DataFrame] = {}
    if previous is not None and len(previous):
        for doc_id, group in previous.groupby("doc_id", sort=False):
            kept[str(doc_id)] = group
    run = ChunkRun(chunks=pd.DataFrame(columns=CHUNK_COLUMNS))
    frames: list[pd.DataFrame] = []
    current = set()

    def unchanged(row: dict, old: pd.DataFrame | None) -> bool:
        return old is not None and (old["doc_content_hash"].iloc[0], old["strategy_fingerprint"].iloc[0]) == (
            row["content_hash"],
            fingerprint,
        )

    rows = documents.to_dict("records")
    advance = counter(
        progress,
        f"chunking {chunker.name}",
        sum(1 for row in rows if not unchanged(row, kept.get(row["doc_id"]))),
        "documents",
    )
    for row in rows:
        doc_id = row["doc_id"]
        current.add(doc_id)
        old = kept.get(doc_id)
        if unchanged(row, old):
            frames.append(old)
            run.unchanged.append(doc_id)
            continue
        try:
            chunks = chunker.chunk(document_from_row(row))
        except Exception as exc:  # one document's failure must not lose the whole chunk set, nor its own chunks
            advance()
            run.failed[doc_id] = f"{type(exc).__name__}: {exc}"[:300]
            if old is not None:
                frames.append(old)
                run.kept_after_failure[doc_id] = len(old)
            log.exception(
                "chunking %s with %s failed; kept its %d previous chunks",
                doc_id,
                chunker.name,
                0 if old is None else len(old),
            )
            continue
        records = [
            c.model_dump() | {"doc_content_hash": row["content_hash"], "strategy_fingerprint": fingerprint}
            for c in chunks
        ]
        frames.append(pd.DataFrame(records, columns=CHUNK_COLUMNS))
        run.rechunked.append(doc_id)
        advance()
    run.removed = sorted(set(kept) - current)
    frames = [f for f in frames if len(f)]
    if frames:
        run.chunks = pd.concat(frames, ignore_index=True).sort_values(
            ["doc_id", "char_start", "char_end"], ignore_index=True
        )
    run.seconds = time.perf_counter() - started
    return run
