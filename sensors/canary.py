"""canary_sensor: evaluates a running canary on every tick and requests its promotion or rollback; observes the model
loop's state (`model_rollout`) whenever it changed.

Each tick reads the canary's evidence from the feedback store (rag.rollout.evidence: interleaving outcomes from
clicks and passage ratings, latency and answer votes per arm) and asks the always-valid sequential test and the
guardrails for a decision; a canary still undecided `max_days` after its start is rolled back (too few users reached
it, and retraining waits while it runs). "continue" is the skip reason, stating the evidence; promote or rollback
requests promote_canary_job or rollback_canary_job once (run_key canary:<candidate>:<decision>:<canary start>). A
run that failed on a retryable error (an embedded Qdrant folder another process held: QdrantLockedError, after the
op's own retries) is requested again on a later tick with the attempt in its run_key (…:attempt2), at most
MAX_ATTEMPTS runs in all; the skip reason says which attempt runs or why nothing is retried.

The cursor holds the fingerprint of the loop's state (production per kind, rollouts, last gate verdicts, last
rollout step: rag.rollout.ui_state) and the canary's evidence. A tick where either changed is an observation of
`model_rollout` (with the canary's figures, so the UI plots the test's progress); an unchanged tick observes
nothing, nor does a tick whose state a job or a gate check has already reported (the latest event's fingerprint).

With no canary running, a candidate that release() queued behind an earlier canary (retrain_job gates an embedder
and a reranker; one canary runs at a time) gets its canary started: start_canary_job, once per candidate
(run_key canary-start:<kind>:<version>), only while its gate verdict still holds against today's production.
"""

import json
from dataclasses import replace

from dagster import (
    AssetKey,
    AssetObservation,
    DagsterEventType,
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

from assets.rollout import FINGERPRINT, ROLLOUT_ASSET, rollout_metadata
from orchestration.rollout import promote_canary_job, rollback_canary_job, start_canary_job
from rag.registry import ModelRegistry
from rag.rollout import CanarySettings
from rag.rollout.evidence import collect, evaluate, past_max_days, summary
from rag.lifecycle.rollout import name_of, queued_candidates, running_canary, status
from rag.index.qdrant import QdrantLockedError
from rag.lifecycle.journal import PendingTransaction, recover
from resources.feedback import FeedbackLoop
from resources.qdrant import QdrantResource
from resources.rollout import Rollout
from resources.storage import DataStore

REQUEST_TAG = "rollout/request"
ATTEMPT_TAG = "rollout/attempt"
JOBS = {"promote": promote_canary_job, "rollback": rollback_canary_job}
MAX_ATTEMPTS = 3  # runs per decision (or queued start) when the earlier ones failed on a retryable error
CANARY = CanarySettings()  # the rollout resource's defaults, quoted in the description
RETRYABLE = ("QdrantLockedError",)  # another process held the embedded Qdrant folder: nothing changed, try again


def idle_message(registry: ModelRegistry) -> str:
    """What the rollouts look like when no canary runs, and what could start."""
    parts = []
    for kind, entry in status(registry).items():
        rollout = entry.get("rollout")
        said = f"{kind}: production {entry['production']}"
        if rollout:
            said += f", last rollout {rollout['candidate']} {rollout['stage']}"
        if entry.get("candidate_can_start"):
            said += (
                f"; candidate {entry['candidate']} passed its gate: start its canary with start_canary_job or "
                f"`rag models rollout start --kind {kind}`"
            )
        parts.append(said)
    return "no canary running (" + "; ".join(parts) + ")"


def _retryable_error(instance, run) -> str | None:
    """The retryable error class a failed run's step ended with (through RetryRequested and chained causes)."""
    for entry in instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_FAILURE):
        pending = [entry.dagster_event.step_failure_data.error]
        while pending:
            error = pending.pop()
            if error is None:
                continue
            if error.cls_name in RETRYABLE:
                return error.cls_name
            pending += [error.cause, error.context]
    return None


