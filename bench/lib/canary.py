"""Simulated users deciding a running canary through the API, and the canary_sensor ticks that decide it (shared by
bench/canary_loop.py, bench/self_improvement.py and bench/recanary.py). The click model is described in
bench/canary_loop.py."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from bench.lib.feedback import TOKEN, USER_HEADER
from bench.lib.results import log as say

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
STRATEGY = "paragraph"  # the chunk set bench/self_improvement.py indexes, and bench/recanary.py serves again


def add_click_model(parser) -> None:
    """The click model's parameters (Users), the same flags and defaults in every bench that simulates users."""
    parser.add_argument("--eta", type=float, default=0.7, help="examination probability of rank r: r^-eta")
    parser.add_argument("--p-relevant", type=float, default=1.0, help="examined relevant passage: clicked and rated +1")
    parser.add_argument("--p-negative", type=float, default=0.1, help="examined non-relevant passage: rated -1")
    parser.add_argument(
        "--p-click-noise", type=float, default=0.0, help="examined non-relevant passage, not rated: clicked"
    )


def click_model(args) -> dict:
    """Users' click-model keywords from the flags add_click_model defined."""
    return {k: getattr(args, k) for k in ("eta", "p_relevant", "p_negative", "p_click_noise")}


class Users:
    """Simulated users: each asked query is a fresh session; clicks and ratings from the click model above."""

    def __init__(
        self,
        http,
        queries: dict[str, str],
        qrels: dict[str, dict[str, int]],
        *,
        eta: float,
        p_relevant: float,
        p_negative: float,
        p_click_noise: float,
        seed: int,
        session_prefix: str = "u",
    ):
        self.http, self.queries, self.qrels = http, queries, qrels
        self.eta, self.p_relevant, self.p_negative, self.p_click_noise = eta, p_relevant, p_negative, p_click_noise
        self.rng = random.Random(seed)
        self.session_prefix = session_prefix  # another prefix for users asking again over a data dir used before
        self.order: list[str] = []
        self.passes, self.asked = 0, 0
        self.stats = {"queries": 0, "canary_served": 0, "clicks": 0, "ratings_up": 0, "ratings_down": 0}

    def next_qid(self) -> str:
        if not self.order:  # the list exhausted: again from the start, reshuffled
            self.order = sorted(self.queries)
            self.rng.shuffle(self.order)
            self.passes += 1
        return self.order.pop()

    def ask(self) -> None:
        qid = self.next_qid()
        self.asked += 1
        session = f"{self.session_prefix}{self.asked}-{qid}"  # one fresh user and session per asked query
        headers = {**HEADERS, USER_HEADER: session}
        self.http.cookies.clear()  # a fresh session: not the cookie the previous user's answer set
        answer = self.http.post("/ask", json={"question": self.queries[qid], "session_id": session}, headers=headers)
        answer.raise_for_status()
        data = answer.json()
        token = data["session"]  # the session the server issued: signals count for a canary only under it
        self.stats["queries"] += 1
        self.stats["canary_served"] += str(data["model_version"]).startswith("interleaved(")
        relevant = self.qrels[qid]
        ratings = []
        for rank, passage in enumerate(data["passages"], start=1):
            if self.rng.random() >= rank**-self.eta:
                continue  # not examined
            chunk = passage["chunk_id"]
            if relevant.get(chunk, 0) > 0:
                if self.rng.random() < self.p_relevant:
                    self._click(data["query_id"], chunk, token, headers)
                    ratings.append({"chunk_id": chunk, "score": 1})
            elif self.rng.random() < self.p_negative:
                ratings.append({"chunk_id": chunk, "score": -1})
            elif self.rng.random() < self.p_click_noise:
                self._click(data["query_id"], chunk, token, headers)
        if ratings:
            ack = self.http.post(
                "/feedback",
                json={
                    "query_id": data["query_id"],
                    "idempotency_key": f"fb-{session}",
                    "passages": ratings,
                    "session_id": session,
                    "session": token,
                },
                headers=headers,
            )
            ack.raise_for_status()
            self.stats["ratings_up"] += sum(r["score"] > 0 for r in ratings)
            self.stats["ratings_down"] += sum(r["score"] < 0 for r in ratings)

    def _click(self, query_id: str, chunk_id: str, token: str, headers: dict) -> None:
        self.http.post(
            "/events",
            json={"query_id": query_id, "kind": "click", "chunk_id": chunk_id, "session": token},
            headers=headers,
        ).raise_for_status()
        self.stats["clicks"] += 1

    def snapshot(self) -> dict:
        return {**self.stats, "passes": self.passes}


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


