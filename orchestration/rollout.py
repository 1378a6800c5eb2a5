"""Rollout jobs: start a canary of a gated candidate, promote it, roll it back. canary_sensor requests the last two
when the sequential test (or a guardrail) decides; an operator launches start_canary_job and rollback_canary_job
from the Launchpad (or uses `rag models rollout start|rollback`). Each step is one locked transition of the state
beside the model registry (rag.lifecycle.rollout), logged, and materializes `model_rollout` with the loop's state after
it (so the UI follows the loop with canary_sensor stopped); a step that moved production (a promotion, the revert of
one) also materializes `production_embedder` or `production_reranker` with the new production version.

Another process holding the embedded Qdrant folder (QdrantLockedError) is retried: the op asks Dagster for a retry
LOCK_RETRIES times, LOCK_RETRY_SECONDS apart, and canary_sensor requests a failed decision again (sensors/canary.py)."""

import contextlib
import json

from dagster import AssetMaterialization, Config, Definitions, OpExecutionContext, RetryRequested, job, op
from pydantic import Field

from assets.rollout import ROLLOUT_ASSET, mlflow_link, rollout_metadata
from rag.index.qdrant import QdrantLockedError
from rag.registry import ModelRegistry
from rag.rollout.state import IllegalTransition, RolloutState
from rag.lifecycle.rollout import conclude, name_of, roll_back_rollout, start
from resources.feedback import FeedbackLoop
from resources.qdrant import QdrantResource
from resources.rollout import Rollout
from resources.storage import DataStore


def registry_of(data_store: DataStore) -> ModelRegistry:
    return ModelRegistry(data_store.root / "models")


LOCK_RETRIES = 3  # Dagster retries of a step that found the embedded Qdrant folder held by another process
LOCK_RETRY_SECONDS = 30


@contextlib.contextmanager
def retried_when_locked(context: OpExecutionContext, what: str):
    """A QdrantLockedError (another process holds the embedded Qdrant folder) asks Dagster to run the step again in
    LOCK_RETRY_SECONDS, up to LOCK_RETRIES times; then the run fails and canary_sensor may request it again."""
    try:
        yield
    except QdrantLockedError as exc:
        context.log.warning(
            f"{what}: {exc}; retry {context.retry_number + 1} of {LOCK_RETRIES} in {LOCK_RETRY_SECONDS} s"
        )
        raise RetryRequested(max_retries=LOCK_RETRIES, seconds_to_wait=LOCK_RETRY_SECONDS) from exc


def _production_version(registry: ModelRegistry, kind: str) -> str | None:
    production = registry.resolve(kind, "production")
    return production.version if production is not None else None


def production_event(
    context: OpExecutionContext, registry: ModelRegistry, kind: str, previous: str | None, step: str, reason: str
) -> AssetMaterialization | None:
    """production_<kind> after a step that moved production (None when it did not): its lineage card shows the last
    promotion or revert, which run did it and why."""
    version = _production_version(registry, kind)
    if version == previous:
        return None
    action = "promoted" if step == "promote" else "reverted"
    summary = f"{action}: {name_of(registry, kind, version)} is production (was {name_of(registry, kind, previous)})"
    metadata = {
        "action": action,
        "summary": summary,
        "production": name_of(registry, kind, version),
        "production_version": version or "v0 (implicit)",
        "previous": name_of(registry, kind, previous),
        "step": step,
        "reason": reason,
        "by": f"{context.job_name} run {context.run_id}",
    }
    link = mlflow_link(registry, kind, version, context.log.warning)
    if link is not None:
        metadata["mlflow"] = link
    return AssetMaterialization(f"production_{kind}", description=summary, metadata=metadata)


def rollout_event(
    registry: ModelRegistry, kind: str, state: RolloutState, step: str, warn=None, **extra
) -> AssetMaterialization:
    """model_rollout after a step: the step, and the loop's state now (assets.rollout.rollout_metadata)."""
    return AssetMaterialization(
        ROLLOUT_ASSET,
        description=f"{step}: {kind} {name_of(registry, kind, state.candidate_version)} is {state.stage}",
        metadata={
            **rollout_metadata(registry, warn),
            "kind": kind,
            "step": step,
            "stage": state.stage,
            "candidate": name_of(registry, kind, state.candidate_version),
            "replaces": name_of(registry, kind, state.production_version),
            "traffic_share": state.traffic_share,
            "reason": state.reason,
            **extra,
        },
    )


class StartCanaryConfig(Config):
    kind: str = Field("embedder", description="embedder | reranker")
    candidate: str | None = Field(
        None, description="version or name (v4, ft-minilm-v4); default: the `candidate` alias"
    )
    traffic_share: float | None = Field(None, description="share of sessions; default: the rollout resource's (10 %)")
    force_reason: str | None = Field(
        None,
        description="an operator's override of the gate verdict (say why: logged "
        "and recorded); empty: the candidate needs a passing verdict against production",
    )