def _request(context: SensorEvaluationContext, key: str, make, then: str) -> tuple[RunRequest | None, str | None]:
    """The run request for `key` (make(run_key, tags) builds it) and what to say of earlier runs: None for a first
    request; a retry's (run_key <key>:attempt<n>); or no request, when a run of it is under way, succeeded, or failed
    beyond retrying (`then`: what an operator does next)."""
    earlier = context.instance.get_runs(filters=RunsFilter(tags={REQUEST_TAG: key}), limit=MAX_ATTEMPTS)  # newest first
    if not earlier:
        return make(key, {REQUEST_TAG: key}), None
    run = earlier[0]
    if run.status != DagsterRunStatus.FAILURE:
        return None, f"run {run.run_id} {run.status.value.lower()}"
    error = _retryable_error(context.instance, run)
    if error is not None and len(earlier) < MAX_ATTEMPTS:
        attempt = len(earlier) + 1
        context.log.warning(
            f"{key}: run {run.run_id} failed with {error}: requesting attempt {attempt} of {MAX_ATTEMPTS}"
        )
        return make(f"{key}:attempt{attempt}", {REQUEST_TAG: key, ATTEMPT_TAG: str(attempt)}), (
            f"run {run.run_id} failed with {error}: retrying (attempt {attempt} of {MAX_ATTEMPTS})"
        )
    why = (
        f"failed with {error} in {len(earlier)} of {MAX_ATTEMPTS} attempts"
        if error is not None
        else "failed (not a retryable error)"
    )
    return None, f"run {run.run_id} {why}: see its logs, then {then}"


def _start_queued(context: SensorEvaluationContext, registry: ModelRegistry, rollout: Rollout) -> tuple[list, str]:
    """Run requests of start_canary_job for the queued candidate with the largest gate estimate
    (rag.lifecycle.rollout.queued_candidates), and what the tick says."""
    for kind, mv in queued_candidates(registry):

        def make(run_key: str, tags: dict) -> RunRequest:
            return RunRequest(
                run_key=run_key,
                job_name=start_canary_job.name,
                tags={**tags, "rollout/kind": kind, "rollout/candidate": mv.name},
                run_config={
                    "ops": {
                        "start_canary_op": {
                            "config": {"kind": kind, "candidate": mv.version, "traffic_share": rollout.traffic_share}
                        }
                    }
                },
            )

        request, said = _request(
            context,
            f"canary-start:{kind}:{mv.version}",
            make,
            then=f"start it (start_canary_job or `rag models rollout start --kind {kind}`)",
        )
        if request is not None and said is None:
            context.log.info(f"{kind} {mv.name} waited for the previous canary: requesting start_canary_job")
        message = f"{idle_message(registry)}; start of {kind} {mv.name}'s queued canary: {said or 'requested'}"
        return ([request] if request is not None else []), message
    return [], idle_message(registry)


def _cursor(cursor: str | None) -> dict:
    """{"state": fingerprint, "evidence": the canary's evidence or None}; {} for no cursor or an older format."""
    try:
        value = json.loads(cursor) if cursor else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) and "state" in value else {}


def _last_reported(instance) -> str | None:
    """The state fingerprint of model_rollout's latest event (observation or materialization), if it has one."""
    key = AssetKey(ROLLOUT_ASSET)
    records = [
        *instance.fetch_observations(key, limit=1).records,
        *instance.fetch_materializations(key, limit=1).records,
    ]
    if not records:
        return None
    latest = max(records, key=lambda r: r.storage_id).asset_event
    value = (latest.metadata or {}).get(FINGERPRINT) if latest is not None else None
    return getattr(value, "value", value)


