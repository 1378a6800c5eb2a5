"""Answer stage: the bake-off of answer quality per (retrieval mode × chunking strategy) on the QA set."""

from dagster import AssetExecutionContext, AssetKey, Config, Definitions, MaterializeResult, MetadataValue, asset
from pydantic import Field

from rag.evaluation.plots import markdown_image
from rag.evaluation.qaset import from_frame
from rag.markdown import markdown_table
from rag.qa import AnswerSettings
from rag.qa.bakeoff import BAKEOFF_MODES, bakeoff_plot, run_bakeoff
from rag.retrieval import RetrievalError
from rag.retrieval.service import open_index
from rag.store import CHUNKS_TABLE
from resources.chunking import ChunkingStrategies
from resources.llm import LLMResource
from resources.models import EmbeddingModels
from resources.qdrant import QdrantResource
from resources.storage import DataStore

ANSWERS_TABLE = "answer_evaluation"


class AnswerEvaluationConfig(Config):
    max_questions: int = Field(30, description="questions of the QA set answered per configuration (dev split first)")
    strategies: list[str] = Field(
        default_factory=list, description="chunking strategies (default: every one with a chunk set)"
    )
    modes: list[str] = Field(default_factory=lambda: list(BAKEOFF_MODES))
    generator: str = Field("auto", description="extractive | llm | auto (llm when the LLM resource has a backend)")
    judge: bool = Field(False, description="LLM-judge faithfulness and answer relevancy with the LLM resource (slow)")
    top_k: int = 5


@asset(
    deps=[AssetKey("synthetic_qa"), AssetKey("embedding_collections"), AssetKey("bm25_indexes")],
    group_name="evaluation",
    kinds={"python", "parquet"},
    description="Answers the QA set with every retrieval mode (none / bm25 / dense / hybrid) × chunking strategy and "
    "scores answer accuracy, source accuracy (a cited chunk overlaps the evidence), coverage (not 'not in context') "
    "and latency, plus EM / F1 / ROUGE-L / semantic similarity; judge metrics only when asked for (absent otherwise, "
    "never 0).",
)
def answer_evaluation(
    context: AssetExecutionContext,
    config: AnswerEvaluationConfig,
    data_store: DataStore,
    qdrant: QdrantResource,
    llm: LLMResource,
    embedding_models: EmbeddingModels,
    chunking: ChunkingStrategies,
) -> MaterializeResult:
    qa = data_store.tables.read("synthetic_qa")
    if qa is None or qa.empty:
        raise FileNotFoundError("synthetic_qa is empty: materialize it first")
    items = sorted(from_frame(qa), key=lambda i: (i.split != "dev", i.qid))[: config.max_questions]
    models = embedding_models.active()
    if not models:
        raise ValueError("no active embedding model: list one under `active:` in config/embedders.yaml")
    model = models[0]
    strategies = config.strategies or [
        s for s in chunking.strategies() if data_store.tables.read(CHUNKS_TABLE, s) is not None
    ]
    indexes, skipped = {}, {}
    for strategy in strategies:
        try:
            indexes[strategy] = open_index(strategy, model, root=data_store.root, qdrant=qdrant.settings())
        except RetrievalError as exc:  # a strategy not indexed yet is reported, not fatal
            skipped[strategy] = str(exc)
            context.log.warning(f"answer_evaluation skips {strategy}: {exc}")
    if not indexes:
        raise FileNotFoundError(f"no strategy has a complete index for model {model!r}: {skipped}")
    generator = config.generator if config.generator != "auto" else ("llm" if llm.backend != "none" else "extractive")
    model_llm = llm.load() if generator == "llm" or config.judge else None
    base = AnswerSettings(model=model, generator=generator, top_k=config.top_k)
    result = run_bakeoff(
        items,
        indexes,
        base,
        modes=tuple(config.modes),
        llm=model_llm if generator == "llm" else None,
        judge=model_llm if config.judge else None,
        progress=context.log.info,
    )
    path = data_store.tables.write(result.summary, ANSWERS_TABLE)
    data_store.tables.write(result.per_question, f"{ANSWERS_TABLE}_per_question")
    summary = result.summary
    best = summary.sort_values(["answer_accuracy", "source_accuracy"], ascending=False).iloc[0]
    columns = ["strategy", "mode", "answer_accuracy", "source_accuracy", "coverage", "latency_p50_ms", "f1", "rouge_l"]
    return MaterializeResult(
        metadata={
            "questions": len(items),
            "configurations": len(summary),
            "generator": str(summary["generator"].iloc[0]),
            "model": model,
            "best": f"{best['strategy']} · {best['mode']}",
            "best_answer_accuracy": float(best["answer_accuracy"] or 0.0),
            "skipped_strategies": MetadataValue.json(skipped),
            "path": MetadataValue.path(str(path)),
            "report": MetadataValue.md(markdown_table(summary, columns)),
            "bakeoff_plot": MetadataValue.md(markdown_image(bakeoff_plot(summary, f"answers · {model}"), "bake-off")),
            "dagster/row_count": len(summary),
        }
    )


defs = Definitions(assets=[answer_evaluation])
