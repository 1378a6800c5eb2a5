"""Qdrant Edge (the in-process engine of qdrant-edge-py) behind the part of qdrant-client's API the index layer
calls, so sync, retrieval, serving replicas and promotion run on it unchanged.

Layout of an engine folder (the names qdrant-client's local mode uses, so `rag.serving.index` fingerprints and
lock checks read it alike):

    .lock                       flock held by the one process that has the folder open
    meta.json                   {"engine": "qdrant-edge", "aliases": {alias: collection}}, replaced atomically
    collection/<name>/config.json   the collection's vector params; written last, so it marks a complete create
    collection/<name>/shard/        the EdgeShard (segments, WAL)
    collection/<name>/written       rewritten after every write: its mtime tells a reader the collection changed

A collection moves to another folder as files (`EdgeClient.export_collection`: the serving replica): Edge has no
snapshot of its own, so the shard is flushed and closed and its folder copied, HNSW graph included.

Edge builds HNSW only when `optimize()` is called (no background optimizer): `optimize(collection)` does it, and
an alias is never pointed at a collection with writes not yet optimized. Below Edge's indexing threshold
(about 10 MB of vectors, ~6,500 points of 384 floats) optimize keeps the exact scan, which is fast at that size.

Sparse vectors (`sparse_vectors_config`, IDF modifier included) and hybrid queries (dense and sparse prefetches
fused by RRF or DBSF) are mapped and score as qdrant-client's local mode does, but for two differences that a
Qdrant server shares (Edge runs the server's shard code), so they are kept rather than patched over:
- IDF statistics come from the sparse index, which keeps counting a deleted point until its segment is vacuumed.
  Edge vacuums only in `optimize`, and only a segment past Qdrant's default thresholds (1,000 vectors, 20% of them
  deleted). Local mode counts live points only, so after deletes the engines' sparse scores differ until then.
  Re-upserting a point updates the statistics at once on both.
- Points with equal scores may come back in another order than local mode's. RRF ties are common: a point ranked
  (1, 3) by the two prefetches scores as one ranked (3, 1).
"""

from __future__ import annotations

import errno
import fcntl
import json
import numbers
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import qdrant_edge as qe
from pydantic import BaseModel
from qdrant_client.http import models  # not qdrant_client.models: its QueryResponse is fastembed's

from rag.index.embedded import EDGE_ENGINE_MARK as ENGINE_MARK
from rag.index.embedded import EDGE_META as META
from rag.index.embedded import QdrantLockedError
from rag.index.embedded import is_edge_folder  # noqa: F401 - re-exported: callers and tests import it from here
from rag.store import atomic_write

COLLECTIONS = "collection"
LOCK = ".lock"


class EdgeOptions(BaseModel):
    # None keeps Edge's default (10,000 KB): segments below it are searched exactly, above it get HNSW on optimize.
    indexing_threshold_kb: int | None = None
    max_indexing_threads: int | None = None  # None: Edge's default (all cores); a busy machine may want fewer
    # Indexed segments smaller than this (KB of vectors) are still searched exactly; None keeps Edge's 10,000 KB.
    full_scan_threshold_kb: int | None = None


class EdgeUnsupportedError(ValueError):
    """A qdrant-client feature the edge engine does not offer (yet)."""


@dataclass(slots=True)
class EdgeScoredPoint:
    """A hit with qdrant-client's ScoredPoint fields, as a plain dataclass: building 100 pydantic models per query,
    even unvalidated, cost more than the engine's search itself (seen in a profile of retrieve at 5k points)."""

    id: int | str
    version: int
    score: float
    payload: dict | None = None
    vector: Any = None
    shard_key: Any = None
    order_value: Any = None


@dataclass(slots=True)
class EdgeQueryResponse:
    points: list[EdgeScoredPoint]


@dataclass(frozen=True)
class EdgeCollectionConfig:
    params: models.CollectionParams
    hnsw_config: models.HnswConfigDiff | None = None  # the graph parameters given at create (None: Edge's defaults)
    quantization_config: models.ScalarQuantization | None = None  # as given at create (None: float vectors only)


@dataclass(frozen=True)
class EdgeCollectionInfo:
    """What `get_collection` returns: the fields callers read of qdrant-client's CollectionInfo."""

    config: EdgeCollectionConfig
    points_count: int
    indexed_vectors_count: int
    segments_count: int
    payload_schema: dict[str, models.PayloadIndexInfo] = field(default_factory=dict)


def _write_atomic(path: Path, data: dict) -> None:
    atomic_write(path, lambda fh: json.dump(data, fh, indent=1, sort_keys=True), mode="w")


def _lock_folder(root: Path):
    """The folder's flock, held through the returned file until it is closed; QdrantLockedError if taken."""
    root.mkdir(parents=True, exist_ok=True)
    lock_file = open(root / LOCK, "a")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.close()
        raise QdrantLockedError(
            f"the embedded Qdrant folder {root} is in use by another process (dagster dev, `rag serve` or "
            "another `rag` command). Stop it, run this from that process, or point every process at one "
            "Qdrant server with QDRANT_URL."
        ) from None
    return lock_file


def _unlock_folder(lock_file) -> None:
    fcntl.flock(lock_file, fcntl.LOCK_UN)
    lock_file.close()


