"""Open the index of a (strategy, model) from the data dir and search it: what `rag search` and the API use."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

from rag.embedding import load_embedder, load_for_queries, model_key
from rag.index.bm25 import BM25Index
from rag.index.bm25_sparse import EngineBM25, has_bm25
from rag.index.qdrant import CollectionName, QdrantSettings, alias_target, get_client, is_local
from rag.retrieval import DENSE_MODES, RETRIEVERS, Hit, Index, RetrievalError, RetrievalParams, retrieve, validate_query
from rag.retrieval.chunks import PayloadChunks
from rag.store import CHUNKS_TABLE, TableStore, bm25_root, data_dir


BM25Source = Literal["auto", "engine", "bm25s"]
# Where a search reads its hits' chunk records (rag.retrieval.chunks): "engine", the opened collection's payloads,
# per hit; "table", the whole chunk table in memory (the way before); "auto", the engine whenever a collection is
# opened (dense and hybrid modes), else the table.
ChunkSource = Literal["auto", "engine", "table"]
PRODUCTION = "production"  # the registry alias serving follows (rag.training.pipeline.SERVING names the same)
log = logging.getLogger(__name__)
# Who encodes a question: the index's embedding model itself, or its int8 twin (rag.embedding.onnx_int8).
QueryEncoder = Literal["model", "int8"]


def bm25_source_from_env() -> BM25Source:
    value = os.environ.get("RAG_BM25") or "auto"
    if value not in ("auto", "engine", "bm25s"):
        raise RetrievalError(f"RAG_BM25={value!r}: use auto, engine or bm25s")
    return value  # type: ignore[return-value]


def chunk_source_from_env() -> ChunkSource:
    value = os.environ.get("RAG_CHUNKS") or "auto"
    if value not in ("auto", "engine", "table"):
        raise RetrievalError(f"RAG_CHUNKS={value!r}: use auto, engine or table")
    return value  # type: ignore[return-value]


def open_bm25(bm25_dir: Path, client, alias: str | None, source: BM25Source | None = None) -> EngineBM25 | BM25Index:
    """The BM25 a search uses. "auto": the engine's, from the opened collection's sparse vectors when it has them
    (one index, filtered in the engine, copied with the collection to a serving replica), else the bm25s index in
    `bm25_dir`. "engine" and "bm25s" force one (RAG_BM25 sets the default; benchmarks compare the two)."""
    source = source or bm25_source_from_env()
    if source != "bm25s" and client is not None and alias is not None and has_bm25(client, alias):
        return EngineBM25(client, alias)
    if source == "engine":
        raise RetrievalError(
            f"{alias or 'this search'} has no BM25 sparse vector in the engine: it needs a collection "
            "built since they exist (re-index it), or RAG_BM25=auto to use the bm25s index"
        )
    try:
        return BM25Index.load(bm25_dir)
    except FileNotFoundError as exc:
        raise RetrievalError(str(exc)) from exc


def index_model(model: str) -> str:
    """The model to index so that `model` can be searched: production is reached through the model it resolves to
    (indexing the base model puts `<strategy>__production` on its collection until a promotion moves it)."""
    if model == PRODUCTION:
        from rag.registry import registered_embedder

        return registered_embedder(PRODUCTION)[0]
    return model


def production_fallback(strategy: str, model: str) -> str | None:
    """For `production` only: the alias of the model it resolves to, searched when `<strategy>__production` is
    missing. An index built before indexing set that alias has only the base model's `<strategy>__minilm`, and
    production before any promotion is that model; open_index's weights check still refuses a collection of
    other weights than production's."""
    if model != PRODUCTION:
        return None
    return CollectionName(strategy, model_key(index_model(model))).alias


