"""Gradual rollout wired end to end: the API assigns sessions to arms deterministically and records the arm of each
query and the team of each shown passage; ratings and clicks credit the right arm; a start without a passing gate
is refused; canary_sensor states the evidence, promotes after enough wins (production and serving aliases swap onto
the candidate's collection) and a rollback reverts it; a rolled-back canary leaves production alone.

The first tests use tiny fake answerers (rag.rollout's statistics are tested in tests/test_rollout.py); the last one
serves a real MiniLM candidate from its own embedded-Qdrant collection."""

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from dagster import DagsterInstance, build_sensor_context
from fastapi.testclient import TestClient

from rag.feedback import FeedbackStore, FeedbackSubmission
from rag.qa import AnswerResult
from rag.registry import ModelRegistry
from rag.retrieval import Hit
from rag.rollout import CanarySettings, IllegalTransition, assign_arm, queries_to_decide
from rag.rollout.evidence import collect, evaluate, summary
from rag.lifecycle.rollout import history, read_state, roll_back_rollout, start
from rag.serving.app import create_app
from rag.serving.canary import CanaryRouter
from rag.serving.sessions import SessionKeys
from rag.serving.settings import ServeSettings
from rag.lifecycle.verdicts import PromotionRefused
from tests.verdicts import sound, won

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEXTS = {
    "cats": "Cats are small domesticated felines that purr and chase mice.",
    "dogs": "Dogs are loyal domesticated canines that bark and fetch sticks.",
    "rockets": "Rockets burn fuel to reach orbit and launch satellites into space.",
    "bread": "Bread is baked from flour, water, yeast and salt in a hot oven.",
    "tea": "Green tea is brewed from the leaves of Camellia sinensis.",
    "moon": "The moon orbits the earth once every twenty-seven days.",
}
quiet = lambda _: None  # noqa: E731
KEYS = SessionKeys("a fixed server secret of the tests")  # the tests issue tokens the app accepts
# The canary's per-client bounds switched off: one test client asking from many sessions counts as many users.
UNBOUNDED = CanarySettings(max_sessions_per_client=10**6, max_outcomes_per_client=10**6, client_window_days=10**4)


def arm_of_token(token: str, share: float, salt: str = "v2", keys: SessionKeys = KEYS) -> str:
    """The arm the server draws for a session it issued: from the secret arm key, not from anything a client sent."""
    return assign_arm(keys.arm_key(keys.verify(token)), share, salt=salt)


def sessions_in(arm: str, share: float, n: int, salt: str = "v2", keys: SessionKeys = KEYS) -> list[str]:
    """n session tokens the server (with `keys`) would put in `arm`."""
    found = []
    while len(found) < n:
        token = keys.issue().token
        if arm_of_token(token, share, salt, keys) == arm:
            found.append(token)
    return found


class FakeAnswerer:
    """A fixed ranking; answers with its first passage. Has what a canary needs: rank() and ask(ranked=...)."""

    def __init__(self, name: str, order: list[str]):
        self.model_version, self.order = f"{name}@1", order

    def rank(self, question: str) -> list[Hit]:
        return [
            Hit(
                rank,
                1.0 / rank,
                {"chunk_id": cid, "doc_id": f"{cid}.md", "page_start": 1, "page_end": 1, "text": TEXTS[cid]},
            )
            for rank, cid in enumerate(self.order[:3], start=1)
        ]

    def ask(self, question: str, *, ranked: list[Hit] | None = None) -> AnswerResult:
        hits = self.rank(question) if ranked is None else ranked
        chunks = [
            {**h.chunk, "rank": h.rank, "score": h.score, "cited": i == 0, "attributed": False}
            for i, h in enumerate(hits)
        ]
        return AnswerResult(
            question=question,
            answer=hits[0].chunk["text"],
            cited_chunk_ids=[hits[0].chunk["chunk_id"]],
            attributed_chunk_ids=[],
            not_in_context=False,
            latency_ms=1.0,
            chunks=chunks,
            generator=self.model_version,
            settings={},
        )


class FakeArm:
    def __init__(self, answerer):
        self.answerer, self.closed = answerer, False

    def current(self):
        return self.answerer

    def close(self):
        self.closed = True


PRODUCTION = FakeAnswerer("production", ["cats", "dogs", "rockets"])
CANDIDATE = FakeAnswerer("candidate", ["moon", "tea", "bread"])  # disjoint: every shown passage has one possible team


def fake_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"0")
    return folder


def verdict(registry, kind, mv, *, passed=True, production=None):
    """A gate verdict as rag.training.pipeline.gate_candidate records it."""
    registry.update_metrics(
        kind,
        mv.version,
        {
            "gate": {
                **sound(registry, kind),
                "passed": passed,
                "reasons": "all criteria met" if passed else "ndcg@10: -0.1000 is not a significant improvement",
                "candidate_version": mv.version,
                "production_version": production,
                "gated_at": "2025-01-01T00:00:00+00:00",
            }
        },
    )


