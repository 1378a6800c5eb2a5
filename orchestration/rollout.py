"""Rollout jobs: start a canary of a gated candidate, promote it, roll it back. canary_sensor requests the last two
when the sequential test (or a guardrail) decides; an operator launches start_canary_job and rollback_canary_job
from the Launchpad (or uses `rag models rollout start|rollback`). Each step is one locked transition of the state
beside the model registry (rag.rollout.store), logged, and materializes `model_rollout`."""
import json

from dagster import AssetMaterialization, Config, Definitions, OpExecutionContext, job, op
from pydantic import Field

from assets.rollout import ROLLOUT_ASSET
from rag.registry import ModelRegistry
from rag.rollout.state import IllegalTransition, RolloutState
from rag.rollout.store import chunk_sets, conclude, name_of, roll_back_rollout, start
from resources.qdrant import QdrantResource
from resources.rollout import Rollout
from resources.storage import DataStore


def registry_of(data_store: DataStore) -> ModelRegistry:
    return ModelRegistry(data_store.root / "models")


def promote_args(data_store: DataStore, qdrant: QdrantResource):
    """Opened only when a step needs Qdrant (building collections, swapping serving aliases)."""
    return lambda: {"tables": data_store.tables, "client": qdrant.client(), "strategies": chunk_sets(data_store.tables),
                    "distance": qdrant.distance}


def rollout_event(registry: ModelRegistry, kind: str, state: RolloutState, step: str, **extra) -> AssetMaterialization:
    return AssetMaterialization(ROLLOUT_ASSET, description=f"{step}: {kind} {name_of(registry, kind, state.candidate_version)} "
                                f"is {state.stage}", metadata={
        "kind": kind, "step": step, "stage": state.stage, "candidate": name_of(registry, kind, state.candidate_version),
        "replaces": name_of(registry, kind, state.production_version), "traffic_share": state.traffic_share,
        "reason": state.reason, **extra})


class StartCanaryConfig(Config):
    kind: str = Field("embedder", description="embedder | reranker")
    candidate: str | None = Field(None, description="version or name (v4, ft-minilm-v4); default: the `candidate` alias")
    traffic_share: float | None = Field(None, description="share of sessions; default: the rollout resource's (10 %)")
    force_reason: str | None = Field(None, description="an operator's override of the gate verdict (say why: logged "
                                     "and recorded); empty: the candidate needs a passing verdict against production")


@op(description="Start a canary: refused unless the candidate's gate passed against today's production; builds an "
    "embedder's collections first, then the API serves traffic_share of sessions interleaved with production.")
def start_canary_op(context: OpExecutionContext, config: StartCanaryConfig, data_store: DataStore, qdrant: QdrantResource,
                    rollout: Rollout) -> None:
    registry = registry_of(data_store)
    share = config.traffic_share if config.traffic_share is not None else rollout.traffic_share
    state = start(config.kind, registry, config.candidate, share, promote_args=promote_args(data_store, qdrant),
                  force_reason=config.force_reason or None, log=context.log.info)
    context.log_event(rollout_event(registry, config.kind, state, "start"))


class DecisionConfig(Config):
    kind: str = Field("embedder", description="embedder | reranker")
    candidate: str | None = Field(None, description="the canary's candidate version; set by canary_sensor. Empty: "
                                  "whatever runs now (an operator's rollback: a promoted candidate is reverted)")
    reason: str = Field("operator rollback from the Dagster UI", description="logged and recorded in the manifest")
    evidence_json: str = Field("", description="the sensor's evidence (JSON), recorded with the decision")


def _conclude(context: OpExecutionContext, decision: str, config: DecisionConfig, data_store: DataStore,
              qdrant: QdrantResource) -> None:
    registry = registry_of(data_store)
    evidence = json.loads(config.evidence_json) if config.evidence_json else None
    try:
        state = conclude(config.kind, registry, decision, config.reason, candidate=config.candidate, evidence=evidence,
                         promote_args=promote_args(data_store, qdrant), log=context.log.info)
    except IllegalTransition as exc:
        # The sensor decided on a canary that has ended since (an operator rolled it back): nothing left to do.
        context.log.warning(f"nothing to {decision}: {exc}")
        return
    context.log_event(rollout_event(registry, config.kind, state, decision, **{
        k: v for k, v in (evidence or {}).items() if isinstance(v, (int, float, str)) and v is not None}))


@op(description="Promote the canary's candidate: the registry's enforced promotion (gate verdict re-checked), serving "
    "aliases swapped onto the collections the canary served from.")
def promote_canary_op(context: OpExecutionContext, config: DecisionConfig, data_store: DataStore, qdrant: QdrantResource) -> None:
    _conclude(context, "promote", config, data_store, qdrant)


@op(description="Roll back: a running canary stops (production never moved); with no candidate given, a candidate the "
    "canary promoted is reverted to the production it replaced (aliases swapped back). Logged with the reason.")
def rollback_canary_op(context: OpExecutionContext, config: DecisionConfig, data_store: DataStore, qdrant: QdrantResource) -> None:
    if config.candidate:  # the sensor's decision on the canary it evaluated
        _conclude(context, "rollback", config, data_store, qdrant)
        return
    registry = registry_of(data_store)
    state = roll_back_rollout(config.kind, registry, config.reason, promote_args=promote_args(data_store, qdrant),
                              log=context.log.info)
    context.log_event(rollout_event(registry, config.kind, state, "rollback"))


@job(description="Start a canary of a gated candidate (run config: kind, candidate, traffic_share).")
def start_canary_job():
    start_canary_op()


@job(description="Promote the canary's candidate to production (requested by canary_sensor).")
def promote_canary_job():
    promote_canary_op()


@job(description="Roll back the embedder's canary, or revert its promotion, in one step: launch from the Launchpad "
     "(set kind: reranker for the reranker) or let canary_sensor request it.")
def rollback_canary_job():
    rollback_canary_op()


defs = Definitions(jobs=[start_canary_job, promote_canary_job, rollback_canary_job])
