"""Drift statistics on hand-computed and synthetic cases; the feedback-volume and drift sensors evaluated with
Dagster's test utilities (progress messages, run keys, cursors, observations, the exported dataset)."""

import json
import math

import numpy as np
import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, SensorResult, SkipReason, build_sensor_context

from rag.feedback import ExpertLabel, FeedbackStore, FeedbackSubmission
from rag.feedback.drift import DriftThresholds, classifier_auc, drift_report, mmd_test
from rag.registry import ModelRegistry
from resources.feedback import FeedbackLoop
from sensors.drift import drift_sensor
from sensors.feedback import EXPERT_MARK_TAG, MARK_TAG, feedback_volume_sensor


def test_mmd_of_two_points_matches_the_hand_computed_value():
    # One point each at distance 1: median heuristic bandwidth = 1, so MMD² = 1 + 1 - 2·exp(-1).
    mmd2, p = mmd_test(np.array([[0.0]]), np.array([[1.0]]), permutations=20)
    assert mmd2 == pytest.approx(2 - 2 / math.e)
    assert 0 < p <= 1


def test_mmd_and_classifier_tell_shifted_samples_apart():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(60, 8)), rng.normal(size=(60, 8))
    shifted = rng.normal(loc=1.0, size=(60, 8))
    _, p_same = mmd_test(a, b, permutations=100)
    _, p_shift = mmd_test(a, shifted, permutations=100)
    assert p_same > 0.05 and p_shift < 0.02  # 1/101 is the smallest p 100 permutations can give
    assert abs(classifier_auc(a, b) - 0.5) < 0.2 and classifier_auc(a, shifted) > 0.9


def test_feedback_shift_alone_counts_as_drift():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 4)), rng.normal(size=(40, 4))
    votes = DriftThresholds().min_votes
    report = drift_report(
        x,
        y,
        recent_scores=[1, -1, -1, -1] * votes,
        reference_scores=[1, 1, 1, -1] * votes,
        recent_retrieved=[5] * 40,
        reference_retrieved=[5] * 40,
        thresholds=DriftThresholds(permutations=50),
    )
    assert report.positive_ratio_recent == 0.25 and report.positive_ratio_reference == 0.75
    assert report.feedback_shift and not report.embedding_shift and report.drifted
    assert report.feedback_note is None


def test_a_feedback_share_from_too_few_votes_is_no_drift():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 4)), rng.normal(size=(40, 4))
    thresholds = DriftThresholds(permutations=50, min_votes=20)

    def report(recent: int, reference: int):
        # Every recent vote down, every reference vote up: as large a drop as there can be.
        return drift_report(
            x,
            y,
            recent_scores=[-1] * recent,
            reference_scores=[1] * reference,
            recent_retrieved=[5] * 40,
            reference_retrieved=[5] * 40,
            thresholds=thresholds,
        )

    few = report(4, 40)
    assert not few.feedback_shift and not few.drifted
    assert few.feedback_note == "not enough votes (4 of 20 in the recent window)"
    assert few.positive_ratio_recent == 0.0  # still reported, only not judged
    thin_reference = report(40, 19)
    assert not thin_reference.feedback_shift
    assert thin_reference.feedback_note == "not enough votes (19 of 20 in the reference)"
    enough = report(20, 20)
    assert enough.feedback_shift and enough.drifted and enough.feedback_note is None
    with pytest.raises(ValueError):
        DriftThresholds(min_votes=0)


def chunks(*ids):
    return [
        {"chunk_id": c, "doc_id": f"d-{c}", "page_start": 1, "page_end": 1, "text": f"text {c}", "rank": i}
        for i, c in enumerate(ids, start=1)
    ]


def make_loop(tmp_path, **overrides) -> FeedbackLoop:
    return FeedbackLoop(
        **{
            "db_url": f"sqlite:///{tmp_path / 'fb.sqlite'}",
            "data_dir": str(tmp_path),
            "volume_threshold": 5,
            "retrain_run_config": {"max_steps": 3},
            "drift_embedder": "wordllama",
            "drift_window": 40,
            "drift_min_queries": 10,
            "drift_consecutive_ticks": 2,
            "drift_permutations": 100,
            **overrides,
        }
    )


@pytest.fixture
def loop(tmp_path):
    return make_loop(tmp_path)


def tick(sensor, instance, loop, cursor=None):
    with build_sensor_context(instance=instance, resources={"feedback_loop": loop}, cursor=cursor) as context:
        return sensor(context)


