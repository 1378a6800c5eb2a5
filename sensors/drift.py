"""Query drift starts a retrain: every tick with new queries compares the recent window with the reference
(the QA set the models were trained and evaluated on), records the statistics as an observation of the
`query_drift` asset (the UI plots them over time), and requests retrain_job after N drifted ticks in a row."""
import json

from dagster import AssetObservation, DefaultSensorStatus, SensorEvaluationContext, SensorResult, SkipReason, sensor

from orchestration.training import retrain_job
from rag.embedding import load_embedder
from rag.feedback.drift import DriftReport, drift_report
from resources.feedback import FeedbackLoop
from sensors.feedback import active_retrain, retrain_request

DRIFT_ASSET = "query_drift"


def evaluate_drift(loop: FeedbackLoop, store) -> tuple[DriftReport | None, str, str | None]:
    """(report or None, a one-line account, the newest query id)."""
    recent = store.recent_queries(loop.drift_window)
    newest = recent["query_id"].iloc[-1] if len(recent) else None
    thresholds = loop.thresholds()
    if len(recent) < thresholds.min_queries:
        return None, f"{len(recent)}/{thresholds.min_queries} queries needed before drift can be measured", newest
    reference = loop.reference_queries(store)
    if len(reference) < thresholds.min_queries:
        return None, f"only {len(reference)} reference queries (need {thresholds.min_queries}): add a QA set", newest
    embedder = load_embedder(loop.drift_embedder)
    recent_ids = recent["query_id"].tolist()
    earlier = store.oldest_queries(10 * loop.drift_window)
    earlier_ids = [q for q in earlier["query_id"] if q not in set(recent_ids)]
    counts = store.retrieved_counts(recent_ids + earlier_ids)
    report = drift_report(
        embedder.encode_queries(recent["text"].tolist()), embedder.encode_queries(reference),
        recent_scores=store.feedback_scores(query_ids=recent_ids), reference_scores=store.feedback_scores(query_ids=earlier_ids),
        recent_retrieved=[counts.get(q, 0) for q in recent_ids], reference_retrieved=[counts.get(q, 0) for q in earlier_ids],
        thresholds=thresholds)
    account = (f"MMD p={report.mmd_p_value:.3f}, classifier AUC={report.classifier_auc:.2f}, answers rated up "
               f"{_pct(report.positive_ratio_recent)} (reference {_pct(report.positive_ratio_reference)})")
    return report, account, newest


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


@sensor(job=retrain_job, minimum_interval_seconds=600, default_status=DefaultSensorStatus.STOPPED,
        description="Compares recent query embeddings with the training/eval queries (MMD permutation test, classifier "
        "AUC) and tracks the answers' up-vote share and passages per query; records each tick as a query_drift "
        "observation; requests retrain_job after N consecutive drifted ticks.")
def drift_sensor(context: SensorEvaluationContext, feedback_loop: FeedbackLoop):
    state = json.loads(context.cursor) if context.cursor else {"consecutive": 0, "newest": None}
    store = feedback_loop.store()
    try:
        report, account, newest = evaluate_drift(feedback_loop, store)
        if newest is not None and newest == state["newest"]:
            return SkipReason(f"no new queries since the last tick ({state['consecutive']} drifted ticks in a row)")
        state["newest"] = newest
        if report is None:
            return SensorResult(skip_reason=account, cursor=json.dumps(state))
        state["consecutive"] = state["consecutive"] + 1 if report.drifted else 0
        needed = feedback_loop.drift_consecutive_ticks
        observation = AssetObservation(DRIFT_ASSET, metadata={
            **report.model_dump(exclude={"embedding_shift", "feedback_shift"}),
            "embedding_shift": report.embedding_shift, "feedback_shift": report.feedback_shift,
            "drifted": report.drifted, "consecutive_drifted_ticks": state["consecutive"]})
        progress = f"{account}; {state['consecutive']}/{needed} drifted ticks in a row"
        running = active_retrain(context.instance)
        if state["consecutive"] < needed or running:
            reason = f"{progress}; retrain run {running} is in progress" if running else progress
            return SensorResult(skip_reason=reason, asset_events=[observation], cursor=json.dumps(state))
        request, materialization = retrain_request(feedback_loop, store, reason="drift", run_key=f"drift:{newest}")
        state["consecutive"] = 0
        context.log.info(f"{progress}: requesting retrain_job")
        return SensorResult(run_requests=[request], asset_events=[observation, materialization], cursor=json.dumps(state))
    finally:
        store.close()
