"""Bring indexes in line with a chunk set, touching only what changed.

Dense: the live collection of (strategy, model) gets upserts for new/changed chunks, then deletes for
chunks that disappeared (in that order, so a changed document stays findable throughout); a new model
version (or distance) builds a fresh collection and swaps the alias when it is complete. Points are upserted in
batches as they are encoded, so a build that is interrupted (an error, Ctrl-C, kill -9) leaves the batches it wrote
in its unaliased collection, and the next run resumes there: it embeds only the chunks that collection lacks (or
holds with another content hash). Each point carries the
chunk's BM25 sparse vector beside the dense one (rag.index.bm25_sparse), so the engine ranks BM25 too. The
strategy's bm25s index: rebuilt when the chunk set's fingerprint changed (seconds, no model); it serves BM25 where
no collection is opened (bm25-only searches) and for collections built before the sparse vector existed.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rag.embedding import TextEmbedder, model_key
from rag.index.bm25 import BM25Index, corpus_fingerprint
from rag.index.bm25_sparse import LENGTH_FIELD, SPARSE, PassageTerms, has_bm25
from rag.index.qdrant import (
    DENSE,
    CollectionName,
    alias_target,
    aliased_collections,
    create_collection,
    drop_unaliased,
    optimize,
    point_alias_to,
    point_id,
    stored_payloads,
)
from rag.progress import Progress, counter

PAYLOAD_FIELDS = [
    "chunk_id",
    "doc_id",
    "strategy",
    "text",
    "char_start",
    "char_end",
    "page_start",
    "page_end",
    "section_path",
    "prev_chunk_id",
    "next_chunk_id",
    "n_tokens",
    "content_hash",
    "table_html",
]


@dataclass
class IndexRun:
    collection: str
    alias: str
    points: int = 0
    added: int = 0
    updated: int = 0
    deleted: int = 0
    rebuilt: bool = False
    resumed: int = 0  # points an interrupted build of this collection had stored, kept instead of re-embedded
    bm25_in_engine: bool = False  # the collection carries BM25 sparse vectors (older ones do not: bm25s serves them)
    dropped_collections: list[str] = field(default_factory=list)
    seconds: float = 0.0
    embed_seconds: float = 0.0

    @property
    def summary(self) -> dict[str, int | float | str | bool]:
        written = self.added + self.updated
        return {
            "collection": self.collection,
            "alias": self.alias,
            "points": self.points,
            "added": self.added,
            "updated": self.updated,
            "deleted": self.deleted,
            "rebuilt": self.rebuilt,
            "resumed": self.resumed,
            "bm25_in_engine": self.bm25_in_engine,
            "seconds": round(self.seconds, 3),
            "embed_seconds": round(self.embed_seconds, 3),
            "chunks_per_second": round(written / self.seconds, 1) if written and self.seconds else 0.0,
        }


def _payload(row: dict) -> dict:
    out = {}
    for key in PAYLOAD_FIELDS:
        value = row.get(key)
        if hasattr(value, "tolist"):  # numpy arrays from parquet list columns
            value = value.tolist()
        if isinstance(value, float) and value != value:  # NaN from pandas for missing strings
            value = None
        out[key] = value
    return out


def point_batch(
    rows: list[dict], dense: np.ndarray, terms: PassageTerms | None = None, avgdl: float = 0.0, start: int = 0
):
    """The points of `rows` (ids, payloads, dense vectors; with `terms`, whose passages start..start+len(rows) are
    these rows, the BM25 sparse vectors and lengths too) as one models.Batch."""
    from qdrant_client import models

    payloads = [_payload(r) for r in rows]
    vectors = {DENSE: dense.tolist()}
    if terms is not None:
        span = range(start, start + len(rows))
        vectors[SPARSE] = terms.vectors(avgdl, span)
        for payload, row in zip(payloads, span):
            payload[LENGTH_FIELD] = int(terms.lengths[row])
    return models.Batch(ids=[point_id(r["chunk_id"]) for r in rows], vectors=vectors, payloads=payloads)


def _upsert_embedded(
    client,
    collection: str,
    rows: list[dict],
    embedder: TextEmbedder,
    batch_size: int,
    progress: Progress | None = None,
    task: str = "embedding",
    kept_lengths: dict[str, int] | None = None,
) -> float:
    """Encode in batches while a second thread upserts the previous batch (Qdrant I/O overlaps the model).
    Each batch is encoded in slices of the embedder's own batch size (the same model calls it makes inside one
    `encode_passages`), so `progress` advances every few seconds, not once per upsert batch.

    `kept_lengths` (token counts of the points this sync leaves as they are) given: the collection carries the
    BM25 sparse vector, and every row is written with its own, normalised by the mean length of the chunk set."""
    # Batches of similar length pad less: the same trick model.encode plays inside one call.
    rows = sorted(rows, key=lambda r: len(r["text"]), reverse=True)
    terms = avgdl = None
    if kept_lengths is not None:
        terms = PassageTerms.of([r["text"] for r in rows])
        total = len(kept_lengths) + len(rows)
        avgdl = (sum(kept_lengths.values()) + int(terms.lengths.sum())) / total if total else 0.0
    pending: queue.Queue = queue.Queue(maxsize=2)
    errors: list[BaseException] = []

    def writer() -> None:
        while (item := pending.get()) is not None:
            if errors:
                continue
            try:
                client.upsert(collection, points=item, wait=True)
            except BaseException as exc:  # surfaced in the caller's thread below
                errors.append(exc)

    thread = threading.Thread(target=writer, name="qdrant-upsert", daemon=True)
    thread.start()
    embed_seconds = 0.0
    step = min(batch_size, getattr(embedder, "batch_size", None) or batch_size)
    advance = counter(progress, task, len(rows), "chunks")
    try:
        for i in range(0, len(rows), batch_size):
            batch = rows[i : i + batch_size]
            started = time.perf_counter()
            parts = []
            for j in range(0, len(batch), step):
                parts.append(embedder.encode_passages([r["text"] for r in batch[j : j + step]]))
                advance(len(parts[-1]))
            vectors = parts[0] if len(parts) == 1 else np.vstack(parts)
            embed_seconds += time.perf_counter() - started
            if errors:
                break
            pending.put(point_batch(batch, vectors, terms, avgdl, start=i))
    finally:
        pending.put(None)
        thread.join()
    if errors:
        raise errors[0]
    return embed_seconds


def _sync_points(
    client,
    collection: str,
    chunks: pd.DataFrame,
    embedder: TextEmbedder,
    batch_size: int,
    progress: Progress | None = None,
    task: str = "embedding",
) -> tuple[int, int, int, float]:
    """Upsert new and changed chunks, then delete the points of chunks that are gone: (added, updated,
    deleted, embed seconds). In this order a live collection never lacks a document while it changes: its
    new chunks are searchable before its old ones go (between the two, retrieval skips points whose chunk
    the chunk set no longer has). Point ids are UUID5(chunk_id), so a changed chunk is overwritten in place."""
    bm25 = has_bm25(client, collection)
    points = stored_payloads(client, collection, ["content_hash", *([LENGTH_FIELD] if bm25 else [])])
    stored = {cid: p["content_hash"] for cid, p in points.items()}
    wanted = dict(zip(chunks["chunk_id"], chunks["content_hash"]))
    stale = [cid for cid in stored if cid not in wanted]
    changed = {cid for cid, h in wanted.items() if cid in stored and stored[cid] != h}
    new = {cid for cid in wanted if cid not in stored}
    todo = chunks[chunks["chunk_id"].isin(new | changed)].to_dict("records")
    kept = None
    if bm25:
        kept = {cid: int(points[cid].get(LENGTH_FIELD) or 0) for cid in wanted if cid in stored and cid not in changed}
    embed_seconds = (
        _upsert_embedded(client, collection, todo, embedder, batch_size, progress, task, kept) if todo else 0.0
    )
    if stale:
        from qdrant_client import models

        client.delete(collection, points_selector=models.PointIdsList(points=[point_id(c) for c in stale]), wait=True)
    return len(new), len(changed), len(stale), embed_seconds


def _resumable(client, collection: str, dim: int) -> bool:
    """Whether `collection`, which no alias points at, is an interrupted build to resume. Its name holds the model's
    weights version and the distance, so its vectors are this model's; it is reused when it has the shape a build
    makes now (a dense vector of `dim` and the BM25 sparse vector), else it is rebuilt."""
    if not client.collection_exists(collection):
        return False
    vectors = client.get_collection(collection).config.params.vectors
    dense = vectors.get(DENSE) if isinstance(vectors, dict) else None
    return dense is not None and int(dense.size) == dim and has_bm25(client, collection)


def _fresh_collection(client, collection: str, dim: int, distance: str) -> None:
    if client.collection_exists(collection):
        client.delete_collection(collection)  # a leftover of another shape: nothing in it can be reused
    create_collection(client, collection, dim, distance)


def sync_collection(
    client,
    chunks: pd.DataFrame,
    embedder: TextEmbedder,
    *,
    strategy: str,
    model: str,
    distance: str = "cosine",
    batch_size: int = 512,
    progress: Progress | None = None,
) -> IndexRun:
    """`progress` counts the chunks embedded (new and changed ones; all of them for a fresh collection, all those an
    interrupted build had not stored for a resumed one)."""
    started = time.perf_counter()
    name = CollectionName(strategy, model_key(model))
    task = f"embedding {strategy}|{model}"
    target = name.versioned(embedder.version, distance)
    live = alias_target(client, name.alias)
    run = IndexRun(collection=target, alias=name.alias)
    if client.collection_exists(target) and (target == live or target in aliased_collections(client)):
        # Bring the complete collection up to date in place. One that another alias still points at (an older
        # version `<strategy>__production` serves, kept by drop_unaliased) is reused, never rebuilt over.
        run.added, run.updated, run.deleted, run.embed_seconds = _sync_points(
            client, target, chunks, embedder, batch_size, progress, task
        )
        if run.added or run.updated or run.deleted:
            optimize(client, target)
        if live != target:
            point_alias_to(client, name.alias, target)
    else:
        # New model version / distance, or first build: fill a fresh collection (or resume one an interrupted build
        # left), then swap the alias.
        if _resumable(client, target, embedder.dim):
            run.added, run.updated, run.deleted, run.embed_seconds = _sync_points(
                client, target, chunks, embedder, batch_size, progress, task + " (resumed)"
            )
            run.resumed = len(chunks) - run.added - run.updated
        else:
            _fresh_collection(client, target, embedder.dim, distance)
            rows = chunks.to_dict("records")
            run.embed_seconds = _upsert_embedded(
                client, target, rows, embedder, batch_size, progress, task, kept_lengths={}
            )
            run.added = len(rows)
        optimize(client, target)  # before the swap: a collection goes live searchable at full speed
        point_alias_to(client, name.alias, target)
        run.rebuilt = True
    run.bm25_in_engine = has_bm25(client, target)
    run.dropped_collections = drop_unaliased(client, name)
    run.points = client.count(name.alias, exact=True).count
    run.seconds = time.perf_counter() - started
    return run


@dataclass
class BM25Run:
    path: str
    fingerprint: str
    chunks: int
    rebuilt: bool
    seconds: float

    @property
    def summary(self) -> dict:
        return {
            "path": self.path,
            "fingerprint": self.fingerprint,
            "chunks": self.chunks,
            "rebuilt": self.rebuilt,
            "seconds": round(self.seconds, 3),
        }


def sync_bm25(chunks: pd.DataFrame, root: Path) -> BM25Run:
    started = time.perf_counter()
    fingerprint = corpus_fingerprint(chunks["chunk_id"].tolist(), chunks["content_hash"].tolist())
    rebuilt = BM25Index.current_fingerprint(root) != fingerprint
    if rebuilt:
        BM25Index.build(chunks["chunk_id"].tolist(), chunks["text"].tolist(), fingerprint).save(root)
    return BM25Run(str(root), fingerprint, len(chunks), rebuilt, time.perf_counter() - started)
