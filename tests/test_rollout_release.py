"""What retrain_job does with a candidate whose gate passed, by the rollout resource's promotion policy:
"canary" starts its canary (collections built, state canary, production and its serving alias untouched) and says so
in production_embedder's metadata; "direct" promotes as before, but is refused while a canary runs instead of
replacing production under it; "auto" (the default) promotes what the gate found significantly better and starts a
canary for what it found only no worse (or queues it behind a running canary, which a significant gain of any
kind pre-empts). While a canary runs every learner retrains, its own kind too. An operator can start a
canary over the gate with force_reason, logged and recorded, and such a canary is promoted only as a recorded forced
promotion.

Fake weights where nothing is embedded; a real MiniLM where production_embedder builds collections."""

from pathlib import Path

import pytest
from dagster import DagsterInstance, RunRequest, build_sensor_context, materialize

from rag.feedback import FeedbackStore, FeedbackSubmission
from rag.registry import ModelRegistry
from rag.rollout import IllegalTransition
from rag.lifecycle.rollout import conclude, history, read_state, roll_back_rollout, start
from rag.lifecycle.verdicts import PromotionRefused
from tests.test_rollout_serving import TEXTS, chunk_table, fake_model, registry, verdict  # noqa: F401 - fixture
from tests.verdicts import sound, won

quiet = lambda _: None  # noqa: E731
QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


@pytest.fixture
def deployed(tmp_path, monkeypatch):
    """A data dir with chunk set "t", MiniLM v1 promoted to production (collection + serving alias t__production)
    and a MiniLM v2 candidate whose gate passed against v1; a Dagster instance that knows the chunk set."""
    from rag.embedding import _minilm_dir
    from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
    from rag.store import CHUNKS_TABLE, TableStore
    from rag.lifecycle.promotion import promote
    from rag.lifecycle.target import ServingTarget

    root = tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    for name in ("QDRANT_URL", "RAG_QDRANT_PATH", "RAG_PROMOTION_POLICY"):
        monkeypatch.delenv(name, raising=False)
    tables = TableStore(root / "tables")
    tables.write(chunk_table(TEXTS), CHUNKS_TABLE, "t")
    registry = ModelRegistry(root / "models")
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    v1 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    promote(
        "embedder",
        registry,
        v1,
        target=ServingTarget.of_client(tables, get_client(qdrant), ["t"]),
        log=quiet,
        force_reason="the starting point",
    )
    production_collection = alias_target(get_client(qdrant), "t__production")
    close_client(qdrant)
    v2 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    registry.set_alias("embedder", "candidate", v2.version)
    verdict(registry, "embedder", v2, production="v1")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", ["t"])
    yield {
        "root": root,
        "registry": registry,
        "qdrant": qdrant,
        "instance": instance,
        "production_collection": production_collection,
    }
    close_client(qdrant)


def release_step(env, **policy):
    """Materialize production_embedder alone (its gate verdict is already recorded) with a rollout resource."""
    from assets.training import production_embedder
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore

    resources = {
        "data_store": DataStore(data_dir=str(env["root"])),
        "rollout": Rollout(**policy),
        "qdrant": QdrantResource(url=None, path=str(env["qdrant"].path)),
    }
    return materialize(
        [production_embedder],
        instance=env["instance"],
        resources=resources,
        raise_on_error=False,
        run_config=QUIET_LOGS,
    )


def failure_message(result) -> str:
    assert not result.success
    (event,) = [e for e in result.all_events if e.is_step_failure]
    error, messages = event.step_failure_data.error, []
    while error is not None:
        messages.append(error.message)
        error = error.cause
    return " ".join(messages)


def aliases(env) -> dict:
    """Where the serving alias and the candidates' own aliases point (None: no such alias)."""
    from rag.index.qdrant import alias_target, close_client, get_client

    try:
        client = get_client(env["qdrant"])
        return {a: alias_target(client, a) for a in ("t__production", "t__ft-minilm-v2", "t__ft-minilm-v3")}
    finally:
        close_client(env["qdrant"])


