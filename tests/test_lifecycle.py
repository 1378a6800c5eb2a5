"""The model lifecycle's three defects (issue 29), each pinned:

1. A promotion cannot half-happen: it is one journaled transaction; a crash between its steps is completed (or
   undone) by the next open, after which `rag models rollback` works (it used to refuse: "no promotion record").
2. Concluding a canary with "promote" re-reads the evidence and refuses unless the sequential test says promote;
   an operator's override is recorded as an override, never as a win.
3. A session repeating a question gives one outcome, and only the session that was shown a query can credit it.

The kill -9 at every step lives in tests/test_lifecycle_kill.py."""

import pytest

from rag.feedback import FeedbackStore, FeedbackSubmission, ImplicitEvent
from rag.registry import ModelRegistry
from rag.rollout.evidence import collect
from rag.lifecycle.rollout import conclude, history, read_state, start
from rag.lifecycle.verdicts import PromotionRefused
from tests.test_rollout_serving import TEXTS, fake_model
from tests.verdicts import sound, won

quiet = lambda _: None  # noqa: E731


def not_worse(registry, kind, mv, production):
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
                "better_reasons": "ndcg@10: +0.0040 (p=0.4100) is not a significant improvement",
                "candidate_version": mv.version,
                "production_version": production,
                "gated_at": "2026-01-01T00:00:00+00:00",
            }
        },
    )


# --- 2. conclude("promote") re-evaluates --------------------------------------------------------------------------