@pytest.fixture
def registry(tmp_path):
    """Embedder v1 in production, v2 a candidate whose gate passed against v1 (fake weights)."""
    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("embedder", fake_model(tmp_path / "m1"), {"base_model": "minilm"})
    registry.set_alias("embedder", "production", v1.version)
    v2 = registry.register("embedder", fake_model(tmp_path / "m2"), {"base_model": "minilm"})
    registry.set_alias("embedder", "candidate", v2.version)
    verdict(registry, "embedder", v2, production="v1")
    return registry


@pytest.fixture
def store(tmp_path):
    st = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    yield st
    st.close()


def ask(client, question="which animal does purr", session=None) -> dict:
    """`session`: a token the server issued (sent as the API's `session` field); none: a new session."""
    client.cookies.clear()  # each call names its session itself
    response = client.post(
        "/ask", json={"question": question, **({"session": session} if session else {})}, headers=AUTH
    )
    assert response.status_code == 200, response.text
    return response.json()


def served(settings):
    """What canary_router reads of rag serve's ConfiguredServing: the settings production answers with."""
    from types import SimpleNamespace

    return SimpleNamespace(settings=lambda: settings, pinned=frozenset(), current=lambda: None)


def arm_of(store, query_id: str):
    queries = store.table("queries")
    return queries.loc[queries["query_id"] == query_id, "arm"].iloc[0]


def teams_of(store, query_id: str) -> dict:
    rows = store.table("retrievals")
    rows = rows[rows["query_id"] == query_id]
    return dict(zip(rows["chunk_id"], rows["team"]))


