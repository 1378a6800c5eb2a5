"""Query drift starts a retrain: every tick with new queries compares the recent window with the reference,
records the statistics as an observation of the `query_drift` asset (the UI plots them over time), and requests
retrain_job after N drifted ticks in a row.

The reference is production traffic: the first queries asked after the latest promotion or finished retrain
(whichever is newer), so it rolls forward each time a retrain has seen the traffic. The QA set is only the
fallback while there are too few of them, and never its questions copied out of the documents (inverse cloze
without an LLM): real questions always look drifted from sentences, and a reference of them starts a retrain
every few ticks."""

import json
from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd
from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    Definitions,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from orchestration.training import retrain_job
from rag.embedding import load_embedder
from rag.feedback.drift import DriftReport, drift_report
from resources.feedback import FeedbackLoop
from sensors.feedback import FINISHED, active_retrain, canary_running, retrain_request, setting

DRIFT_ASSET = "query_drift"


@dataclass
class Baseline:
    """Where the reference period starts: production traffic after this moment is what the models have seen."""

    since: datetime | None  # None: from the first query (nothing promoted or retrained yet)
    label: str  # "since promotion of embedder v2 (2024-05-01T10:00:00+00:00)"


@dataclass
class Windows:
    recent: pd.DataFrame  # query_id, text; oldest first
    reference: list[str]
    reference_ids: list[str] | None  # production queries: their feedback is the reference's feedback
    source: str  # said in the tick and recorded in the observation


def _parse(stamp: str) -> datetime:
    parsed = datetime.fromisoformat(stamp)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def baseline(loop: FeedbackLoop, instance, state: dict, now: datetime) -> Baseline:
    """The newer of the production models' promotion and the request of the newest finished retrain_job (it
    exported and trained on the traffic up to then; a refused gate counts too, or a lasting shift would
    request a retrain every N ticks that can only be refused again). Resets the drifted-tick count in `state`
    when the baseline moved: ticks that drifted from the old reference say nothing about the new one."""
    try:
        from rag.registry import KINDS, ModelRegistry

        registry = ModelRegistry(loop.root / "models")
        production = {kind: v for kind in KINDS if (v := registry.resolve(kind, "production")) is not None}
    except (ImportError, ValueError, FileNotFoundError):
        production = {}
    label = ", ".join(f"{kind} {v.version}" for kind, v in production.items()) or None
    if "production" not in state or label != state["production"]:
        # An alias set by hand has no promotion record: the first tick that sees it stands in for the promotion.
        state["production"], state["production_seen"] = label, now.isoformat() if label else None
    starts = []
    for kind, version in production.items():
        recorded = (version.metrics.get("promotion") or {}).get("at")
        at = _parse(recorded) if recorded else _parse(state["production_seen"])
        starts.append((at, f"since promotion of {kind} {version.version} ({at.isoformat(timespec='seconds')})"))
    runs = instance.get_run_records(filters=RunsFilter(job_name=retrain_job.name, statuses=FINISHED), limit=1)
    if runs and runs[0].create_timestamp is not None:
        at = runs[0].create_timestamp
        at = at if at.tzinfo else at.replace(tzinfo=timezone.utc)
        starts.append((at, f"since retrain run {runs[0].dagster_run.run_id} ({at.isoformat(timespec='seconds')})"))
    base = (
        Baseline(*max(starts)) if starts else Baseline(None, "since the first query, nothing promoted or retrained yet")
    )
    since = base.since.isoformat() if base.since else None
    if "since" in state and state["since"] != since:
        state["consecutive"] = 0
    state["since"] = since
    return base


def drift_windows(loop: FeedbackLoop, store, base: Baseline) -> tuple[Windows | None, str]:
    """(the recent window and its reference, or None and why not)."""
    needed = loop.thresholds().min_queries
    if loop.drift_reference:
        recent = store.queries_since(None, loop.drift_window, newest=True)
        reference = loop.reference_file()
        if len(recent) < needed:
            return None, f"{len(recent)}/{needed} queries needed before drift can be measured"
        if len(reference) < needed:
            return None, f"only {len(reference)} reference queries in {loop.drift_reference} (need {needed})"
        return Windows(recent, reference, None, f"{len(reference)} queries of {loop.drift_reference}"), ""
    # The newest queries form the recent window; the oldest ones since the baseline, up to
    # drift_reference_window, the reference. Early after a promotion both share what there is (the recent
    # window gives way first), so production traffic becomes the reference at 2 x min_queries.
    latest = store.queries_since(base.since, loop.drift_window + needed, newest=True)
    if len(latest) >= 2 * needed:
        recent = latest.iloc[-min(loop.drift_window, len(latest) - needed) :]
        oldest = store.queries_since(base.since, max(loop.drift_reference_window, needed))
        reference = oldest[~oldest["query_id"].isin(set(recent["query_id"]))]
        return Windows(
            recent,
            reference["text"].tolist(),
            reference["query_id"].tolist(),
            f"{len(reference)} production queries {base.label}",
        ), ""
    shortfall = f"only {len(latest)} production queries {base.label}; {2 * needed} make a reference"
    recent = store.queries_since(None, loop.drift_window, newest=True)
    if len(recent) < needed:
        return None, f"{len(recent)}/{needed} queries needed before drift can be measured ({shortfall})"
    qa, missing = loop.qa_reference()
    if not qa:
        return None, f"no reference yet: {shortfall}, and {missing}"
    return Windows(recent, qa, None, f"QA set (fallback: {shortfall})"), ""


