"""The model loop's state in the Dagster UI (issue 29, item 4) and a promotion that met a locked Qdrant folder:

- canary_sensor observes `model_rollout` whenever the loop's state changed (production per kind, rollouts, last gate
  verdicts, last step), also with no canary running, and never on an unchanged tick nor again for a state a job has
  already reported; the metadata names production versions (with an MLflow link when the registry offers one), the
  canary's share and evidence, and the last gate verdict per kind;
- promote_canary_job and rollback_canary_job materialize production_<kind> when production moved;
- a gate check that could not decide says "no verdict", and production_<kind> materialized alone reports the
  candidate's recorded verdict on the gate check instead of leaving a check that never ran;
- a QdrantLockedError is retried by the op, and canary_sensor requests a failed decision again (attempt in run_key);
- a candidate the gate rejects loses the `candidate` alias (its verdict goes to MLflow with the Dagster run that
  gated it), and the release step still reports that verdict and keeps production instead of failing;
- feedback_volume_sensor names the retrain its count starts from (a rejected one restarts it), and the sensors'
  descriptions give numbers and plain words, not code names or bare acronyms.

Fake weights throughout: nothing is embedded (reranker canaries never open Qdrant)."""

import sys
import types

import pytest
from dagster import DagsterInstance, SkipReason, build_sensor_context, materialize

from rag.feedback import FeedbackStore
from rag.index.qdrant import QdrantLockedError
from rag.registry import ModelRegistry
from rag.lifecycle.rollout import read_state, start
from tests.test_rollout_serving import fake_model, simulate, verdict

quiet = lambda _: None  # noqa: E731
QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


@pytest.fixture
def loop(tmp_path):
    """A data dir whose registry has embedder v1 in production, reranker v1 a gated candidate (against no reranker),
    a feedback store, and the resources the sensor and the rollout jobs take."""
    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore

    root = tmp_path / "data"
    registry = ModelRegistry(root / "models")
    e1 = registry.register("embedder", fake_model(tmp_path / "e1"), {"base_model": "minilm"})
    registry.set_alias("embedder", "production", e1.version)
    r1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    registry.set_alias("reranker", "candidate", r1.version)
    verdict(registry, "reranker", r1, production=None)
    store = FeedbackStore(f"sqlite:///{root / 'feedback.sqlite'}")
    feedback = FeedbackLoop(db_url=store.url, data_dir=str(root))
    # As tests/test_rollout_serving.py: a lenient alpha so a few simulated wins decide, no latency breach.
    rollout = Rollout(alpha=0.2, min_latency_samples=5, latency_p95_allowance_ms=10_000)
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "feedback_loop": feedback,
        "rollout": rollout,
        "qdrant": QdrantResource(url=None, path=str(root / "qdrant")),
    }
    with DagsterInstance.ephemeral() as instance:
        yield {
            "root": root,
            "registry": registry,
            "store": store,
            "resources": resources,
            "instance": instance,
            "r1": r1,
        }
    store.close()


def tick(env, cursor=None):
    from sensors.canary import canary_sensor

    resources = {k: env["resources"][k] for k in ("data_store", "feedback_loop", "rollout", "qdrant")}
    with build_sensor_context(instance=env["instance"], resources=resources, cursor=cursor) as context:
        return canary_sensor(context)


def values(metadata) -> dict:
    return {k: getattr(v, "value", v) for k, v in metadata.items()}


def winning_canary(env, wins: int = 8) -> None:
    start("reranker", env["registry"], "v1", 0.5, log=quiet)
    simulate(env["store"], wins, 0, team_liked="canary")