def canary_phase(
    root: Path, http, app, users: Users, instance, resources: dict, *, batch: int, max_asked: int, log=print
) -> dict:
    """Users ask until canary_sensor decides on the running canary; the requested job runs in-process and the API
    refreshes. Returns what the decision needed."""
    from dagster import SensorResult, SkipReason, build_sensor_context

    from orchestration.rollout import promote_canary_job, rollback_canary_job
    from rag.registry import ModelRegistry
    from rag.lifecycle.rollout import read_state, running_canary
    from sensors.canary import canary_sensor
    from sensors.feedback import feedback_volume_sensor

    registry = ModelRegistry(root / "models")
    kind, state = running_canary(registry)
    started, before = time.perf_counter(), users.snapshot()
    out: dict = {
        "kind": kind,
        "candidate_version": state.candidate_version,
        "traffic_share": state.traffic_share,
        "start_reason": state.reason,
        "forced": state.force_reason is not None,
    }
    sensor_resources = {k: resources[k] for k in ("data_store", "feedback_loop", "rollout", "qdrant")}
    cursor, ticks, asked, request = None, 0, 0, None
    while request is None and asked < max_asked:
        for _ in range(batch):
            users.ask()
        asked += batch
        with build_sensor_context(instance=instance, resources=sensor_resources, cursor=cursor) as context:
            result = canary_sensor(context)
            cursor = context.cursor if isinstance(result, SkipReason) else (result.cursor or cursor)
        ticks += 1
        if isinstance(result, SensorResult) and result.run_requests:
            request = result.run_requests[0]
        else:
            said = result.skip_message if isinstance(result, SkipReason) else result.skip_reason.skip_message
            out["last_evidence"] = said
            if ticks % 5 == 1:
                log(f"  {asked} asked in the canary phase: {said}")
        if ticks == 1:  # the retrain sensor waits while the canary runs
            with build_sensor_context(
                instance=instance, resources={"feedback_loop": resources["feedback_loop"]}
            ) as context:
                waiting = feedback_volume_sensor(context)
            out["feedback_volume_sensor_during_canary"] = (
                getattr(waiting, "skip_message", None) or "requested a retrain"
            )
    out.update(asked=asked, sensor_ticks=ticks, users=delta(users.snapshot(), before))
    if request is None:
        out["decision"] = None
        out["seconds"] = round(time.perf_counter() - started, 1)
        log(f"  no decision after {asked} asked queries (cap --max-canary-asked)")
        return out
    evidence = json.loads(next(iter(request.run_config["ops"].values()))["config"]["evidence_json"])
    out.update(
        decision=evidence["decision"],
        evidence=evidence["reason"],
        canary_queries=evidence["queries_canary"],
        decisive_canary_queries=evidence["wins"] + evidence["losses"],
        wins=evidence["wins"],
        losses=evidence["losses"],
        ties=evidence["ties"],
        log_likelihood_ratio=evidence["log_likelihood_ratio"],
        plain_team_draft=evidence.get("plain_team_draft"),
        threshold=evidence["threshold"],
        queries_to_decide=evidence.get("queries_to_decide"),
        production_queries=evidence["queries_production"],
        latency_p95_ms={
            "production": evidence["latency_p95_ms_production"],
            "canary": evidence["latency_p95_ms_canary"],
        },
        ranking_p95_ms={
            "production": evidence.get("ranking_p95_ms_production"),
            "canary": evidence.get("ranking_p95_ms_canary"),
        },
        breaches=evidence["breaches"],
    )
    job = {"promote_canary_job": promote_canary_job, "rollback_canary_job": rollback_canary_job}[request.job_name]
    run = job.execute_in_process(
        run_config=request.run_config, resources=resources, instance=instance, tags=request.tags, raise_on_error=False
    )
    out["job"], out["job_success"] = request.job_name, run.success
    out["stage_after"] = read_state(registry, kind).stage
    app.state.serving.refresh(force=True)
    out["seconds"] = round(time.perf_counter() - started, 1)
    log(f"  {request.job_name} ({'ok' if run.success else 'FAILED'}): {evidence['reason']}")
    return out