def evaluate_drift(loop: FeedbackLoop, store, base: Baseline) -> tuple[DriftReport | None, str, str | None]:
    """(report or None, a one-line account, the reference it was measured against)."""
    windows, why_not = drift_windows(loop, store, base)
    if windows is None:
        return None, why_not, None
    recent_ids = windows.recent["query_id"].tolist()
    if windows.reference_ids is not None:
        reference_ids = windows.reference_ids
    else:  # a reference without feedback of its own: the earliest stored traffic stands in for it
        earlier = store.oldest_queries(10 * loop.drift_window)
        reference_ids = [q for q in earlier["query_id"] if q not in set(recent_ids)]
    embedder = load_embedder(loop.drift_embedder)
    counts = store.retrieved_counts(recent_ids + reference_ids)
    report = drift_report(
        embedder.encode_queries(windows.recent["text"].tolist()),
        embedder.encode_queries(windows.reference),
        recent_scores=store.feedback_scores(query_ids=recent_ids),
        reference_scores=store.feedback_scores(query_ids=reference_ids),
        recent_retrieved=[counts.get(q, 0) for q in recent_ids],
        reference_retrieved=[counts.get(q, 0) for q in reference_ids],
        thresholds=loop.thresholds(),
    )
    votes = f", {report.feedback_note}" if report.feedback_note else ""  # the share was not judged: say why
    account = (
        f"MMD p={report.mmd_p_value:.3f}, classifier AUC={report.classifier_auc:.2f}, answers rated up "
        f"{_pct(report.positive_ratio_recent)} (reference {_pct(report.positive_ratio_reference)}{votes}); "
        f"{len(recent_ids)} recent queries vs reference: {windows.source}"
    )
    return report, account, windows.source


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


@sensor(
    job=retrain_job,
    minimum_interval_seconds=600,
    default_status=DefaultSensorStatus.STOPPED,
    description=f"Every 10 minutes, when people asked new questions: are they still the kind the models were trained "
    f"for? The latest {setting('drift_window')} questions are compared with a reference: the first "
    f"{setting('drift_reference_window')} asked after the latest promotion or retrain (the generated questions until "
    f"{2 * setting('drift_min_queries')} were asked). Drift is a kernel two-sample test on the questions' embeddings "
    f"saying the two sets differ (MMD, p < {setting('drift_mmd_p_value')}), a classifier telling recent from "
    f"reference questions apart (AUC at least {setting('drift_classifier_auc')}; 0.5 is chance), or the share of "
    f"answers rated up {setting('drift_positive_ratio_drop') * 100:.0f} points lower (once each side has "
    f"{setting('drift_min_votes')} votes). Each measured tick is recorded on query_drift; after "
    f"{setting('drift_consecutive_ticks')} drifted ticks in a row it starts retrain_job (not while a retrain or a "
    "canary runs).",
)
def drift_sensor(context: SensorEvaluationContext, feedback_loop: FeedbackLoop):
    state = json.loads(context.cursor) if context.cursor else {"consecutive": 0, "newest": None}
    store = feedback_loop.store()
    try:
        # Before anything costly: the statistics of an unchanged window would only repeat the last tick's.
        newest_query = store.queries_since(None, 1, newest=True)
        newest = newest_query["query_id"].iloc[-1] if len(newest_query) else None
        if newest is not None and newest == state["newest"]:
            return SkipReason(f"no new queries since the last tick ({state['consecutive']} drifted ticks in a row)")
        state["newest"] = newest
        base = baseline(feedback_loop, context.instance, state, datetime.now(timezone.utc))
        report, account, reference = evaluate_drift(feedback_loop, store, base)
        if report is None:
            return SensorResult(skip_reason=account, cursor=json.dumps(state))
        state["consecutive"] = state["consecutive"] + 1 if report.drifted else 0
        needed = feedback_loop.drift_consecutive_ticks
        observation = AssetObservation(
            DRIFT_ASSET,
            metadata={
                **report.model_dump(exclude={"embedding_shift", "feedback_shift"}),
                "embedding_shift": report.embedding_shift,
                "feedback_shift": report.feedback_shift,
                "drifted": report.drifted,
                "consecutive_drifted_ticks": state["consecutive"],
                "reference": reference,
                "reference_since": base.since.isoformat() if base.since else "the first query",
            },
        )
        progress = f"{account}; {state['consecutive']}/{needed} drifted ticks in a row"
        running = active_retrain(context.instance)
        waiting = None if running or state["consecutive"] < needed else canary_running(feedback_loop)
        if state["consecutive"] < needed or running or waiting:
            reason = f"{progress}; retrain run {running} is in progress" if running else progress
            reason = f"{reason}; {waiting}" if waiting else reason
            return SensorResult(skip_reason=reason, asset_events=[observation], cursor=json.dumps(state))
        request, materialization = retrain_request(feedback_loop, store, reason="drift", run_key=f"drift:{newest}")
        state["consecutive"] = 0
        context.log.info(f"{progress}: requesting retrain_job")
        return SensorResult(
            run_requests=[request], asset_events=[observation, materialization], cursor=json.dumps(state)
        )
    finally:
        store.close()


defs = Definitions(sensors=[drift_sensor])