def test_canary_sensor_observes_the_loop_state_only_when_it_changed(loop, monkeypatch):
    # A registry that offers MLflow runs: the production version's link is in the metadata.
    tracking = types.ModuleType("rag.registry.tracking")
    tracking.run_url = lambda registry, mv: f"http://mlflow.test/#/runs/{mv.kind}-{mv.version}"
    monkeypatch.setitem(sys.modules, "rag.registry.tracking", tracking)
    registry, r1 = loop["registry"], loop["r1"]
    gate = registry.resolve("reranker", "v1").metrics["gate"]
    registry.update_metrics(
        "reranker",
        "v1",
        {
            "gate": {
                **gate,
                "outcome": "better",
                "delta_ndcg@10": 0.031,
                "p_value_ndcg@10": 0.012,
                "gated_at": "2025-02-03T04:05:06+00:00",
            }
        },
    )

    first = tick(loop)  # no canary running: before, an idle tick observed nothing
    assert first.skip_reason.skip_message.startswith("no canary running (embedder: production ft-minilm-v1")
    (observation,) = first.asset_events
    seen = values(observation.metadata)
    assert observation.asset_key.path == ["model_rollout"]
    assert seen["embedder_production"] == "ft-minilm-v1" and seen["embedder_production_version"] == "v1"
    assert seen["embedder_production_mlflow"] == "http://mlflow.test/#/runs/embedder-v1"
    assert seen["reranker_production"] == "no reranker (implicit v0)" and "reranker_production_mlflow" not in seen
    assert seen["reranker_gate"] == f"better: {r1.name} vs no reranker (implicit v0)"
    assert (seen["reranker_gate_delta_ndcg@10"], seen["reranker_gate_p_ndcg@10"]) == (0.031, 0.012)
    assert seen["reranker_gate_at"] == "2025-02-03T04:05:06+00:00" and seen["embedder_gate"] == "no gate verdict yet"
    assert seen["canary"] == "none running" and seen["last_step"] == "no rollout step yet"

    assert tick(loop, first.cursor).asset_events == []  # nothing changed: nothing observed

    # The canary starts (by hand, as `rag models rollout start` does): observed with its share and evidence.
    winning_canary(loop, wins=2)
    running = tick(loop, first.cursor)
    (observation,) = running.asset_events
    seen = values(observation.metadata)
    assert seen["canary"].startswith(f"reranker {r1.name} on 50% of sessions since ")
    assert (seen["kind"], seen["stage"], seen["traffic_share"], seen["wins"], seen["losses"]) == (
        "reranker",
        "canary",
        0.5,
        2,
        0,
    )
    assert seen["threshold"] > seen["log_likelihood_ratio"] > 0
    assert "reranker start v1" in seen["last_step"]
    assert tick(loop, running.cursor).asset_events == []

    # Production moving with no canary step (a hand-set alias) is a change too.
    e2 = registry.register("embedder", fake_model(loop["root"].parent / "e2"), {"base_model": "minilm"})
    registry.set_alias("embedder", "production", e2.version)
    moved = tick(loop, running.cursor)
    (observation,) = moved.asset_events
    assert values(observation.metadata)["embedder_production"] == e2.name


def test_by_default_the_sensor_rolls_back_a_canary_that_shows_no_edge_for_futility(loop):
    from resources.rollout import Rollout

    start("reranker", loop["registry"], "v1", 0.5, log=quiet)
    simulate(loop["store"], 14, 0, team_liked="canary")
    simulate(loop["store"], 20, 100, team_liked="production")  # 14 wins to 20: no test crosses at alpha 0.2
    settings = dict(alpha=0.2, min_latency_samples=5, latency_p95_allowance_ms=10_000)
    loop["resources"]["rollout"] = Rollout(**settings, futility_win_share=None)
    assert tick(loop).run_requests == []  # futility off: the canary runs on
    loop["resources"]["rollout"] = Rollout(**settings)  # the default: futility at a win share of 0.6
    (request,) = tick(loop).run_requests
    assert request.job_name == "rollback_canary_job"