def test_under_the_canary_policy_a_passing_candidate_starts_a_canary_and_production_stays(deployed):
    env, registry = deployed, deployed["registry"]
    result = release_step(env, promotion="canary", traffic_share=0.25)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert metadata["action"] == "canary" and metadata["production"] == "ft-minilm-v1"
    assert metadata["canary"].startswith(
        "canary started: ft-minilm-v2 at 25% of sessions (production ft-minilm-v1 unchanged"
    )
    state = read_state(registry, "embedder")
    assert (state.stage, state.candidate_version, state.production_version, state.traffic_share) == (
        "canary",
        "v2",
        "v1",
        0.25,
    )
    assert state.force_reason is None and state.reason.startswith("gate found it no worse than ft-minilm-v1")
    # Production did not move: registry alias, serving alias; the candidate's own collection was built for the canary.
    assert registry.aliases()["embedder"] == {"production": "v1", "candidate": "v2"}
    served = aliases(env)
    assert served["t__production"] == env["production_collection"] and served["t__ft-minilm-v2"].startswith(
        "t__ft-minilm-v2__"
    )
    assert [e["step"] for e in history(registry)] == ["start"]
    assert registry.resolve("embedder", "v2").metrics["canary_start"]["forced"] is False


def test_under_the_default_policy_a_significantly_better_candidate_is_promoted_directly(deployed):
    env, registry = deployed, deployed["registry"]
    result = release_step(env)  # the default policy, "auto"
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (metadata["action"], metadata["production"], metadata["previous"]) == (
        "promoted",
        "ft-minilm-v2",
        "ft-minilm-v1",
    )
    assert registry.aliases()["embedder"] == {"production": "v2"} and read_state(registry, "embedder") is None
    assert aliases(env)["t__production"].startswith("t__ft-minilm-v2__")
    assert registry.resolve("embedder", "v2").metrics["promotion"]["forced"] is False


def test_a_direct_promotion_is_refused_while_a_canary_runs_and_every_learner_retrains(deployed, tmp_path):
    from rag.embedding import _minilm_dir
    from resources.feedback import FeedbackLoop
    from sensors.feedback import feedback_volume_sensor

    env, registry = deployed, deployed["registry"]
    start("embedder", registry, "v2", 0.1, log=quiet)  # e.g. an operator's canary (no collections needed here)
    v3 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    registry.set_alias("embedder", "candidate", v3.version)
    verdict(registry, "embedder", v3, production="v1")  # passed, against today's production

    message = failure_message(release_step(env, promotion="direct"))
    assert (
        "refusing to promote embedder ft-minilm-v3 directly: a canary of embedder ft-minilm-v2 is running (on 10% "
        "of sessions"
        in message
        and "Production is unchanged" in message
    )
    # The canary policy does not start a second canary either: v3 waits, marked in its manifest, nothing started.
    queued = release_step(env, promotion="canary")
    assert queued.success
    (event,) = queued.get_asset_materialization_events()
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (metadata["action"], metadata["waiting_behind"]) == ("waiting", "embedder ft-minilm-v2")
    assert registry.resolve("embedder", "v3").metrics["canary_queued"]["behind"] == "embedder ft-minilm-v2"
    # Nothing moved and nothing was built for v3.
    assert registry.aliases()["embedder"] == {"production": "v1", "candidate": "v3"}
    assert read_state(registry, "embedder").stage == "canary" and [e["step"] for e in history(registry)] == ["start"]
    assert aliases(env)["t__production"] == env["production_collection"] and aliases(env)["t__ft-minilm-v3"] is None

    # feedback_volume_sensor holds the retrain while the canary runs, and requests it once the canary is decided.
    store = FeedbackStore(f"sqlite:///{env['root'] / 'feedback.sqlite'}")
    for i in range(3):
        q = store.record_query(
            f"question {i}",
            answer="a",
            chunks=[{"chunk_id": "cats", "doc_id": "cats.md", "text": TEXTS["cats"], "rank": 1}],
        )
        store.submit_feedback(
            FeedbackSubmission(
                query_id=q.query_id, idempotency_key=f"k{i}", passages=[{"chunk_id": "cats", "score": 1}]
            )
        )
    loop = FeedbackLoop(db_url=store.url, data_dir=str(env["root"]), volume_threshold=3)

    def tick():
        with build_sensor_context(instance=env["instance"], resources={"feedback_loop": loop}) as context:
            return feedback_volume_sensor(context)

    # While the embedder's canary runs every learner retrains, the embedder too: people's feedback keeps growing
    # while interleavings tie, and a later embedder the gate finds significantly better supersedes the canary.
    (during,) = tick().run_requests
    assert isinstance(during, RunRequest) and during.asset_selection is None
    embedder_only = FeedbackLoop(db_url=store.url, data_dir=str(env["root"]), volume_threshold=3, learners=["embedder"])
    with build_sensor_context(instance=env["instance"], resources={"feedback_loop": embedder_only}) as context:
        (alone,) = feedback_volume_sensor(context).run_requests
    assert {k.to_user_string() for k in alone.asset_selection} == {"finetuned_embedder", "production_embedder"}
    roll_back_rollout("embedder", registry, "test", log=quiet)
    store.close()
    # With the canary decided, the direct promotion of v3 goes through.
    assert release_step(env, promotion="direct").success and registry.aliases()["embedder"]["production"] == "v3"