def test_api_assigns_sessions_to_arms_deterministically_and_records_arms_and_teams(registry, store):
    state = start("embedder", registry, traffic_share=0.3, log=quiet)
    assert (state.stage, state.candidate_version, state.production_version) == ("canary", "v2", "v1")
    arm = FakeArm(CANDIDATE)
    router = CanaryRouter(registry, lambda kind, candidate: arm)
    app = create_app(lambda: PRODUCTION, store, ServeSettings(api_token=TOKEN), canary=router, sessions=KEYS)
    with TestClient(app) as client:
        # The server issues each session; the same session gets the same arm on every request: the one drawn from
        # the session's secret arm key.
        first = ask(client)
        token = first["session"]
        assert {arm_of(store, ask(client, session=token)["query_id"]) for _ in range(3)} == {arm_of_token(token, 0.3)}
        # Every session the server issues gets the arm its secret key draws. The sessions are random, so their share
        # is bounded at 5 sd (sd over 300 sessions: 0.026; a false alarm about once in two million runs)...
        served = {}
        for _ in range(300):
            answer = ask(client)
            served[answer["session"]] = arm_of(store, answer["query_id"])
        assert all(a == arm_of_token(s, 0.3) for s, a in served.items())
        share = sum(a == "canary" for a in served.values()) / len(served)
        assert 0.17 < share < 0.43, share
        # ...and the draw itself is held to its share on 20,000 fixed session ids (sd 0.0032), which never varies.
        fixed = [assign_arm(KEYS.arm_key(f"session-{i}"), 0.3, salt="v2") for i in range(20_000)]
        assert abs(sum(a == "canary" for a in fixed) / len(fixed) - 0.3) < 0.013
        # A client's own session_id is a label: the same label twice is two sessions, and a forged token is ignored.
        labelled = []
        for _ in range(2):
            client.cookies.clear()  # a client that keeps no cookie, only its label
            labelled.append(client.post("/ask", json={"question": "q", "session_id": "me"}, headers=AUTH).json())
        assert labelled[0]["session"] != labelled[1]["session"]
        forged = ask(client, session="mine.0123456789abcdef0123456789")
        assert forged["session"] != "mine.0123456789abcdef0123456789" and KEYS.verify(forged["session"])
        # A browser keeps its session in the cookie the first answer set.
        client.cookies.clear()
        cookie_first = client.post("/ask", json={"question": "q"}, headers=AUTH)
        cookie_again = client.post("/ask", json={"question": "q"}, headers=AUTH)
        assert cookie_first.cookies.get("rag_session") == cookie_first.json()["session"]
        assert cookie_again.json()["session"] == cookie_first.json()["session"]

        # A production session: production's list, no teams. A canary session: the interleaved list, every passage
        # tagged with the team that picked it, answered by the candidate from that list; teams are not shown to users.
        production_session = next(s for s, a in served.items() if a == "production")
        canary_sessions = [s for s, a in served.items() if a == "canary"]
        plain = ask(client, session=production_session)
        assert [p["chunk_id"] for p in plain["passages"]] == ["cats", "dogs", "rockets"]
        assert set(teams_of(store, plain["query_id"]).values()) == {None}
        mixed = ask(client, session=canary_sessions[0])
        teams = teams_of(store, mixed["query_id"])
        assert len(teams) == 3 and set(teams.values()) == {"production", "canary"}
        assert all(teams[c] == ("production" if c in PRODUCTION.order else "canary") for c in teams)
        assert (
            mixed["answer"] == TEXTS[mixed["passages"][0]["chunk_id"]]
            and mixed["model_version"] == "interleaved(production@1, candidate@1)"
        )
        assert "team" not in mixed["passages"][0]
        again = ask(client, session=canary_sessions[0])  # the same question in the same session: the same list
        assert [p["chunk_id"] for p in again["passages"]] == [p["chunk_id"] for p in mixed["passages"]]
        assert client.get("/health").json()["canary"] == {
            "running": True,
            "kind": "embedder",
            "candidate": "ft-minilm-v2",
            "traffic_share": 0.3,
            "index_open": True,
            "error": None,
            "failed_requests": 0,
        }

        # Signals credit the team that contributed the passage: a +1 on the candidate's passage is a candidate win,
        # a click on production's passage a production win, and a rating beats a click on the same passage: clicked,
        # then rated -1, the candidate's passage credits nobody (a -1 debits no team), a tie.
        def shown(query: dict, team: str) -> str:
            return next(c for c, t in teams_of(store, query["query_id"]).items() if t == team)

        won, lost, rated = (ask(client, f"question {i}", session=canary_sessions[i]) for i in (1, 2, 3))
        # Each signal comes from the session that was shown the query (its token, as the page sends it).
        client.post(
            "/feedback",
            headers=AUTH,
            json={
                "query_id": won["query_id"],
                "idempotency_key": "w",
                "session": canary_sessions[1],
                "passages": [{"chunk_id": shown(won, "canary"), "score": 1}],
            },
        )
        client.post(
            "/events",
            headers=AUTH,
            json={
                "query_id": lost["query_id"],
                "kind": "click",
                "session": canary_sessions[2],
                "chunk_id": shown(lost, "production"),
            },
        )
        client.post(
            "/events",
            headers=AUTH,
            json={
                "query_id": rated["query_id"],
                "kind": "click",
                "session": canary_sessions[3],
                "chunk_id": shown(rated, "canary"),
            },
        )
        client.post(
            "/feedback",
            headers=AUTH,
            json={
                "query_id": rated["query_id"],
                "idempotency_key": "r",
                "session": canary_sessions[3],
                "passages": [{"chunk_id": shown(rated, "canary"), "score": -1}],
            },
        )
        # Every request came from one client (the test client's address). Its signals are credited as above, and a
        # question it repeated is one judgement however many sessions asked it (counted without the per-client
        # bounds here; tests/test_canary_attack.py tests those).
        evidence = collect(store, state.started_at, UNBOUNDED)
        asked_in_canary = store.table("queries").query("arm == 'canary'")
        canaries = len(asked_in_canary)
        judged = asked_in_canary["text"].str.lower().nunique()
        assert judged < canaries and evidence.queries["canary"] == canaries
        assert evidence.counts == (1, 1, judged - 2) and evidence.clients == 1
        # Under the product's bounds that client, with its hundreds of sessions, adds nothing at all.
        bounded = collect(store, state.started_at)
        assert bounded.counts == (0, 0, 0) and bounded.clients_with_too_many_sessions == 1

        # An operator's rollback: the next request of a canary session is production's, production never moved.
        rolled = roll_back_rollout("embedder", registry, "looks wrong", log=quiet)
        assert rolled.stage == "rolled_back" and registry.aliases()["embedder"]["production"] == "v1"
        after = ask(client, session=canary_sessions[0])
        assert (
            arm_of(store, after["query_id"]) is None and [p["chunk_id"] for p in after["passages"]] == PRODUCTION.order
        )
        assert registry.resolve("embedder", "v2").metrics["canary"]["decision"] == "rollback"
    assert [e["step"] for e in history(registry)] == ["start", "rollback"]


def test_a_canary_needs_a_passing_gate_and_runs_alone(tmp_path, registry):
    v3 = registry.register("embedder", fake_model(tmp_path / "m3"), {"base_model": "minilm"})
    with pytest.raises(
        PromotionRefused,
        match="cannot start a canary: refusing to promote embedder ft-minilm-v3: it has no gate verdict",
    ):
        start("embedder", registry, "v3", log=quiet)
    verdict(registry, "embedder", v3, passed=False, production="v1")
    with pytest.raises(PromotionRefused, match="the gate rejected it"):
        start("embedder", registry, "ft-minilm-v3", log=quiet)
    verdict(registry, "embedder", v3, production=None)  # passed, but against the implicit v0, not today's v1
    with pytest.raises(PromotionRefused, match="gated against the implicit v0"):
        start("embedder", registry, "v3", log=quiet)
    with pytest.raises(IllegalTransition, match="already production"):
        start("embedder", registry, "v1", log=quiet)
    with pytest.raises(ValueError, match="traffic_share"):
        start("embedder", registry, "v2", traffic_share=1.5, log=quiet)
    assert read_state(registry, "embedder") is None and history(registry) == []  # refusals write nothing

    start("embedder", registry, log=quiet)  # v2, the candidate alias
    reranker = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    verdict(registry, "reranker", reranker, production=None)
    with pytest.raises(IllegalTransition, match="a canary of embedder ft-minilm-v2 is running"):
        start("reranker", registry, "v1", log=quiet)


