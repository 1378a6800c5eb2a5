"""Retrieval over an index (BM25 + a Qdrant collection): a registry of modes, filters, MMR.

index = open_index("fixed-512", "minilm")
hits = get_retriever("hybrid-rrf").search(index, "what is ...", RetrievalParams(k=10))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from rag.embedding import TextEmbedder
from rag.index.bm25 import BM25Index
from rag.index.bm25_sparse import EngineBM25
from rag.index.qdrant import DENSE, collection_distance, similarity
from rag.retrieval.chunks import ChunkLookup, TableChunks
from rag.retrieval.fusion import convex_combination, reciprocal_rank_fusion
from rag.retrieval.mmr import mmr

MAX_QUERY_CHARS = 8000  # far beyond any question; a 10 MB "query" is a mistake, not a search
DENSE_MODES = frozenset({"dense", "hybrid-rrf", "hybrid-cc"})  # the modes that need an embedding model


class RetrievalError(ValueError):
    """Bad retrieval input or a missing index: the message says what to do."""


class SearchFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    doc_ids: list[str] | None = None
    page_from: int | None = Field(None, ge=1)
    page_to: int | None = Field(None, ge=1)

    @property
    def active(self) -> bool:
        return bool(self.doc_ids) or self.page_from is not None or self.page_to is not None


class RetrievalParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = Field(10, ge=1, le=1000)
    candidates: int = Field(100, ge=1, description="per-retriever depth before fusion / MMR")
    rrf_k: int = Field(60, ge=1)
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="hybrid-cc weight of the dense score")
    mmr_lambda: float | None = Field(None, ge=0.0, le=1.0, description="diversify the top k with MMR when set")
    filters: SearchFilter = Field(default_factory=SearchFilter)


@dataclass
class Hit:
    rank: int
    score: float
    chunk: dict
    # What the first stage saw: each component list's score and rank (dense_score, dense_rank, bm25_score,
    # bm25_rank) and the fused rank; a learning-to-rank reranker reads these. Missing = not in that list.
    signals: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        c = self.chunk
        return {
            "rank": self.rank,
            "score": round(float(self.score), 6),
            "chunk_id": c["chunk_id"],
            "doc_id": c["doc_id"],
            "page_start": int(c["page_start"]),
            "page_end": int(c["page_end"]),
            "char_start": int(c["char_start"]),
            "char_end": int(c["char_end"]),
            "text": c["text"],
        }


QUERY_VECTORS_KEPT = 4096


@dataclass
class Index:
    """Everything a retriever reads: the chunk records, the BM25 index, the dense collection alias."""

    # The chunk records: a chunk table indexed by chunk_id (in memory), or a lookup that reads them per hit (the
    # collection's payloads: rag.retrieval.chunks.PayloadChunks, what open_index gives a search that opens a
    # collection). Everything reads them through `lookup`.
    chunks: pd.DataFrame | ChunkLookup
    # BM25 from the collection's sparse vectors (the engine ranks it, filters by the payload indexes) or from the
    # strategy's bm25s index (searches that open no collection, collections built before the sparse vector).
    bm25: EngineBM25 | BM25Index | None
    client: object | None
    alias: str | None
    embedder: TextEmbedder | None
    # Query vectors by text: hybrid modes, MMR and evaluations over several modes ask for the same query again.
    _query_vectors: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    # The dense collection's distance, read once per Index (one request), like the weights checked at open time:
    # a collection's distance never changes; only a new collection swapped in behind the alias brings another.
    _distance: str | None = field(default=None, repr=False)
    # HNSW's search breadth (Qdrant's hnsw_ef; None: the engine's default, max(ef_construct, limit)). Wider finds
    # more of the exact top k in big collections of near-duplicates, for more time per search.
    hnsw_ef: int | None = None
    # Exact dense search (every vector scored) instead of the graph: the exact top k whatever the data, for time
    # linear in the collection (bench/edge_latency.py --exact times it at scale).
    exact: bool = False
    # Encodes the questions when set (the int8 twin of `embedder`, rag.embedding.onnx_int8.int8_query_encoder): a
    # question is encoded on every request, the passages once at index time by `embedder`, whose weights the
    # collection was checked against.
    query_encoder: TextEmbedder | None = None
    lookup: ChunkLookup = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.lookup = TableChunks(self.chunks) if isinstance(self.chunks, pd.DataFrame) else self.chunks

    @property
    def question_encoder(self) -> TextEmbedder | None:
        return self.query_encoder or self.embedder

    def query_vector(self, query: str) -> np.ndarray:
        if query not in self._query_vectors:
            if (
                len(self._query_vectors) >= QUERY_VECTORS_KEPT
            ):  # bounded: a long-lived API process sees endless new queries
                self._query_vectors.clear()
            self._query_vectors[query] = self.question_encoder.encode_queries([query])[0]
        return self._query_vectors[query]

    def chunk_ranking(self, ranking: list[tuple[str, float]]) -> list[tuple[str, float]]:
        """A ranking of the lookup's keys as (chunk_id, score), in order; keys whose chunk the chunk records do not
        hold are left out."""
        chunk_ids = self.lookup.chunk_ids([key for key, _ in ranking])
        return [(chunk_ids[key], score) for key, score in ranking if key in chunk_ids]

    def dense_distance(self) -> str:
        if self._distance is None:
            self._distance = collection_distance(self.client, self.alias)
        return self._distance

    def forget_query(self, query: str) -> None:
        """Drop a query's cached vector: a timing that must include the encoding (a canary's paired ranking times)."""
        self._query_vectors.pop(
            query.strip() if isinstance(query, str) else query, None
        )  # keyed as validate_query leaves it

    def embed_queries(self, queries: list[str]) -> None:
        """Embed the queries not cached yet in batches, not one by one (an evaluation asks every question of a set)."""
        todo = list(dict.fromkeys(q for q in queries if q not in self._query_vectors))[:QUERY_VECTORS_KEPT]
        if self.embedder is None or not todo:
            return
        if len(self._query_vectors) + len(todo) > QUERY_VECTORS_KEPT:
            self._query_vectors.clear()
        if self.query_encoder is not None:  # one at a time, as query_vector does: int8 scales are set per batch
            self._query_vectors.update((q, self.query_encoder.encode_queries([q])[0]) for q in todo)
        else:
            self._query_vectors.update(zip(todo, self.embedder.encode_queries(todo)))

    def record(self, chunk_id: str) -> dict:
        """A chunk's record; KeyError when the chunk records hold none."""
        found = self.lookup.get_many([chunk_id])
        if chunk_id not in found:
            raise KeyError(chunk_id)
        return found[chunk_id]

    def records(self, chunk_ids: list[str]) -> list[dict]:
        """The records of those chunks the chunk records hold, in the given order, read in one lookup."""
        found = self.lookup.get_many(chunk_ids)
        return [found[cid] for cid in chunk_ids if cid in found]

    def allowed_ids(self, flt: SearchFilter) -> set[str]:
        return self.lookup.allowed_ids(flt)