def open_index(
    strategy: str,
    model: str | None,
    *,
    root: Path | None = None,
    qdrant: QdrantSettings | None = None,
    need_dense: bool = True,
    need_bm25: bool = True,
    bm25: BM25Source | None = None,
    query_encoder: QueryEncoder = "model",
    chunk_source: ChunkSource | None = None,
) -> Index:
    """`query_encoder` "int8": questions are encoded by the model's int8 twin (a few times faster on a CPU) against
    the float passage vectors, when that twin loads and agrees with the model; else by the model, with a warning.
    `chunk_source` (default RAG_CHUNKS, else auto): where hits' chunk records are read (ChunkSource)."""
    root = Path(root or data_dir())
    source = chunk_source or chunk_source_from_env()
    tables = TableStore(root / "tables")
    no_chunk_set = RetrievalError(
        f"no chunk set for strategy {strategy!r} under {root}: run `rag index DOCS --strategy {strategy}` "
        "or materialize chunk_sets for that partition"
    )
    if source == "engine" and not need_dense:
        raise RetrievalError(
            "RAG_CHUNKS=engine reads chunk records from a collection, and this search opens none (bm25 alone): "
            "use a dense or hybrid mode with a model, or RAG_CHUNKS=auto"
        )
    from_engine = source == "engine" or (source == "auto" and need_dense)
    has_table = tables.exists(CHUNKS_TABLE, strategy)
    if not has_table and not from_engine:
        raise no_chunk_set
    client = alias = embedder = twin = None
    qdrant = qdrant or QdrantSettings.from_env()
    if need_dense:
        if not model:
            raise RetrievalError("this mode needs an embedding model: pass --model")
        client = get_client(qdrant)
        alias = CollectionName(strategy, model_key(model)).alias
        live = alias_target(client, alias)
        fallback = production_fallback(strategy, model)
        if live is None and fallback is not None and (live := alias_target(client, fallback)) is not None:
            alias = fallback
        if live is None and not has_table:
            raise no_chunk_set
        if live is None:
            raise RetrievalError(
                f"no collection for strategy {strategy!r} and model {model!r}: run "
                f"`rag index DOCS --strategy {strategy} --model {index_model(model)}` or materialize "
                "embedding_collections"
            )
        try:
            # With the int8 twin encoding the questions, a recorded pairing spares this process the float model.
            embedder = load_for_queries(model) if query_encoder == "int8" else load_embedder(model)
        except ValueError as exc:
            raise RetrievalError(str(exc)) from exc
        if f"__{embedder.version}__" not in live:
            # Query vectors from other weights than the indexed ones would rank nonsense silently.
            raise RetrievalError(
                f"the collection {live} was built with other weights than model {model!r} has now "
                f"({embedder.version}): re-index it (materialize embedding_collections or `rag index`)"
            )
        if query_encoder == "int8":
            from rag.embedding.onnx_int8 import int8_query_encoder

            twin, why_not = int8_query_encoder(model, embedder)
            if why_not:
                log.warning(why_not)
    if from_engine:
        chunks = PayloadChunks(client, alias)  # read per hit: no chunk table in memory
    else:
        table = tables.read(CHUNKS_TABLE, strategy)
        if table is None:  # removed since the check above
            raise no_chunk_set
        chunks = table.set_index("chunk_id")
    if client is not None and not is_local(client):  # local mode always scans exactly
        if hint := qdrant.breadth_hint(len(chunks)):
            log.warning("%s: %s", live, hint)
    sparse = open_bm25(bm25_root(root, strategy), client, alias, bm25) if need_bm25 else None
    return Index(
        chunks=chunks,
        bm25=sparse,
        client=client,
        alias=alias,
        embedder=embedder,
        query_encoder=twin,
        hnsw_ef=qdrant.hnsw_ef,
        exact=qdrant.exact_search,
    )


def search(
    query: str,
    *,
    strategy: str,
    model: str | None = "minilm",
    mode: str = "hybrid-rrf",
    k: int = 10,
    params: RetrievalParams | None = None,
    root: Path | None = None,
    qdrant: QdrantSettings | None = None,
) -> list[Hit]:
    validate_query(query)  # before any model or index is loaded
    if mode not in RETRIEVERS:
        raise RetrievalError(f"unknown retrieval mode {mode!r} (known: {', '.join(RETRIEVERS)})")
    params = (params or RetrievalParams()).model_copy(update={"k": k})
    index = open_index(
        strategy,
        model,
        root=root,
        qdrant=qdrant,
        need_dense=mode in DENSE_MODES or params.mmr_lambda is not None,
        need_bm25=mode in {"bm25", "hybrid-rrf", "hybrid-cc"},
    )
    return retrieve(index, query, mode, params)
