"""What starts a retrain from the feedback store: enough new feedback (feedback_volume_sensor), or a week
without one (weekly_retrain schedule). Both export the feedback RAG-Dataset first and hand its folder to the
training assets, so the new ratings become positives and hard negatives. The weekly fallback waits while a canary
runs; the feedback sensor does not (a later candidate of the canary's kind supersedes it only when the gate finds it
significantly better)."""

import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    MetadataValue,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from orchestration.training import retrain_job
from rag.feedback import FeedbackStore, export_versioned
from resources.feedback import FeedbackLoop

MARK_TAG = "feedback/high_water_mark"
EXPERT_MARK_TAG = "feedback/expert_high_water_mark"  # expert labels are numbered apart from users' feedback events
# Each learner's training asset (which reads run config: the trainer settings and the exported feedback dataset)
# and its release step, in retrain_job.
LEARNER_ASSETS = {
    "embedder": ("finetuned_embedder", "production_embedder"),
    "reranker": ("trained_reranker", "production_reranker"),
    "configuration": ("trained_configuration", "production_configuration"),
}
TRAINING_ASSETS = tuple(assets[0] for assets in LEARNER_ASSETS.values())
FINISHED = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE]
RETRAIN_CRON = os.environ.get("RAG_RETRAIN_CRON", "0 3 * * 0")
RETRAIN_TIMEZONE = os.environ.get("RAG_RETRAIN_TIMEZONE", "UTC")
ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


@dataclass(frozen=True)
class CountStart:
    """Where feedback_volume_sensor's count starts: the feedback event and expert label marks, and in words."""

    feedback: int
    expert: int
    label: str  # "retrain run 1a2b3c4d, finished 2025-01-02 03:04 UTC" or "the start (...)"


def count_start(instance) -> CountStart:
    """The marks of the newest finished retrains that read the feedback (tagged by retrain_request), whatever their
    gate decided. A failed or rejected one counts too: its gate (or its error) has seen that feedback, and counting
    from an older mark would retrain again on every new rating. A retrain launched without the exported dataset
    (no mark) read none, so the count goes on from before it; the label names the run the count starts from."""
    records = instance.get_run_records(filters=RunsFilter(job_name=retrain_job.name, statuses=FINISHED), limit=50)

    def newest(tag: str) -> int:
        return max((int(r.dagster_run.tags[tag]) for r in records if _marked(r, tag)), default=0)

    marks = newest(MARK_TAG), newest(EXPERT_MARK_TAG)
    marked = [r for r in records if _marked(r, MARK_TAG)]
    if not marked:
        return CountStart(*marks, "the start (no finished retrain read the feedback)")
    last = max(marked, key=lambda r: int(r.dagster_run.tags[MARK_TAG]))
    end = datetime.fromtimestamp(last.end_time, timezone.utc) if last.end_time else None
    when = f", finished {end:%Y-%m-%d %H:%M} UTC" if end else ""
    return CountStart(*marks, f"retrain run {last.dagster_run.run_id[:8]}{when}")


def _marked(record, tag: str) -> bool:
    return record.dagster_run.tags.get(tag, "").isdigit()


def dataset_mark(feedback: int, expert: int) -> str:
    """The run key and cursor of a dataset version: the feedback mark, and the expert mark once experts labelled."""
    return f"{feedback}-e{expert}" if expert else str(feedback)


def active_retrain(instance) -> str | None:
    runs = instance.get_runs(filters=RunsFilter(job_name=retrain_job.name, statuses=ACTIVE), limit=1)
    return runs[0].run_id if runs else None


def canary_running(loop: FeedbackLoop) -> str | None:
    """Why a retrain waits: a canary is running. Its candidate would be gated against the production the canary may
    replace, could not be released while it runs (one canary at a time; no direct promotion under a canary), and
    the feedback it would consume is still counted after the decision. None when no canary runs."""
    try:
        from rag.registry import ModelRegistry
        from rag.lifecycle.rollout import name_of, running_canary

        registry = ModelRegistry(loop.root / "models")
        running = running_canary(registry)
    except (ImportError, ValueError, FileNotFoundError):
        return None
    if running is None:
        return None
    kind, state = running
    return (
        f"a canary of {kind} {name_of(registry, kind, state.candidate_version)} is running: the retrain waits for "
        "canary_sensor's decision"
    )


def canary_kind(loop: FeedbackLoop) -> str | None:
    """The model kind whose canary is running (None: none)."""
    try:
        from rag.registry import ModelRegistry
        from rag.lifecycle.rollout import running_canary

        running = running_canary(ModelRegistry(loop.root / "models"))
    except (ImportError, ValueError, FileNotFoundError):
        return None
    return running[0] if running is not None else None