def test_reranker_canary_promotes_through_the_registry_and_a_rollback_restores_the_implicit_v0(tmp_path):
    from rag.lifecycle.rollout import conclude

    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    verdict(registry, "reranker", v1, production=None)
    start("reranker", registry, "v1", log=quiet)
    with pytest.raises(IllegalTransition, match="no canary of reranker v9 to promote"):
        conclude("reranker", registry, "promote", "stale request", candidate="v9", log=quiet)
    assert registry.aliases()["reranker"] == {}  # production (no reranker) untouched while the canary runs
    state = conclude(
        "reranker", registry, "promote", "wins", candidate="v1", evidence={"wins": 9}, evidence_source=won(), log=quiet
    )
    assert state.stage == "production" and registry.aliases()["reranker"] == {"production": "v1"}
    with pytest.raises(IllegalTransition, match="no canary of reranker v1 to rollback: v1 is in stage 'production'"):
        conclude("reranker", registry, "rollback", "late", candidate="v1", log=quiet)  # the sensor's stale decision
    reverted = roll_back_rollout("reranker", registry, "users complain", log=quiet)
    assert reverted.stage == "rolled_back" and registry.aliases()["reranker"] == {}
    assert "production is no reranker (implicit v0) again" in reverted.reason
    with pytest.raises(IllegalTransition, match="nothing to roll back for reranker: v1 is already rolled_back"):
        roll_back_rollout("reranker", registry, "again", log=quiet)


def test_a_server_that_does_not_serve_production_ignores_the_canary(registry, store):
    from rag.qa import AnswerSettings
    from rag.serving.server import canary_router

    start("embedder", registry, traffic_share=0.9, log=quiet)
    router = canary_router(served(AnswerSettings(model="minilm", mode="dense")), root=registry.root.parent)
    app = create_app(lambda: PRODUCTION, store, ServeSettings(api_token=TOKEN), canary=router)
    with TestClient(app) as client:
        data = ask(client, session="any")
        assert arm_of(store, data["query_id"]) is None and data["model_version"] == "production@1"
        assert "serve with --model production" in client.get("/health").json()["canary"]["ignored"]


def test_a_reranker_canary_needs_a_server_that_serves_the_production_reranker(tmp_path, store):
    from rag.qa import AnswerSettings
    from rag.serving.server import canary_router

    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    verdict(registry, "reranker", v1, production=None)
    start("reranker", registry, "v1", traffic_share=0.9, log=quiet)
    # A server configured without a reranker (the default is production): once promoted, it would still serve
    # retrieval order.
    router = canary_router(served(AnswerSettings(model="minilm", mode="dense", reranker="none")), root=tmp_path)
    app = create_app(lambda: PRODUCTION, store, ServeSettings(api_token=TOKEN), canary=router)
    with TestClient(app) as client:
        data = ask(client, session="any")
        assert arm_of(store, data["query_id"]) is None and data["model_version"] == "production@1"
        assert "set `reranker: production`" in client.get("/health").json()["canary"]["ignored"]


def test_a_failing_candidate_leaves_the_answer_to_production(registry, store):
    class Broken(FakeAnswerer):
        def rank(self, question):
            raise RuntimeError("collection gone")

    start("embedder", registry, traffic_share=0.9, log=quiet)
    router = CanaryRouter(registry, lambda kind, candidate: FakeArm(Broken("candidate", [])))
    app = create_app(lambda: PRODUCTION, store, ServeSettings(api_token=TOKEN), canary=router, sessions=KEYS)
    session = sessions_in("canary", 0.9, 1)[0]
    with TestClient(app) as client:
        data = ask(client, session=session)
        assert data["answer"] == TEXTS["cats"] and arm_of(store, data["query_id"]) is None  # outside the comparison
        health = client.get("/health").json()["canary"]
        assert health["failed_requests"] == 1 and "collection gone" in health["error"]