def _read_aliases(root: Path) -> dict[str, str]:
    """The aliases of an edge folder (whose lock the caller holds); a folder without meta.json becomes one."""
    path = root / META
    if not path.exists():
        if (root / COLLECTIONS).exists():
            raise ValueError(
                f"{root} has collections but no {META}: not an edge engine folder. Point "
                "RAG_QDRANT_PATH at an empty folder and re-index."
            )
        _write_atomic(path, {"engine": ENGINE_MARK, "aliases": {}})
        return {}
    meta = json.loads(path.read_text())
    if meta.get("engine") != ENGINE_MARK:
        raise ValueError(
            f"{root} holds a qdrant-client local-mode index, not an edge one: move it to "
            f"edge with `rag migrate-engine --path {root}` (nothing is re-embedded), or open it "
            "with RAG_QDRANT_ENGINE=local (or auto, the default)."
        )
    return dict(meta.get("aliases", {}))


# Hidden folders under collection/ that exist only between two steps of one call: delete_collection renames a
# collection to .deleted-* and then removes it; export_collection copies into .partial-* and then renames it.
LEFTOVER_PREFIXES = (".deleted-", ".partial-")


def _reclaim_leftovers(root: Path) -> list[Path]:
    """Remove the .deleted-* and .partial-* folders a process killed mid-call left behind. Called right after the
    folder's lock is taken, and that is what makes it safe: both kinds are made and removed within one call that
    holds the lock, and every process that writes or reads the folder holds it (a second opener, in this process or
    another, gets QdrantLockedError before reaching here). So whichever such folder an opener finds belonged to a
    previous holder that is gone; none can be in use. Age would be no rule: a removal of a large collection can take
    long, and clocks say nothing about whether its owner still runs."""
    folder = root / COLLECTIONS
    if not folder.is_dir():
        return []
    leftovers = sorted(p for p in folder.iterdir() if p.name.startswith(LEFTOVER_PREFIXES))
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


_COPY_CHUNK = 64 << 20


def _copy_range(src: int, dst: int, start: int, end: int) -> None:
    while start < end:
        try:
            n = os.copy_file_range(src, dst, min(end - start, _COPY_CHUNK), start, start)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            n = 0  # a kernel or filesystem without it: copy through user space
        if n == 0:
            data = os.pread(src, min(end - start, _COPY_CHUNK), start)
            if not data:
                raise OSError(errno.EIO, f"file shrank while being copied (at byte {start})")
            n = os.pwrite(dst, data, start)
        start += n


def copy_sparse(src: str, dst: str, *, follow_symlinks: bool = True) -> str:
    """shutil.copy2 that keeps holes. Edge preallocates its WAL (32 MiB files) and payload pages (32 MiB per
    segment) as sparse files, mostly empty: copy2 would write all those zeros out, ~100 MB for a tiny shard.
    Only the data regions (SEEK_DATA/SEEK_HOLE) are copied; the size is set by truncate."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                start = os.lseek(fin.fileno(), offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole after offset
                    break
                raise
            end = os.lseek(fin.fileno(), start, os.SEEK_HOLE)
            _copy_range(fin.fileno(), fout.fileno(), start, end)
            offset = end
        fout.truncate(size)
    shutil.copystat(src, dst, follow_symlinks=follow_symlinks)
    return dst


def _distance(metric: models.Distance | str) -> qe.Distance:
    return getattr(qe.Distance, getattr(metric, "value", metric))


def _point_id(value: Any) -> int | str:
    # Edge hands UUID ids back as uuid.UUID; qdrant-client (and every caller) uses their string form.
    return str(value) if isinstance(value, uuid.UUID) else value


# Qdrant's default RRF constant: server and local mode use it when a FusionQuery or RrfQuery gives no k; Edge
# has no default and takes k explicitly.
RRF_K = 2


def _vector_out(vector: Any) -> Any:
    if isinstance(vector, dict):
        vector = {
            name: models.SparseVector(indices=list(v.indices), values=list(v.values))
            if isinstance(v, qe.SparseVector)
            else v
            for name, v in vector.items()
        }
        if set(vector) == {""}:
            return vector[""]  # the unnamed default vector reads as a plain list, as in qdrant-client
    return vector


def _sparse_in(vector: Any) -> qe.SparseVector | None:
    """An Edge sparse vector from a models.SparseVector or its dict form; None for anything else."""
    if isinstance(vector, Mapping) and set(vector) == {"indices", "values"}:
        vector = models.SparseVector(**vector)
    if isinstance(vector, models.SparseVector):
        return qe.SparseVector(indices=[int(i) for i in vector.indices], values=[float(v) for v in vector.values])
    return None


def _named_in(vector: Any) -> Any:
    sparse = _sparse_in(vector)
    return sparse if sparse is not None else list(map(float, vector))


def _vector_in(vector: Any) -> Any:
    if isinstance(vector, Mapping):
        return {name: _named_in(v) for name, v in vector.items()}
    return {"": list(map(float, vector))}


def _sparse_config(name: str, params: Any) -> dict:
    """The sparse vector's config.json form: what get_collection gives back after a reopen."""
    params = models.SparseVectorParams.model_validate(params)
    index = params.index or models.SparseIndexParams()
    unmapped = [f for f in ("memory", "datatype") if getattr(index, f) is not None]
    if unmapped:
        raise EdgeUnsupportedError(
            f"sparse vector {name!r}: index options {unmapped} are not mapped to the edge "
            "engine: leave them out or use engine local"
        )
    return params.model_dump(mode="json", exclude_none=True)