def retrain_request(
    loop: FeedbackLoop,
    store: FeedbackStore,
    *,
    reason: str,
    run_key: str | None,
) -> tuple[RunRequest, AssetMaterialization]:
    """Export the dataset up to now and request retrain_job with it, for the resource's learners."""
    folder = export_versioned(store, loop.root)
    stats = json.loads((folder / "stats.json").read_text())
    op_config = {**loop.retrain_run_config, "feedback_dataset": str(folder)}
    learners = [kind for kind in LEARNER_ASSETS if kind in loop.learners]
    request = RunRequest(
        run_key=run_key,
        run_config={"ops": {LEARNER_ASSETS[kind][0]: {"config": op_config} for kind in learners}},
        # Every learner by default; a subset where the resource names one (the assets of the others do not run).
        asset_selection=(
            None
            if len(learners) == len(LEARNER_ASSETS)
            else [AssetKey(name) for kind in learners for name in LEARNER_ASSETS[kind]]
        ),
        tags={
            MARK_TAG: str(stats["high_water_mark"]),
            EXPERT_MARK_TAG: str(stats.get("expert_high_water_mark", 0)),
            "feedback/dataset_version": stats["version"],
            "trigger": reason,
        },
    )
    materialization = AssetMaterialization(
        "feedback_dataset",
        description=f"exported for a retrain ({reason})",
        metadata={
            "path": MetadataValue.path(str(folder)),
            **{k: v for k, v in stats.items() if not isinstance(v, dict)},
        },
    )
    return request, materialization


def setting(field: str):
    """A feedback_loop setting's default as this code location loads it (environment included): the sensors'
    descriptions quote the numbers people will see."""
    info = FeedbackLoop.model_fields[field]
    return info.default_factory() if info.default_factory is not None else info.default


@sensor(
    job=retrain_job,
    minimum_interval_seconds=300,
    default_status=DefaultSensorStatus.STOPPED,
    description="Every 5 minutes: counts the answer and passage ratings and expert labels that arrived since the "
    "last finished retrain (a rejected or failed one too, so the count restarts after each), and at "
    f"{setting('volume_threshold')} (RAG_RETRAIN_FEEDBACK_THRESHOLD) exports them and starts retrain_job. Waits "
    "while a retrain runs. A running canary holds no learner back: a later candidate of its kind that the gate finds "
    "significantly better replaces it, one found only no worse waits for it to end. Each tick says how far it "
    f"is, e.g. '37/{setting('volume_threshold')} new "
    "feedback events since retrain run 1a2b3c4d'.",
)
def feedback_volume_sensor(context: SensorEvaluationContext, feedback_loop: FeedbackLoop):
    store = feedback_loop.store()
    try:
        mark, expert_mark = store.high_water_mark(), store.expert_high_water_mark()
        # An expert label counts as one feedback event: experts label what active learning picked, so a batch of
        # them is at least as worth a retrain as the same number of users' ratings.
        start = count_start(context.instance)
        ratings = store.count_feedback(since_event_id=start.feedback)
        labels = store.count_expert_labels(since_label_id=start.expert)
        new = ratings + labels
        experts = f" ({labels} of them expert labels)" if labels else ""
        # Named by the retrain it counts from, not by production: a rejected retrain restarts the count while
        # production stays, and "since the start" then read as if the count had not restarted.
        progress = f"{new}/{feedback_loop.volume_threshold} new feedback events{experts} since {start.label}"
        running = active_retrain(context.instance)
        if running:
            return SkipReason(f"{progress}; retrain run {running} is in progress")
        if new < feedback_loop.volume_threshold:
            return SkipReason(progress)
        # A running canary holds no learner back, its own kind included: interleavings mostly tie, so a canary may
        # run for weeks, and meanwhile people's feedback grows. A later candidate the gate finds significantly better
        # on held-out questions supersedes it on release; one found only no worse waits for the canary's end.
        busy = canary_kind(feedback_loop)
        request, materialization = retrain_request(
            feedback_loop,
            store,
            reason="feedback_volume",
            run_key=f"feedback-volume:{dataset_mark(mark, expert_mark)}",
        )
        beside = f" (beside the {busy}'s canary)" if busy else ""
        context.log.info(f"{progress}: requesting retrain_job{beside}")
        return SensorResult(
            run_requests=[request], asset_events=[materialization], cursor=dataset_mark(mark, expert_mark)
        )
    finally:
        store.close()


@schedule(
    job=retrain_job,
    cron_schedule=RETRAIN_CRON,
    execution_timezone=RETRAIN_TIMEZONE,
    default_status=DefaultScheduleStatus.STOPPED,
    description=f"Weekly fallback retrain, at cron '{RETRAIN_CRON}' {RETRAIN_TIMEZONE} (RAG_RETRAIN_CRON; default "
    "Sundays 03:00 UTC): trains on the generated questions and all feedback so far, unless a retrain or a canary "
    "is running or a retrain finished in the last 6 days.",
)
def weekly_retrain(context: ScheduleEvaluationContext, feedback_loop: FeedbackLoop):
    # Two retrains at once would train, gate and promote against each other's production (and each other's
    # candidate alias): wait for the running one, like the feedback and drift sensors do.
    running = active_retrain(context.instance)
    if running:
        return SkipReason(f"retrain run {running} is in progress")
    waiting = canary_running(feedback_loop)
    if waiting:
        return SkipReason(waiting)
    recent = context.instance.get_run_records(filters=RunsFilter(job_name=retrain_job.name, statuses=FINISHED), limit=1)
    if (
        recent
        and recent[0].end_time
        and datetime.fromtimestamp(recent[0].end_time, timezone.utc) > datetime.now(timezone.utc) - timedelta(days=6)
    ):
        return SkipReason(f"retrain run {recent[0].dagster_run.run_id} finished less than 6 days ago")
    store = feedback_loop.store()
    try:
        request, _ = retrain_request(feedback_loop, store, reason="weekly", run_key=None)
    finally:
        store.close()
    return request


defs = Definitions(sensors=[feedback_volume_sensor], schedules=[weekly_retrain])
