"""Jobs: ingestion (parse the folder) and chunking (one strategy partition per run)."""

from dagster import AssetSelection, Definitions, define_asset_job

from orchestration.partitions import chunking_strategy_partitions, collection_partitions

ingest_job = define_asset_job(
    "ingest_documents_job",
    selection=AssetSelection.assets("parsed_documents", "document_quarantine"),
    description="Parse new and changed documents; quarantine what cannot be parsed.",
)

chunk_job = define_asset_job(
    "chunk_sets_job",
    selection=AssetSelection.assets("chunk_sets", "bm25_indexes"),
    partitions_def=chunking_strategy_partitions,
    description="Build (incrementally) the chunk set of one chunking strategy and its BM25 index.",
)

index_job = define_asset_job(
    "embedding_collections_job",
    selection=AssetSelection.assets("embedding_collections"),
    partitions_def=collection_partitions,
    description="Embed (incrementally) one chunk set with one model into its Qdrant collection.",
)

qa_job = define_asset_job(
    "synthetic_qa_job",
    selection=AssetSelection.assets("synthetic_qa"),
    description="Generate the span-anchored synthetic QA set from the parsed documents.",
)

evaluation_job = define_asset_job(
    "retrieval_evaluation_job",
    selection=AssetSelection.assets("retrieval_evaluation"),
    partitions_def=collection_partitions,
    description="Score one (strategy, model) index with the QA set, for every retrieval mode.",
)

summary_job = define_asset_job(
    "evaluation_summary_job",
    selection=AssetSelection.assets("evaluation_summary"),
    description="Compare every evaluated configuration.",
)

# Optimization stage (assets/config_search.py): the search, and the explicit step that applies its winner.
config_search_job = define_asset_job(
    "config_search_job",
    selection=AssetSelection.assets("config_search"),
    description="Search the best pipeline configuration for the QA set (method, space and budget in the run config).",
)

apply_configuration_job = define_asset_job(
    "apply_configuration_job",
    selection=AssetSelection.assets("active_configuration"),
    description="Make the last search's winner (or a given best_config.yaml) the configuration that serves queries.",
)

# Answer stage (assets/answers.py): the answer bake-off per retrieval mode × chunking strategy.
answer_evaluation_job = define_asset_job(
    "answer_evaluation_job",
    selection=AssetSelection.assets("answer_evaluation"),
    description=(
        "Answer the QA set with every retrieval mode × chunking strategy and score accuracy, sources, coverage, "
        "latency."
    ),
)


defs = Definitions(
    jobs=[
        ingest_job,
        chunk_job,
        index_job,
        qa_job,
        evaluation_job,
        summary_job,
        config_search_job,
        apply_configuration_job,
        answer_evaluation_job,
    ]
)