def test_the_latency_guardrail_compares_each_arms_own_ranking_in_the_same_requests(store):
    """An interleaved request ranks twice, so its total is about twice production's: that alone must not roll back a
    candidate that ranks as fast; a candidate whose own ranking is 3x slower is rolled back."""
    from datetime import UTC, datetime, timedelta

    from rag.rollout.config import CanarySettings
    from rag.rollout.evidence import evaluate

    since = datetime.now(UTC) - timedelta(seconds=1)
    settings = CanarySettings(min_latency_samples=20, max_latency_p95_ratio=1.5)

    def ask(i: int, arm: str, candidate_ms: float) -> None:
        production_ms = 40.0 + i % 5
        timings = (
            {"rank_production": production_ms, "rank_canary": candidate_ms, "generate": 5.0}
            if arm == "canary"
            else {"retrieve": production_ms, "rerank": 0.0, "generate": 5.0}
        )
        total = sum(timings.values())
        store.record_query(
            f"q{i}",
            answer="a",
            chunks=[],
            session_id=f"s{i}",
            arm=arm,
            latency_ms=total,
            timings_ms=timings,
            client_session=f"s{i}",
            client_key=f"client {i}",
        )

    for i in range(60):
        ask(i, "canary" if i % 2 else "production", candidate_ms=41.0)
    evidence = collect(store, since)
    assert len(evidence.ranking_ms["canary"]) == len(evidence.ranking_ms["production"]) == 30
    decision = evaluate(evidence, "v2", settings)
    assert decision.breaches == () and decision.decision == "continue"
    import numpy as np

    assert np.percentile(evidence.latencies_ms["canary"], 95) > 1.5 * np.percentile(
        evidence.latencies_ms["production"], 95
    )

    for i in range(60, 120):
        ask(i, "canary", candidate_ms=130.0)
    decision = evaluate(collect(store, since), "v2", settings)
    assert decision.decision == "rollback" and "ranking latency p95 130 ms is" in decision.reason


def test_a_promotion_waits_until_the_latency_guardrail_can_judge():
    from rag.rollout import CanarySettings
    from rag.rollout.evidence import CanaryEvidence

    settings = CanarySettings(min_latency_samples=50)
    early = CanaryEvidence(["b"] * 9 + ["tie"] * 18, ranking_ms={"production": [40.0] * 27, "canary": [45.0] * 27})
    waiting = evaluate(early, "v2", settings)
    assert waiting.decision == "continue" and waiting.reason.endswith(
        "promotion waits for the latency guardrail: 27 of 50 timed canary requests"
    )
    assert "wins 9 / losses 0" in waiting.reason
    timed = CanaryEvidence(["b"] * 9 + ["tie"] * 41, ranking_ms={"production": [40.0] * 50, "canary": [45.0] * 50})
    assert evaluate(timed, "v2", settings).decision == "promote"
    slow = CanaryEvidence(["b"] * 9 + ["tie"] * 41, ranking_ms={"production": [40.0] * 50, "canary": [90.0] * 50})
    assert evaluate(slow, "v2", settings).decision == "rollback"  # the guardrail now judges, and wins over the test
    losing = CanaryEvidence(["a"] * 9 + ["tie"] * 18, ranking_ms={"production": [40.0] * 27, "canary": [45.0] * 27})
    assert evaluate(losing, "v2", settings).decision == "rollback"  # a rollback never waits


def test_both_arms_encode_the_question_afresh_in_a_canary_request():
    """Production's long-lived index has the replayed question's vector cached, the candidate's new index has not:
    timed as they are, a lookup would be compared with an encoding. A shared index (a reranker canary) would hand
    the candidate production's vector. Both rankings must start without the question's cached vector."""
    from rag.retrieval import Index
    from rag.serving.canary import interleaved_answer

    class Encoder:
        calls = 0

        def encode_queries(self, texts):
            Encoder.calls += len(texts)
            return [[1.0, 0.0] for _ in texts]

    def answerer(name, order, index):
        fake = FakeAnswerer(name, order)
        fake.index = index
        ranked = fake.rank
        fake.rank = lambda q: (index.query_vector(q), ranked(q))[1]  # what a dense retrieval asks of its index
        return fake

    production_index = Index(chunks=pd.DataFrame(), bm25=None, client=None, alias=None, embedder=Encoder())
    production_index.query_vector("a replayed question")  # cached by an earlier production request
    candidate_index = Index(chunks=pd.DataFrame(), bm25=None, client=None, alias=None, embedder=Encoder())
    Encoder.calls = 0
    result = interleaved_answer(
        answerer("production", PRODUCTION.order, production_index),
        answerer("candidate", CANDIDATE.order, candidate_index),
        " a replayed question ",
        seed=1,
    )
    assert Encoder.calls == 2 and {"rank_production", "rank_canary"} <= set(result.timings_ms)
    Encoder.calls = 0
    interleaved_answer(
        answerer("production", PRODUCTION.order, production_index),
        answerer("candidate", CANDIDATE.order, production_index),
        "a replayed question",
        seed=1,
    )
    assert Encoder.calls == 2  # one shared index: still one encoding per arm


