"""The rollout of trained models, visible in the UI: `model_rollout` is observed by canary_sensor on every tick
whose evidence changed (wins, losses, ties, log-likelihood ratio, guardrail inputs) and materialized by each
rollout step (start, promote, rollback), with the stage, the candidate and the production it would replace."""
from dagster import AssetSpec, Definitions

ROLLOUT_ASSET = "model_rollout"

model_rollout = AssetSpec(
    ROLLOUT_ASSET, group_name="training", kinds={"json"},
    description="Canary rollout of a gated candidate (rag.rollout; state in <data dir>/models/rollout/<kind>.json): "
    "candidate → canary (a share of sessions, team-draft interleaved with production) → production or rolled_back. "
    "Materialized by start_canary_job, promote_canary_job and rollback_canary_job; observed by canary_sensor with "
    "the sequential test's evidence (plot wins, losses or log_likelihood_ratio over time on this page).",
)


defs = Definitions(assets=[model_rollout])
