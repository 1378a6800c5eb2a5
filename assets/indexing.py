"""Indexing stage: a BM25 index per chunk set and a Qdrant collection per (strategy, model)."""

from dagster import AssetExecutionContext, AssetKey, Definitions, Failure, MaterializeResult, MetadataValue, asset

from orchestration.partitions import chunking_strategy_partitions, collection_partitions, indexed_models, unwanted
from rag.embedding import window_fit
from rag.pipeline import bm25_step, embed_step
from rag.progress import LogProgress
from rag.registry import ModelRegistry
from rag.store import CHUNKS_TABLE
from resources.models import EmbeddingModels
from resources.qdrant import QdrantResource, qdrant_pool
from resources.storage import DataStore


def require_indexed(model: str, data_store: DataStore, embedding_models: EmbeddingModels) -> None:
    """Refuse a trained model that neither serves, runs a canary nor is listed as active (a candidate the gate
    rejected): its partition may still exist, since training adds one per candidate, and a backfill of "All" would
    pick it."""
    wanted = indexed_models(ModelRegistry(data_store.root / "models"), embedding_models.active())
    if unwanted(model, wanted):
        raise Failure(
            f"{model} neither serves, runs a canary nor is listed as active, so it gets no collection (indexed: "
            f"{', '.join(wanted)}). To index it anyway, add it to `active:` in config/embedders.yaml (or "
            "RAG_ACTIVE_MODELS); `rag sync-strategies` removes partitions of models that are none of these."
        )


@asset(
    partitions_def=chunking_strategy_partitions,
    deps=[AssetKey(CHUNKS_TABLE)],
    group_name="indexing",
    kinds={"python", "bm25s"},
    description="BM25 index (bm25s; lower-case, English stopwords, Snowball stems) of one chunk set. "
    "Rebuilt only when the chunk set changed; swapped in atomically.",
)
def bm25_indexes(context: AssetExecutionContext, data_store: DataStore) -> MaterializeResult:
    run = bm25_step(data_store.tables, data_store.root, context.partition_key)
    return MaterializeResult(metadata={**run.summary, "path": MetadataValue.path(run.path)})


@asset(
    partitions_def=collection_partitions,
    deps=[AssetKey(CHUNKS_TABLE)],
    group_name="indexing",
    kinds={"python", "qdrant"},
    pool=qdrant_pool(),
    description="Dense vectors of one chunk set with one embedding model in Qdrant, behind the alias "
    "`<strategy>__<model>`. Incremental: only new or changed chunks are embedded, removed ones deleted. A new "
    "model version fills a new collection and swaps the alias when complete. A trained model only while it serves "
    "(production, a canary) or is listed as active: a rejected candidate's partition fails with what to do. "
    "Metadata says how many chunks exceed the model's window (truncated_chunks, truncated_share) and how to fix it "
    "(window_note).",
)
def embedding_collections(
    context: AssetExecutionContext, data_store: DataStore, qdrant: QdrantResource, embedding_models: EmbeddingModels
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    strategy, model = keys["strategy"], keys["model"]
    require_indexed(model, data_store, embedding_models)
    embedder = embedding_models.load(model)
    run = embed_step(
        data_store.tables, qdrant.client(), strategy, model, embedder, qdrant.distance, LogProgress(context.log.info)
    )
    context.log.info(f"{strategy} × {model}: {run.summary}")
    # Chunks longer than the model's window are embedded from their start only: count them with its tokenizer.
    fit = window_fit(embedder, data_store.tables.read(CHUNKS_TABLE, strategy)["text"].tolist())
    note = fit.message(strategy) if fit else None
    if note:
        context.log.info(note)
    return MaterializeResult(
        metadata={
            **run.summary,
            **(fit.summary if fit else {}),
            **({"window_note": note} if note else {}),
            "model_version": embedder.version,
            "dimension": embedder.dim,
            "qdrant": qdrant.url or "embedded (local folder)",
            "dagster/row_count": run.points,
        }
    )


defs = Definitions(assets=[bm25_indexes, embedding_collections])