def rate(store, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        q = store.record_query(f"question {i}", answer="a", chunks=chunks("p1", "p2"))
        store.submit_feedback(
            FeedbackSubmission(query_id=q.query_id, idempotency_key=f"k{i}", passages=[{"chunk_id": "p1", "score": 1}])
        )


def test_feedback_volume_sensor_counts_since_the_last_retrain(loop, tmp_path):
    store = FeedbackStore(loop.db_url)
    rate(store, 3)
    with DagsterInstance.ephemeral() as instance:
        skip = tick(feedback_volume_sensor, instance, loop)
        assert isinstance(skip, SkipReason)
        assert skip.skip_message == "3/5 new feedback events since the start (no finished retrain read the feedback)"
        model_dir = tmp_path / "m"
        model_dir.mkdir()
        (model_dir / "weights.bin").write_bytes(b"0")
        registry = ModelRegistry(tmp_path / "models")
        registry.set_alias(
            "embedder", "production", registry.register("embedder", model_dir, {"base_model": "minilm"}).version
        )
        rate(store, 2, start=3)
        result = tick(feedback_volume_sensor, instance, loop)
        assert isinstance(result, SensorResult) and len(result.run_requests) == 1
        request = result.run_requests[0]
        mark = store.high_water_mark()
        assert (
            request.run_key == f"feedback-volume:{mark}"
            and request.tags[MARK_TAG] == str(mark)
            and result.cursor == str(mark)
        )
        config = request.run_config["ops"]["finetuned_embedder"]["config"]
        assert config["max_steps"] == 3 and request.run_config["ops"]["trained_reranker"]["config"] == config
        stats = json.loads((tmp_path / config["feedback_dataset"] / "stats.json").read_text())
        assert stats["high_water_mark"] == mark and stats["chunk_qrels_positive"] == 5
        assert result.asset_events[0].asset_key.path == ["feedback_dataset"]
        # A finished retrain at this mark resets the count; the message names that retrain, not production.
        instance.add_run(
            DagsterRun(job_name="retrain_job", run_id="r1", status=DagsterRunStatus.SUCCESS, tags={MARK_TAG: str(mark)})
        )
        rate(store, 1, start=5)
        skip = tick(feedback_volume_sensor, instance, loop)
        assert skip.skip_message == "1/5 new feedback events since retrain run r1"
    store.close()


def label(store, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.record_expert_label(
            ExpertLabel(item_id=f"item{i}", grade=i % 3, expert="ann", idempotency_key=f"e{i}"),
            question=f"expert question {i}",
            passage={"chunk_id": f"c{i}", "doc_id": "d.pdf", "text": f"passage {i}"},
        )


def test_expert_labels_count_toward_a_retrain_and_a_retrain_resets_their_count(loop, tmp_path):
    store = FeedbackStore(loop.db_url)
    rate(store, 2)
    label(store, 2)
    with DagsterInstance.ephemeral() as instance:
        skip = tick(feedback_volume_sensor, instance, loop)
        assert (
            skip.skip_message
            == "4/5 new feedback events (2 of them expert labels) since the start "
            "(no finished retrain read the feedback)"
        )
        label(store, 1, start=2)
        result = tick(feedback_volume_sensor, instance, loop)
        request = result.run_requests[0]
        mark, expert_mark = store.high_water_mark(), store.expert_high_water_mark()
        assert request.run_key == f"feedback-volume:{mark}-e{expert_mark}" == f"feedback-volume:{result.cursor}"
        assert request.tags[MARK_TAG] == str(mark) and request.tags[EXPERT_MARK_TAG] == str(expert_mark) == "3"
        dataset = tmp_path / request.run_config["ops"]["finetuned_embedder"]["config"]["feedback_dataset"]
        assert dataset.name == f"hw-{mark:010d}-e{expert_mark:010d}"
        assert json.loads((dataset / "stats.json").read_text())["expert_labels"] == 3
        # The retrain that used them resets both counts: one more expert label is 1 new event, not 6.
        instance.add_run(
            DagsterRun(job_name="retrain_job", run_id="r1", status=DagsterRunStatus.SUCCESS, tags=dict(request.tags))
        )
        label(store, 1, start=3)
        skip = tick(feedback_volume_sensor, instance, loop)
        assert skip.skip_message.startswith("1/5 new feedback events (1 of them expert labels)")
    store.close()


SPACE = [
    "how far is the moon from earth",
    "what fuel do rockets burn",
    "how many planets orbit the sun",
    "why is mars red",
    "what is a black hole",
    "how hot is the surface of venus",
    "who walked on the moon first",
    "how do satellites stay in orbit",
    "what is the largest planet",
    "how old is the universe",
    "what are saturn's rings made of",
    "how fast does light travel",
    "what is a comet tail",
    "how do astronauts sleep in space",
    "what is the milky way",
]
COOKING = [
    "how long to boil an egg",
    "what flour is best for bread",
    "how to make tomato sauce",
    "why does dough rise",
    "how much salt in pasta water",
    "what temperature to roast chicken",
    "how to caramelize onions",
    "what is a roux",
    "how to keep rice from sticking",
    "how to whip cream by hand",
    "why rest a steak",
    "how to make pancakes fluffy",
    "what oil for deep frying",
    "how to poach an egg",
    "how to store fresh basil",
]


def test_drift_sensor_fires_after_consecutive_drifted_ticks(tmp_path):
    reference = tmp_path / "reference.txt"
    reference.write_text("\n".join(COOKING * 2))
    loop = make_loop(tmp_path, drift_reference=str(reference))
    store = FeedbackStore(loop.db_url)
    for q in SPACE[:10]:
        store.record_query(q, answer="a", chunks=chunks("p1"))
    with DagsterInstance.ephemeral() as instance:
        results, cursor = [], None
        for q in SPACE[10:13]:
            store.record_query(q, answer="a", chunks=chunks("p1"))
            results.append(tick(drift_sensor, instance, loop, cursor))
            cursor = results[-1].cursor
        first, second, third = results
        assert not first.run_requests and "1/2 drifted ticks in a row" in first.skip_reason.skip_message
        observation = first.asset_events[0]
        assert observation.asset_key.path == ["query_drift"] and observation.metadata["drifted"].value is True
        assert observation.metadata["classifier_auc"].value > 0.9 and observation.metadata["mmd_p_value"].value < 0.05
        assert len(second.run_requests) == 1 and second.run_requests[0].run_key.startswith("drift:")
        assert second.run_requests[0].tags["trigger"] == "drift"
        assert not third.run_requests and "1/2" in third.skip_reason.skip_message  # the count starts again
        unchanged = tick(drift_sensor, instance, loop, cursor)
        assert isinstance(unchanged, SkipReason) and "no new queries" in unchanged.skip_message
    store.close()


def test_drift_sensor_stays_quiet_on_familiar_questions(tmp_path):
    reference = tmp_path / "reference.txt"
    reference.write_text("\n".join(COOKING[:8] + SPACE[:8]))
    loop = make_loop(tmp_path, drift_reference=str(reference))
    store = FeedbackStore(loop.db_url)
    for q in COOKING[8:] + SPACE[8:]:
        store.record_query(q, answer="a", chunks=chunks("p1"))
    with DagsterInstance.ephemeral() as instance:
        result = tick(drift_sensor, instance, loop)
    assert not result.run_requests and result.asset_events[0].metadata["drifted"].value is False
    store.close()


def test_drift_sensor_judges_the_up_vote_share_only_from_enough_votes(tmp_path):
    reference = tmp_path / "reference.txt"
    reference.write_text("\n".join(COOKING * 2))
    store = FeedbackStore(make_loop(tmp_path).db_url)
    # Familiar questions throughout (no embedding shift): the 10 oldest were rated up, 3 of the 40 recent ones down.
    for i, q in enumerate((COOKING * 4)[:50]):
        asked = store.record_query(q, answer="a", chunks=chunks("p1"))
        if i < 10 or i >= 47:
            store.submit_feedback(
                FeedbackSubmission(query_id=asked.query_id, idempotency_key=f"k{i}", answer_score=1 if i < 10 else -1)
            )
    with DagsterInstance.ephemeral() as instance:
        few = tick(drift_sensor, instance, make_loop(tmp_path, drift_reference=str(reference)))
        enough = tick(drift_sensor, instance, make_loop(tmp_path, drift_reference=str(reference), drift_min_votes=3))
    store.close()
    observation = few.asset_events[0].metadata
    assert observation["embedding_shift"].value is False and observation["drifted"].value is False
    assert "0/2 drifted ticks" in few.skip_reason.skip_message
    assert "not enough votes (3 of 50 in the recent window, 10 of 50 in the reference)" in few.skip_reason.skip_message
    assert enough.asset_events[0].metadata["feedback_shift"].value is True  # the same drop, from enough votes
    assert "1/2 drifted ticks" in enough.skip_reason.skip_message


def test_weekly_retrain_exports_the_feedback_and_requests_a_run(loop, tmp_path):
    from dagster import RunRequest, build_schedule_context, instance_for_test

    from sensors.feedback import weekly_retrain

    store = FeedbackStore(loop.db_url)
    rate(store, 2)
    with instance_for_test() as instance:  # schedules need a persistent instance
        with build_schedule_context(instance=instance, resources={"feedback_loop": loop}) as context:
            request = weekly_retrain(context)
    assert isinstance(request, RunRequest) and request.tags["trigger"] == "weekly"
    assert request.tags[MARK_TAG] == str(store.high_water_mark())
    folder = request.run_config["ops"]["finetuned_embedder"]["config"]["feedback_dataset"]
    assert json.loads((tmp_path / folder / "stats.json").read_text())["chunk_qrels_positive"] == 2
    store.close()


def test_weekly_retrain_waits_for_a_running_retrain(loop):
    from dagster import build_schedule_context, instance_for_test

    from sensors.feedback import weekly_retrain

    with instance_for_test() as instance:
        instance.add_run(DagsterRun(job_name="retrain_job", run_id="r-running", status=DagsterRunStatus.STARTED))
        with build_schedule_context(instance=instance, resources={"feedback_loop": loop}) as context:
            skip = weekly_retrain(context)
    assert isinstance(skip, SkipReason) and skip.skip_message == "retrain run r-running is in progress"
    assert not list(loop.root.glob("**/stats.json"))  # nothing exported for a run that was not requested
