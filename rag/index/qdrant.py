"""Qdrant access: one client per location per process, collections per (strategy, model version),
an alias per (strategy, model) that only ever points at a complete collection."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from rag.index.aliases import aliased_collections, alias_target, point_alias_to  # noqa: F401 - re-exported
from rag.index.layout import CollectionLayout
from rag.index.embedded import (  # noqa: F401 - re-exported: callers import the folder facts from here too
    EDGE_ENGINE_MARK,
    EDGE_META,
    QdrantLockedError,
    embedded_engine,
    is_edge_folder,
    is_local_mode_folder,
)
from rag.store import data_dir

log = logging.getLogger(__name__)

# Fixed namespace: point ids are UUID5(chunk_id), identical on every machine and every re-run.
POINT_NAMESPACE = uuid.UUID("6f1c2a3e-5b7d-4e8f-9a0b-1c2d3e4f5a6b")
DENSE = "dense"
DISTANCES = ("cosine", "dot", "l2")
_METRICS = {"cosine": "Cosine", "dot": "Dot", "l2": "Euclid"}  # our names -> qdrant_client.models.Distance values


def _int_from_env(name: str, example: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"{name}={value!r}: give a whole number (e.g. {example}), or unset it for the engine's default"
        ) from None


def _flag_from_env(name: str) -> bool:
    value = (os.environ.get(name) or "0").strip().lower()
    if value not in {"0", "1", "true", "false", "yes", "no"}:
        raise ValueError(f"{name}={value!r}: give 1 or 0")
    return value in {"1", "true", "yes"}


def _hnsw_ef_from_env() -> int | None:
    return _int_from_env("RAG_HNSW_EF", "256")


class HnswBuild(BaseModel):
    """How new collections build their HNSW graph (Qdrant's m and ef_construct), any engine. None keeps the
    engine's default (16 and 100). Denser graphs raise recall on large or near-duplicate-heavy collections at the
    cost of build time, memory and some search time: bench/edge_latency.py --hnsw-m / --hnsw-ef-construct
    measures the trade. Read from RAG_HNSW_M / RAG_HNSW_EF_CONSTRUCT; takes effect when a collection is built."""

    m: int | None = Field(default=None, ge=4)
    ef_construct: int | None = Field(default=None, ge=4)

    @classmethod
    def from_env(cls) -> HnswBuild:
        return cls(m=_int_from_env("RAG_HNSW_M", "32"), ef_construct=_int_from_env("RAG_HNSW_EF_CONSTRUCT", "256"))

    def config(self, on_disk: bool | None = None):
        """The graph's create_collection setting; `on_disk`: the graph on disk (CollectionLayout.hnsw_on_disk)."""
        from qdrant_client import models

        if self.m is None and self.ef_construct is None and on_disk is None:
            return None
        return models.HnswConfigDiff(m=self.m, ef_construct=self.ef_construct, on_disk=on_disk)


def _engine_from_env() -> str:
    return os.environ.get("RAG_QDRANT_ENGINE") or "auto"


# A judgment between two measurements (docs/indexes.md, 'Latency and recall, measured'): at 100k the default
# breadth found 0.96 of the exact top 10, at 1M 0.76-0.81 (bench/hnsw_recall.py, bench/edge_latency.py).
LARGE_COLLECTION_POINTS = 500_000


class QdrantSettings(BaseModel):
    url: str | None = None  # a Qdrant server or cluster; None = embedded (in this process, one folder)
    api_key: str | None = None
    path: str | None = None  # the embedded folder; default <data dir>/qdrant; ":memory:" keeps it in this process only
    # The embedded engine when url is None: "edge" = Qdrant Edge (rag.index.edge: Rust segments, HNSW), "local" =
    # qdrant-client's local mode (exact scan in Python), "auto" = edge, but a folder local mode already wrote stays
    # on local mode (embedded_engine). Read from the environment by default so that settings made anywhere (Dagster
    # resource, serving replicas) agree on it.
    engine: Literal["auto", "local", "edge"] = Field(default_factory=_engine_from_env)
    # Searches' HNSW breadth (Qdrant's hnsw_ef), any engine; None keeps the engine's default.
    hnsw_ef: int | None = Field(default_factory=lambda: _hnsw_ef_from_env(), ge=1)
    # Searches score every dense vector (Qdrant's exact=True) instead of walking the graph: recall 1.0 where the
    # graph misses neighbours (large collections of near-duplicates), for time linear in the points. RAG_EXACT_SEARCH=1.
    exact_search: bool = Field(default_factory=lambda: _flag_from_env("RAG_EXACT_SEARCH"))

    @classmethod
    def from_env(cls) -> QdrantSettings:
        return cls(
            url=os.environ.get("QDRANT_URL") or None,
            api_key=os.environ.get("QDRANT_API_KEY") or None,
            path=os.environ.get("RAG_QDRANT_PATH") or None,
        )

    @property
    def location(self) -> str:
        return self.url or str(Path(self.path) if self.path else data_dir() / "qdrant")

    def breadth_hint(self, points: int) -> str | None:
        """What to set when a collection is big enough that the engine's default search breadth misses much of the
        exact top 10 (bench/hnsw_recall.py: 0.76-0.81 at 1M points, 0.95-0.97 at hnsw_ef 2048); None when nothing is
        needed."""
        if points < LARGE_COLLECTION_POINTS or self.hnsw_ef is not None or self.exact_search:
            return None
        return (
            f"{points:,} points searched at the engine's default HNSW breadth, which missed about a fifth "
            "or more of the exact top 10 at 1M points in the benchmarks; set RAG_HNSW_EF=2048 "
            "(a few ms more per search) or RAG_EXACT_SEARCH=1 (recall 1, time linear in the points). "
            "docs/indexes.md ('Latency and recall, measured') has the trade."
        )


_clients: dict[str, object] = {}
_clients_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    # Closing before interpreter teardown releases the folder lock cleanly; qdrant-client's own
    # __del__ runs too late and prints an ImportError traceback.
    with _clients_lock:
        for client in _clients.values():
            client.close()
        _clients.clear()


def get_client(settings: QdrantSettings | None = None):
    """The process's client for a location. Local mode locks its folder to one process, so every
    caller in this process shares one client and another process gets a clear error."""
    from qdrant_client import QdrantClient

    settings = settings or QdrantSettings.from_env()
    key = settings.location
    with _clients_lock:
        client = _clients.get(key)
        if (
            client is not None
            and not settings.url
            and settings.engine != "auto"
            and engine_of(client) != settings.engine
        ):
            raise ValueError(
                f"{key} is open in this process with engine {engine_of(client)!r}, asked for "
                f"{settings.engine!r}: close_client first, or use one RAG_QDRANT_ENGINE throughout"
            )
        if client is None:
            engine = None if settings.url else embedded_engine(key, settings.engine)
            if settings.engine == "auto" and engine == "local":
                log.warning(
                    "%s was built by qdrant-client's local mode: it stays on local mode (exact scan); "
                    "`rag migrate-engine` moves it to Qdrant Edge",
                    key,
                )
            if settings.url:
                client = QdrantClient(url=settings.url, api_key=settings.api_key, timeout=120)
            elif engine == "edge":
                from rag.index.edge import EdgeClient

                client = EdgeClient(None if key == ":memory:" else key)
            elif key == ":memory:":
                client = QdrantClient(location=":memory:")
            else:
                if is_edge_folder(key):  # local mode would fail on its meta.json with a KeyError
                    raise ValueError(
                        f"{key} holds a Qdrant Edge index: open it with RAG_QDRANT_ENGINE=edge, or give "
                        "local mode its own folder (RAG_QDRANT_PATH) and re-index there."
                    )
                Path(key).mkdir(parents=True, exist_ok=True)
                try:
                    client = QdrantClient(path=key)
                except RuntimeError as exc:
                    if "already accessed" in str(exc):
                        raise QdrantLockedError(
                            f"the embedded Qdrant folder {key} is in use by another process (dagster dev, "
                            "`rag serve` or another `rag` command). Stop it, run this from that process, or "
                            "point every process at one Qdrant server with QDRANT_URL."
                        ) from exc
                    raise
            _clients[key] = client
        return client


def close_client(settings: QdrantSettings | None = None) -> None:
    """Release the local folder lock (tests, and commands that hand the folder to another process)."""
    settings = settings or QdrantSettings.from_env()
    with _clients_lock:
        client = _clients.pop(settings.location, None)
    if client is not None:
        client.close()


_borrowers: dict[str, int] = {}
_borrow_lock = threading.Lock()  # taken before _clients_lock (get_client, close_client), never inside it


@contextmanager
def borrowed_client(settings: QdrantSettings) -> Iterator:
    """The location's client for the length of a with-block, closed when the last borrower in this process gives
    it back. For callers that open a folder only for a moment and must then release its lock (a serving replica's
    copy of the primary, which a Dagster re-index waits on): two of them at once (production's refresh and a
    canary's, or a request opening the canary's index) share the one client of the location, so the first to
    finish must not close it under the other. Only borrowers are counted: close_client still closes at once."""
    key = settings.location
    with _borrow_lock:
        client = get_client(settings)
        _borrowers[key] = _borrowers.get(key, 0) + 1
    try:
        yield client
    finally:
        with _borrow_lock:
            _borrowers[key] -= 1
            if not _borrowers[key]:
                del _borrowers[key]
                close_client(settings)


@contextmanager
def reading_client(settings: QdrantSettings) -> Iterator:
    """The location's client for a few reads by a step that does not otherwise open Qdrant (training): the process's
    own client when it has one open (left open), else a borrowed one (borrowed_client), so an embedded folder's lock
    is held only while reading."""
    with _clients_lock:
        client = _clients.get(settings.location)
    if client is not None:
        yield client
        return
    with borrowed_client(settings) as client:
        yield client


def is_local(client) -> bool:
    from qdrant_client.local.qdrant_local import QdrantLocal

    return isinstance(getattr(client, "_client", None), QdrantLocal)


def engine_of(client) -> str:
    """ "edge", "local" (qdrant-client's local mode) or "server"."""
    edge = sys.modules.get("rag.index.edge")  # never loaded: no client of it exists, and qdrant_edge stays unimported
    return (
        "edge"
        if edge is not None and isinstance(client, edge.EdgeClient)
        else "local"
        if is_local(client)
        else "server"
    )


def optimize(client, collection: str) -> None:
    """Build what fast searches need once a batch of writes is in. A server optimizes in the background and local
    mode always scans, so only the edge engine does work here (HNSW past its indexing threshold, vacuum). Looked up
    by name, not type, so wrappers that delegate to an edge client (tests watch writes that way) keep it."""
    run = getattr(client, "optimize", None)  # qdrant-client has no method of that name
    if callable(run):
        run(collection)


def point_id(chunk_id: str) -> str:
    return str(uuid.uuid5(POINT_NAMESPACE, chunk_id))


@dataclass(frozen=True)
class CollectionName:
    strategy: str
    model: str  # a model key (rag.embedding.model_key)

    @property
    def alias(self) -> str:
        return f"{self.strategy}__{self.model}"

    def versioned(self, model_version: str, distance: str) -> str:
        return f"{self.alias}__{model_version}__{distance}"


def drop_unaliased(client, name: CollectionName) -> list[str]:
    """Delete collections of this (strategy, model) that no alias points at: old versions and
    half-built leftovers of a crashed build. A version the alias of this model has left may still be
    what `<strategy>__production` (or a canary's alias) serves, so any alias target is kept."""
    keep = aliased_collections(client)
    dropped = []
    for c in client.get_collections().collections:
        if c.name.startswith(name.alias + "__") and c.name not in keep:
            client.delete_collection(c.name)
            dropped.append(c.name)
    return dropped


def create_collection(
    client,
    collection: str,
    dim: int,
    distance: str,
    *,
    bm25: bool = True,
    graph: HnswBuild | None = None,
    layout: CollectionLayout | None = None,
) -> None:
    """The dense vector and, with `bm25`, the BM25 sparse vector (rag.index.bm25_sparse) beside it; the HNSW graph
    built with `graph` (default: HnswBuild.from_env(), the engine's own parameters where nothing is set); parts on
    disk, quantization, shards and replicas as `layout` says (default: CollectionLayout.from_env(), the engine's own
    defaults where nothing is set)."""
    from qdrant_client import models

    from rag.index.bm25_sparse import sparse_params

    layout = layout or CollectionLayout.from_env()
    metric = models.Distance(_METRICS[distance])
    client.create_collection(
        collection,
        vectors_config={DENSE: layout.vector_params(dim, metric)},
        sparse_vectors_config=sparse_params(on_disk=layout.sparse_on_disk) if bm25 else None,
        hnsw_config=(graph or HnswBuild.from_env()).config(on_disk=layout.hnsw_on_disk),
        **layout.create_options(server=engine_of(client) == "server"),
    )
    add_payload_indexes(client, collection, on_disk=layout.payload_indexes_on_disk)


def add_payload_indexes(client, collection: str, *, on_disk: bool | None = None) -> None:
    """Indexes on the fields searches filter by (document, pages); local mode scans anyway, so it gets none.
    `on_disk`: read from disk rather than held in RAM (CollectionLayout.payload_indexes_on_disk)."""
    from qdrant_client import models

    if is_local(client):
        return
    for field, schema in (
        ("doc_id", models.PayloadSchemaType.KEYWORD),
        ("page_start", models.PayloadSchemaType.INTEGER),
        ("page_end", models.PayloadSchemaType.INTEGER),
    ):
        if on_disk and schema == models.PayloadSchemaType.KEYWORD:
            schema = models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, on_disk=True)
        elif on_disk:
            schema = models.IntegerIndexParams(
                type=models.IntegerIndexType.INTEGER, lookup=True, range=True, on_disk=True
            )
        client.create_payload_index(collection, field_name=field, field_schema=schema)