def test_what_users_see_of_an_interleaved_list_follows_its_order_not_the_arms_score_scales():
    """A learned ranker scores in probabilities (0.001), production in hybrid scores (0.5): the answer's context
    budget drops the lowest-scoring passages first, so with the arms' own scores the candidate's passages were the
    first to go (a SciFact canary showed 255 candidate passages against 8,133 of production's). Under any budget the
    interleaved list must be cut from its end, keeping both teams' top picks."""
    from rag.qa.prompt import fit_context
    from rag.serving.canary import interleaved_answer

    class Scaled(FakeAnswerer):
        def __init__(self, name, order, scale):
            super().__init__(name, order)
            self.scale, self.received = scale, None

        def rank(self, question):
            return [replace(h, score=h.score * self.scale) for h in super().rank(question)]

        def ask(self, question, *, ranked=None):
            self.received = ranked
            return super().ask(question, ranked=ranked)

    production, candidate = Scaled("production", PRODUCTION.order, 1.0), Scaled("candidate", CANDIDATE.order, 1e-3)
    result = interleaved_answer(production, candidate, "what do cats chase?", seed=3)
    drafted = candidate.received
    assert [c["chunk_id"] for c in result.chunks] == [h.chunk["chunk_id"] for h in drafted]
    assert [h.score for h in drafted] == sorted((h.score for h in drafted), reverse=True)
    own = {h.chunk["chunk_id"]: h.score for arm in (production, candidate) for h in arm.rank("")}
    assert all(h.chunk["arm_score"] == own[h.chunk["chunk_id"]] for h in drafted)
    for keep in range(1, len(drafted) + 1):
        budget = sum(len(h.chunk["text"]) for h in drafted[:keep])
        assert fit_context(drafted, budget) == drafted[:keep]
    first_two = {h.chunk["team"] for h in fit_context(drafted, sum(len(h.chunk["text"]) for h in drafted[:2]))}
    assert first_two == {"production", "canary"}  # each team's first pick stays: a draft round gives one to each


def test_shared_picks_are_recorded_through_the_api_and_credit_nobody(registry, store):
    # The candidate's list starts with production's first passage: both would show "cats" first, so it is a shared
    # pick whichever team drew it; every other shown passage is one arm's own pick.
    state = start("embedder", registry, traffic_share=0.99, log=quiet)
    router = CanaryRouter(registry, lambda kind, candidate: FakeArm(FakeAnswerer("candidate", ["cats", "moon", "tea"])))
    app = create_app(lambda: PRODUCTION, store, ServeSettings(api_token=TOKEN), canary=router, sessions=KEYS)
    sessions = sessions_in("canary", 0.99, 3)
    with TestClient(app) as client:
        asked = [ask(client, f"q{i}", session=s) for i, s in enumerate(sessions)]
        rows = store.table("retrievals")
        own = {}  # query -> (an unshared shown passage, the arm that picked it)
        for query in asked:
            mine = rows[rows["query_id"] == query["query_id"]].set_index("chunk_id")
            assert bool(mine.loc["cats", "shared"]) and not mine.drop(index="cats")["shared"].any()
            assert "shared" not in query["passages"][0]  # like the team, never shown to the user
            chunk = mine.drop(index="cats").index[0]
            own[query["query_id"]] = (chunk, mine.loc[chunk, "team"])
        one, two, three = (q["query_id"] for q in asked)
        session_of = {q["query_id"]: s for q, s in zip(asked, sessions)}

        def click(query_id: str, chunk_id: str) -> None:
            client.post(
                "/events",
                headers=AUTH,
                json={"query_id": query_id, "kind": "click", "chunk_id": chunk_id, "session": session_of[query_id]},
            )

        click(one, "cats")
        click(two, own[two][0])
        click(three, "cats")
        click(three, own[three][0])
    evidence = collect(store, state.started_at)
    team = {"production": "a", "canary": "b"}
    # A click on the shared "cats" alone is a tie; a click on an arm's own pick is that arm's win, with or without
    # a click on "cats" beside it.
    assert evidence.outcomes == ["tie", team[own[two][1]], team[own[three][1]]]
    # Plain team draft credits "cats" to whichever team drew it: query one is decided by the draw.
    assert evidence.plain_outcomes[0] != "tie" and evidence.plain_outcomes[1] == team[own[two][1]]
    settings = CanarySettings(max_queries=500)
    figures = summary(evaluate(evidence, "v2", settings), evidence, settings)
    assert figures["plain_team_draft"].startswith("wins ")
    # The projection an operator reads beside the horizon is the test's own, on these counts.
    assert figures["max_queries"] == 500 and figures["queries_to_decide"] == queries_to_decide(*evidence.counts)