def test_rollout_jobs_materialize_production_and_the_sensor_does_not_repeat_them(loop):
    from orchestration.rollout import promote_canary_job, rollback_canary_job

    env, registry, r1 = loop, loop["registry"], loop["r1"]
    winning_canary(env)
    decided = tick(env)
    (request,) = decided.run_requests
    assert request.job_name == "promote_canary_job"
    run = promote_canary_job.execute_in_process(
        run_config={**request.run_config, **QUIET_LOGS},
        tags=request.tags,
        resources=env["resources"],
        instance=env["instance"],
    )
    assert run.success and registry.aliases()["reranker"].get("production") == "v1"
    events = {
        e.asset_key.to_user_string(): values(e.materialization.metadata) for e in run.get_asset_materialization_events()
    }
    assert set(events) == {"model_rollout", "production_reranker"}
    assert (
        events["production_reranker"]["action"],
        events["production_reranker"]["production"],
        events["production_reranker"]["production_version"],
        events["production_reranker"]["previous"],
    ) == ("promoted", r1.name, "v1", "no reranker (implicit v0)")
    assert events["production_reranker"]["by"] == f"promote_canary_job run {run.run_id}"
    assert (
        events["model_rollout"]["reranker_production"] == r1.name
        and events["model_rollout"]["canary"] == "none running"
    )

    # The job reported this state: the sensor's next tick (whose cursor still holds the canary) observes nothing.
    after = tick(env, decided.cursor)
    assert after.asset_events == [] and after.skip_reason.skip_message.startswith("no canary running")

    # An operator's revert from the UI moves production back: production_reranker says so.
    undo = rollback_canary_job.execute_in_process(
        run_config={"ops": {"rollback_canary_op": {"config": {"kind": "reranker"}}}, **QUIET_LOGS},
        resources=env["resources"],
        instance=env["instance"],
    )
    assert undo.success
    events = {
        e.asset_key.to_user_string(): values(e.materialization.metadata)
        for e in undo.get_asset_materialization_events()
    }
    assert (
        events["production_reranker"]["action"],
        events["production_reranker"]["production"],
        events["production_reranker"]["previous"],
    ) == ("reverted", "no reranker (implicit v0)", r1.name)
    assert tick(env, after.cursor).asset_events == []

    # Ending a canary moves no production: only model_rollout.
    r2 = registry.register("reranker", fake_model(env["root"].parent / "r2"), {"base_model": "minilm"})
    verdict(registry, "reranker", r2, production=None)
    start("reranker", registry, "v2", 0.5, log=quiet)
    stopped = rollback_canary_job.execute_in_process(
        run_config={
            "ops": {"rollback_canary_op": {"config": {"kind": "reranker", "candidate": "v2", "reason": "guardrail"}}},
            **QUIET_LOGS,
        },
        resources=env["resources"],
        instance=env["instance"],
    )
    assert stopped.success and read_state(registry, "reranker").stage == "rolled_back"
    assert [e.asset_key.to_user_string() for e in stopped.get_asset_materialization_events()] == ["model_rollout"]


def _locked_first(monkeypatch, times: int):
    """orchestration.rollout.conclude raising QdrantLockedError on its first `times` calls (another process holds
    the embedded Qdrant folder), then concluding for real; returns the list of calls."""
    import orchestration.rollout as rollout_jobs

    real, calls = rollout_jobs.conclude, []

    def conclude(*args, **kwargs):
        calls.append(args[2])
        if len(calls) <= times:
            raise QdrantLockedError("the embedded Qdrant folder is in use by another process (test)")
        return real(*args, **kwargs)

    monkeypatch.setattr(rollout_jobs, "conclude", conclude)
    monkeypatch.setattr(rollout_jobs, "LOCK_RETRY_SECONDS", 0)
    return calls


def test_promote_canary_job_retries_a_locked_qdrant_folder(loop, monkeypatch):
    from orchestration.rollout import promote_canary_job

    winning_canary(loop)
    (request,) = tick(loop).run_requests
    calls = _locked_first(monkeypatch, times=1)
    run = promote_canary_job.execute_in_process(
        run_config={**request.run_config, **QUIET_LOGS},
        tags=request.tags,
        resources=loop["resources"],
        instance=loop["instance"],
    )
    assert run.success and calls == ["promote", "promote"]  # the op's retry concluded the canary
    assert [e.event_type_value for e in run.all_events].count("STEP_UP_FOR_RETRY") == 1
    assert loop["registry"].aliases()["reranker"].get("production") == "v1"
    assert read_state(loop["registry"], "reranker").stage == "production"


def test_canary_sensor_requests_a_decision_again_after_a_locked_qdrant_failure(loop, monkeypatch):
    import sensors.canary as canary
    from orchestration import rollout as rollout_jobs
    from orchestration.rollout import promote_canary_job

    env = loop
    monkeypatch.setattr(rollout_jobs, "LOCK_RETRIES", 1)
    winning_canary(env)

    def launch(request):
        return promote_canary_job.execute_in_process(
            run_config={**request.run_config, **QUIET_LOGS},
            tags=request.tags,
            resources=env["resources"],
            instance=env["instance"],
            raise_on_error=False,
        )

    (first,) = tick(env).run_requests
    calls = _locked_first(monkeypatch, times=2)  # the run and its one retry both find the folder locked
    failed = launch(first)
    assert (
        not failed.success
        and calls == ["promote", "promote"]
        and read_state(env["registry"], "reranker").stage == "canary"
    )

    # Before: "failed: see its logs" and the canary stayed stuck. Now the next tick requests it again.
    (again,) = tick(env).run_requests
    assert again.run_key == f"{first.run_key}:attempt2" and again.tags["rollout/attempt"] == "2"
    assert again.run_config == first.run_config
    assert launch(again).success and env["registry"].aliases()["reranker"].get("production") == "v1"
    assert tick(env).skip_reason.skip_message.startswith("no canary running")

    # A run that keeps failing on the lock stops being retried after MAX_ATTEMPTS runs, and says so.
    r2 = env["registry"].register("reranker", fake_model(env["root"].parent / "r2"), {"base_model": "minilm"})
    verdict(env["registry"], "reranker", r2, production="v1")
    start("reranker", env["registry"], "v2", 0.5, log=quiet)
    simulate(env["store"], 8, 100, team_liked="canary")
    monkeypatch.setattr(canary, "MAX_ATTEMPTS", 2)
    calls = _locked_first(monkeypatch, times=100)
    (request,) = tick(env).run_requests
    assert not launch(request).success
    (retry,) = tick(env).run_requests
    assert retry.run_key.endswith(":attempt2") and not launch(retry).success
    stuck = tick(env)
    assert (
        stuck.run_requests == []
        and " failed with QdrantLockedError in 2 of 2 attempts: see its logs, then roll back (rollback_canary_job)"
        in stuck.skip_reason.skip_message
    )