_GRAPH_FIELDS = ("m", "ef_construct", "on_disk")


def _hnsw_config(diff: models.HnswConfigDiff | None) -> dict[str, int | bool]:
    """The graph's parameters Edge takes (m, ef_construct, on_disk); the rest of a server's HNSW config says so."""
    if diff is None:
        return {}
    given = set(diff.model_dump(exclude_none=True))
    if given - set(_GRAPH_FIELDS):
        raise EdgeUnsupportedError(
            f"hnsw_config fields {sorted(given - set(_GRAPH_FIELDS))} are not mapped to the "
            "edge engine: give m, ef_construct and on_disk only (EdgeOptions holds the indexing threads "
            "and the full-scan threshold)"
        )
    return {k: getattr(diff, k) for k in _GRAPH_FIELDS if getattr(diff, k) is not None}


def _quantization_config(config: Any) -> dict | None:
    """A scalar quantization's config.json form (int8 only: what CollectionLayout makes); other kinds say so."""
    if config is None:
        return None
    if not isinstance(config, models.ScalarQuantization):
        raise EdgeUnsupportedError(
            f"quantization {type(config).__name__} is not mapped to the edge engine: use scalar int8 "
            "(RAG_QDRANT_QUANTIZATION=int8) or a Qdrant server"
        )
    scalar = config.scalar
    if getattr(scalar, "memory", None) is not None:
        raise EdgeUnsupportedError("quantization `memory` is not mapped to the edge engine: use always_ram")
    return models.ScalarQuantization(scalar=scalar).model_dump(mode="json", exclude_none=True)


def _edge_quantization(saved: dict | None) -> qe.ScalarQuantizationConfig | None:
    if not saved:
        return None
    scalar = models.ScalarQuantization.model_validate(saved).scalar
    return qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, quantile=scalar.quantile, always_ram=scalar.always_ram)


def _edge_sparse(params: models.SparseVectorParams) -> qe.EdgeSparseVectorParams:
    index = params.index or models.SparseIndexParams()
    return qe.EdgeSparseVectorParams(
        full_scan_threshold=index.full_scan_threshold,
        on_disk=index.on_disk,
        modifier=qe.Modifier.Idf if params.modifier == models.Modifier.IDF else None,
    )


def _search_params(params: models.SearchParams | None) -> qe.SearchParams | None:
    if params is None:
        return None
    idf = None
    if isinstance(params.idf, models.IdfCorpusParams):
        idf = qe.IdfParams(corpus=_filter(params.idf.corpus))
    return qe.SearchParams(hnsw_ef=params.hnsw_ef, exact=bool(params.exact), idf=idf)


def _unsupported_query(what: str) -> EdgeUnsupportedError:
    return EdgeUnsupportedError(
        f"{what} is not mapped to the edge engine. It takes a dense vector, a models.SparseVector with `using`, or "
        "prefetches of those fused by models.FusionQuery (RRF, DBSF) or models.RrfQuery; add the rest to "
        "rag.index.edge.EdgeClient.query_points or use engine local (RAG_QDRANT_ENGINE=local)"
    )


def _nearest(query: Any, using: str | None) -> qe.Query:
    """A dense or sparse nearest-neighbour query."""
    if isinstance(query, models.NearestQuery):
        if query.mmr is not None:
            raise _unsupported_query("NearestQuery with mmr")
        query = query.nearest
    sparse = _sparse_in(query)
    if sparse is not None:
        if not using:
            raise EdgeUnsupportedError(
                "a sparse query needs `using`, the sparse vector's name (sparse vectors are always named)"
            )
        return qe.Query.Nearest(sparse, using=using)
    if hasattr(query, "tolist"):
        query = query.tolist()
    # `type(x) is float` first: tolist() gives floats, and isinstance against numbers.Real is slow over 384 of them.
    if not isinstance(query, list) or not all(type(x) is float or isinstance(x, numbers.Real) for x in query):
        raise _unsupported_query(f"query {type(query).__name__}")
    return qe.Query.Nearest([float(x) for x in query], using=using or "")


def _fusion(query: Any) -> Any:
    if isinstance(query, models.FusionQuery):
        if query.fusion == models.Fusion.RRF:
            return qe.Fusion.Rrf(k=RRF_K)
        if query.fusion == models.Fusion.DBSF:
            return qe.Fusion.Dbsf()
    if isinstance(query, models.RrfQuery):
        return qe.Fusion.Rrf(k=RRF_K if query.rrf.k is None else query.rrf.k, weights=query.rrf.weights)
    raise _unsupported_query(f"query {type(query).__name__} over prefetches")


def _prefetch(prefetch: models.Prefetch) -> qe.Prefetch:
    if prefetch.prefetch or prefetch.lookup_from is not None:
        raise _unsupported_query("a nested prefetch or lookup_from")
    if prefetch.query is None:
        raise _unsupported_query("a prefetch without a query")
    return qe.Prefetch(
        limit=10 if prefetch.limit is None else prefetch.limit,  # qdrant-client's default
        query=_nearest(prefetch.query, prefetch.using),
        params=_search_params(prefetch.params),
        filter=_filter(prefetch.filter),
        score_threshold=prefetch.score_threshold,
    )


