"""When the annotation queue is rebuilt: after every retrain (annotation_after_retrain_sensor: a new materialization
of a training asset means other models may serve, so other pairs are uncertain) and once a day (the
annotation_queue_daily schedule: new production queries, new labels). Neither runs while a retrain is in progress:
the queue would score models that are about to change."""

import os

from dagster import (
    AssetKey,
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    schedule,
    sensor,
)

from orchestration.training import TRAINING_ASSETS
from sensors.feedback import active_retrain

ANNOTATION_CRON = os.environ.get("RAG_ANNOTATION_CRON", "0 5 * * *")
ANNOTATION_TIMEZONE = os.environ.get("RAG_ANNOTATION_TIMEZONE", "UTC")

annotation_queue_job = define_asset_job(
    "annotation_queue_job",
    selection=AssetSelection.assets("annotation_queue"),
    description="Rebuild the annotation queue (what experts label next) from the newest queries and what serves now.",
)


def newest_training_event(instance) -> tuple[int, str | None]:
    """(storage id, asset) of the newest materialization of a training asset (0, None when there is none)."""
    newest, name = 0, None
    for asset in TRAINING_ASSETS:
        records = instance.fetch_materializations(AssetKey(asset), limit=1).records
        if records and records[0].storage_id > newest:
            newest, name = records[0].storage_id, asset
    return newest, name


@sensor(
    job=annotation_queue_job,
    minimum_interval_seconds=120,
    default_status=DefaultSensorStatus.STOPPED,
    description="Every 2 minutes: after each retrain (a new materialization of "
    + ", ".join(TRAINING_ASSETS)
    + "), once no retrain is running, rebuilds the expert queue (annotation_queue) over what serves now, once per "
    "retrain.",
)
def annotation_after_retrain_sensor(context: SensorEvaluationContext):
    seen = int(context.cursor or 0)
    newest, asset = newest_training_event(context.instance)
    if newest <= seen:
        return SkipReason(
            f"no retrain since the queue was last refreshed for one (training event #{seen})"
            if seen
            else "no retrain yet: the daily schedule keeps the queue fresh until the first one"
        )
    running = active_retrain(context.instance)
    if running:
        return SkipReason(
            f"{asset} materialized (event #{newest}); retrain run {running} is still in progress: the "
            "queue is rebuilt when it ends"
        )
    context.log.info(f"{asset} materialized (event #{newest}): rebuilding the annotation queue")
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"annotation-after-retrain:{newest}",
                tags={"trigger": "retrain", "annotation/training_event": str(newest)},
            )
        ],
        cursor=str(newest),
    )


@schedule(
    job=annotation_queue_job,
    cron_schedule=ANNOTATION_CRON,
    execution_timezone=ANNOTATION_TIMEZONE,
    default_status=DefaultScheduleStatus.STOPPED,
    description=f"Daily rebuild of the expert queue (annotation_queue), at cron '{ANNOTATION_CRON}' "
    f"{ANNOTATION_TIMEZONE} (RAG_ANNOTATION_CRON; default 05:00 UTC): the newest questions people asked, without "
    "what experts already labelled; skipped while a retrain runs.",
)
def annotation_queue_daily(context: ScheduleEvaluationContext):
    running = active_retrain(context.instance)
    if running:
        return SkipReason(
            f"retrain run {running} is in progress: annotation_after_retrain_sensor rebuilds the queue after it"
        )
    return RunRequest(tags={"trigger": "daily"})


defs = Definitions(
    jobs=[annotation_queue_job], sensors=[annotation_after_retrain_sensor], schedules=[annotation_queue_daily]
)