def payload_indexes_on_disk(info) -> bool | None:
    """Whether the payload indexes of a collection (its get_collection info) were built on disk (True), or None (the
    engine's default)."""
    schema = getattr(info, "payload_schema", None) or {}
    return True if any(getattr(index.params, "on_disk", None) for index in schema.values()) else None


def copy_collection(source, target, collection: str, batch: int = 512, *, add_bm25: bool = False) -> int:
    """Copy one collection (vector config, points with vectors and payloads) from one client to another, with the
    payload indexes the target engine uses and its index built (optimize). Returns the points copied. With
    `add_bm25`, a collection written before BM25 moved into the engine gets the `bm25` sparse vector on the way,
    from its payloads' texts (rag.index.bm25_sparse; nothing is re-embedded)."""
    from qdrant_client import models

    from rag.index.bm25_sparse import LENGTH_FIELD, SPARSE, PassageTerms, sparse_params

    info = source.get_collection(collection)
    config = info.config
    params, graph = config.params, getattr(config, "hnsw_config", None)
    sparse_config = params.sparse_vectors
    terms = row_of = None
    if (
        add_bm25
        and SPARSE not in (sparse_config or {})
        and isinstance(params.vectors, dict)
        and DENSE in params.vectors
    ):
        texts, row_of = [], {}
        for points in _pages(source, collection, batch, with_payload=["text"], with_vectors=False):
            for point in points:
                row_of[point.id] = len(texts)
                texts.append((point.payload or {}).get("text") or "")
        terms = PassageTerms.of(texts)
        avgdl = float(terms.lengths.mean()) if len(terms) else 0.0
        sparse_config = {**(sparse_config or {}), **sparse_params()}
    # The layout travels with the collection: vectors' and sparse index's placement are in their params; the graph's,
    # the payload's and the quantization are carried where the source set them.
    layout = {"quantization_config": getattr(config, "quantization_config", None)}
    if getattr(params, "on_disk_payload", None):
        layout["on_disk_payload"] = True
    target.create_collection(
        collection,
        vectors_config=params.vectors,
        sparse_vectors_config=sparse_config,
        hnsw_config=models.HnswConfigDiff(
            m=graph.m, ef_construct=graph.ef_construct, on_disk=getattr(graph, "on_disk", None) or None
        )
        if graph
        else None,
        **{k: v for k, v in layout.items() if v is not None},
    )
    add_payload_indexes(target, collection, on_disk=payload_indexes_on_disk(info))
    copied = 0
    for points in _pages(source, collection, batch):
        structs = [models.PointStruct(id=p.id, vector=p.vector, payload=p.payload) for p in points]
        if terms is not None:
            rows = [row_of[p.id] for p in points]
            for struct, row, sparse in zip(structs, rows, terms.vectors(avgdl, rows)):
                struct.vector = {**struct.vector, SPARSE: sparse}
                struct.payload = {**(struct.payload or {}), LENGTH_FIELD: int(terms.lengths[row])}
        target.upsert(collection, structs)
        copied += len(structs)
    optimize(target, collection)
    return copied


