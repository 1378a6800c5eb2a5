"""Annotation stage: the queue of (question, passage) pairs experts should label next, chosen by active learning
over what serves (rag.annotation). The expert view serves its items from `<data dir>/annotation/queue.json`; the
labels go to the feedback store's `expert_labels` table and from there into retraining."""

from dagster import AssetExecutionContext, AssetKey, Config, Definitions, MaterializeResult, MetadataValue, asset
from pydantic import Field

from assets.evaluation import library_field
from rag.annotation.build import build_queue, pooled_items, with_pool
from rag.annotation.candidates import (
    furniture_keys,
    is_furniture,
    pick_questions,
    production_questions,
    reads_as_a_question,
    synthetic_questions,
)
from rag.annotation.config import AnnotationSettings
from rag.annotation.pool import read_pools
from rag.annotation.queue import read_queue, write_queue
from rag.annotation.report import coverage, current_labels, expert_labels, preview, since_refresh
from rag.annotation.served import ServedRanking
from rag.markdown import markdown_table
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE
from resources.feedback import FeedbackLoop
from resources.qdrant import QdrantResource
from resources.storage import DataStore

QA_TABLE = "synthetic_qa"
# Upstream: the passages and indexes the candidates come from, the QA set that stands in for traffic, and the models
# that serve (a promotion changes what users see, so what is uncertain).
UPSTREAM = (
    CHUNKS_TABLE,
    "bm25_indexes",
    "embedding_collections",
    QA_TABLE,
    "production_embedder",
    "production_reranker",
)


class AnnotationQueueConfig(Config):
    """Launchpad settings of annotation_queue (rag.annotation.config.AnnotationSettings, defaults from there)."""

    size: int = library_field(AnnotationSettings, "size")
    questions: int = library_field(AnnotationSettings, "questions")
    k: int = library_field(AnnotationSettings, "k")
    source: str = library_field(AnnotationSettings, "source")
    method: str = library_field(AnnotationSettings, "method")
    diversity: str = library_field(AnnotationSettings, "diversity")
    mmr_lambda: float = library_field(AnnotationSettings, "mmr_lambda")
    per_document: int | None = library_field(AnnotationSettings, "per_document")
    per_question: int | None = library_field(AnnotationSettings, "per_question")
    weights: dict[str, float] = library_field(AnnotationSettings, "weights")
    skip_labelled: bool = library_field(AnnotationSettings, "skip_labelled")
    gate_pairs: int = library_field(AnnotationSettings, "gate_pairs")
    seed: int = library_field(AnnotationSettings, "seed")
    strategy: str | None = Field(None, description="chunk set whose passages are labelled (None: the one that serves)")
    model: str | None = Field(
        None, description="embedder of the served ranking (None: the one that serves, production)"
    )
    mode: str | None = Field(None, description="retrieval mode of the served ranking (None: the one that serves)")

    def settings(self) -> AnnotationSettings:
        return AnnotationSettings(**{name: getattr(self, name) for name in AnnotationSettings.model_fields})


@asset(
    deps=[AssetKey(key) for key in UPSTREAM],
    group_name="annotation",
    kinds={"python", "json"},
    description="Pairs (question, passage) for experts to label, most useful first: the newest questions people asked "
    "fill it first, the synthetic QA set's questions (keyword strings left out) top it up; each question with the "
    "served ranking's top k (active configuration or defaults: production embedder and reranker), page-furniture "
    "passages left out, scored by uncertainty (reranker probability near 0.5, small score margin to the top passage, "
    "BM25 / dense / reranker ranks disagreeing; weights in run config) and picked for diversity (MMR or k-center over "
    "question embeddings, quotas per document and question). The gate's pool goes first: held-out questions people "
    "asked, with a passage one model ranks high and the other does not, that nobody rated (up to gate_pairs). "
    "Written to `<data dir>/annotation/queue.json` for the "
    "expert view; built at the end of `rag demo`, refreshed daily and after each retrain.",
)
def annotation_queue(
    context: AssetExecutionContext,
    config: AnnotationQueueConfig,
    data_store: DataStore,
    qdrant: QdrantResource,
    feedback_loop: FeedbackLoop,
) -> MaterializeResult:
    settings = config.settings()
    ranking = ServedRanking(
        data_store.root, qdrant.settings(), k=settings.k, strategy=config.strategy, model=config.model, mode=config.mode
    )
    store = feedback_loop.store()
    try:
        recent = store.recent_queries(4 * settings.questions) if settings.source != "synthetic" else None
        labels = expert_labels(store)
    finally:
        store.close()
    qa = data_store.tables.read(QA_TABLE)
    questions = pick_questions(
        production_questions(recent, settings.questions),
        synthetic_questions(qa, settings.questions, settings.seed),
        settings.questions,
        settings.source,
    )
    if not questions:
        raise ValueError(
            f"no question to build the annotation queue from (source {settings.source!r}): there is no "
            "production traffic and no synthetic QA set yet (or it holds keyword strings only, which are left out); "
            "materialize synthetic_qa or serve some queries"
        )
    previous, labelled = read_queue(data_store.root), set(current_labels(labels)["item_id"])
    furniture = furniture_keys(data_store.tables.read(DOCUMENTS_TABLE, columns=["doc_id", "metadata_json"]))
    served = ranking.served()
    context.log.info(f"scoring the top {settings.k} of {len(questions)} questions as served by {served}")
    built = build_queue(
        questions,
        ranking.rank,
        settings,
        strategy=ranking.settings.strategy,
        reranked=ranking.reranked,
        embed=ranking.encoder,
        labelled=labelled,
        depth=ranking.depth,
        served=served,
        furniture=lambda chunk: is_furniture(chunk, furniture),
    )
    pooled = pooled_items(
        read_pools(data_store.root),
        settings.gate_pairs,
        labelled=labelled,
        furniture=lambda chunk: is_furniture(chunk, furniture),
    )
    built.queue = with_pool(built.queue, pooled)
    path = write_queue(data_store.root, built.queue)
    covered = coverage(built.queue, ranking.documents())
    progress = since_refresh(previous, labels)
    table = preview(built.queue)
    considered = {source: sum(q.source == source for q in built.questions) for source in ("production", "synthetic")}
    context.log.info(
        f"annotation queue: {covered['queue_size']} items over {covered['distinct_documents']} documents "
        f"({settings.method}); {progress['labels_since_refresh']} labels since the previous refresh"
    )
    return MaterializeResult(
        metadata={
            **covered,
            **{k: v for k, v in progress.items() if v is not None},
            "dagster/row_count": covered["queue_size"],
            "path": MetadataValue.path(str(path)),
            "method": settings.method,
            "questions_considered": len(built.questions),
            "production_questions_considered": considered["production"],
            "synthetic_questions_considered": considered["synthetic"],
            "gate_pool_pairs": len(pooled),
            "candidates_scored": built.candidates,
            "already_labelled_skipped": built.skipped_labelled,
            "furniture_passages_skipped": built.skipped_furniture,
            "keyword_questions_dropped": 0 if qa is None else int((~qa["question"].map(reads_as_a_question)).sum()),
            "labelled_items": len(labelled),
            "served": MetadataValue.json(served),
            "settings": MetadataValue.json(settings.model_dump(mode="json")),
            "preview": MetadataValue.md(markdown_table(table, list(table.columns))),
        }
    )


defs = Definitions(assets=[annotation_queue])