@op(
    description="Start a canary: refused unless the candidate's gate passed against today's production; builds an "
    "embedder's collections first, then the API serves traffic_share of sessions interleaved with production."
)
def start_canary_op(
    context: OpExecutionContext,
    config: StartCanaryConfig,
    data_store: DataStore,
    qdrant: QdrantResource,
    rollout: Rollout,
) -> None:
    registry = registry_of(data_store)
    share = config.traffic_share if config.traffic_share is not None else rollout.traffic_share
    with retried_when_locked(context, f"start of the {config.kind} canary"):
        state = start(
            config.kind,
            registry,
            config.candidate,
            share,
            target=qdrant.serving_target(data_store.tables),
            force_reason=config.force_reason or None,
            approved_by=f"dagster run {context.run_id}",
            log=context.log.info,
        )
    context.log_event(rollout_event(registry, config.kind, state, "start", context.log.warning))


class DecisionConfig(Config):
    kind: str = Field("embedder", description="embedder | reranker")
    candidate: str | None = Field(
        None,
        description="the canary's candidate version; set by canary_sensor. Empty: "
        "whatever runs now (an operator's rollback: a promoted candidate is reverted)",
    )
    reason: str = Field("operator rollback from the Dagster UI", description="logged and recorded in the manifest")
    evidence_json: str = Field("", description="the sensor's evidence (JSON), recorded with the decision")
    override_reason: str | None = Field(
        None,
        description="promote only: an operator promoting although the "
        "sequential test does not say promote (say why: recorded as an override, "
        "never as a won canary); empty: the test must say promote now",
    )


def _conclude(
    context: OpExecutionContext,
    decision: str,
    config: DecisionConfig,
    data_store: DataStore,
    qdrant: QdrantResource,
    feedback_loop: FeedbackLoop | None = None,
    rollout: Rollout | None = None,
) -> None:
    from rag.rollout.evidence import collect

    registry = registry_of(data_store)
    evidence = json.loads(config.evidence_json) if config.evidence_json else None

    def observed(since):  # promotion re-reads the evidence: the sensor's word (or an operator's) is not enough
        store = feedback_loop.store()
        try:
            return collect(store, since, rollout.settings() if rollout is not None else None)
        finally:
            store.close()

    previous = _production_version(registry, config.kind)
    try:
        with retried_when_locked(context, f"{decision} of the {config.kind} canary"):
            state = conclude(
                config.kind,
                registry,
                decision,
                config.reason,
                candidate=config.candidate,
                evidence=evidence,
                evidence_source=observed if feedback_loop is not None else None,
                settings=rollout.settings() if rollout is not None else None,
                override_reason=config.override_reason or None,
                approved_by=f"dagster run {context.run_id}",
                target=qdrant.serving_target(data_store.tables),
                log=context.log.info,
            )
    except IllegalTransition as exc:
        # The sensor decided on a canary that has ended since (an operator rolled it back): nothing left to do.
        context.log.warning(f"nothing to {decision}: {exc}")
        return
    context.log_event(
        rollout_event(
            registry,
            config.kind,
            state,
            decision,
            context.log.warning,
            **{k: v for k, v in (evidence or {}).items() if isinstance(v, (int, float, str)) and v is not None},
        )
    )
    moved = production_event(context, registry, config.kind, previous, decision, config.reason)
    if moved is not None:
        context.log_event(moved)


@op(
    description="Promote the canary's candidate: the registry's enforced promotion (gate verdict re-checked), serving "
    "aliases swapped onto the collections the canary served from."
)
def promote_canary_op(
    context: OpExecutionContext,
    config: DecisionConfig,
    data_store: DataStore,
    qdrant: QdrantResource,
    feedback_loop: FeedbackLoop,
    rollout: Rollout,
) -> None:
    _conclude(context, "promote", config, data_store, qdrant, feedback_loop, rollout)


@op(
    description="Roll back: a running canary stops (production never moved); with no candidate given, a candidate the "
    "canary promoted is reverted to the production it replaced (aliases swapped back). Logged with the reason."
)
def rollback_canary_op(
    context: OpExecutionContext, config: DecisionConfig, data_store: DataStore, qdrant: QdrantResource
) -> None:
    if config.candidate:  # the sensor's decision on the canary it evaluated
        _conclude(context, "rollback", config, data_store, qdrant)
        return
    registry = registry_of(data_store)
    previous = _production_version(registry, config.kind)
    with retried_when_locked(context, f"rollback of the {config.kind} rollout"):
        state = roll_back_rollout(
            config.kind,
            registry,
            config.reason,
            target=qdrant.serving_target(data_store.tables),
            approved_by=f"dagster run {context.run_id}",
            log=context.log.info,
        )
    context.log_event(rollout_event(registry, config.kind, state, "rollback", context.log.warning))
    moved = production_event(context, registry, config.kind, previous, "rollback", config.reason)
    if moved is not None:
        context.log_event(moved)


@job(description="Start a canary of a gated candidate (run config: kind, candidate, traffic_share).")
def start_canary_job():
    start_canary_op()


@job(description="Promote the canary's candidate to production (requested by canary_sensor).")
def promote_canary_job():
    promote_canary_op()


@job(
    description="Roll back the embedder's canary, or revert its promotion, in one step: launch from the Launchpad "
    "(set kind: reranker for the reranker) or let canary_sensor request it."
)
def rollback_canary_job():
    rollback_canary_op()


defs = Definitions(jobs=[start_canary_job, promote_canary_job, rollback_canary_job])
