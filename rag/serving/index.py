"""What the API answers with, kept fresh while Dagster re-indexes.

Embedded Qdrant lets one process hold its folder. A long-lived API holding `data/qdrant` would make every
Dagster re-index fail, so in embedded mode the server answers from a **serving replica**: a copy of the live
collection in its own folder (`data/serving/replica-N`). It takes the primary folder's lock only for the copy
(seconds), and only once the primary has stopped changing; while a re-index holds the lock it keeps answering
from the replica it has. Between edge folders the copy is of the shard's files, HNSW graph included; other
engines copy point by point and the replica indexes on its own. Hits' chunk records come from the copy's payloads
(rag.retrieval.chunks), so the copy is all a replica holds of the chunk set; the chunk table and BM25 files, read
only by searches that open no collection and by collections older than the engine's BM25, are replaced atomically
on disk and read directly. With a Qdrant server (QDRANT_URL) there is no replica: the server serves readers and
writers at once.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rag.index.qdrant import (
    CollectionName,
    QdrantLockedError,
    QdrantSettings,
    alias_target,
    borrowed_client,
    close_client,
    copies_files,
    copy_collection,
    get_client,
    point_alias_to,
)
from rag.serving.residency import MAPPED_PAGES_MB, MappedPagesBudget
from rag.store import CHUNKS_TABLE, TableStore, bm25_root

log = logging.getLogger(__name__)
COPY_BATCH = 512


def replicate_collection(
    source: QdrantSettings, target: QdrantSettings, alias: str, fallback: str | None = None
) -> str:
    """Copy the collection behind `alias` (points, vectors, payloads, and between edge folders the HNSW graph)
    from source to target and point the same alias at it there. Returns the collection's name. Holds the
    source's lock only for the copy and releases it afterwards. A file copy that fails leaves no target folder
    behind (if it made it); a point-by-point one may leave a partial one, which the caller removes.
    `fallback`: the alias copied (under its own name) when `alias` is missing (rag.retrieval.service's
    production_fallback: an index older than the `<strategy>__production` alias indexing sets)."""
    # Borrowed, not opened and closed: another refresh in this process (the canary's index copies the same primary)
    # may be copying from the same client right now.
    with borrowed_client(source) as src:
        live = alias_target(src, alias)
        if live is None and fallback is not None and (live := alias_target(src, fallback)) is not None:
            alias = fallback
        if live is None:
            raise FileNotFoundError(
                f"no collection behind alias {alias!r} in {source.location}: index first "
                "(`rag index` or materialize embedding_collections)"
            )
        if copies_files(src, target):
            src.export_collection(live, target.location, alias=alias)
            get_client(target)  # opened here, as the point-by-point path leaves it
        else:
            dst = get_client(target)
            copy_collection(src, dst, live, batch=COPY_BATCH)
            point_alias_to(dst, alias, live)
        return live


def source_fingerprint(root: Path, strategy: str, qdrant: QdrantSettings | None) -> tuple:
    """Changes whenever a re-index or a promotion changes what would be served: chunk table, BM25 files, Qdrant
    folder, and the model registry's change signature (its aliases in MLflow: a promoted reranker, or an embedder
    whose collection sits on a Qdrant server, changes nothing else here)."""
    from rag.registry import ModelRegistry

    paths = [TableStore(root / "tables").path(CHUNKS_TABLE, strategy), *sorted(bm25_root(root, strategy).glob("*"))]
    if qdrant is not None and not qdrant.url:
        folder = Path(qdrant.location)
        # Files only: the engine rewrites files inside its subfolders just by opening a collection (edge's
        # shard/edge_config.json on every load), which would make taking a replica look like a change.
        collections = (folder / "collection").glob(f"{strategy}__*/*")
        paths += [folder / "meta.json", *sorted(p for p in collections if p.is_file())]
    marks = []
    for path in paths:
        try:
            stat = path.stat()
            marks.append((str(path), stat.st_mtime_ns, stat.st_size))
        except FileNotFoundError:  # between a delete and a rename of a re-index: the next tick sees it settled
            marks.append((str(path), None, None))
    return (*marks, ("model registry", ModelRegistry(root / "models").change_signature()))


class ServingIndex:
    """Holds the current answerer and swaps in a new one (on a new replica) when the index was re-built.

    `build(index)` makes an answerer from an opened rag.retrieval Index; `open_index(qdrant)` opens one.
    `mapped_pages_mb`: rag.serving.residency's budget for the replicas' mapped collection pages (None: unbounded);
    `drop_copy_from_cache`: with a budget, a copy bigger than it leaves the page cache once made (residency)."""

    def __init__(
        self,
        *,
        root: Path,
        strategy: str,
        model: str | None,
        build: Callable,
        open_index: Callable,
        qdrant: QdrantSettings | None = None,
        lock_wait_seconds: float = 120.0,
        mapped_pages_mb: float | None = MAPPED_PAGES_MB,
        drop_copy_from_cache: bool = True,
    ):
        self.root, self.strategy, self.model = Path(root), strategy, model
        self.build, self.open_index = build, open_index
        self.primary = qdrant or QdrantSettings.from_env()
        self.embedded = not self.primary.url and model is not None
        self.replicas = self.root / "serving"
        self.mapped_pages = MappedPagesBudget(self.replicas, mapped_pages_mb if self.embedded else None)
        self.drop_copy_from_cache = drop_copy_from_cache
        self._lock = threading.Lock()
        self._current = None
        self._replica: QdrantSettings | None = None
        self._fingerprint: tuple | None = None
        self._pending: tuple | None = None
        self._retired: list[QdrantSettings] = []
        self.generation = 0
        self.last_refresh_error: str | None = None
        deadline = time.monotonic() + lock_wait_seconds
        while not self.refresh(force=True):
            if time.monotonic() > deadline:
                raise QdrantLockedError(
                    f"{self.primary.location} stayed locked for {lock_wait_seconds:.0f} s (a re-index "
                    "running?): start `rag serve` when it is done, or use a Qdrant server (QDRANT_URL)"
                )
            time.sleep(2)

    def current(self):
        self.mapped_pages.check()  # before the question that asked for it: what it maps stays until the next
        return self._current

    def info(self) -> dict:
        return {
            "strategy": self.strategy,
            "model": self.model,
            "generation": self.generation,
            "qdrant": "replica " + self._replica.location if self._replica else self.primary.location,
            "last_refresh_error": self.last_refresh_error,
            **self.mapped_pages.info(),
        }

    def refresh(self, force: bool = False) -> bool:
        """Re-open when the source changed and has been stable since the previous call. True when what is
        served is current (or was just replaced), False when the primary was busy."""
        with self._lock:
            fingerprint = source_fingerprint(self.root, self.strategy, self.primary if self.embedded else None)
            if not force:
                if fingerprint == self._fingerprint:
                    return True
                if fingerprint != self._pending:  # still changing (a re-index is writing): wait for it to settle
                    self._pending = fingerprint
                    return False
            try:
                answerer, replica = self._open()
            except QdrantLockedError as exc:
                self.last_refresh_error = str(exc)
                return False
            old, self._current, self._replica = self._replica, answerer, replica
            self._fingerprint, self._pending, self.last_refresh_error = fingerprint, None, None
            self.generation += 1
        if old is not None:
            self._retired.append(old)
            timer = threading.Timer(30.0, self._retire, args=(old,))  # requests in flight finish on the old one
            timer.daemon = True
            timer.start()
        return True

    def _retire(self, replica: QdrantSettings) -> None:
        if replica in self._retired:
            self._retired.remove(replica)
            _drop_replica(replica)

    def _open(self):
        if not self.embedded:
            return self.build(self.open_index(self.primary)), None
        self.replicas.mkdir(parents=True, exist_ok=True)
        if self._replica is None:
            drop_stale_replicas(self.replicas)
        target = QdrantSettings(path=str(self.replicas / f"replica-{time.time_ns()}"))
        alias = CollectionName(self.strategy, _model_key(self.model)).alias
        try:
            replicate_collection(self.primary, target, alias, _production_fallback(self.strategy, self.model))
            if self.drop_copy_from_cache:
                self.mapped_pages.settle_copy(Path(target.location))
            return self.build(self.open_index(target)), target
        except BaseException:
            _drop_replica(target)
            raise

    def close(self) -> None:
        for replica in [*self._retired, self._replica]:
            if replica is not None:
                _drop_replica(replica)
        self._retired.clear()


def drop_stale_replicas(folder: Path) -> list[Path]:
    """Remove replicas left by a server that died (their folder lock is free); another live server's stay."""
    dropped = []
    for replica in sorted(folder.glob("replica-*")):
        lock = replica / ".lock"
        try:
            with open(lock, "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what qdrant-client's portalocker takes on Linux
                fcntl.flock(fh, fcntl.LOCK_UN)
        except BlockingIOError:
            continue
        except FileNotFoundError:
            pass
        shutil.rmtree(replica, ignore_errors=True)
        dropped.append(replica)
    return dropped


def _model_key(model: str) -> str:
    from rag.embedding import model_key

    return model_key(model)


def _production_fallback(strategy: str, model: str) -> str | None:
    from rag.retrieval.service import production_fallback

    return production_fallback(strategy, model)


def _drop_replica(settings: QdrantSettings) -> None:
    close_client(settings)
    shutil.rmtree(settings.location, ignore_errors=True)


def refresh_forever(
    serving: ServingIndex, every_seconds: float, stop: threading.Event, before: Callable[[], object] | None = None
) -> None:
    """`before`: run ahead of each refresh (rag serve's recovery of a promotion killed meanwhile), so that refresh
    picks up what it changed."""
    while not stop.wait(every_seconds):
        try:
            if before is not None:
                before()
            serving.refresh()
        except Exception as exc:  # noqa: BLE001 - keep serving the old index; /health shows the error
            serving.last_refresh_error = f"{type(exc).__name__}: {exc}"
            log.exception("index refresh failed; still serving the previous one")