def test_a_significantly_better_candidate_of_another_kind_ends_an_undecided_canary(tmp_path, registry):
    """Under the default policy an offline win on held-out questions pre-empts a canary of another kind that has not
    decided (waiting behind it would hold a known gain back up to the canary's horizon); a candidate found only no
    worse still waits."""
    from rag.lifecycle.rollout import release

    release("embedder", registry, registry.resolve("embedder", "v2"), policy="canary", log=quiet)
    r1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    not_worse_verdict(registry, "reranker", r1, production=None)
    assert release("reranker", registry, r1, policy="auto", log=quiet)["action"] == "waiting"
    assert read_state(registry, "embedder").stage == "canary"
    r2 = registry.register("reranker", fake_model(tmp_path / "r2"), {"base_model": "minilm"})
    verdict(registry, "reranker", r2, production=None)  # significantly better
    outcome = release("reranker", registry, r2, policy="auto", log=quiet)
    assert outcome["action"] == "promoted" and registry.aliases()["reranker"]["production"] == r2.version
    ended = read_state(registry, "embedder")
    assert ended.stage == "rolled_back" and f"pre-empted by reranker {r2.name}" in ended.reason
    assert registry.aliases()["embedder"]["production"] == "v1"  # the embedder's canary never moved production


def test_a_candidate_gated_while_a_canary_runs_waits_and_canary_sensor_starts_it_afterwards(tmp_path, registry):
    # One retrain_job gates an embedder and a reranker: the embedder's canary starts, the reranker's waits.
    from rag.lifecycle.rollout import queued_candidate, release
    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore
    from sensors.canary import canary_sensor

    release("embedder", registry, registry.resolve("embedder", "v2"), policy="canary", log=quiet)
    r1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    registry.set_alias("reranker", "candidate", r1.version)
    not_worse_verdict(registry, "reranker", r1, production=None)
    outcome = release("reranker", registry, r1, policy="canary", log=quiet)
    assert outcome["action"] == "waiting" and outcome["behind"] == "embedder ft-minilm-v2"
    assert "canary_sensor starts ce-" in outcome["summary"] and read_state(registry, "reranker") is None
    assert queued_candidate(registry, "reranker").version == "v1"
    # A candidate the gate rejected is not queued: the same refusal as start() gives.
    r2 = registry.register("reranker", fake_model(tmp_path / "r2"), {"base_model": "minilm"})
    verdict(registry, "reranker", r2, passed=False, production=None)
    with pytest.raises(PromotionRefused, match="cannot queue a canary"):
        release("reranker", registry, r2, policy="canary", log=quiet)
    assert "canary_queued" not in registry.resolve("reranker", "v2").metrics

    resources = {
        "data_store": DataStore(data_dir=str(tmp_path)),
        "rollout": Rollout(promotion="canary", traffic_share=0.3),
        "feedback_loop": FeedbackLoop(data_dir=str(tmp_path)),
        "qdrant": QdrantResource(url=None, path=str(tmp_path / "qdrant")),
    }

    def tick():
        with build_sensor_context(instance=DagsterInstance.ephemeral(), resources=resources) as context:
            return canary_sensor(context)

    conclude("embedder", registry, "rollback", "test: the embedder's canary ends", candidate="v2", log=quiet)
    (request,) = tick().run_requests
    assert isinstance(request, RunRequest) and request.job_name == "start_canary_job"
    assert request.run_key == "canary-start:reranker:v1"
    assert request.run_config["ops"]["start_canary_op"]["config"] == {
        "kind": "reranker",
        "candidate": "v1",
        "traffic_share": 0.3,
    }
    # Once its canary has started (what that job does), it is no longer waiting.
    start("reranker", registry, "v1", 0.3, log=quiet)
    assert queued_candidate(registry, "reranker") is None
    # A queued candidate whose verdict is against a production that has changed since is not started.
    conclude("reranker", registry, "rollback", "test", candidate="v1", log=quiet)
    r3 = registry.register("reranker", fake_model(tmp_path / "r3"), {"base_model": "minilm"})
    registry.set_alias("reranker", "candidate", r3.version)
    not_worse_verdict(registry, "reranker", r3, production="v1")  # v1 never became production
    registry.update_metrics("reranker", r3.version, {"canary_queued": {"at": "2025-01-01", "behind": "embedder x"}})
    assert queued_candidate(registry, "reranker") is None and tick().run_requests == []