def test_a_failure_that_is_not_a_locked_folder_is_not_retried(loop, monkeypatch):
    import orchestration.rollout as rollout_jobs
    from orchestration.rollout import promote_canary_job

    winning_canary(loop)
    (request,) = tick(loop).run_requests

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(rollout_jobs, "conclude", broken)
    run = promote_canary_job.execute_in_process(
        run_config={**request.run_config, **QUIET_LOGS},
        tags=request.tags,
        resources=loop["resources"],
        instance=loop["instance"],
        raise_on_error=False,
    )
    assert not run.success
    after = tick(loop)
    assert after.run_requests == [] and "failed (not a retryable error): see its logs" in after.skip_reason.skip_message


# --- gate checks ------------------------------------------------------------------------------------------------
def _check_evaluations(instance, check_name: str):
    from dagster import AssetCheckKey, AssetKey

    asset = {"trained_reranker_gate": "trained_reranker", "finetuned_embedder_gate": "finetuned_embedder"}[check_name]
    key = AssetCheckKey(AssetKey(asset), check_name)
    return instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)


def _gate_check_alone(env):
    """trained_reranker_gate executed on its own (the candidate is the one the registry holds)."""
    from dagster import AssetSelection

    import assets.training as training

    return materialize(
        [training.trained_reranker, training.trained_reranker_gate],
        instance=env["instance"],
        resources=env["resources"],
        selection=AssetSelection.checks(training.trained_reranker_gate),
        raise_on_error=False,
        run_config=QUIET_LOGS,
    )


def test_a_gate_that_reaches_no_verdict_says_so_and_observes_the_loop(loop, monkeypatch):

    import assets.training as training
    from rag.training.gate import TooFewGateQuestions

    def too_few(kind, tables, registry, candidate, settings):
        raise TooFewGateQuestions("only 4 held-out gate question(s) with a relevant chunk, the gate needs at least 5")

    monkeypatch.setattr(training, "gate_candidate", too_few)
    result = _gate_check_alone(loop)
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.severity.value == "WARN"
    assert evaluation.metadata["verdict"].value == (
        "no verdict: only 4 held-out gate question(s) with a relevant chunk, the gate needs at least 5"
    )
    (observation,) = [
        e.asset_observation_data.asset_observation
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]
    assert observation.asset_key.path == ["model_rollout"]
    assert observation.description.startswith("gate: no verdict: only 4 held-out")