def _with_payload(value: Any) -> Any:
    if isinstance(value, models.PayloadSelectorInclude):
        return qe.PayloadSelector.Include(list(value.include))
    if isinstance(value, models.PayloadSelectorExclude):
        return qe.PayloadSelector.Exclude(list(value.exclude))
    return list(value) if isinstance(value, (list, tuple)) else bool(value)


def _with_vectors(value: Any) -> bool | list[str]:
    return list(value) if isinstance(value, (list, tuple)) else bool(value)


def _match(match: Any) -> Any:
    if isinstance(match, models.MatchValue):
        return qe.MatchValue(match.value)
    if isinstance(match, models.MatchAny):
        return qe.MatchAny(list(match.any))
    if isinstance(match, models.MatchExcept):
        return qe.MatchExcept(list(match.except_))
    raise EdgeUnsupportedError(
        f"filter match {type(match).__name__} is not mapped to the edge engine: add it to "
        "rag.index.edge._match or use engine local (RAG_QDRANT_ENGINE=local)"
    )


def _condition(cond: Any) -> Any:
    if isinstance(cond, models.Filter):
        return _filter(cond)
    if isinstance(cond, models.HasIdCondition):
        return qe.HasIdCondition(set(cond.has_id))
    if isinstance(cond, models.IsEmptyCondition):
        return qe.IsEmptyCondition(cond.is_empty.key)
    if isinstance(cond, models.IsNullCondition):
        return qe.IsNullCondition(cond.is_null.key)
    if isinstance(cond, models.FieldCondition):
        unsupported = [f for f in ("geo_bounding_box", "geo_radius", "geo_polygon", "values_count") if getattr(cond, f)]
        if unsupported:
            raise EdgeUnsupportedError(
                f"filter {unsupported} on {cond.key!r} is not mapped to the edge engine: add it "
                "to rag.index.edge._condition or use engine local"
            )
        rng = None
        if cond.range is not None:
            if not isinstance(cond.range, models.Range):
                raise EdgeUnsupportedError("datetime ranges are not mapped to the edge engine: use engine local")
            rng = qe.RangeFloat(gte=cond.range.gte, gt=cond.range.gt, lte=cond.range.lte, lt=cond.range.lt)
        return qe.FieldCondition(
            cond.key,
            match=_match(cond.match) if cond.match is not None else None,
            range=rng,
            is_empty=cond.is_empty,
            is_null=cond.is_null,
        )
    raise EdgeUnsupportedError(
        f"filter condition {type(cond).__name__} is not mapped to the edge engine: use engine local"
    )


def _conditions(part: Any) -> list | None:
    if part is None:
        return None
    return [_condition(c) for c in (part if isinstance(part, list) else [part])]


def _filter(flt: models.Filter | None) -> qe.Filter | None:
    if flt is None:
        return None
    if flt.min_should is not None:
        raise EdgeUnsupportedError("min_should filters are not mapped to the edge engine: use engine local")
    return qe.Filter(must=_conditions(flt.must), should=_conditions(flt.should), must_not=_conditions(flt.must_not))


def _points(points: Any) -> list[qe.Point]:
    if isinstance(points, models.Batch):
        vectors = points.vectors
        n = len(points.ids)
        rows = (
            [{name: vs[i] for name, vs in vectors.items()} for i in range(n)]
            if isinstance(vectors, Mapping)
            else list(vectors)
        )
        payloads = points.payloads or [None] * n
        return [qe.Point(id=pid, vector=_vector_in(v), payload=p) for pid, v, p in zip(points.ids, rows, payloads)]
    return [qe.Point(id=p.id, vector=_vector_in(p.vector), payload=p.payload) for p in points]


def _edge_index(schema: str, field_schema: Any):
    """Edge's index type, or its index params where a keyword or integer index is asked to live on disk."""
    if getattr(field_schema, "on_disk", None) and schema == "Keyword":
        return qe.KeywordIndexParams(on_disk=True)
    if getattr(field_schema, "on_disk", None) and schema == "Integer":
        return qe.IntegerIndexParams(lookup=field_schema.lookup, range=field_schema.range, on_disk=True)
    return getattr(qe.PayloadSchemaType, schema)


def _index_info(index) -> models.PayloadIndexInfo:
    """qdrant-client's record of an Edge payload index: its type, and whether it is on disk where it says."""
    kind = models.PayloadSchemaType(_SCHEMA_NAMES[str(index.data_type).rsplit(".", 1)[-1]])
    on_disk = getattr(index.params, "on_disk", None)
    params = None
    if on_disk and kind == models.PayloadSchemaType.KEYWORD:
        params = models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, on_disk=True)
    elif on_disk and kind == models.PayloadSchemaType.INTEGER:
        params = models.IntegerIndexParams(
            type=models.IntegerIndexType.INTEGER, lookup=index.params.lookup, range=index.params.range, on_disk=True
        )
    return models.PayloadIndexInfo(data_type=kind, params=params, points=index.points or 0)