def test_a_canary_is_promoted_only_when_the_sequential_test_says_so_now(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    not_worse(registry, "reranker", v1, production=None)  # the gate found it only no worse
    start("reranker", registry, "v1", 0.2, log=quiet)

    # The caller's word is not evidence: without the store's evidence, or with evidence that decides nothing yet,
    # nothing changes.
    with pytest.raises(PromotionRefused, match="the sequential test says nothing"):
        conclude("reranker", registry, "promote", "the job was launched by hand", candidate="v1", log=quiet)
    with pytest.raises(PromotionRefused, match="the sequential test says continue"):
        conclude(
            "reranker", registry, "promote", "looks good", candidate="v1", evidence_source=won(3, 2, 10), log=quiet
        )
    assert (
        registry.aliases()["reranker"].get("production") is None and read_state(registry, "reranker").stage == "canary"
    )

    # An operator may promote anyway, with a reason: recorded as an override, not as online evidence of a win.
    with pytest.raises(ValueError, match="override_reason must say why"):
        conclude(
            "reranker", registry, "promote", "x", candidate="v1", evidence_source=won(3, 2, 10), override_reason=" "
        )
    state = conclude(
        "reranker",
        registry,
        "promote",
        "operator decision",
        candidate="v1",
        evidence_source=won(3, 2, 10),
        override_reason="the old ranker breaks on tables; accepted risk",
        approved_by="alice",
        log=quiet,
    )
    assert state.stage == "production" and registry.aliases()["reranker"]["production"] == "v1"
    metrics = registry.resolve("reranker", "v1").metrics
    assert metrics["promotion"]["forced"] is True and "online_evidence" not in metrics["promotion"]
    assert metrics["promotion"]["force_reason"].startswith(
        "operator override of the canary's sequential test (it said continue)"
    )
    assert metrics["promotion"]["approved_by"] == "alice"
    assert metrics["canary"]["override"]["test_said"] == "continue"
    assert history(registry)[-1]["override"]["override_reason"] == "the old ranker breaks on tables; accepted risk"


def test_a_won_canary_is_promoted_with_the_evidence_it_was_reread_from(tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    not_worse(registry, "reranker", v1, production=None)
    start("reranker", registry, "v1", 0.2, log=quiet)
    conclude(
        "reranker",
        registry,
        "promote",
        "sensor: promote",
        candidate="v1",
        evidence_source=won(60, 10),
        approved_by="dagster run abc",
        log=quiet,
    )
    promotion = registry.resolve("reranker", "v1").metrics["promotion"]
    assert promotion["forced"] is False and "wins 60 / losses 10" in promotion["online_evidence"]
    assert promotion["approved_by"] == "dagster run abc"


# --- 3. one outcome per (client, question); signals only from the session shown ---------------------------------


def shown(store, question: str, session: str):
    chunks = [
        {"chunk_id": "cats", "doc_id": "cats.md", "text": TEXTS["cats"], "rank": 1, "team": "canary"},
        {"chunk_id": "dogs", "doc_id": "dogs.md", "text": TEXTS["dogs"], "rank": 2, "team": "production"},
    ]
    return store.record_query(
        question,
        answer="a",
        chunks=chunks,
        session_id=session,
        arm="canary",
        latency_ms=20.0,
        timings_ms={"rank_production": 8.0, "rank_canary": 9.0},
        client_session=f"issued-{session}",  # what the API records: the session it issued, and the client's key
        client_key=f"client-{session}",
    )


def test_a_session_repeating_a_question_gives_one_outcome(tmp_path):
    from datetime import UTC, datetime, timedelta

    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    since = datetime.now(UTC) - timedelta(minutes=1)
    try:
        for i in range(8):  # the same list every time (same coin): one user clicking rank 1 eight times
            q = shown(store, "Which animal purrs?" if i % 2 else "which  animal PURRS?", "s1")
            store.record_event(ImplicitEvent(query_id=q.query_id, chunk_id="cats"), client_session="issued-s1")
        assert collect(store, since).counts == (1, 0, 0)  # was 8 wins: log-LR 3.35 past the threshold 3.0
        q = shown(store, "what do rockets burn", "s1")  # another question of the same session is its own judgement
        store.record_event(ImplicitEvent(query_id=q.query_id, chunk_id="cats"), client_session="issued-s1")
        assert collect(store, since).counts == (2, 0, 0)
    finally:
        store.close()


def test_only_the_session_shown_a_query_can_credit_it(tmp_path):
    from datetime import UTC, datetime, timedelta

    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    since = datetime.now(UTC) - timedelta(minutes=1)
    try:
        q = shown(store, "which animal purrs", "alice")
        # Another client (or one without a session) rates and clicks alice's canary query: no credit, even under
        # alice's own label or from another session the server issued.
        store.submit_feedback(
            FeedbackSubmission(
                query_id=q.query_id,
                idempotency_key="mallory",
                session_id="alice",
                passages=[{"chunk_id": "cats", "score": 1}],
            ),
            client_session="issued-mallory",
        )
        store.submit_feedback(
            FeedbackSubmission(
                query_id=q.query_id, idempotency_key="anonymous", passages=[{"chunk_id": "cats", "score": 1}]
            )
        )
        store.record_event(ImplicitEvent(query_id=q.query_id, chunk_id="cats"))
        assert collect(store, since).counts == (0, 0, 1)
        store.submit_feedback(
            FeedbackSubmission(
                query_id=q.query_id,
                idempotency_key="alice",
                session_id="alice",
                passages=[{"chunk_id": "dogs", "score": 1}],
            ),
            client_session="issued-alice",
        )
        assert collect(store, since).counts == (0, 1, 0)  # alice's own rating counts: production's passage won
    finally:
        store.close()


# --- 1. a promotion that was interrupted is completed by the next open ---------------------------------------------


@pytest.fixture
def canary_running(tmp_path, monkeypatch):
    """MiniLM v1 production with its serving alias, v2 (the same weights) in a canary with its collection built."""
    from rag.index.qdrant import QdrantSettings, close_client
    from tests.test_lifecycle_kill import canary_of_v2

    root = tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    for name in ("QDRANT_URL", "RAG_QDRANT_PATH"):
        monkeypatch.delenv(name, raising=False)
    registry, target = canary_of_v2(root)
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    yield {"root": root, "registry": registry, "qdrant": qdrant, "target": target}
    close_client(qdrant)


def serving(env) -> dict:
    from rag.index.qdrant import alias_target

    client = env["target"].client()
    return {name: alias_target(client, f"t__{name}") for name in ("production", "ft-minilm-v1", "ft-minilm-v2")}


def test_a_promotion_interrupted_between_its_steps_is_completed_by_the_next_open(canary_running, monkeypatch):
    from rag.lifecycle.journal import consistency, pending
    from rag.lifecycle.rollout import roll_back_production

    env, registry = canary_running, canary_running["registry"]
    original = ModelRegistry.set_alias

    def crash_on_production(self, kind, alias, version):
        if alias == "production":
            raise KeyboardInterrupt("killed between the serving alias swap and the registry alias")
        return original(self, kind, alias, version)

    monkeypatch.setattr(ModelRegistry, "set_alias", crash_on_production)
    with pytest.raises(KeyboardInterrupt):
        conclude(
            "embedder",
            registry,
            "promote",
            "sensor: promote",
            candidate="v2",
            evidence_source=won(),
            target=env["target"],
            log=quiet,
        )
    monkeypatch.setattr(ModelRegistry, "set_alias", original)
    assert pending(registry) is not None  # half done: serving moved, the registry and the rollout state did not
    assert (
        serving(env)["production"] == serving(env)["ft-minilm-v2"]
        and registry.aliases()["embedder"]["production"] == "v1"
    )

    # The operator's rollback (which refused before: "no promotion record") first completes the promotion, then
    # reverts it: every store agrees at each end.
    lines = []
    roll_back_production("embedder", registry, "drill after a crash", target=env["target"], log=lines.append)
    assert any("completed an unfinished embedder promote" in line for line in lines)
    assert pending(registry) is None and registry.aliases()["embedder"]["production"] == "v1"
    assert serving(env)["production"] == serving(env)["ft-minilm-v1"]
    v2 = registry.resolve("embedder", "v2").metrics
    assert v2["promotion"]["previous_version"] == "v1" and v2["reverted"]["production_version"] == "v1"
    assert read_state(registry, "embedder").stage == "rolled_back"
    assert consistency(registry, "embedder") == {
        "registry": "v1",
        "rollout": "v1",
        "rollout_stage": "rolled_back",
        "pending": False,
    }
    steps = [entry["step"] for entry in history(registry)]
    assert steps[-2:] == ["promote", "revert"] and steps.count("promote") == 1  # the log line written once


def test_an_interrupted_promotion_whose_collection_is_gone_is_rolled_back_on_open(canary_running, monkeypatch):
    from rag.lifecycle.journal import pending, recover

    from rag.lifecycle import journal

    env, registry = canary_running, canary_running["registry"]
    original = journal.point_alias_to

    def crash(*_args, **_kwargs):
        raise KeyboardInterrupt("killed before the first alias moved")

    monkeypatch.setattr(journal, "point_alias_to", crash)
    with pytest.raises(KeyboardInterrupt):
        conclude(
            "embedder",
            registry,
            "promote",
            "sensor: promote",
            candidate="v2",
            evidence_source=won(),
            target=env["target"],
            log=quiet,
        )
    monkeypatch.setattr(journal, "point_alias_to", original)
    intent = pending(registry)
    env["target"].client().delete_collection(intent.serving_after["t__production"])  # lost meanwhile
    before = serving(env)["production"]
    outcome = recover(registry, env["target"].client, log=quiet)
    assert outcome.startswith("rolled back an unfinished embedder promote")
    assert pending(registry) is None and registry.aliases()["embedder"]["production"] == "v1"
    assert serving(env)["production"] == before and read_state(registry, "embedder").stage == "canary"


# --- minor: verdicts computed with weak settings, or over another first stage, promote nothing ---------------------


def test_gate_settings_have_floors_and_a_verdict_below_them_promotes_nothing(tmp_path):
    from pydantic import ValidationError

    from rag.lifecycle.verdicts import promotion_refusal
    from rag.training.config import GateSettings

    for weak in ({"p_value": 0.99}, {"min_questions": 1}, {"resamples": 100}, {"max_drop": 0.5}):
        with pytest.raises(ValidationError):
            GateSettings(**weak)
    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    verdict = {**sound(registry, "reranker"), "passed": True, "candidate_version": "v1", "production_version": None}
    registry.update_metrics(
        "reranker",
        "v1",
        {"gate": {**verdict, "settings": {**verdict["settings"], "p_value": 0.99, "min_questions": 1}}},
    )
    why = promotion_refusal("reranker", registry, v1)
    assert "below the floors" in why and "p_value" in why and "min_questions" in why
    registry.update_metrics("reranker", "v1", {"gate": {k: v for k, v in verdict.items() if k != "settings"}})
    assert "does not record the settings" in promotion_refusal("reranker", registry, v1)
    registry.update_metrics("reranker", "v1", {"gate": verdict})
    assert promotion_refusal("reranker", registry, v1) is None


def test_a_reranker_verdict_holds_only_over_the_first_stage_it_was_gated_on(tmp_path):
    from rag.lifecycle.verdicts import promotion_refusal

    registry = ModelRegistry(tmp_path / "models")
    e1 = registry.register("embedder", fake_model(tmp_path / "e1"), {"base_model": "minilm"})
    r1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    registry.update_metrics(
        "reranker",
        "v1",
        {
            "gate": {
                **sound(registry, "reranker"),
                "passed": True,
                "candidate_version": "v1",
                "production_version": None,
            }
        },
    )
    assert promotion_refusal("reranker", registry, r1) is None  # gated over the base embedder, which serves
    registry.set_alias("embedder", "production", e1.version)  # the first stage changed since
    why = promotion_refusal("reranker", registry, r1)
    assert "gated over the first stage of embedder minilm (implicit v0)" in why and "ft-minilm-v1" in why