def test_production_materialized_alone_reports_the_recorded_gate_verdict(loop):
    from dagster import AssetCheckSeverity

    from assets.training import production_reranker
    from resources.rollout import Rollout

    env, registry = loop, loop["registry"]
    resources = {"data_store": env["resources"]["data_store"], "rollout": Rollout(promotion="direct")}

    def release_alone():
        return materialize(
            [production_reranker],
            instance=env["instance"],
            resources=resources,
            raise_on_error=False,
            run_config=QUIET_LOGS,
        )

    # A candidate never gated: the check shows "no verdict" (before: a check that never ran, "0 / 1 passed").
    r2 = registry.register("reranker", fake_model(env["root"].parent / "r2"), {"base_model": "minilm"})
    registry.set_alias("reranker", "candidate", r2.version)
    refused = release_alone()
    assert not refused.success  # release refuses an ungated candidate, as before
    record = _check_evaluations(env["instance"], "trained_reranker_gate")
    evaluation = record.event.dagster_event.event_specific_data
    assert record.run_id == refused.run_id and not evaluation.passed and evaluation.severity == AssetCheckSeverity.WARN
    assert evaluation.metadata["verdict"].value.startswith(
        f"no verdict: {r2.name} vs no reranker (hybrid order, implicit v0): the gate "
        "never ran on it; run trained_reranker_gate"
    )

    # The gated candidate: its recorded, passing verdict is the check's result, and the release step observes the loop.
    registry.set_alias("reranker", "candidate", "v1")
    released = release_alone()
    assert released.success and registry.aliases()["reranker"]["production"] == "v1"
    record = _check_evaluations(env["instance"], "trained_reranker_gate")
    evaluation = record.event.dagster_event.event_specific_data
    assert record.run_id == released.run_id and evaluation.passed
    assert evaluation.metadata["verdict"].value == "passed: passes (better)"
    observations = [
        e.asset_observation_data.asset_observation
        for e in released.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]
    assert [values(o.metadata)["reranker_production"] for o in observations] == [env["r1"].name]


def test_canary_sensor_skips_with_a_reason_while_an_unfinished_promotion_waits_for_a_locked_qdrant(loop, monkeypatch):
    import sensors.canary as canary

    def locked(*_args, **_kwargs):
        raise QdrantLockedError("the embedded Qdrant folder is in use by another process (test)")

    # Before: this branch named SkipReason without importing it, so the tick died with a NameError.
    monkeypatch.setattr(canary, "recover", locked)
    skipped = tick(loop)  # a bare SkipReason: no run requested, nothing observed
    assert isinstance(skipped, SkipReason)
    message = skipped.skip_message
    assert message.startswith(
        "an unfinished promotion or rollback waits for Qdrant (the embedded Qdrant folder is in use"
    )
    assert "completes on the next tick" in message


# --- a rejected candidate, the feedback count after it, and the sensors' descriptions (issue 49, item 2) ---------
def _rejecting_gate(monkeypatch) -> None:
    """rag.training.pipeline.gate_candidate itself, with what it reads faked: six held-out questions on which the
    candidate ranks far below production (a significant loss: outcome "worse")."""
    import pandas as pd

    import rag.rerank
    from rag.training import pipeline
    from rag.training.data import TrainingData
    from rag.training.gate import gate_decision

    def scores(values):
        return pd.DataFrame(
            {"qid": [f"q{i}" for i in range(6)], "ndcg@10": values, "mrr@10": values, "recall@20": [1.0] * 6}
        )

    def worse(first, current, candidate, gate, settings, **_):
        return gate_decision(scores([0.9, 0.8, 0.9, 0.7, 0.8, 0.9]), scores([0.1, 0.2, 0.1, 0.2, 0.1, 0.3]), settings)

    inputs = pipeline.Inputs("paragraph", pd.DataFrame({"chunk_id": ["c"], "text": ["t"]}), TrainingData([]), "qa1")
    monkeypatch.setattr(pipeline, "load_inputs", lambda tables, config: inputs)
    monkeypatch.setattr(pipeline, "decision_questions", lambda gate, chunks, settings: (None, chunks, 0))
    monkeypatch.setattr(rag.rerank, "load_reranker", lambda name, registry=None: name)
    monkeypatch.setattr(pipeline, "reranker_gate", worse)


def test_a_rejected_candidate_loses_its_alias_and_the_release_step_still_keeps_production(loop, monkeypatch):

    import assets.training as training
    from rag.registry.tracking import GATE_RUN_TAG
    from resources.rollout import Rollout

    env, registry, r1 = loop, loop["registry"], loop["r1"]
    _rejecting_gate(monkeypatch)
    gated = _gate_check_alone(env)
    (evaluation,) = gated.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["outcome"].value == "worse"
    assert evaluation.metadata["candidate_alias"].value == f"removed from {r1.name}: the gate keeps production"
    assert evaluation.description.endswith(
        f"The `candidate` alias was removed from {r1.name}: the gate keeps production."
    )
    assert registry.aliases()["reranker"] == {}  # MLflow's alias editor offers no candidate the gate refused
    # The verdict went to MLflow with the Dagster run that gated it.
    gate_run = registry.resolve("reranker", r1.version)._tags[GATE_RUN_TAG]
    assert registry.mlflow_client().get_run(gate_run).data.tags["gate.dagster.run_id"] == gated.run_id

    # The release step of the same retrain (or materialized alone) finds no alias: it reports the verdict that took
    # it and keeps production, a normal end of the run, instead of failing with "no reranker candidate".
    released = materialize(
        [training.production_reranker],
        instance=env["instance"],
        resources={"data_store": env["resources"]["data_store"], "rollout": Rollout()},
        raise_on_error=False,
        run_config=QUIET_LOGS,
    )
    assert released.success and not released.get_asset_materialization_events()
    record = _check_evaluations(env["instance"], "trained_reranker_gate")
    reported = record.event.dagster_event.event_specific_data
    assert record.run_id == released.run_id and not reported.passed
    assert reported.metadata["verdict"].value.startswith("worse: the gate rejected it against no reranker")
    assert registry.aliases()["reranker"] == {}