def test_old_stores_get_the_arm_and_team_columns(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    old = FeedbackStore(url)
    old.record_query("q", answer="a", chunks=[{"chunk_id": "c", "doc_id": "d", "text": "t", "rank": 1}])
    with old.engine.begin() as conn:  # what a store from before canaries looks like
        conn.exec_driver_sql("ALTER TABLE queries DROP COLUMN arm")
        conn.exec_driver_sql("ALTER TABLE retrievals DROP COLUMN team")
        conn.exec_driver_sql("ALTER TABLE queries DROP COLUMN timings_ms")
        conn.exec_driver_sql("ALTER TABLE retrievals DROP COLUMN shared")
    old.close()
    store = FeedbackStore(url)
    assert store.table("queries")["arm"].tolist() == [None] and store.table("retrievals")["team"].tolist() == [None]
    assert store.table("queries")["timings_ms"].tolist() == [None]
    store.record_query(
        "q2", answer="a", arm="canary", chunks=[{"chunk_id": "c", "doc_id": "d", "text": "t", "team": "canary"}]
    )
    assert sorted(store.table("retrievals")["team"].fillna("-")) == ["-", "canary"]
    # The shared flag column is added too: NULL for the earlier query, False for a canary pick not marked shared.
    assert sorted(store.table("retrievals")["shared"].map(repr)) == ["False", "None"]
    store.close()


# --- a real candidate: its collection, the API's interleaving, canary_sensor, promotion and rollback ---------------
def chunk_table(texts: dict[str, str]) -> pd.DataFrame:
    import hashlib

    return pd.DataFrame(
        [
            {
                "chunk_id": cid,
                "doc_id": f"{cid}.md",
                "strategy": "t",
                "text": text,
                "char_start": 0,
                "char_end": len(text),
                "page_start": 1,
                "page_end": 1,
                "section_path": [],
                "prev_chunk_id": None,
                "next_chunk_id": None,
                "n_tokens": len(text.split()),
                "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                "table_html": None,
            }
            for cid, text in texts.items()
        ]
    )


def simulate(store, n: int, start_at: int, team_liked: str) -> None:
    """n interleaved canary queries whose user rates +1 the passage of `team_liked`."""
    for i in range(start_at, start_at + n):
        chunks = [
            {"chunk_id": "cats", "doc_id": "cats.md", "text": TEXTS["cats"], "rank": 1, "team": "canary"},
            {"chunk_id": "dogs", "doc_id": "dogs.md", "text": TEXTS["dogs"], "rank": 2, "team": "production"},
        ]
        q = store.record_query(
            f"sim {i}",
            answer="a",
            chunks=chunks,
            session_id=f"sim{i}",
            arm="canary",
            latency_ms=20.0,
            timings_ms={"rank_production": 8.0, "rank_canary": 9.0},
            client_session=f"sim{i}",
            client_key=f"user {i}",
        )  # as the API records it: each simulated user its own session and client
        liked = "cats" if team_liked == "canary" else "dogs"
        store.submit_feedback(
            FeedbackSubmission(
                query_id=q.query_id,
                idempotency_key=f"sim{i}",
                session_id=f"sim{i}",
                passages=[{"chunk_id": liked, "score": 1}],
            ),
            client_session=f"sim{i}",
        )


def test_real_candidate_is_served_interleaved_promoted_by_the_sensor_and_rolled_back(tmp_path, monkeypatch):
    from rag.embedding import _minilm_dir
    from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
    from rag.serving.server import build_app
    from rag.store import CHUNKS_TABLE, TableStore
    from rag.lifecycle.promotion import promote, serving_alias

    from orchestration.rollout import promote_canary_job, rollback_canary_job
    from resources.feedback import FeedbackLoop
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore
    from sensors.canary import canary_sensor

    root = tmp_path / "data"
    monkeypatch.setenv(
        "RAG_DATA_DIR", str(root)
    )  # serving resolves "production" and the candidate through this registry
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.delenv("RAG_QDRANT_PATH", raising=False)
    tables = TableStore(root / "tables")
    tables.write(chunk_table(TEXTS), CHUNKS_TABLE, "t")
    registry = ModelRegistry(root / "models")
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    from rag.lifecycle.target import ServingTarget

    target = ServingTarget.of_client(tables, get_client(qdrant), ["t"])
    v1 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    verdict(registry, "embedder", v1, production=None)
    promote("embedder", registry, v1, log=quiet, target=target)
    production_collection = alias_target(target.client(), serving_alias("t"))
    v2 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    verdict(registry, "embedder", v2, production="v1")

    state = start("embedder", registry, "v2", 0.5, target=target, log=quiet)
    client = target.client()
    candidate_collection = alias_target(client, "t__ft-minilm-v2")  # built by the start, not by training
    assert (
        candidate_collection.startswith("t__ft-minilm-v2__")
        and alias_target(client, "t__production") == production_collection
    )
    close_client(qdrant)  # the API replicates from the folder, as it would beside Dagster

    store = FeedbackStore(f"sqlite:///{root / 'feedback.sqlite'}")
    app = build_app(
        ServeSettings(api_token=TOKEN, refresh_seconds=0),
        root=root,
        store=store,
        strategy="t",
        model="production",
        mode="dense",
    )
    session = sessions_in("canary", 0.5, 1, keys=SessionKeys.for_data_dir(root))[0]  # the keys build_app serves with
    with TestClient(app) as c:
        data = ask(c, "which animal does purr and chase mice", session=session)
        assert (
            data["model_version"].startswith("interleaved(ft-minilm-v1@") and ", ft-minilm-v2@" in data["model_version"]
        )
        assert arm_of(store, data["query_id"]) == "canary" and data["passages"][0]["chunk_id"] == "cats"
        assert set(teams_of(store, data["query_id"]).values()) <= {"production", "canary"}
        assert c.get("/health").json()["canary"]["index_open"] is True

    # canary_sensor: the evidence in the skip reason, an observation only when it changed, then promotion.
    loop = FeedbackLoop(db_url=store.url, data_dir=str(root))
    # The one real request's ranking times (a cold canary arm: 227 ms against 110 in one CI run) are machine noise
    # among 5 samples: no latency breach here; test_rollout.py tests the latency guardrail.
    rollout = Rollout(alpha=0.2, min_latency_samples=5, latency_p95_allowance_ms=10_000)
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "feedback_loop": loop,
        "rollout": rollout,
        "qdrant": QdrantResource(url=None, path=str(root / "qdrant")),
    }
    sensor_resources = {k: resources[k] for k in ("data_store", "feedback_loop", "rollout", "qdrant")}
    simulate(store, 3, 0, team_liked="canary")
    with DagsterInstance.ephemeral() as instance:

        def tick(cursor=None):
            with build_sensor_context(instance=instance, resources=sensor_resources, cursor=cursor) as context:
                return canary_sensor(context)

        first = tick()
        assert first.skip_reason.skip_message == (
            "canary ft-minilm-v2: 4 queries, wins 3 / losses 0 / ties 1, log-likelihood ratio 0.7 of 1.6 needed"
        )
        (observation,) = first.asset_events
        assert observation.asset_key.path == ["model_rollout"] and observation.metadata["wins"].value == 3
        assert tick(first.cursor).asset_events == []  # nothing new since the last tick
        simulate(store, 2, 3, team_liked="canary")
        decided = tick(first.cursor)
        (request,) = decided.run_requests
        assert request.job_name == "promote_canary_job"
        assert request.run_key == f"canary:ft-minilm-v2:promote:{state.started_at.strftime('%Y%m%dT%H%M%S')}"
        run = promote_canary_job.execute_in_process(
            run_config=request.run_config, resources=resources, instance=instance, tags=request.tags
        )
        assert run.success
        events = {e.asset_key.to_user_string(): e.materialization for e in run.get_asset_materialization_events()}
        assert set(events) == {"model_rollout", "production_embedder"}  # the promotion shows on production's card
        assert events["model_rollout"].metadata["stage"].value == "production"
        client = get_client(qdrant)
        assert registry.aliases()["embedder"] == {"production": "v2"}
        assert alias_target(client, "t__production") == candidate_collection  # swapped onto the collection it served
        record = registry.resolve("embedder", "v2").metrics
        assert record["canary"]["decision"] == "promote" and record["canary"]["evidence"]["wins"] == 5
        assert record["promotion"]["forced"] is False and read_state(registry, "embedder").stage == "production"
        idle = tick()  # the job has reported this state: nothing to observe again
        assert idle.asset_events == [] and idle.skip_reason.skip_message.startswith(
            "no canary running (embedder: production ft-minilm-v2, last rollout ft-minilm-v2 production"
        )

        # Rollback from the UI (rollback_canary_job with its defaults) reverts the promotion in one step.
        close_client(qdrant)
        undo = rollback_canary_job.execute_in_process(resources=resources, instance=instance)
        assert undo.success
        client = get_client(qdrant)
        assert registry.aliases()["embedder"] == {"production": "v1"}
        assert alias_target(client, "t__production") == production_collection
        assert read_state(registry, "embedder").stage == "rolled_back"
        assert (
            registry.resolve("embedder", "v1")
            .metrics["promotion"]["force_reason"]
            .startswith("rollback of ft-minilm-v2 after its promotion: operator rollback from the Dagster UI")
        )
    close_client(qdrant)
    store.close()
    log = history(registry)
    assert [(e["step"], e["to"]) for e in log] == [
        ("start", "canary"),
        ("promote", "production"),
        ("revert", "rolled_back"),
    ]
    assert json.loads(json.dumps(log[1]["evidence"]))["wins"] == 5