def test_an_operator_can_start_a_canary_over_the_gate_logged_and_recorded(tmp_path, registry):
    v3 = registry.register("embedder", fake_model(tmp_path / "m3"), {"base_model": "minilm"})
    verdict(registry, "embedder", v3, passed=False, production="v1")
    with pytest.raises(PromotionRefused, match="cannot start a canary: .*the gate rejected it.*force_reason"):
        start("embedder", registry, "v3", log=quiet)
    with pytest.raises(ValueError, match="force_reason must say why"):
        start("embedder", registry, "v3", force_reason="  ", log=quiet)
    assert read_state(registry, "embedder") is None and history(registry) == []

    lines = []
    state = start(
        "embedder", registry, "v3", 0.5, force_reason="rollback drill: a deliberately worse model", log=lines.append
    )
    assert state.stage == "canary" and state.force_reason == "rollback drill: a deliberately worse model"
    assert state.reason.startswith("operator override of the gate (the gate rejected it against ft-minilm-v1")
    assert any(
        line.startswith(
            "WARNING: starting a canary of embedder ft-minilm-v3 without a valid gate verdict (the gate rejected it"
        )
        for line in lines
    )
    (entry,) = history(registry)
    assert entry["override"]["forced"] is True and "the gate rejected it" in entry["override"]["gate_refusal"]
    record = registry.resolve("embedder", "v3").metrics["canary_start"]
    assert record["forced"] is True and record["force_reason"] == "rollback drill: a deliberately worse model"
    # The override bypasses the gate only: still one canary at a time.
    with pytest.raises(IllegalTransition, match="a canary of embedder ft-minilm-v3 is running"):
        start("embedder", registry, "v2", force_reason="another", log=quiet)

    # Rolled back as any canary (the benchmark's worse candidate), the rollback carries the override in the manifest.
    conclude("embedder", registry, "rollback", "loses", candidate="v3", log=quiet)
    assert registry.resolve("embedder", "v3").metrics["canary"]["force_reason"].startswith("rollback drill")
    assert registry.aliases()["embedder"]["production"] == "v1"


