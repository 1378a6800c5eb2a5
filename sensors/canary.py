"""canary_sensor: evaluates a running canary on every tick and requests its promotion or rollback.

Each tick reads the canary's evidence from the feedback store (rag.rollout.evidence: interleaving outcomes from
clicks and passage ratings, latency and answer votes per arm) and asks the always-valid sequential test and the
guardrails for a decision. "continue" is the skip reason, stating the evidence; promote or rollback requests
promote_canary_job or rollback_canary_job once (run_key canary:<candidate>:<decision>:<canary start>). Ticks whose
evidence changed are observations of `model_rollout`, so the UI plots the test's progress; the cursor remembers the
last evidence observed.

With no canary running, a candidate that release() queued behind an earlier canary (retrain_job gates an embedder
and a reranker; one canary runs at a time) gets its canary started: start_canary_job, once per candidate
(run_key canary-start:<kind>:<version>), only while its gate verdict still holds against today's production.
"""
import json
from dataclasses import replace

from dagster import (
    AssetObservation,
    DagsterRunStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.rollout import ROLLOUT_ASSET
from orchestration.rollout import promote_canary_job, rollback_canary_job, start_canary_job
from rag.registry import KINDS, ModelRegistry
from rag.rollout.evidence import collect, evaluate, summary
from rag.rollout.store import name_of, queued_candidate, running_canary, status
from resources.feedback import FeedbackLoop
from resources.rollout import Rollout
from resources.storage import DataStore

REQUEST_TAG = "rollout/request"
JOBS = {"promote": promote_canary_job, "rollback": rollback_canary_job}


def idle_message(registry: ModelRegistry) -> str:
    """What the rollouts look like when no canary runs, and what could start."""
    parts = []
    for kind, entry in status(registry).items():
        rollout = entry.get("rollout")
        said = f"{kind}: production {entry['production']}"
        if rollout:
            said += f", last rollout {rollout['candidate']} {rollout['stage']}"
        if entry.get("candidate_can_start"):
            said += (f"; candidate {entry['candidate']} passed its gate: start its canary with start_canary_job or "
                     f"`rag models rollout start --kind {kind}`")
        parts.append(said)
    return "no canary running (" + "; ".join(parts) + ")"


def _decision_runs(instance, key: str) -> list:
    return instance.get_runs(filters=RunsFilter(tags={REQUEST_TAG: key}), limit=1)


def _start_queued(context: SensorEvaluationContext, registry: ModelRegistry, rollout: Rollout):
    """A RunRequest of start_canary_job for the first queued candidate (embedder before reranker), or a skip reason."""
    for kind in KINDS:
        mv = queued_candidate(registry, kind)
        if mv is None:
            continue
        key = f"canary-start:{kind}:{mv.version}"
        earlier = _decision_runs(context.instance, key)
        if earlier:
            return SkipReason(f"{idle_message(registry)}; start of {kind} {mv.name}'s queued canary: run "
                              f"{earlier[0].run_id} {earlier[0].status.value.lower()}")
        context.log.info(f"{kind} {mv.name} waited for the previous canary: requesting start_canary_job")
        return RunRequest(run_key=key, job_name=start_canary_job.name, tags={REQUEST_TAG: key, "rollout/kind": kind,
                                                                              "rollout/candidate": mv.name},
                          run_config={"ops": {"start_canary_op": {"config": {
                              "kind": kind, "candidate": mv.version, "traffic_share": rollout.traffic_share}}}})
    return SkipReason(idle_message(registry))


@sensor(jobs=[promote_canary_job, rollback_canary_job, start_canary_job], minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.STOPPED,
        description="Evaluates the running canary on every tick (always-valid mSPRT on interleaving wins/losses, "
        "guardrails on latency p95 and the answer up-vote share); requests promote_canary_job or rollback_canary_job "
        "when it decides. The skip reason states the evidence.")
def canary_sensor(context: SensorEvaluationContext, data_store: DataStore, feedback_loop: FeedbackLoop, rollout: Rollout):
    registry = ModelRegistry(data_store.root / "models")
    running = running_canary(registry)
    if running is None:
        return _start_queued(context, registry, rollout)
    kind, state = running
    name = name_of(registry, kind, state.candidate_version)
    settings = rollout.settings()
    store = feedback_loop.store()
    try:
        evidence = collect(store, state.started_at)
    finally:
        store.close()
    decision = evaluate(evidence, name, settings)
    production = registry.resolve(kind, "production")
    if (production.version if production else None) != state.production_version:
        # Its gate verdict and every win were against the production it started beside: promotion would be refused.
        decision = replace(decision, decision="rollback", reason=(
            f"{decision.reason}; production moved to {name_of(registry, kind, production.version if production else None)} "
            "during the canary, roll back (gate the candidate against the new production and start again)"))
    figures = summary(decision, evidence)
    seen = json.dumps({"candidate": state.candidate_version, "started_at": state.started_at.isoformat(),
                       **{k: figures[k] for k in ("queries_production", "queries_canary", "wins", "losses", "ties")},
                       "votes": {arm: list(v) for arm, v in evidence.votes.items()}}, sort_keys=True)
    events = [] if seen == context.cursor else [AssetObservation(ROLLOUT_ASSET, metadata={
        "kind": kind, "stage": state.stage, "traffic_share": state.traffic_share,
        **{k: v for k, v in figures.items() if v is not None}})]
    if decision.decision == "continue":
        return SensorResult(skip_reason=decision.reason, asset_events=events, cursor=seen)
    key = f"canary:{name}:{decision.decision}:{state.started_at.strftime('%Y%m%dT%H%M%S')}"
    earlier = _decision_runs(context.instance, key)
    if earlier:
        run = earlier[0]
        what = "failed: see its logs, then roll back (rollback_canary_job)" if run.status == DagsterRunStatus.FAILURE \
            else f"is {run.status.value.lower()}"
        return SensorResult(skip_reason=f"{decision.reason}; {decision.decision} run {run.run_id} {what}",
                            asset_events=events, cursor=seen)
    context.log.info(f"{decision.reason}: requesting {JOBS[decision.decision].name}")
    config = {"kind": kind, "candidate": state.candidate_version, "reason": decision.reason,
              "evidence_json": json.dumps(figures, default=str)}
    op_name = "promote_canary_op" if decision.decision == "promote" else "rollback_canary_op"
    request = RunRequest(run_key=key, job_name=JOBS[decision.decision].name,
                         run_config={"ops": {op_name: {"config": config}}},
                         tags={REQUEST_TAG: key, "rollout/kind": kind, "rollout/candidate": name})
    return SensorResult(run_requests=[request], asset_events=events, cursor=seen)


defs = Definitions(sensors=[canary_sensor])