def _rate(store: FeedbackStore, n: int, start: int) -> None:
    from rag.feedback import FeedbackSubmission

    for i in range(start, start + n):
        chunks = [{"chunk_id": "p1", "doc_id": "d.md", "text": "a passage", "rank": 1}]
        q = store.record_query(f"question {i}", answer="a", chunks=chunks)
        store.submit_feedback(
            FeedbackSubmission(query_id=q.query_id, idempotency_key=f"k{i}", passages=[{"chunk_id": "p1", "score": 1}])
        )


def test_the_feedback_count_restarts_after_a_rejected_retrain_and_names_the_run_it_counts_from(loop):
    """The issue saw "10/100 new feedback events ... since the start" after a rejected retrain: the count had
    restarted, but the message named production (still the base model), not the retrain it counted from."""
    from dagster import DagsterRun, DagsterRunStatus

    from sensors.feedback import MARK_TAG, feedback_volume_sensor

    env, store = loop, loop["store"]

    def tick_feedback() -> str:
        with build_sensor_context(
            instance=env["instance"], resources={"feedback_loop": env["resources"]["feedback_loop"]}
        ) as context:
            return feedback_volume_sensor(context).skip_message

    _rate(store, 3, 0)
    n = env["resources"]["feedback_loop"].volume_threshold
    assert tick_feedback() == f"3/{n} new feedback events since the start (no finished retrain read the feedback)"
    # The retrain that read those 3 succeeded with its candidate rejected (production stays): the count restarts.
    env["instance"].add_run(
        DagsterRun(
            job_name="retrain_job",
            run_id="5e1ec7ed-0000-4000-8000-000000000000",
            status=DagsterRunStatus.SUCCESS,
            tags={MARK_TAG: str(store.high_water_mark())},
        )
    )
    _rate(store, 2, 3)
    assert tick_feedback() == f"2/{n} new feedback events since retrain run 5e1ec7ed"
    # A retrain launched without the exported feedback (the Launchpad, `rag retrain --no-feedback`) read none of
    # it: the count goes on, still from the run that did.
    env["instance"].add_run(DagsterRun(job_name="retrain_job", run_id="n0feed", status=DagsterRunStatus.SUCCESS))
    _rate(store, 1, 5)
    assert tick_feedback() == f"3/{n} new feedback events since retrain run 5e1ec7ed"


def test_sensor_descriptions_say_numbers_and_plain_words_not_code_names():
    """What the Automation page shows: how often each sensor looks, its thresholds as numbers, and any statistical
    test named with what it asks, never a class attribute or a bare acronym."""
    import re

    from orchestration.definitions import defs
    from sensors.feedback import setting

    descriptions = {s.name: s.description for s in defs.sensors} | {s.name: s.description for s in defs.schedules}
    for name, text in descriptions.items():
        assert text and not re.search(r"\b[A-Z][a-z]+[A-Z]\w*\.\w+", text), (name, text)  # FeedbackLoop.x
        assert "mSPRT" not in text, (name, text)
    assert (
        f"at {setting('volume_threshold')} (RAG_RETRAIN_FEEDBACK_THRESHOLD)" in descriptions["feedback_volume_sensor"]
    )
    assert descriptions["feedback_volume_sensor"].startswith("Every 5 minutes:")
    drift = descriptions["drift_sensor"]
    assert "latest 200 questions" in drift and "MMD, p < 0.01" in drift and "AUC at least 0.7; 0.5 is chance" in drift
    assert "after 3 drifted ticks in a row" in drift
    canary = descriptions["canary_sensor"]
    assert "10% of sessions" in canary and "at most a 5% chance of promoting one no better" in canary
    assert "after 2000 canary questions or 14 days" in canary