def test_a_forced_canary_that_wins_is_promoted_as_a_recorded_forced_promotion(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})  # v1, never gated
    start("reranker", registry, "v1", force_reason="operator: try it on users", log=quiet)
    state = conclude(
        "reranker", registry, "promote", "wins 40 / losses 10", candidate="v1", evidence_source=won(40, 10), log=quiet
    )
    assert state.stage == "production" and registry.aliases()["reranker"]["production"] == "v1"
    promotion = registry.resolve("reranker", "v1").metrics["promotion"]
    assert promotion["forced"] is True and promotion["force_reason"].startswith(
        "canary started with an operator override of the gate (operator: try it on users) and won: "
    )
    assert (
        "wins 40 / losses 10" in promotion["force_reason"]
    )  # the evidence conclude() read again, not the caller's word

    # A forced canary is never promoted over a production that moved during it.
    registry.register("reranker", fake_model(tmp_path / "r2"), {"base_model": "minilm"})
    start("reranker", registry, "v2", force_reason="drill", log=quiet)
    v3 = registry.register("reranker", fake_model(tmp_path / "r3"), {"base_model": "minilm"})
    registry.set_alias("reranker", "production", v3.version)  # set by hand meanwhile
    with pytest.raises(IllegalTransition, match="production moved to ce-minilm-v3 during its canary"):
        conclude("reranker", registry, "promote", "wins", candidate="v2", evidence_source=won(), log=quiet)
    assert registry.aliases()["reranker"]["production"] == "v3" and read_state(registry, "reranker").stage == "canary"


def test_start_canary_job_takes_the_operators_force_reason(tmp_path):
    from orchestration.rollout import start_canary_job
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore

    root = tmp_path / "data"
    registry = ModelRegistry(root / "models")
    v1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    verdict(registry, "reranker", v1, passed=False, production=None)
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "rollout": Rollout(traffic_share=0.2),
        "qdrant": QdrantResource(url=None, path=str(tmp_path / "qdrant")),
    }

    def launch(**config):
        return start_canary_job.execute_in_process(
            resources=resources,
            raise_on_error=False,
            run_config={
                "ops": {"start_canary_op": {"config": {"kind": "reranker", "candidate": "v1", **config}}},
                **QUIET_LOGS,
            },
        )

    assert not launch().success and read_state(registry, "reranker") is None  # the gate rejected it
    assert launch(force_reason="rehearsal").success
    state = read_state(registry, "reranker")
    assert (state.stage, state.force_reason, state.traffic_share) == ("canary", "rehearsal", 0.2)


def not_worse_verdict(registry, kind, mv, production):
    """What gate_candidate records under the canary policy for a candidate it found no worse, but not better."""
    registry.update_metrics(
        kind,
        mv.version,
        {
            "gate": {
                **sound(registry, kind),
                "passed": True,
                "criterion": "not_worse",
                "better": False,
                "not_worse": True,
                "reasons": "all criteria met",
                "better_reasons": "ndcg@10: +0.0089 (p=0.3166) is not a significant improvement at p<0.05",
                "candidate_version": mv.version,
                "production_version": production,
                "gated_at": "2025-01-01T00:00:00+00:00",
            }
        },
    )