def _pages(client, collection: str, batch: int, with_payload=True, with_vectors=True):
    """A collection's points, a page (scroll) at a time."""
    offset = None
    while True:
        points, offset = client.scroll(
            collection, limit=batch, offset=offset, with_payload=with_payload, with_vectors=with_vectors
        )
        if points:
            yield points
        if offset is None:
            return


def copies_files(source, target: QdrantSettings) -> bool:
    """Whether a collection of the client `source` can reach `target` as files (EdgeClient.export_collection)
    rather than point by point (copy_collection): both are edge folders, and the target is not open in this
    process, whose client would not see files written under it. Copying files keeps the HNSW graph the source
    built; point by point, the target builds its own (tens of seconds of CPU at 100k points)."""
    if engine_of(source) != "edge" or target.url or target.location == ":memory:":
        return False
    with _clients_lock:
        if target.location in _clients:
            return False
    return embedded_engine(target.location, target.engine) == "edge"


def collection_distance(client, collection: str) -> str:
    """The distance ("cosine" | "dot" | "l2") a collection, or the collection behind an alias, was built with."""
    params = client.get_collection(alias_target(client, collection) or collection).config.params.vectors
    metric = (params[DENSE] if isinstance(params, dict) else params).distance
    return {v: k for k, v in _METRICS.items()}[getattr(metric, "value", metric)]


def similarity(score: float, distance: str) -> float:
    """A dense score as a similarity (higher = closer) whatever the distance, so fusion and `min_score` read
    every collection alike. Cosine and dot scores already are similarities. For l2 Qdrant returns the
    Euclidean distance d >= 0 (smaller = closer); 1 / (1 + d) is strictly decreasing in d, so the ranking is
    kept, and lies in (0, 1] (1 = the query itself): `min_score` s keeps the points with d <= 1/s - 1. (-d
    would keep the order too, but every threshold would be negative and unbounded.)"""
    return 1.0 / (1.0 + score) if distance == "l2" else score


def stored_payloads(client, collection: str, fields: list[str]) -> dict[str, dict]:
    """chunk_id -> those payload fields of every point: the collection itself is the record of what is indexed."""
    return {
        p.payload["chunk_id"]: p.payload
        for points in _pages(client, collection, 2048, with_payload=["chunk_id", *fields], with_vectors=False)
        for p in points
    }
