"""The retrain job: fine-tune → evaluate → gate → promote → re-index, for the embedder and the reranker.

Each gate is a blocking asset check, so a candidate that is not significantly better stops its branch before
promotion: production, its collections and the serving aliases stay as they were. Sensors and users launch it
by name ("retrain_job"), e.g. after new feedback or a new QA set.
"""

from dagster import AssetSelection, Definitions, define_asset_job

TRAINING_ASSETS = (
    "finetuned_embedder",
    "production_embedder",
    "trained_reranker",
    "production_reranker",
    "trained_configuration",
    "production_configuration",
)

retrain_job = define_asset_job(
    "retrain_job",
    selection=AssetSelection.assets(*TRAINING_ASSETS),
    description="Fine-tune the embedder and train the reranker on the QA set (+ feedback), choose the serving "
    "configuration on people's rated questions, gate each against production with a paired significance test, and "
    "promote (or canary) only what passed.",
)


defs = Definitions(jobs=[retrain_job])