def test_a_candidate_the_gate_found_only_no_worse_needs_the_canarys_win(tmp_path, registry):
    from rag.lifecycle.rollout import release
    from rag.lifecycle.verdicts import check_promotable

    v3 = registry.register("embedder", fake_model(tmp_path / "m3"), {"base_model": "minilm"})
    not_worse_verdict(registry, "embedder", v3, production="v1")
    with pytest.raises(
        PromotionRefused,
        match="no worse than ft-minilm-v1 but not significantly better .ndcg@10: "
        r"\+0.0089.*only a canary's online test can promote it",
    ):
        check_promotable("embedder", registry, v3)
    with pytest.raises(PromotionRefused, match="only a canary's online test"):
        release("embedder", registry, v3, policy="direct", log=quiet)
    assert registry.aliases()["embedder"]["production"] == "v1" and read_state(registry, "embedder") is None

    # The canary policy starts it; the online win promotes it, recorded as the evidence (not as an override).
    outcome = release("embedder", registry, v3, policy="canary", traffic_share=0.2, log=quiet)
    assert outcome["action"] == "canary" and read_state(registry, "embedder").force_reason is None
    conclude(
        "embedder",
        registry,
        "promote",
        "wins 60 / losses 30: the candidate wins significantly more often",
        candidate="v3",
        evidence_source=won(60, 30),
        log=quiet,
    )
    assert registry.aliases()["embedder"]["production"] == "v3"
    promotion = registry.resolve("embedder", "v3").metrics["promotion"]
    assert promotion["forced"] is False and "wins 60 / losses 30" in promotion["online_evidence"]

    # A worse verdict starts no canary at all.
    v4 = registry.register("embedder", fake_model(tmp_path / "m4"), {"base_model": "minilm"})
    registry.update_metrics(
        "embedder",
        v4.version,
        {
            "gate": {
                **sound(registry, "embedder"),
                "passed": False,
                "criterion": "not_worse",
                "better": False,
                "not_worse": False,
                "reasons": "ndcg@10: -0.1000 is worse",
                "candidate_version": v4.version,
                "production_version": "v3",
            }
        },
    )
    with pytest.raises(PromotionRefused, match="the gate rejected it against ft-minilm-v3: ndcg@10: -0.1000 is worse"):
        start("embedder", registry, "v4", log=quiet)


def test_the_gate_check_asks_no_worse_under_the_canary_policy(tmp_path, monkeypatch):
    """The blocking gate check decides by the rollout policy's criterion and says what follows."""
    import pandas as pd

    from dagster import AssetCheckSeverity

    import assets.training as training
    from rag.training.gate import GateResult
    from resources.rollout import Rollout
    from resources.storage import DataStore

    registry = ModelRegistry(tmp_path / "models")
    registry.set_alias("embedder", "candidate", registry.register("embedder", fake_model(tmp_path / "m"), {}).version)
    seen = []

    def gate(kind, tables, registry, candidate, settings):
        seen.append(settings.criterion)
        passed = settings.criterion == "not_worse"  # an unproven candidate: no worse, not better
        table = pd.DataFrame(
            [
                {
                    "metric": "ndcg@10",
                    "production": 0.9,
                    "candidate": 0.91,
                    "delta": 0.01,
                    "p_value": 0.3,
                    "p_value_worse": 0.7,
                    "required": "> 0, p < 0.05",
                    "ok": False,
                    "not_worse": True,
                }
            ]
        )
        return GateResult(passed, table, [], 40, criterion=settings.criterion, not_worse=True)

    monkeypatch.setattr(training, "gate_candidate", gate)
    store = DataStore(data_dir=str(tmp_path))
    canary = training._gate("embedder", training.GateConfig(), store, Rollout(promotion="canary"))
    direct = training._gate("embedder", training.GateConfig(), store, Rollout(promotion="direct"))
    auto = training._gate("embedder", training.GateConfig(), store, Rollout(promotion="auto"))
    assert seen == ["not_worse", "better", "not_worse"]
    assert canary.passed and "no worse: start its canary (the online test decides)" in canary.description
    assert auto.passed and auto.description.endswith(
        "no worse, not shown better: start its canary (the online test decides)"
    )
    assert not direct.passed and direct.description.endswith("keep production (inconclusive)")
    # A rejection is a normal outcome of retraining: a warning, so the run succeeds and production_* keeps production.
    assert direct.severity == AssetCheckSeverity.WARN