@sensor(
    jobs=[promote_canary_job, rollback_canary_job, start_canary_job],
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.STOPPED,
    description=f"Every minute while a canary runs (a candidate serving {CANARY.traffic_share:.0%} of sessions, its "
    "passages mixed into production's): counts the questions where people clicked or rated up the candidate's "
    "passages (wins) or production's (losses). It promotes the candidate when a sequential test, valid however often "
    f"it looks, finds it wins (at most a {CANARY.alpha:.0%} chance of promoting one no better), and rolls it back "
    f"when it loses (at most a {CANARY.rollback_alpha or CANARY.alpha:.0%} chance for one at least as good), when "
    f"its ranking's 95th percentile latency is over {CANARY.max_latency_p95_ratio}× production's and over "
    f"{CANARY.latency_p95_allowance_ms:.0f} ms slower, when its answers' up-vote share falls "
    f"{CANARY.max_upvote_share_drop * 100:.0f} points below, or undecided after {CANARY.max_queries} canary "
    f"questions or {CANARY.max_days:.0f} days. A decision run that found the Qdrant folder busy is requested again, "
    f"{MAX_ATTEMPTS} attempts in all. With no canary running it starts a queued candidate's. It records the loop's "
    "state on model_rollout when it changed; each tick says the evidence.",
)
def canary_sensor(
    context: SensorEvaluationContext,
    data_store: DataStore,
    feedback_loop: FeedbackLoop,
    rollout: Rollout,
    qdrant: QdrantResource,
):
    registry = ModelRegistry(data_store.root / "models")
    try:  # a promotion or rollback a killed run left unfinished is completed (or undone) before anything is judged
        recovered = recover(registry, qdrant.client, log=context.log.warning)
    except (PendingTransaction, QdrantLockedError) as exc:
        return SkipReason(
            f"an unfinished promotion or rollback waits for Qdrant ({exc}); it completes on the next tick, "
            "`rag serve` start or `rag models recover`"
        )
    if recovered:
        context.log.warning(recovered)
    before = _cursor(context.cursor)
    loop = rollout_metadata(registry, warn=context.log.warning)
    state = loop[FINGERPRINT]
    running = running_canary(registry)
    requests, seen, canary = [], None, {}
    if running is None:
        requests, message = _start_queued(context, registry, rollout)
    else:
        kind, rollout_state = running
        name = name_of(registry, kind, rollout_state.candidate_version)
        settings = rollout.settings()
        store = feedback_loop.store()
        try:
            evidence = collect(store, rollout_state.started_at, settings)
        finally:
            store.close()
        decision = evaluate(evidence, name, settings)
        production = registry.resolve(kind, "production")
        if (production.version if production else None) != rollout_state.production_version:
            # Its gate verdict and every win were against the production it started beside: promotion would be refused.
            decision = replace(
                decision,
                decision="rollback",
                reason=(
                    f"{decision.reason}; production moved to "
                    f"{name_of(registry, kind, production.version if production else None)} "
                    "during the canary, roll back (gate the candidate against the new production and start again)"
                ),
            )
        decision = past_max_days(decision, rollout_state.started_at, settings)
        figures = summary(decision, evidence, settings)
        seen = {
            "candidate": rollout_state.candidate_version,
            "started_at": rollout_state.started_at.isoformat(),
            **{k: figures[k] for k in ("queries_production", "queries_canary", "wins", "losses", "ties")},
            "votes": {arm: list(v) for arm, v in evidence.votes.items()},
        }
        canary = {
            "kind": kind,
            "stage": rollout_state.stage,
            "traffic_share": rollout_state.traffic_share,
            **{k: v for k, v in figures.items() if v is not None},
        }
        message = decision.reason
        if decision.decision != "continue":
            config = {
                "kind": kind,
                "candidate": rollout_state.candidate_version,
                "reason": decision.reason,
                "evidence_json": json.dumps(figures, default=str),
            }
            op_name = "promote_canary_op" if decision.decision == "promote" else "rollback_canary_op"

            def make(run_key: str, tags: dict) -> RunRequest:
                return RunRequest(
                    run_key=run_key,
                    job_name=JOBS[decision.decision].name,
                    run_config={"ops": {op_name: {"config": config}}},
                    tags={**tags, "rollout/kind": kind, "rollout/candidate": name},
                )

            key = f"canary:{name}:{decision.decision}:{rollout_state.started_at.strftime('%Y%m%dT%H%M%S')}"
            request, said = _request(context, key, make, then="roll back (rollback_canary_job)")
            if request is not None and said is None:
                context.log.info(f"{decision.reason}: requesting {JOBS[decision.decision].name}")
            requests = [request] if request is not None else []
            if said is not None:
                message = f"{decision.reason}; {decision.decision} {said}"
    # Observe only a change: the running canary's evidence moved, or the state moved (a canary that ended among it)
    # and no job or check has reported it yet.
    changed = (seen is not None and seen != before.get("evidence")) or (
        state != before.get("state") and _last_reported(context.instance) != state
    )
    events = [AssetObservation(ROLLOUT_ASSET, description=message, metadata={**loop, **canary})] if changed else []
    cursor = json.dumps({"state": state, "evidence": seen}, sort_keys=True)
    if requests:
        return SensorResult(run_requests=requests, asset_events=events, cursor=cursor)
    return SensorResult(skip_reason=message, asset_events=events, cursor=cursor)


defs = Definitions(sensors=[canary_sensor])
