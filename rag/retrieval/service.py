"""Open the index of a (strategy, model) from the data dir and search it: what `rag search` and the API use."""
from __future__ import annotations

from pathlib import Path

from rag.embedding import load_embedder, model_key
from rag.index.bm25 import BM25Index
from rag.index.qdrant import CollectionName, QdrantSettings, alias_target, get_client
from rag.retrieval import DENSE_MODES, RETRIEVERS, Hit, Index, RetrievalError, RetrievalParams, retrieve, validate_query
from rag.store import CHUNKS_TABLE, TableStore, bm25_root, data_dir


def open_index(strategy: str, model: str | None, *, root: Path | None = None, qdrant: QdrantSettings | None = None,
               need_dense: bool = True, need_bm25: bool = True) -> Index:
    root = Path(root or data_dir())
    chunks = TableStore(root / "tables").read(CHUNKS_TABLE, strategy)
    if chunks is None:
        raise RetrievalError(f"no chunk set for strategy {strategy!r} under {root}: run `rag index DOCS --strategy {strategy}` "
                             "or materialize chunk_sets for that partition")
    bm25 = None
    if need_bm25:
        try:
            bm25 = BM25Index.load(bm25_root(root, strategy))
        except FileNotFoundError as exc:
            raise RetrievalError(str(exc)) from exc
    client = alias = embedder = None
    if need_dense:
        if not model:
            raise RetrievalError("this mode needs an embedding model: pass --model")
        client = get_client(qdrant)
        alias = CollectionName(strategy, model_key(model)).alias
        live = alias_target(client, alias)
        if live is None:
            raise RetrievalError(f"no collection for strategy {strategy!r} and model {model!r}: run "
                                 f"`rag index DOCS --strategy {strategy} --model {model}` or materialize embedding_collections")
        try:
            embedder = load_embedder(model)
        except ValueError as exc:
            raise RetrievalError(str(exc)) from exc
        if f"__{embedder.version}__" not in live:
            # Query vectors from other weights than the indexed ones would rank nonsense silently.
            raise RetrievalError(f"the collection {live} was built with other weights than model {model!r} has now "
                                 f"({embedder.version}): re-index it (materialize embedding_collections or `rag index`)")
    return Index(chunks=chunks.set_index("chunk_id"), bm25=bm25, client=client, alias=alias, embedder=embedder)


def search(query: str, *, strategy: str, model: str | None = "minilm", mode: str = "hybrid-rrf", k: int = 10,
           params: RetrievalParams | None = None, root: Path | None = None, qdrant: QdrantSettings | None = None) -> list[Hit]:
    validate_query(query)  # before any model or index is loaded
    if mode not in RETRIEVERS:
        raise RetrievalError(f"unknown retrieval mode {mode!r} (known: {', '.join(RETRIEVERS)})")
    params = (params or RetrievalParams()).model_copy(update={"k": k})
    index = open_index(strategy, model, root=root, qdrant=qdrant, need_dense=mode in DENSE_MODES or params.mmr_lambda is not None,
                       need_bm25=mode in {"bm25", "hybrid-rrf", "hybrid-cc"})
    return retrieve(index, query, mode, params)