def test_the_default_policy_hands_a_candidate_found_only_no_worse_to_a_canary(deployed):
    """'auto': the gate could not show v2 better (too few questions, or a gain on generated questions alone), so a
    canary lets people decide; production and its serving alias stay, and `rag retrain`'s report says so."""
    from rag.registry.cli import gate_report

    env, registry = deployed, deployed["registry"]
    v2 = registry.resolve("embedder", "v2")
    not_worse_verdict(registry, "embedder", v2, production="v1")
    result = release_step(env)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (metadata["action"], metadata["production"]) == ("canary", "ft-minilm-v1")
    state = read_state(registry, "embedder")
    assert (state.stage, state.candidate_version, state.production_version) == ("canary", "v2", "v1")
    assert registry.aliases()["embedder"] == {"production": "v1", "candidate": "v2"}
    assert aliases(env)["t__production"] == env["production_collection"]
    (line,) = [x for x in gate_report(registry, registry.resolve("embedder", "v2")) if x.startswith("  -> ")]
    assert line.startswith("  -> canary running on 10% of sessions (gate found it no worse than ft-minilm-v1")
    assert "`rag models rollout rollback --kind embedder` ends it now" in line


def test_the_default_policy_queues_a_no_worse_candidate_behind_a_running_canary_of_its_kind(deployed):
    from rag.embedding import _minilm_dir

    env, registry = deployed, deployed["registry"]
    start("embedder", registry, "v2", 0.1, log=quiet)
    v3 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    registry.set_alias("embedder", "candidate", v3.version)
    not_worse_verdict(registry, "embedder", v3, production="v1")
    result = release_step(env)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (metadata["action"], metadata["waiting_behind"]) == ("waiting", "embedder ft-minilm-v2")
    assert registry.aliases()["embedder"] == {"production": "v1", "candidate": "v3"}
    assert read_state(registry, "embedder").candidate_version == "v2"
    assert aliases(env)["t__production"] == env["production_collection"] and aliases(env)["t__ft-minilm-v3"] is None


def test_a_later_candidate_of_the_canarys_kind_found_significantly_better_supersedes_the_canary(tmp_path, registry):
    """A reranker canary whose interleavings tie holds no retrain back: the next reranker, trained on more feedback
    and found significantly better on held-out questions, ends the undecided canary and is promoted directly."""
    from rag.lifecycle.rollout import release

    r1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    not_worse_verdict(registry, "reranker", r1, production=None)
    assert release("reranker", registry, r1, policy="auto", log=quiet)["action"] == "canary"
    r2 = registry.register("reranker", fake_model(tmp_path / "r2"), {"base_model": "minilm"})
    registry.set_alias("reranker", "candidate", r2.version)
    verdict(registry, "reranker", r2, production=None)  # significantly better
    outcome = release("reranker", registry, r2, policy="auto", log=quiet)
    assert outcome["action"] == "promoted" and registry.aliases()["reranker"]["production"] == r2.version
    (started, ended) = history(registry)
    assert (started["step"], ended["step"], ended["candidate"]) == ("start", "rollback", r1.version)
    assert f"superseded by {r2.name}, a later candidate the gate found significantly better" in ended["reason"]


def test_under_the_default_policy_a_worse_candidate_keeps_production_and_gets_no_canary(deployed):
    env, registry = deployed, deployed["registry"]
    verdict(registry, "embedder", registry.resolve("embedder", "v2"), passed=False, production="v1")
    result = release_step(env)
    assert result.success and not result.get_asset_materialization_events()
    assert registry.aliases()["embedder"] == {"production": "v1", "candidate": "v2"}
    assert read_state(registry, "embedder") is None
    assert aliases(env)["t__production"] == env["production_collection"] and aliases(env)["t__ft-minilm-v2"] is None