_SCHEMAS = {
    models.PayloadSchemaType.KEYWORD: "Keyword",
    models.PayloadSchemaType.INTEGER: "Integer",
    models.PayloadSchemaType.FLOAT: "Float",
    models.PayloadSchemaType.BOOL: "Bool",
    models.PayloadSchemaType.TEXT: "Text",
    models.PayloadSchemaType.DATETIME: "Datetime",
    models.PayloadSchemaType.UUID: "Uuid",
    models.PayloadSchemaType.GEO: "Geo",
}
_SCHEMA_NAMES = {edge: kind.value for kind, edge in _SCHEMAS.items()}


class EdgeClient:
    """One engine folder, opened by one process: a shard per collection and aliases in meta.json.

    Method names, arguments and returned objects follow qdrant-client for the calls this project makes
    (get_aliases, update_collection_aliases, collection_exists, create_collection, get_collection,
    get_collections, delete_collection, upsert, delete, scroll, retrieve, query_points, count,
    create_payload_index, close), plus `optimize`, which Edge needs and a server does by itself."""

    def __init__(self, root: str | Path | None, options: EdgeOptions | None = None):
        # root None: a throwaway folder removed on close, what ":memory:" means for the other engines.
        self._temporary = root is None
        self.root = Path(tempfile.mkdtemp(prefix="qdrant-edge-")) if root is None else Path(root)
        self.options = options or EdgeOptions()
        self._lock_file = _lock_folder(self.root)
        try:
            self._aliases: dict[str, str] = _read_aliases(self.root)
            _reclaim_leftovers(self.root)
        except BaseException:
            self._release()
            raise
        self._mutex = threading.RLock()
        self._shards: dict[str, qe.EdgeShard] = {}
        self._dirty: set[str] = set()  # collections written since their last optimize
        self.closed = False

    # --- folder ---------------------------------------------------------------------------------------------

    def _save_aliases(self, aliases: dict[str, str]) -> None:
        _write_atomic(self.root / META, {"engine": ENGINE_MARK, "aliases": aliases})

    def _dir(self, collection: str) -> Path:
        if not collection or "/" in collection or collection.startswith("."):
            raise ValueError(f"invalid collection name {collection!r}")
        return self.root / COLLECTIONS / collection

    def _names(self) -> list[str]:
        folder = self.root / COLLECTIONS
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".") and (p / "config.json").exists())

    def _exists(self, collection: str) -> bool:
        return (self._dir(collection) / "config.json").exists()

    def _resolve(self, name: str) -> str:
        collection = self._aliases.get(name, name)
        if not self._exists(collection):
            raise ValueError(f"Collection {name} not found")
        return collection

    def _config(self, collection: str) -> dict:
        return json.loads((self._dir(collection) / "config.json").read_text())

    def _edge_config(self, config: Mapping[str, Any]) -> qe.EdgeConfig:
        """The shard's config from a collection's config.json (as create_collection wrote it)."""
        params = {
            name: qe.EdgeVectorParams(size=v["size"], distance=_distance(v["distance"]), on_disk=v.get("on_disk"))
            for name, v in config["vectors"].items()
        }
        sparse_params = {
            name: _edge_sparse(models.SparseVectorParams.model_validate(p))
            for name, p in (config.get("sparse_vectors") or {}).items()
        } or None
        optimizers = None
        if self.options.indexing_threshold_kb is not None:
            optimizers = qe.EdgeOptimizersConfig(indexing_threshold=self.options.indexing_threshold_kb)
        hnsw = None
        opts = self.options
        graph = config.get("hnsw") or {}
        if graph or opts.max_indexing_threads is not None or opts.full_scan_threshold_kb is not None:
            # Edge takes the HNSW config whole: Qdrant's defaults for what is not set.
            hnsw = qe.HnswIndexConfig(
                m=graph.get("m", 16),
                ef_construct=graph.get("ef_construct", 100),
                full_scan_threshold=opts.full_scan_threshold_kb or 10_000,
                max_indexing_threads=opts.max_indexing_threads or 0,
                on_disk=graph.get("on_disk"),
            )
        return qe.EdgeConfig(
            vectors=params,
            sparse_vectors=sparse_params,
            optimizers=optimizers,
            hnsw_config=hnsw,
            on_disk_payload=config.get("on_disk_payload"),
            quantization_config=_edge_quantization(config.get("quantization")),
        )

    def _shard(self, name: str) -> tuple[str, qe.EdgeShard]:
        self._check_open()
        with self._mutex:
            # An open shard's collection exists (this process holds the folder; deleting or exporting a collection
            # closes its shard first): only a shard still to be opened needs the folder checked, not every query.
            collection = self._aliases.get(name, name)
            shard = self._shards.get(collection)
            if shard is None:
                collection = self._resolve(name)
                shard = self._shards.get(collection)
            if shard is None:
                config = self._config(collection)
                try:
                    edge_config = self._edge_config(config)
                    shard = qe.EdgeShard.load(str(self._dir(collection) / "shard"), edge_config)
                except Exception as exc:  # Edge raises bare Exception; its WAL lock says WouldBlock
                    if "WouldBlock" in str(exc):
                        raise QdrantLockedError(
                            f"the shard of {collection} in {self.root} is open elsewhere: stop the other process"
                        ) from exc
                    raise
                self._shards[collection] = shard
            return collection, shard

    def _written(self, collection: str, shard: qe.EdgeShard) -> None:
        # Flushed per call, as local mode persists each write: an acknowledged upsert survives kill -9.
        shard.flush()
        self._dirty.add(collection)
        (self._dir(collection) / "written").write_text(str(time.time_ns()))

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(
                f"the edge engine at {self.root} is closed: get a new client (rag.index.qdrant.get_client)"
            )

    # --- collections and aliases ----------------------------------------------------------------------------

    def get_aliases(self, **_: Any) -> models.CollectionsAliasesResponse:
        self._check_open()
        return models.CollectionsAliasesResponse(
            aliases=[models.AliasDescription(alias_name=a, collection_name=c) for a, c in sorted(self._aliases.items())]
        )

    def update_collection_aliases(self, change_aliases_operations: Sequence[Any], **_: Any) -> bool:
        """All operations land in one atomic replace of meta.json: readers see the old aliases or the new."""
        self._check_open()
        with self._mutex:
            aliases = dict(self._aliases)
            for op in change_aliases_operations:
                if isinstance(op, models.CreateAliasOperation):
                    target, alias = op.create_alias.collection_name, op.create_alias.alias_name
                    if not self._exists(target):
                        raise ValueError(f"Collection {target} not found")
                    if self._exists(alias):
                        raise ValueError(f"Collection {alias} already exists")
                    aliases[alias] = target
                elif isinstance(op, models.DeleteAliasOperation):
                    aliases.pop(op.delete_alias.alias_name, None)
                elif isinstance(op, models.RenameAliasOperation):
                    old, new = op.rename_alias.old_alias_name, op.rename_alias.new_alias_name
                    if self._exists(new):
                        raise ValueError(f"Collection {new} already exists")
                    if old not in aliases:
                        raise ValueError(f"Alias {old} does not exist")
                    aliases[new] = aliases.pop(old)
                else:
                    raise ValueError(f"Unknown operation: {op}")
            # A collection goes live with its HNSW built, whoever wrote it (sync, a serving replica's copy).
            for target in set(aliases.values()) & self._dirty:
                self.optimize(target)
            self._save_aliases(aliases)
            self._aliases = aliases
        return True

    def collection_exists(self, collection_name: str, **_: Any) -> bool:
        self._check_open()
        return self._exists(self._aliases.get(collection_name, collection_name))

    def get_collections(self, **_: Any) -> models.CollectionsResponse:
        self._check_open()
        return models.CollectionsResponse(collections=[models.CollectionDescription(name=n) for n in self._names()])

    def create_collection(
        self,
        collection_name: str,
        vectors_config: models.VectorParams | Mapping[str, models.VectorParams],
        sparse_vectors_config: Mapping[str, Any] | None = None,
        hnsw_config: models.HnswConfigDiff | None = None,
        on_disk_payload: bool | None = None,
        quantization_config: models.ScalarQuantization | None = None,
        **unsupported: Any,
    ) -> bool:
        """Vectors (dense on disk or in RAM), sparse vectors, the graph's parameters, the payload's placement and
        int8 scalar quantization: a server's sharding and replication options raise EdgeUnsupportedError."""
        self._check_open()
        given = sorted(k for k, v in unsupported.items() if v is not None and k != "timeout")
        if given:
            raise EdgeUnsupportedError(
                f"create_collection options {given} are not mapped to the edge engine: leave "
                "them out or use engine local"
            )
        hnsw = _hnsw_config(hnsw_config)
        quantization = _quantization_config(quantization_config)
        named = vectors_config if isinstance(vectors_config, Mapping) else {"": vectors_config}
        vectors = {
            name: {"size": int(p.size), "distance": getattr(p.distance, "value", p.distance)}
            | ({"on_disk": bool(p.on_disk)} if p.on_disk is not None else {})
            for name, p in named.items()
        }
        sparse = {name: _sparse_config(name, p) for name, p in (sparse_vectors_config or {}).items()}
        if set(sparse) & set(vectors):
            raise ValueError(f"vector names {sorted(set(sparse) & set(vectors))} are both dense and sparse")
        # Only what was given is written: a collection built with the engine's defaults keeps the config.json it had
        # before these options were mapped, and Edge takes all of it again on every load.
        config: dict[str, Any] = {"vectors": vectors}
        if sparse:
            config["sparse_vectors"] = sparse
        if hnsw:
            config["hnsw"] = hnsw
        if on_disk_payload is not None:
            config["on_disk_payload"] = bool(on_disk_payload)
        if quantization:
            config["quantization"] = quantization
        with self._mutex:
            if self._exists(collection_name):
                raise ValueError(f"Collection {collection_name} already exists")
            if collection_name in self._aliases:
                raise ValueError(f"Alias {collection_name} already exists")
            folder = self._dir(collection_name)
            shutil.rmtree(folder, ignore_errors=True)  # a create that crashed before config.json: never complete
            folder.mkdir(parents=True)
            shard = qe.EdgeShard.create(str(folder / "shard"), self._edge_config(config))
            _write_atomic(folder / "config.json", config)
            self._shards[collection_name] = shard
        return True

    def get_collection(self, collection_name: str, **_: Any) -> EdgeCollectionInfo:
        collection, shard = self._shard(collection_name)
        config = self._config(collection)
        vectors = {
            name: models.VectorParams(size=v["size"], distance=models.Distance(v["distance"]), on_disk=v.get("on_disk"))
            for name, v in config["vectors"].items()
        }
        sparse = {
            name: models.SparseVectorParams.model_validate(p) for name, p in config.get("sparse_vectors", {}).items()
        }
        info = shard.info()
        params = models.CollectionParams(
            vectors=vectors.get("") if set(vectors) == {""} else vectors,
            sparse_vectors=sparse or None,
            on_disk_payload=config.get("on_disk_payload"),
        )
        graph = models.HnswConfigDiff(**config["hnsw"]) if config.get("hnsw") else None
        quantization = config.get("quantization")
        return EdgeCollectionInfo(
            EdgeCollectionConfig(
                params, graph, models.ScalarQuantization.model_validate(quantization) if quantization else None
            ),
            info.points_count,
            info.indexed_vectors_count,
            info.segments_count,
            {name: _index_info(index) for name, index in (info.payload_schema or {}).items()},
        )

    def delete_collection(self, collection_name: str, **_: Any) -> bool:
        self._check_open()
        with self._mutex:
            if not self._exists(collection_name):
                return False
            # Aliases first: a crash in between leaves an unaliased folder (drop_unaliased removes it), never an
            # alias naming nothing.
            aliases = {a: c for a, c in self._aliases.items() if c != collection_name}
            if aliases != self._aliases:
                self._save_aliases(aliases)
                self._aliases = aliases
            shard = self._shards.pop(collection_name, None)
            if shard is not None:
                shard.close()  # releases its WAL lock and files before the folder goes
            self._dirty.discard(collection_name)
            folder = self._dir(collection_name)
            doomed = folder.with_name(f".deleted-{collection_name}-{uuid.uuid4().hex}")
            os.replace(folder, doomed)  # gone at once for every reader, however long the removal takes
            shutil.rmtree(doomed, ignore_errors=True)
        return True

    # --- points ---------------------------------------------------------------------------------------------

    def upsert(self, collection_name: str, points: Any, wait: bool = True, **_: Any) -> models.UpdateResult:
        collection, shard = self._shard(collection_name)
        shard.update(qe.UpdateOperation.upsert_points(_points(points)))
        self._written(collection, shard)
        return models.UpdateResult(operation_id=None, status=models.UpdateStatus.COMPLETED)

    def delete(self, collection_name: str, points_selector: Any, wait: bool = True, **_: Any) -> models.UpdateResult:
        collection, shard = self._shard(collection_name)
        if isinstance(points_selector, models.PointIdsList):
            op = qe.UpdateOperation.delete_points(list(points_selector.points))
        elif isinstance(points_selector, models.FilterSelector):
            op = qe.UpdateOperation.delete_points_by_filter(_filter(points_selector.filter))
        elif isinstance(points_selector, models.Filter):
            op = qe.UpdateOperation.delete_points_by_filter(_filter(points_selector))
        else:
            op = qe.UpdateOperation.delete_points(list(points_selector))
        shard.update(op)
        self._written(collection, shard)
        return models.UpdateResult(operation_id=None, status=models.UpdateStatus.COMPLETED)

    def create_payload_index(
        self, collection_name: str, field_name: str, field_schema: Any = None, **_: Any
    ) -> models.UpdateResult:
        collection, shard = self._shard(collection_name)
        kind = getattr(field_schema, "type", field_schema)  # a type, or index params that carry theirs
        schema = _SCHEMAS.get(models.PayloadSchemaType(getattr(kind, "value", kind)))
        shard.update(qe.UpdateOperation.create_field_index(field_name, _edge_index(schema, field_schema)))
        self._written(collection, shard)
        return models.UpdateResult(operation_id=None, status=models.UpdateStatus.COMPLETED)

    def scroll(
        self,
        collection_name: str,
        scroll_filter: models.Filter | None = None,
        limit: int = 10,
        offset: Any = None,
        with_payload: Any = True,
        with_vectors: Any = False,
        **_: Any,
    ) -> tuple[list[models.Record], int | str | None]:
        _, shard = self._shard(collection_name)
        records, next_offset = shard.scroll(
            qe.ScrollRequest(
                offset=offset,
                limit=limit,
                filter=_filter(scroll_filter),
                with_payload=_with_payload(with_payload),
                with_vector=_with_vectors(with_vectors),
            )
        )
        return (
            [models.Record(id=_point_id(r.id), payload=r.payload, vector=_vector_out(r.vector)) for r in records],
            None if next_offset is None else _point_id(next_offset),
        )

    def retrieve(
        self, collection_name: str, ids: Sequence[Any], with_payload: Any = True, with_vectors: Any = False, **_: Any
    ) -> list[models.Record]:
        _, shard = self._shard(collection_name)
        records = shard.retrieve(
            list(ids), with_payload=_with_payload(with_payload), with_vector=_with_vectors(with_vectors)
        )
        return [models.Record(id=_point_id(r.id), payload=r.payload, vector=_vector_out(r.vector)) for r in records]

    def query_points(
        self,
        collection_name: str,
        query: Any = None,
        using: str | None = None,
        prefetch: models.Prefetch | Sequence[models.Prefetch] | None = None,
        query_filter: models.Filter | None = None,
        search_params: models.SearchParams | None = None,
        limit: int = 10,
        offset: int | None = None,
        with_payload: Any = True,
        with_vectors: Any = False,
        score_threshold: float | None = None,
        lookup_from: Any = None,
        **_: Any,
    ) -> EdgeQueryResponse:
        """Nearest-neighbour queries by a dense vector or a sparse one (`using` its name), and prefetches of those
        fused by RRF or DBSF. `query_filter` reaches into every prefetch, as on a server: each prefetch's limit
        counts only matching points. Other query kinds raise EdgeUnsupportedError."""
        _, shard = self._shard(collection_name)
        if lookup_from is not None:
            raise _unsupported_query("lookup_from")
        prefetches = [prefetch] if isinstance(prefetch, models.Prefetch) else list(prefetch or [])
        if prefetches:
            scoring, prefetched = _fusion(query), [_prefetch(p) for p in prefetches]
        elif query is None or isinstance(query, (models.FusionQuery, models.RrfQuery)):
            raise _unsupported_query("a query without prefetches that is no vector")
        else:
            scoring, prefetched = _nearest(query, using), None
        hits = shard.query(
            qe.QueryRequest(
                limit=limit,
                offset=offset,
                query=scoring,
                prefetches=prefetched,
                filter=_filter(query_filter),
                params=_search_params(search_params),
                with_payload=_with_payload(with_payload),
                with_vector=_with_vectors(with_vectors),
                score_threshold=score_threshold,
            )
        )
        return EdgeQueryResponse(
            [EdgeScoredPoint(_point_id(p.id), p.version, p.score, p.payload, _vector_out(p.vector)) for p in hits]
        )

    def count(
        self, collection_name: str, count_filter: models.Filter | None = None, exact: bool = True, **_: Any
    ) -> models.CountResult:
        _, shard = self._shard(collection_name)
        return models.CountResult(count=shard.count(qe.CountRequest(exact=exact, filter=_filter(count_filter))))

    # --- engine ---------------------------------------------------------------------------------------------

    def optimize(self, collection_name: str) -> bool:
        """Build HNSW for segments past the indexing threshold (blocking: minutes at large sizes, see
        bench/edge_latency.py) and vacuum deletes. A no-op when only a small appendable segment changed."""
        collection, shard = self._shard(collection_name)
        changed = shard.optimize()
        shard.flush()
        self._dirty.discard(collection)
        return changed

    def export_collection(self, collection_name: str, target_root: str | Path, alias: str | None = None) -> str:
        """Copy one collection (a name or an alias) into the edge folder `target_root` as files: segments with
        their HNSW graphs and payload indexes, so the copy answers at once with nothing re-indexed. `alias`, if
        given, points at it there. Returns the collection's name.

        Nothing may write the collection during the copy: the folder's lock keeps other processes out, and the
        caller must not write it from another thread of this one (the serving replica opens the primary only to
        copy it). The shard is optimized if written since its last optimize, then flushed and closed, because Edge
        has no snapshot of a live shard and a closed shard's folder is complete; the next call that needs it
        reopens it. The target's lock is held throughout, so no one opens a half-copied collection, and the copy
        lands under a hidden name, renamed into place when complete. On any failure the partial copy is removed,
        and `target_root` too when this call created it."""
        self._check_open()
        target = Path(target_root)
        with self._mutex:
            collection = self._resolve(collection_name)
            if collection in self._dirty:
                self.optimize(collection)  # a collection leaves with its index, as it goes live with it
            shard = self._shards.pop(collection, None)
            if shard is not None:
                shard.flush()
                shard.close()
            created = not target.exists()
            try:
                lock = _lock_folder(target)
                try:
                    aliases = _read_aliases(target)
                    dest = target / COLLECTIONS / collection
                    if dest.exists():
                        raise ValueError(f"{target} already holds collection {collection}")
                    if alias is not None and (target / COLLECTIONS / alias).exists():
                        raise ValueError(f"{target} already holds a collection named {alias}")
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    partial = dest.with_name(f".partial-{collection}-{uuid.uuid4().hex}")  # hidden: no collection yet
                    try:
                        # Looked up at call time, so the copy function can be swapped (tests break it midway).
                        shutil.copytree(self._dir(collection), partial, copy_function=copy_sparse)
                        os.replace(partial, dest)
                    except BaseException:
                        shutil.rmtree(partial, ignore_errors=True)
                        raise
                    if alias is not None:
                        _write_atomic(target / META, {"engine": ENGINE_MARK, "aliases": {**aliases, alias: collection}})
                finally:
                    _unlock_folder(lock)
            except BaseException:
                if created:
                    shutil.rmtree(target, ignore_errors=True)
                raise
        return collection

    def close(self, **_: Any) -> None:
        with self._mutex:
            if self.closed:
                return
            self.closed = True
            for shard in self._shards.values():
                shard.flush()  # what a writer sent is on disk before the next opener reads
                shard.close()
            self._shards.clear()
            self._release()

    def _release(self) -> None:
        _unlock_folder(self._lock_file)
        if self._temporary:
            shutil.rmtree(self.root, ignore_errors=True)
