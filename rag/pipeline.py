"""The indexing path as steps over the data dir: ingest → chunk → BM25 + dense collection.

The Dagster assets, the nightly job and `rag index` all call these, so there is one implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rag.chunk_sets import CHUNK_QUARANTINE_TABLE, ChunkLimits, ChunkRun, update_chunk_set
from rag.chunking import Chunker, get_chunker, load_strategies
from rag.embedding import TextEmbedder, load_embedder, model_key
from rag.index.qdrant import CollectionName, QdrantSettings, alias_target, drop_unaliased, get_client, point_alias_to
from rag.index.stored import ReusingEmbedder, StoredVectors, other_chunk_sets
from rag.index.sync import BM25Run, IndexRun, sync_bm25, sync_collection
from rag.ingest import ParseRun, update_documents
from rag.parsing import ParseSettings
from rag.progress import Progress
from rag.registry import IMPLICIT_PRODUCTION, ModelRegistry
from rag.retrieval.service import PRODUCTION
from rag.source import SourceScan, require_folder, scan_folder
from rag.store import CHUNK_FAILURES_TABLE, CHUNKS_TABLE, DOCUMENTS_TABLE, QUARANTINE_TABLE, TableStore, bm25_root

if TYPE_CHECKING:  # rag.qa brings the answer stack, which importing the pipeline should not load
    from rag.qa.encoding import SentenceEncoder


def ingest_step(
    tables: TableStore,
    scan: SourceScan,
    settings: ParseSettings,
    on_progress: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> ParseRun:
    run = update_documents(
        scan,
        tables.read(DOCUMENTS_TABLE),
        tables.read(QUARANTINE_TABLE),
        settings,
        on_progress=on_progress,
        progress=progress,
    )
    tables.write(run.documents, DOCUMENTS_TABLE)
    tables.write(run.quarantine, QUARANTINE_TABLE)
    return run


def chunk_step(
    tables: TableStore, chunker: Chunker, progress: Progress | None = None, limits: ChunkLimits | None = None
) -> ChunkRun:
    """Bring one strategy's chunk set up to date. A document over the chunk cap (`limits`, default ChunkLimits())
    is refused whole before the set is written, so it never leaves part of its chunks behind."""
    documents = tables.read(DOCUMENTS_TABLE)
    if documents is None:
        raise FileNotFoundError("parsed_documents does not exist yet: ingest documents first")
    run = update_chunk_set(
        tables.read(CHUNKS_TABLE, chunker.name),
        documents,
        chunker,
        progress,
        limits=limits,
        previous_quarantine=tables.read(CHUNK_QUARANTINE_TABLE, chunker.name),
    )
    tables.write(run.chunks, CHUNKS_TABLE, chunker.name)
    tables.write(run.quarantine, CHUNK_QUARANTINE_TABLE, chunker.name)
    # Written on every run (empty when all went well) so the chunk-set check sees this run's failures only.
    tables.write(run.failures, CHUNK_FAILURES_TABLE, chunker.name)
    return run


def _chunks(tables: TableStore, strategy: str):
    chunks = tables.read(CHUNKS_TABLE, strategy)
    if chunks is None:
        raise FileNotFoundError(f"chunk set {strategy!r} does not exist yet: chunk documents with it first")
    return chunks


def bm25_step(tables: TableStore, root: Path, strategy: str) -> BM25Run:
    return sync_bm25(_chunks(tables, strategy), bm25_root(root, strategy))


@dataclass
class EmbedRun(IndexRun):
    """The collection's sync and the sentence vectors stored beside it (rag.qa.encoding). `reused`: chunks written
    with a vector the model had already given their text (a sentence of the store, a chunk of another chunk set)."""

    sentence_vectors: dict = field(default_factory=dict)
    reused: int = 0

    @property
    def summary(self) -> dict:
        return (
            super().summary
            | {"reused_vectors": self.reused}
            | {f"sentence_vectors_{k}": v for k, v in self.sentence_vectors.items()}
        )


def embed_step(
    tables: TableStore,
    client,
    strategy: str,
    model: str,
    embedder: TextEmbedder,
    distance: str = "cosine",
    progress: Progress | None = None,
    registry: ModelRegistry | None = None,
    *,
    batch_size: int = 512,
    sentence_batch_size: int = 256,
    sentence_encoder: SentenceEncoder | None = None,
) -> EmbedRun:
    """Bring the (strategy, model) collection up to date. For the base model, while no embedder is promoted in
    `registry` (default: the data dir's, beside `tables`), also keep `<strategy>__production` on it: serving asks
    for `production` by default and must answer on a fresh index (see base_serving_alias). Then store the vectors
    of the chunks' sentences the data dir's sentence store lacks for this model, so answering encodes only the
    question (rag.qa.encoding).

    Interruptible: chunk vectors are upserted `batch_size` at a time into a collection that survives a kill, and
    sentence vectors stored `sentence_batch_size` at a time, so a run that dies resumes where it stopped and never
    encodes again what it stored (rag.index.sync, rag.qa.encoding).

    Every text is encoded once per model version: a chunk whose text the model already encoded (a sentence in the
    store, a chunk of another chunk set's collection of the same model and weights) is written with that vector, and
    a sentence that is a chunk's whole text takes the chunk's (rag.index.stored). `sentence_encoder` "int8": the
    sentences are encoded by the model's int8 twin, into the twin's own store (rag.qa.encoding.sentence_encoder);
    None: the answer stage's default, so what is stored is what answering reads."""
    # Imported when used: rag.qa brings the answer stack (LLM backends), which importing the pipeline should not load.
    from rag.embedding.onnx_int8 import available_cores
    from rag.qa.encoding import DEFAULT_SENTENCE_ENCODER, open_sentence_store, store_sentence_vectors
    from rag.qa.encoding import sentence_encoder as sentence_encoder_of

    chunks = _chunks(tables, strategy)
    root = Path(tables.root).parent
    others = other_chunk_sets(client, strategy, model, embedder.version, distance)
    store = open_sentence_store(root, embedder)
    reusing = ReusingEmbedder(embedder, store.vectors_of, others)
    try:
        run = sync_collection(
            client,
            chunks,
            reusing,
            strategy=strategy,
            model=model,
            distance=distance,
            batch_size=batch_size,
            progress=progress,
        )
    finally:
        store.close()
    registry = registry or ModelRegistry(root / "models")
    if base_serving_alias(client, strategy, model, run.collection, registry):
        # The collection the serving alias left may be an old version of the base model nothing else holds.
        run.dropped_collections += drop_unaliased(client, CollectionName(strategy, model_key(model)))
    # Indexing encodes batch after batch with nothing else to serve: the twin gets every core (a server's gets one).
    sentences_by = sentence_encoder_of(
        model, embedder, sentence_encoder or DEFAULT_SENTENCE_ENCODER, threads=available_cores()
    )
    sentences = store_sentence_vectors(
        root,
        chunks["text"].tolist(),
        sentences_by,
        batch_size=sentence_batch_size,
        progress=progress,
        task=f"sentence vectors {strategy}|{model}",
        # The chunks' vectors are the model's: a twin's store takes none of them.
        known=StoredVectors(client, [run.collection, *others.collections]) if sentences_by is embedder else None,
    )
    return EmbedRun(**vars(run), sentence_vectors=sentences, reused=reusing.reused)


def base_serving_alias(client, strategy: str, model: str, collection: str, registry: ModelRegistry) -> bool:
    """Point `<strategy>__production` at `collection` (the base model's, just synced) when production is the
    implicit v0 (nothing promoted) and the alias is missing or on another collection of the base model (an older
    version, or where a revert to the implicit v0 put it). An alias on any other collection was set by a promotion
    or an operator and is never moved. True when it moved. Idempotent: a second call finds it in place."""
    base = IMPLICIT_PRODUCTION["embedder"]
    if model != base or registry.resolve("embedder", PRODUCTION) is not None:
        return False
    alias = CollectionName(strategy, PRODUCTION).alias
    current = alias_target(client, alias)
    base_collections = CollectionName(strategy, model_key(base)).alias + "__"
    if current == collection or (current is not None and not current.startswith(base_collections)):
        return False
    point_alias_to(client, alias, collection)
    return True


@dataclass
class PipelineReport:
    parse: dict = field(default_factory=dict)
    chunks: dict[str, dict] = field(default_factory=dict)
    bm25: dict[str, dict] = field(default_factory=dict)
    collections: dict[str, dict] = field(default_factory=dict)


def index_folder(
    docs_dir: Path,
    root: Path,
    *,
    strategies: list[str] | None = None,
    models: list[str] | None = None,
    parse_settings: ParseSettings | None = None,
    chunk_limits: ChunkLimits | None = None,
    qdrant: QdrantSettings | None = None,
    distance: str = "cosine",
    progress: Progress | None = None,
    sentence_encoder: SentenceEncoder | None = None,
) -> PipelineReport:
    """Everything for one folder, without Dagster: what `rag index` runs. `progress` hears every step's counts.
    No file stops it: what cannot be read or is over a cap is quarantined (report.parse, report.chunks)."""
    tables = TableStore(Path(root) / "tables")
    configs = load_strategies()
    strategies = strategies or list(configs)
    unknown = [s for s in strategies if s not in configs]
    if unknown:
        raise ValueError(f"unknown chunking strategies {unknown} (known: {', '.join(configs)})")
    require_folder(docs_dir)  # before the models load: a mistyped path is said in 2 s, not after 12
    embedders = {m: load_embedder(m) for m in (models or [])}  # fail fast on an unknown model
    report = PipelineReport()
    parsed = ingest_step(tables, scan_folder(docs_dir), parse_settings or ParseSettings(), progress=progress)
    report.parse = parsed.summary | {
        "quarantine": parsed.quarantine[["doc_id", "reason", "message"]].to_dict("records")
    }
    client = get_client(qdrant) if embedders else None
    for strategy in strategies:
        chunked = chunk_step(tables, get_chunker(strategy, configs), progress, chunk_limits)
        report.chunks[strategy] = chunked.summary | {
            "failures": chunked.failures.to_dict("records"),
            "quarantine": chunked.quarantine[["doc_id", "reason", "message"]].to_dict("records"),
        }
        report.bm25[strategy] = bm25_step(tables, root, strategy).summary
        for name, embedder in embedders.items():
            report.collections[f"{strategy}|{name}"] = embed_step(
                tables, client, strategy, name, embedder, distance, progress, sentence_encoder=sentence_encoder
            ).summary
    return report