def queued_canaries(
    root: Path, http, app, users: Users, instance, resources: dict, *, batch: int, max_asked: int, log=print
) -> list[dict]:
    """After a decision, canary_sensor starts the candidate that waited behind it (retrain_job gates an embedder and a
    reranker; one canary runs at a time): its start_canary_job runs in-process, then the users decide that canary too.
    Returns one canary_phase record per started canary."""
    from dagster import RunRequest, SensorResult, build_sensor_context

    from orchestration.rollout import start_canary_job
    from sensors.canary import canary_sensor

    phases = []
    sensor_resources = {k: resources[k] for k in ("data_store", "feedback_loop", "rollout", "qdrant")}
    while True:
        with build_sensor_context(instance=instance, resources=sensor_resources) as context:
            result = canary_sensor(context)
        requests = (
            [result]
            if isinstance(result, RunRequest)
            else (result.run_requests or [])
            if isinstance(result, SensorResult)
            else []
        )
        if not requests or requests[0].job_name != start_canary_job.name:
            return phases
        request = requests[0]
        run = start_canary_job.execute_in_process(
            run_config=request.run_config,
            resources=resources,
            instance=instance,
            tags=request.tags,
            raise_on_error=False,
        )
        log(
            f"  canary_sensor started the queued {request.tags.get('rollout/kind')} canary: "
            f"start_canary_job {'ok' if run.success else 'FAILED'}"
        )
        if not run.success:
            phases.append({"kind": request.tags.get("rollout/kind"), "start_job_success": False})
            return phases
        app.state.serving.refresh(force=True)
        phases.append(
            {
                "started_by": f"canary_sensor -> start_canary_job (run_key {request.run_key})",
                **canary_phase(root, http, app, users, instance, resources, batch=batch, max_asked=max_asked, log=log),
            }
        )


def split_users(items, share: float, seed: int):
    """(users' questions, judged questions): a random `share` of the human questions drives the canary and is
    never scored; the rest is scored."""
    order = sorted(items, key=lambda i: i.qid)
    random.Random(seed).shuffle(order)
    cut = round(len(order) * share)
    return order[:cut], order[cut:]


def users_decide(
    root: Path,
    users_items,
    qrels,
    instance,
    resources: dict,
    args,
    save_into: dict,
    *,
    strategy: str,
    session_prefix: str = "u",
) -> None:
    """The users' questions through the API (the defaults `rag serve` uses, over chunk set `strategy`) until
    canary_sensor decides the running canary, then each queued one: one canary_phase record per canary in
    save_into["canaries"]. `args` carries the click model (add_click_model), seed, canary_batch, max_canary_asked."""
    from fastapi.testclient import TestClient

    from bench.lib.feedback import TOKEN, USER_HEADER
    from rag.feedback import FeedbackStore
    from rag.serving.server import build_app
    from rag.serving.settings import ServeSettings

    queries = {i.qid: i.question for i in users_items}
    app = build_app(
        ServeSettings(api_token=TOKEN, refresh_seconds=0, client_header=USER_HEADER),
        root=root,
        store=FeedbackStore(root=root),
        strategy=strategy,
        top_k=10,
        attribution=False,
    )
    phases: list[dict] = save_into.setdefault("canaries", [])
    started = time.perf_counter()
    with TestClient(app) as http:
        users = Users(
            http,
            queries,
            {q: qrels.get(q, {}) for q in queries},
            seed=args.seed,
            session_prefix=session_prefix,
            **click_model(args),
        )
        kwargs = dict(batch=args.canary_batch, max_asked=args.max_canary_asked, log=lambda m: say(f"  {m}"))
        phases.append(canary_phase(root, http, app, users, instance, resources, **kwargs))
        phases.extend(queued_canaries(root, http, app, users, instance, resources, **kwargs))
        save_into["users"] = {**users.snapshot(), "seconds": round(time.perf_counter() - started, 1)}


def load_corpus(name: str, args):
    """(documents, human questions) of bench/self_improvement.py's corpus `name` (squad | scifact), from its
    arguments: --articles, --scifact-docs (all relevant abstracts kept), --questions sampled with --seed."""
    from bench.lib.datasets import SCIFACT, SQUAD
    from rag.evaluation.loaders import beir_documents, squad_articles

    if name == "squad":
        docs, items = squad_articles(SQUAD, max_articles=args.articles)
    else:
        docs, items = beir_documents(SCIFACT, "test")
        if args.scifact_docs:
            wanted = {e.doc_id for i in items for e in i.evidence}
            others = [d for d in docs if d.doc_id not in wanted]
            keep = wanted | {
                d.doc_id for d in random.Random(args.seed).sample(others, min(args.scifact_docs, len(others)))
            }
            docs = [d for d in docs if d.doc_id in keep]
    if args.questions and len(items) > args.questions:
        items = random.Random(args.seed).sample(items, args.questions)
    return docs, items