def validate_query(query: str) -> str:
    if not isinstance(query, str) or not query.strip():
        raise RetrievalError("the query is empty: pass a question")
    if len(query) > MAX_QUERY_CHARS:
        raise RetrievalError(f"the query is {len(query):,} characters; the limit is {MAX_QUERY_CHARS:,}")
    return query.strip()


def qdrant_filter(flt: SearchFilter):
    if not flt.active:
        return None
    from qdrant_client import models

    must = []
    if flt.doc_ids:
        must.append(models.FieldCondition(key="doc_id", match=models.MatchAny(any=flt.doc_ids)))
    if flt.page_from is not None:
        must.append(models.FieldCondition(key="page_end", range=models.Range(gte=flt.page_from)))
    if flt.page_to is not None:
        must.append(models.FieldCondition(key="page_start", range=models.Range(lte=flt.page_to)))
    return models.Filter(must=must)


def bm25_ranking(index: Index, query: str, depth: int, flt: SearchFilter) -> list[tuple[str, float]]:
    """(chunk_id, BM25 score), best first."""
    if isinstance(index.bm25, BM25Index):
        return _bm25s_ranking(index, query, depth, flt)
    return index.chunk_ranking(_bm25_keys(index, query, depth, flt))


def dense_ranking(index: Index, query: str, depth: int, flt: SearchFilter) -> list[tuple[str, float]]:
    """(chunk_id, similarity), best first."""
    return index.chunk_ranking(_dense_keys(index, query, depth, flt))


