"""Incremental chunk sets: one table per strategy, rebuilt only for documents that changed.

A document whose chunking fails keeps its previous chunks (if it had any): the next index sync deletes points
whose chunks are gone, so dropping them would take a document out of search over a transient failure (a model
that failed to load). The failure is recorded and retried on the next run, because the kept chunks still carry
the old content hash or strategy fingerprint.

A document with more chunks than the cap (ChunkLimits) is different: it is expected, not transient. It gets no
chunks in the set at all and a row in the strategy's chunk quarantine, and is not chunked again until it changes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pandas as pd
from pydantic import BaseModel, Field

from rag.chunking import Chunker
from rag.chunking.models import Chunk
from rag.ingest import document_from_row
from rag.parsing import QuarantineReason
from rag.parsing.settings import int_from_env
from rag.progress import Progress, counter

log = logging.getLogger(__name__)

CHUNK_COLUMNS = list(Chunk.model_fields) + ["doc_content_hash", "strategy_fingerprint"]
FAILURE_COLUMNS = ["doc_id", "error", "kept_previous_chunks"]
# Per strategy, beside its chunk set: documents refused for having too many chunks with that strategy. Not in
# chunk_failures, whose rows fail the blocking chunk-set check (a transient failure to retry): a refusal is an
# expected outcome for a huge document, and must not hold back the index of every other document.
CHUNK_QUARANTINE_TABLE = "chunk_quarantine"
CHUNK_QUARANTINE_COLUMNS = [
    "doc_id",
    "doc_content_hash",
    "strategy_fingerprint",
    "max_chunks",
    "n_chunks",
    "reason",
    "message",
    "quarantined_at",
]

MAX_CHUNKS_ENV = "RAG_MAX_CHUNKS_PER_DOCUMENT"
# At the character cap (5 million, ParseSettings.max_document_chars) paragraph chunks (~1,800 characters) come to
# ~2,800 and recursive-1000-200 to ~6,300, under the cap; only strategies finer than ~500 characters a chunk (sentence
# windows) refuse the very largest documents. 10,000 chunks is minutes of embedding per model on a CPU: one document
# cannot stall a run for hours (the 50 MB single-line file made 29,132 paragraph chunks).
DEFAULT_MAX_CHUNKS_PER_DOCUMENT = 10_000


class ChunkLimits(BaseModel):
    max_chunks_per_document: int = Field(
        default_factory=lambda: int_from_env(MAX_CHUNKS_ENV, DEFAULT_MAX_CHUNKS_PER_DOCUMENT),
        gt=0,
        description=f"A document with more chunks with one strategy gets none in that strategy's chunk set and a "
        f"row in its chunk_quarantine (env {MAX_CHUNKS_ENV}).",
    )


@dataclass
class ChunkRun:
    chunks: pd.DataFrame
    rechunked: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    kept_after_failure: dict[str, int] = field(default_factory=dict)  # doc id -> previous chunks kept
    quarantine: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CHUNK_QUARANTINE_COLUMNS))
    quarantined: list[str] = field(default_factory=list)  # newly refused in this run
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
            "quarantined_documents": len(self.quarantine),
            "quarantined_new": len(self.quarantined),
            "mean_chars": round(float(lengths.mean()), 1) if len(lengths) else 0.0,
            "median_chars": float(lengths.median()) if len(lengths) else 0.0,
            "max_chars": int(lengths.max()) if len(lengths) else 0,
            "mean_tokens": round(float(self.chunks["n_tokens"].mean()), 1) if len(self.chunks) else 0.0,
            "chunks_with_tables": int(self.chunks["table_html"].notna().sum()) if len(self.chunks) else 0,
            "seconds": round(self.seconds, 3),
        }


def _by_doc(table: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    if table is None or not len(table):
        return {}
    return {str(doc_id): group for doc_id, group in table.groupby("doc_id", sort=False)}


def _first(frame: pd.DataFrame, *columns: str) -> tuple:
    return tuple(frame[list(columns)].iloc[0])


class _Update:
    """One pass of update_chunk_set: what each document contributes to the new chunk set or its quarantine."""

    def __init__(self, chunker: Chunker, cap: int, kept: dict[str, pd.DataFrame], refused: dict[str, pd.DataFrame]):
        self.chunker, self.cap, self.kept, self.refused = chunker, cap, kept, refused
        self.fingerprint = chunker.fingerprint
        self.frames: list[pd.DataFrame] = []
        self.refusals: list[pd.DataFrame] = []

    def unchanged_chunks(self, row: dict) -> pd.DataFrame | None:
        """The previous chunks of a document with the same content and strategy params."""
        old = self.kept.get(row["doc_id"])
        if old is not None and _first(old, "doc_content_hash", "strategy_fingerprint") == self._key(row):
            return old
        return None

    def standing_refusal(self, row: dict) -> pd.DataFrame | None:
        """The previous quarantine entry of a document with the same content, strategy params and cap: chunking it
        again would only refuse it again."""
        old = self.refused.get(row["doc_id"])
        if old is not None and _first(old, "doc_content_hash", "strategy_fingerprint", "max_chunks") == (
            *self._key(row),
            self.cap,
        ):
            return old
        return None

    def settled(self, row: dict) -> bool:
        return self.unchanged_chunks(row) is not None or self.standing_refusal(row) is not None

    def _key(self, row: dict) -> tuple:
        return (row["content_hash"], self.fingerprint)

    def rechunk(self, row: dict, run: ChunkRun) -> None:
        doc_id, old = row["doc_id"], self.kept.get(row["doc_id"])
        try:
            chunks = self.chunker.chunk(document_from_row(row))
        except Exception as exc:  # one document's failure must not lose the whole chunk set, nor its own chunks
            run.failed[doc_id] = f"{type(exc).__name__}: {exc}"[:300]
            if old is not None:
                self.frames.append(old)
                run.kept_after_failure[doc_id] = len(old)
            log.exception(
                "chunking %s with %s failed; kept its %d previous chunks",
                doc_id,
                self.chunker.name,
                0 if old is None else len(old),
            )
            return
        if len(chunks) > self.cap:  # refused whole, before any of its rows is written: no partial document
            self.refusals.append(self._refusal(row, len(chunks)))
            run.quarantined.append(doc_id)
            return
        records = [
            c.model_dump() | {"doc_content_hash": row["content_hash"], "strategy_fingerprint": self.fingerprint}
            for c in chunks
        ]
        self.frames.append(pd.DataFrame(records, columns=CHUNK_COLUMNS))
        run.rechunked.append(doc_id)

    def _refusal(self, row: dict, n_chunks: int) -> pd.DataFrame:
        message = (
            f"{n_chunks:,} chunks with strategy {self.chunker.name}; the cap is {self.cap:,} per document "
            f"({MAX_CHUNKS_ENV} / ChunkLimits.max_chunks_per_document): split the file or raise the cap"
        )
        log.warning("quarantined %s from chunk set %s: %s", row["doc_id"], self.chunker.name, message)
        entry = {
            "doc_id": row["doc_id"],
            "doc_content_hash": row["content_hash"],
            "strategy_fingerprint": self.fingerprint,
            "max_chunks": self.cap,
            "n_chunks": n_chunks,
            "reason": QuarantineReason.TOO_LARGE.value,
            "message": message,
            "quarantined_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        return pd.DataFrame([entry], columns=CHUNK_QUARANTINE_COLUMNS)


def update_chunk_set(
    previous: pd.DataFrame | None,
    documents: pd.DataFrame,
    chunker: Chunker,
    progress: Progress | None = None,
    *,
    limits: ChunkLimits | None = None,
    previous_quarantine: pd.DataFrame | None = None,
) -> ChunkRun:
    """Keep the chunks of documents whose content and strategy params are unchanged; redo the rest.
    A document over `limits` (default: ChunkLimits()) gets no chunks and a row in `run.quarantine`, kept (and not
    chunked again) until its content, the strategy's params or the cap change. `progress` counts the documents to
    re-chunk."""
    started = time.perf_counter()
    cap = (limits or ChunkLimits()).max_chunks_per_document
    update = _Update(chunker, cap, _by_doc(previous), _by_doc(previous_quarantine))
    run = ChunkRun(chunks=pd.DataFrame(columns=CHUNK_COLUMNS))
    rows = documents.to_dict("records")
    advance = counter(progress, f"chunking {chunker.name}", sum(not update.settled(row) for row in rows), "documents")
    for row in rows:
        if (old := update.unchanged_chunks(row)) is not None:
            update.frames.append(old)
        elif (refusal := update.standing_refusal(row)) is not None:
            update.refusals.append(refusal)
        else:
            update.rechunk(row, run)
            advance()
            continue
        run.unchanged.append(row["doc_id"])
    run.removed = sorted(set(update.kept) - {row["doc_id"] for row in rows})
    frames = [f for f in update.frames if len(f)]
    if frames:
        run.chunks = pd.concat(frames, ignore_index=True).sort_values(
            ["doc_id", "char_start", "char_end"], ignore_index=True
        )
    if update.refusals:
        run.quarantine = pd.concat(update.refusals, ignore_index=True).sort_values("doc_id", ignore_index=True)
    run.seconds = time.perf_counter() - started
    return run