def test_a_canary_no_user_decides_is_rolled_back_after_max_days_and_a_fresh_one_continues(tmp_path, registry):
    """The default policy starts a canary for every candidate the gate could not show better; without users to
    decide it, it would hold retraining back for good."""
    from datetime import UTC, datetime, timedelta

    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore
    from sensors.canary import canary_sensor

    resources = {
        "data_store": DataStore(data_dir=str(tmp_path)),
        "rollout": Rollout(max_days=14),
        "feedback_loop": FeedbackLoop(data_dir=str(tmp_path)),
        "qdrant": QdrantResource(url=None, path=str(tmp_path / "qdrant")),
    }

    def tick():
        with build_sensor_context(instance=DagsterInstance.ephemeral(), resources=resources) as context:
            return canary_sensor(context)

    start("embedder", registry, "v2", 0.1, now=datetime.now(UTC) - timedelta(days=13), log=quiet)
    fresh = tick()
    assert fresh.run_requests == [] and "wins 0 / losses 0 / ties 0" in fresh.skip_reason.skip_message
    roll_back_rollout("embedder", registry, "test: start again, older", log=quiet)
    start("embedder", registry, "v2", 0.1, now=datetime.now(UTC) - timedelta(days=15), log=quiet)
    (request,) = tick().run_requests
    reason = request.run_config["ops"]["rollback_canary_op"]["config"]["reason"]
    assert request.job_name == "rollback_canary_job" and "no decision 15.0 days after its start (max_days 14)" in reason
    assert registry.aliases()["embedder"]["production"] == "v1"  # the request rolls back; nothing promoted


def test_of_two_candidates_a_retrain_gated_the_larger_gate_estimate_takes_the_canary_slot(tmp_path, registry):
    """One retrain gates several kinds and releases them one after another: the first released no longer takes the
    one canary slot by its place in the job. A candidate whose gate estimate is smaller waits behind the other kind's
    (without a canary running), the larger one starts, and canary_sensor, once nothing runs, starts the queued
    candidate with the largest estimate first. Candidates without an estimate keep the old order."""
    from rag.lifecycle.rollout import queued_candidates, release, stronger_waiting

    def estimate(kind, mv, delta):
        registry.update_metrics(
            kind, mv.version, {"gate": {**registry.resolve(kind, mv.version).metrics["gate"], "delta_ndcg@10": delta}}
        )

    r1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    registry.set_alias("reranker", "candidate", r1.version)
    not_worse_verdict(registry, "reranker", r1, production=None)
    not_worse_verdict(registry, "embedder", registry.resolve("embedder", "v2"), production="v1")
    v2 = registry.resolve("embedder", "v2")
    assert stronger_waiting(registry, "embedder", v2) is None  # no estimates recorded: the old order
    estimate("embedder", v2, 0.004)
    estimate("reranker", r1, 0.008)
    outcome = release("embedder", registry, registry.resolve("embedder", "v2"), policy="canary", log=quiet)
    assert outcome["action"] == "waiting" and outcome["behind"] == f"reranker {r1.name}"
    assert "gate estimate is larger (+0.0080 against +0.0040)" in outcome["summary"]
    assert read_state(registry, "embedder") is None  # no canary started for the weaker one
    started = release("reranker", registry, registry.resolve("reranker", r1.version), policy="canary", log=quiet)
    assert started["action"] == "canary" and read_state(registry, "reranker").stage == "canary"
    assert [k for k, _ in queued_candidates(registry)] == ["embedder"]  # waiting behind the reranker's canary now
    # Once the reranker's canary ends, the queued embedder is what canary_sensor starts.
    conclude("reranker", registry, "rollback", "test: the reranker's canary ends", candidate=r1.version, log=quiet)
    assert [(k, mv.version) for k, mv in queued_candidates(registry)] == [("embedder", "v2")]
    # Two queued candidates: the larger estimate first.
    r2 = registry.register("reranker", fake_model(tmp_path / "r2"), {"base_model": "minilm"})
    registry.set_alias("reranker", "candidate", r2.version)
    not_worse_verdict(registry, "reranker", r2, production=None)
    estimate("reranker", r2, 0.02)
    registry.update_metrics("reranker", r2.version, {"canary_queued": {"at": "2025-01-01", "behind": "embedder x"}})
    assert [k for k, _ in queued_candidates(registry)] == ["reranker", "embedder"]