def _bm25s_ranking(index: Index, query: str, depth: int, flt: SearchFilter) -> list[tuple[str, float]]:
    mask = index.bm25.mask_for(index.allowed_ids(flt)) if flt.active else None
    return index.bm25.search(query, depth, mask)


def _bm25_keys(index: Index, query: str, depth: int, flt: SearchFilter) -> list[tuple[str, float]]:
    """BM25's ranking keyed by the lookup's keys (rag.retrieval.chunks): the engine's ranks point ids, read no
    payload."""
    if index.bm25 is None:
        raise RetrievalError("this index has no BM25 part: build it (materialize bm25_indexes or run `rag index`)")
    if isinstance(index.bm25, EngineBM25):
        return index.lookup.ranking(index.bm25.points(query, depth, qdrant_filter(flt)))
    return [(index.lookup.key(cid), score) for cid, score in _bm25s_ranking(index, query, depth, flt)]


def _dense_keys(index: Index, query: str, depth: int, flt: SearchFilter) -> list[tuple[str, float]]:
    """The dense ranking keyed by the lookup's keys: the scored points alone, no payload read."""
    if index.client is None or index.embedder is None:
        raise RetrievalError("this index has no dense part: pass an embedding model")
    vector = index.query_vector(query)
    search_params = None
    if index.hnsw_ef is not None or index.exact:
        from qdrant_client import models

        search_params = models.SearchParams(hnsw_ef=index.hnsw_ef, exact=index.exact)
    points = index.client.query_points(
        index.alias,
        query=vector.tolist(),
        using=DENSE,
        limit=depth,
        query_filter=qdrant_filter(flt),
        search_params=search_params,
        with_payload=False,
    ).points
    # Similarities for every distance (l2 scores are distances): hybrid-cc and min_score expect higher = better.
    distance = index.dense_distance()
    return [(key, similarity(score, distance)) for key, score in index.lookup.ranking(points)]


class Ranking(list):
    """(key, score) best first, plus the component lists' scores and ranks of every item (by key)."""

    def __init__(self, items, signals: dict[str, dict[str, float]] | None = None):
        super().__init__(items)
        self.signals = signals or {}


def component_signals(**components: list[tuple[str, float]]) -> dict[str, dict[str, float]]:
    """{key: {"<name>_score": s, "<name>_rank": r}} over named rankings (ranks from 1)."""
    out: dict[str, dict[str, float]] = {}
    for name, ranking in components.items():
        for rank, (key, score) in enumerate(ranking, start=1):
            entry = out.setdefault(key, {})
            entry[f"{name}_score"], entry[f"{name}_rank"] = float(score), float(rank)
    return out


# A retrieval mode: (key, score) best first, keyed by the index's lookup (Index.lookup: chunk ids or point ids), so
# that fusion reads no payload; retrieve() reads the records of the top k.
Ranker = Callable[[Index, str, RetrievalParams], list[tuple[str, float]]]
RETRIEVERS: dict[str, Ranker] = {}


def register_retriever(name: str) -> Callable[[Ranker], Ranker]:
    def decorator(fn: Ranker) -> Ranker:
        RETRIEVERS[name] = fn
        return fn

    return decorator


