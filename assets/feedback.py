"""Feedback stage: the RAG-Dataset exported from the feedback store (what retraining learns from), and the
query-drift statistics the drift sensor observes every tick."""

import json

import pandas as pd

from dagster import AssetExecutionContext, AssetSpec, DataVersion, Definitions, MaterializeResult, MetadataValue, asset

from rag.feedback import export_versioned
from rag.markdown import markdown_table
from resources.feedback import FeedbackLoop


@asset(
    group_name="feedback",
    kinds={"sql", "json"},
    description="BEIR-compatible RAG-Dataset of every rated query: corpus, queries, answers (system / user / expert), "
    "chunk, document and answer qrels with ±1 scores, raw feedback rows, stats.json. One folder per feedback "
    "high-water mark under `<data dir>/feedback_dataset`; the training assets downstream read its +1 passages as "
    "positives and its -1 retrieved passages as hard negatives (feedback_volume_sensor, drift_sensor and "
    "weekly_retrain export it and hand its folder to retrain_job).",
)
def feedback_dataset(context: AssetExecutionContext, feedback_loop: FeedbackLoop) -> MaterializeResult:
    store = feedback_loop.store()
    try:
        folder = export_versioned(store, feedback_loop.root)
        counts = store.counts()
    finally:
        store.close()
    stats = json.loads((folder / "stats.json").read_text())
    context.log.info(f"feedback dataset {stats['version']} at {folder}")
    flat = {k: v for k, v in stats.items() if not isinstance(v, dict)}
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(folder)),
            **flat,
            "store": MetadataValue.md(
                markdown_table(pd.DataFrame({"table": list(counts), "rows": list(counts.values())}), ["table", "rows"])
            ),
            "answers_by_source": MetadataValue.json(stats["answers_by_source"]),
        },
        data_version=DataVersion(stats["version"]),
    )


query_drift = AssetSpec(
    "query_drift",
    group_name="feedback",
    kinds={"python"},
    description="Whether the questions people ask are drifting from those the models were trained for, observed by "
    "drift_sensor on every tick with new questions: how different the recent and reference questions' embeddings "
    "are (MMD², with the p-value of a permutation test: small means really different), how well a classifier tells "
    "them apart (AUC: 0.5 is chance, 1 always), and the share of answers and passages rated up, recent vs "
    "reference. Plot any of them over time on the asset page.",
)


defs = Definitions(assets=[feedback_dataset, query_drift])
