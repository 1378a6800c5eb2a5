"""Optimization stage: search the best pipeline configuration for the QA set, and (explicitly) make a winner
the configuration that serves queries."""

import json
from pathlib import Path

from dagster import AssetExecutionContext, AssetKey, Config, Definitions, MaterializeResult, MetadataValue, asset
from pydantic import Field

from rag.evaluation.plots import markdown_image
from rag.evaluation.qaset import from_frame
from rag.markdown import markdown_table
from rag.tuning.active import active_path, apply_configuration
from rag.tuning.data import load_qa_dir
from rag.tuning.evaluate import Objective, PipelineEvaluator, Workspace
from rag.tuning.optimizers import GeneticSettings
from rag.tuning.report import convergence_plot
from rag.tuning.runner import load_items, run_search
from rag.tuning.space import load_space
from resources.llm import LLMResource
from resources.qdrant import QdrantResource
from resources.storage import DataStore

QA_TABLE = "synthetic_qa"
LEADERBOARD_TABLE = "config_search_leaderboard"
SEARCH_FOLDER = ("search", "config_search")  # under the data dir: best_config.yaml, report.md, ...


class ConfigSearchConfig(Config):
    method: str = Field("genetic", description="genetic | grid | preliminary-ranking")
    space_path: str = Field("", description="search space YAML (default config/search_space.yaml)")
    budget: int = Field(100, ge=1, description="distinct candidates to evaluate at most")
    retrieval_weight: float = 0.5
    generation_weight: float = 0.5
    qa_dir: str = Field("", description="a folder with a SQuAD JSON; empty = the synthetic_qa asset's QA set")
    split: str = "all"
    max_questions: int | None = None
    top_n: int = Field(2, ge=1, description="preliminary ranking: embedders kept for the grid")
    judge: bool = Field(False, description="generate and judge answers with the LLM resource (GenerationScore)")
    seed: int = 42


@asset(
    deps=[AssetKey(QA_TABLE)],
    group_name="optimization",
    kinds={"python", "parquet"},
    description="Configuration search over the families of config/search_space.yaml (chunking, embedder, retrieval "
    "mode, MMR, reranker, filter, neighbours, query expansion, prompt order): grid, genetic (RAGSmith) or preliminary "
    "ranking of embedders then grid. Each (chunker, embedder) index is built once; fitness is cached by genome.",
)
def config_search(
    context: AssetExecutionContext,
    config: ConfigSearchConfig,
    data_store: DataStore,
    qdrant: QdrantResource,
    llm: LLMResource,
) -> MaterializeResult:
    if config.qa_dir:
        workspace, items = load_qa_dir(Path(config.qa_dir), data_store.root)
    else:
        table = data_store.tables.read(QA_TABLE)
        if table is None or table.empty:
            raise FileNotFoundError(
                "synthetic_qa is empty: materialize it first (or set qa_dir to a SQuAD JSON folder)"
            )
        workspace, items = Workspace(data_store.root, qdrant.settings()), from_frame(table)
    items = load_items(items, config.split, config.max_questions, config.seed)
    model = llm.load()
    generator = None
    if config.judge:
        if model is None:
            raise ValueError("judge=True needs an LLM: configure the llm resource (backend local-gguf or openai)")
        from rag.embedding import load_embedder
        from rag.tuning.generation import GenerationScorer

        generator = GenerationScorer(model, model, load_embedder("minilm"))
    evaluator = PipelineEvaluator(
        workspace,
        items,
        llm=model,
        generator=generator,
        objective=Objective(retrieval_weight=config.retrieval_weight, generation_weight=config.generation_weight),
    )
    out_dir = data_store.root.joinpath(*SEARCH_FOLDER)
    outcome = run_search(
        config.method,
        evaluator,
        load_space(config.space_path or None),
        budget=config.budget,
        cache_path=data_store.root / "search" / "fitness_cache.sqlite",
        genetic_settings=GeneticSettings(seed=config.seed),
        top_n=config.top_n,
        out_dir=out_dir,
    )
    path = data_store.tables.write(outcome.leaderboard, LEADERBOARD_TABLE)
    summary = outcome.summary()
    context.log.info(
        f"best {summary['best']} fitness {summary['best_fitness']:.4f}; "
        f"{summary['unique_candidates']} candidates, {summary['distinct_indexes']} indexes"
    )
    families = [f.name for f in outcome.result.space.families]
    return MaterializeResult(
        metadata={
            "method": config.method,
            "fitness": outcome.fitness_note,
            "best_fitness": float(summary["best_fitness"]),
            "best_retrieval_score": float(summary["best_retrieval_score"]),
            "delta_fitness_vs_baseline": float(summary.get("delta_fitness") or 0.0),
            "unique_candidates": summary["unique_candidates"],
            "computed": summary["computed"],
            "cache_hits": summary["cache_hits"],
            "distinct_indexes": summary["distinct_indexes"],
            "retrieval_runs": summary["retrieval_runs"],
            "stopped": summary["stopped"],
            "questions": len(items),
            "best_config": MetadataValue.md(f"```yaml\n{outcome.best_yaml}```"),
            "best_config_path": MetadataValue.path(str(outcome.files["best_config"])),
            "leaderboard": MetadataValue.md(
                markdown_table(outcome.leaderboard.head(30), ["rank", "fitness", "retrieval_score"] + families)
            ),
            "leaderboard_path": MetadataValue.path(str(path)),
            "convergence": MetadataValue.md(
                markdown_image(
                    convergence_plot(outcome.result.history, f"{config.method}: fitness per generation"), "convergence"
                )
            ),
            "report": MetadataValue.md(outcome.report),
            "summary_json": MetadataValue.json(json.loads(json.dumps(summary, default=str))),
        }
    )


class ApplyConfigurationConfig(Config):
    source: str = Field("", description="a best_config.yaml; empty = the last config_search winner")
    reason: str = "applied from the config_search winner"


@asset(
    deps=[AssetKey("config_search")],
    group_name="optimization",
    kinds={"python", "yaml"},
    description="The configuration that serves queries (`<data dir>/active_configuration.yaml`, read by `rag ask` "
    "and the API). Materializing it is the explicit step that applies a search's winner; every apply is logged with "
    "what it replaced (`active_configuration_log.jsonl`).",
)
def active_configuration(
    context: AssetExecutionContext, config: ApplyConfigurationConfig, data_store: DataStore
) -> MaterializeResult:
    source = Path(config.source) if config.source else data_store.root.joinpath(*SEARCH_FOLDER, "best_config.yaml")
    entry = apply_configuration(source, data_store.root, reason=config.reason)
    context.log.info(
        f"active configuration replaced from {source}: {entry['settings']} (previous: {entry['previous']})"
    )
    return MaterializeResult(
        metadata={
            "source": MetadataValue.path(str(source)),
            "path": MetadataValue.path(str(active_path(data_store.root))),
            "settings": MetadataValue.json(entry["settings"]),
            "previous": MetadataValue.json(entry["previous"] or {}),
            "reason": config.reason,
        }
    )


defs = Definitions(assets=[config_search, active_configuration])