@register_retriever("bm25")
def _bm25(index: Index, query: str, p: RetrievalParams) -> list[tuple[str, float]]:
    ranking = _bm25_keys(index, query, max(p.k, p.candidates), p.filters)
    return Ranking(ranking, component_signals(bm25=ranking))


@register_retriever("dense")
def _dense(index: Index, query: str, p: RetrievalParams) -> list[tuple[str, float]]:
    ranking = _dense_keys(index, query, max(p.k, p.candidates), p.filters)
    return Ranking(ranking, component_signals(dense=ranking))


@register_retriever("hybrid-rrf")
def _hybrid_rrf(index: Index, query: str, p: RetrievalParams) -> list[tuple[str, float]]:
    depth = max(p.k, p.candidates)
    dense, sparse = _dense_keys(index, query, depth, p.filters), _bm25_keys(index, query, depth, p.filters)
    return Ranking(reciprocal_rank_fusion([dense, sparse], k=p.rrf_k), component_signals(dense=dense, bm25=sparse))


@register_retriever("hybrid-cc")
def _hybrid_cc(index: Index, query: str, p: RetrievalParams) -> list[tuple[str, float]]:
    depth = max(p.k, p.candidates)
    dense, sparse = _dense_keys(index, query, depth, p.filters), _bm25_keys(index, query, depth, p.filters)
    return Ranking(convex_combination(dense, sparse, p.alpha), component_signals(dense=dense, bm25=sparse))


def retrieve(index: Index, query: str, mode: str, params: RetrievalParams | None = None) -> list[Hit]:
    params = params or RetrievalParams()
    query = validate_query(query)
    try:
        ranker = RETRIEVERS[mode]
    except KeyError:
        raise RetrievalError(f"unknown retrieval mode {mode!r} (known: {', '.join(RETRIEVERS)})") from None
    # A collection can briefly hold points of chunks the chunk set no longer has (between re-chunking and
    # re-embedding); those are skipped rather than served or crashed on.
    ranked = ranker(index, query, params)
    signals = getattr(ranked, "signals", {})
    ranking = index.lookup.keep_known(ranked)
    if params.mmr_lambda is not None and ranking:
        ranking = _diversify(index, query, ranking, params)
    return [
        Hit(rank, score, record, {**signals.get(key, {}), "first_stage_rank": float(rank)})
        for rank, (key, score, record) in enumerate(_top_records(index, ranking, params.k), start=1)
    ]


def _top_records(index: Index, ranking: list[tuple[str, float]], k: int) -> list[tuple[str, float, dict]]:
    """The first k of a ranking with their records, read a few at a time (one read when all are held, as they are
    whenever the ranking came from the records' own engine); a key whose record is gone is passed over."""
    top: list[tuple[str, float, dict]] = []
    start = 0
    while len(top) < k and start < len(ranking):
        part = ranking[start : start + k - len(top)]
        start += len(part)
        found = index.lookup.read([key for key, _ in part])
        top += [(key, score, found[key]) for key, score in part if key in found]
    return top


def _diversify(
    index: Index, query: str, ranking: list[tuple[str, float]], p: RetrievalParams
) -> list[tuple[str, float]]:
    if index.client is None or index.embedder is None:
        raise RetrievalError("MMR needs chunk vectors: pass an embedding model")
    pool = ranking[: max(p.candidates, p.k)]
    keys = {index.lookup.point(key): key for key, _ in pool}
    points = index.client.retrieve(index.alias, ids=list(keys), with_vectors=[DENSE], with_payload=False)
    vectors = {keys[str(pt.id)]: np.asarray(pt.vector[DENSE], dtype=np.float32) for pt in points if str(pt.id) in keys}
    pool = [(key, s) for key, s in pool if key in vectors]
    matrix = np.vstack([vectors[key] for key, _ in pool])
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    order = mmr(index.query_vector(query), matrix, p.k, p.mmr_lambda)
    return [pool[i] for i in order]
