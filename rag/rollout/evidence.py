"""A running canary's evidence, read from the feedback store: one interleaving outcome per canary question and the
guardrails' inputs per arm. The store records which arm served each query (queries.arm), which team contributed
each shown passage of an interleaved answer (retrievals.team), and the session the server issued and the client
key of each request (rag.serving.sessions); this module turns them into a Decision.

What one client can say is bounded, because a client can open any number of sessions:
- Only queries asked under a session the server issued count (queries.client_session), and a signal counts only when
  it was sent under the session that was shown the query: a rating or click from another session, from a
  client-chosen label, or from none is stored but credits nobody. Answer votes likewise.
- One judgement per (client, normalised question): a client repeating a question, in one session or in many, is one
  judgement; the first of its queries that received a credited signal decides (none: a tie).
- At most rag.rollout.sequential.client_bound(settings) judgements per client (per client_window_days, or over the
  whole canary), those that credited an arm or carry an answer vote first, then the earliest: one client never adds
  more than that to the outcomes, the answer votes or the latency samples, whatever it sends. The rest are counted
  (`over_client_bound`) and judged no further. A client that opened more than max_sessions_per_client sessions in a
  window adds nothing in it (`clients_with_too_many_sessions`): it was drawing arms until it got one. A client is its
  key (queries.client_key), or its session when the key is missing.
- Outcome of a canary judgement: credit() of its signals on the shown passages — a passage rated +1 or clicked
  credits its team, one rated -1 credits nobody; a passage both clicked and rated counts its rating only (the later
  rating wins when a user changed their mind); where a passage was rated +1, clicks on passages nobody rated credit
  nobody (the +1 says which one answered); a shared pick (retrievals.shared: both rankings would have shown it
  there) credits nobody. A judgement without credited signals is a tie: it counts towards the horizon (max_queries)
  and tells the test nothing. The outcomes plain team draft would have given (shared picks credited to the team
  that drew them) are kept beside them, for reports only.
- Guardrails: ranking latency and answer votes (the latest ±1 per judgement) of each arm. The latency compared is
  each arm's own ranking (retrieve → rerank) inside the same canary requests (queries.timings_ms rank_production and
  rank_canary, timed back to back), one pair per judgement: what the candidate would cost serving alone, on the same
  question and under the same machine load as production's. The whole request (queries.latency_ms, two rankings for
  a canary query) is reported, not judged: interleaving's second ranking is the canary's own overhead and ends with
  it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from sqlalchemy import select

from rag.feedback import schema as s
from rag.training.data import normalized_question
from rag.rollout.config import CanarySettings
from rag.rollout.guardrails import Votes, guardrail_breaches, with_guardrails
from rag.rollout.interleaving import credit, tally
from rag.rollout.sequential import Decision, client_bound, queries_to_decide, sequential_decision

ARMS = ("production", "canary")
TEAM = {"production": "a", "canary": "b"}  # interleaving teams as retrievals.team stores them; the candidate is "b"


@dataclass(frozen=True)
class CanaryEvidence:
    outcomes: list[str]  # per canary query, oldest first: "a" (production won), "b" (the candidate won), "tie"
    plain_outcomes: list[str] = field(default_factory=list)  # the same, shared picks credited (reported, not judged)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)  # per arm: whole requests (reported)
    ranking_ms: dict[str, list[float]] = field(default_factory=dict)  # per arm: own ranking in canary requests (judged)
    votes: dict[str, Votes] = field(default_factory=dict)  # answer votes per arm
    queries: dict[str, int] = field(default_factory=dict)  # per arm, every query asked under an issued session
    over_client_bound: int = 0  # judgements left out: their client had already said as much as one client may
    clients: int = 0  # clients whose canary judgements count
    clients_with_too_many_sessions: int = 0  # clients left out for opening more than max_sessions_per_client

    @property
    def counts(self) -> tuple[int, int, int]:
        """(candidate wins, losses, ties)."""
        return tally(self.outcomes, candidate="b")


@dataclass
class _Judgement:
    """One client's one question in one arm: its queries' signals reduced to one outcome and one answer vote."""

    arm: str
    client: str
    window: int
    order: int  # position of its first query, oldest first
    outcome: str = "tie"
    plain: str = "tie"
    vote: int | None = None
    ranking_ms: dict[str, float] | None = None  # the first query's own ranking per arm (canary judgements)

    @property
    def informative(self) -> bool:
        return self.outcome != "tie" or self.vote is not None


def _window(created_at: datetime, since: datetime, settings: CanarySettings) -> int:
    if settings.client_window_days is None:
        return 0
    age = _utc(created_at) - since.astimezone(timezone.utc)
    return int(age.total_seconds() // (settings.client_window_days * 86400))


def _utc(stamp: datetime) -> datetime:
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)  # SQLite returns UTC without its zone


def _read(engine, since: datetime) -> dict[str, list]:
    q, r, f, e, sub = s.queries, s.retrievals, s.feedback, s.implicit_events, s.submissions
    asked_since = q.c.created_at >= since.astimezone(timezone.utc)
    in_canary = (q.c.arm.in_(ARMS), asked_since, q.c.client_session.is_not(None))
    canary = (q.c.arm == "canary", asked_since, q.c.client_session.is_not(None))
    with engine.connect() as conn:
        return {
            "asked": conn.execute(
                select(
                    q.c.query_id,
                    q.c.arm,
                    q.c.latency_ms,
                    q.c.timings_ms,
                    q.c.client_session,
                    q.c.client_key,
                    q.c.text,
                    q.c.created_at,
                )
                .where(*in_canary)
                .order_by(q.c.created_at, q.c.query_id)
            ).all(),
            "shown": conn.execute(
                select(r.c.query_id, r.c.chunk_id, r.c.team, r.c.shared)
                .join(q, q.c.query_id == r.c.query_id)
                .where(*canary, r.c.team.in_(ARMS))
            ).all(),
            "ratings": conn.execute(
                select(f.c.query_id, f.c.chunk_id, f.c.score)
                .join(q, q.c.query_id == f.c.query_id)
                .join(sub, sub.c.submission_id == f.c.submission_id)
                .where(*canary, f.c.target == "passage", sub.c.client_session == q.c.client_session)
                .order_by(f.c.event_id)
            ).all(),
            "clicks": conn.execute(
                select(e.c.query_id, e.c.chunk_id)
                .join(q, q.c.query_id == e.c.query_id)
                .where(
                    *canary, e.c.kind == "click", e.c.chunk_id.is_not(None), e.c.client_session == q.c.client_session
                )
            ).all(),
            "votes": conn.execute(
                select(f.c.query_id, f.c.score)
                .join(q, q.c.query_id == f.c.query_id)
                .join(sub, sub.c.submission_id == f.c.submission_id)
                .where(*in_canary, f.c.target == "answer", sub.c.client_session == q.c.client_session)
                .order_by(f.c.event_id)
            ).all(),
        }


def collect(store, since: datetime, settings: CanarySettings | None = None) -> CanaryEvidence:
    """The evidence of queries asked at or after `since` (the canary's start) in a FeedbackStore (or an Engine),
    each client bounded by `settings` (max_outcomes_per_client, client_window_days)."""
    settings = settings or CanarySettings()
    rows = _read(getattr(store, "engine", store), since)
    teams: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for query_id, chunk_id, team, shared in rows["shown"]:
        teams[query_id].append((chunk_id, TEAM[team], bool(shared)))
    signals: dict[str, dict[str, int | str]] = defaultdict(dict)
    for query_id, chunk_id in rows["clicks"]:
        signals[query_id][chunk_id] = "click"
    for query_id, chunk_id, score in rows["ratings"]:  # after the clicks and in event order: the latest rating wins
        signals[query_id][chunk_id] = int(score)
    votes = {query_id: int(score) for query_id, score in rows["votes"]}  # in event order: the latest vote wins

    latencies, queries = {arm: [] for arm in ARMS}, {arm: 0 for arm in ARMS}
    judgements: dict[tuple, _Judgement] = {}  # (arm, client, normalised question) -> its judgement
    sessions: dict[tuple, set] = defaultdict(set)  # (client, window) -> the sessions it asked from
    for order, (query_id, arm, latency, timings, session, client_key, text, created_at) in enumerate(rows["asked"]):
        queries[arm] += 1
        if latency is not None:
            latencies[arm].append(float(latency))
        client, window = client_key or f"session:{session}", _window(created_at, since, settings)
        sessions[(client, window)].add(session)
        key = (arm, client, normalized_question(text))
        judgement = judgements.get(key)
        if judgement is None:
            judgement = judgements[key] = _Judgement(arm, client, window, order)
            if arm == "canary":
                timed = {a: (timings or {}).get(f"rank_{a}") for a in ARMS}
                if all(v is not None for v in timed.values()):  # paired: both rankings of the same request
                    judgement.ranking_ms = {a: float(ms) for a, ms in timed.items()}
        if query_id in votes:
            judgement.vote = votes[query_id]
        said = signals.get(query_id, {})
        if arm == "canary" and judgement.outcome == "tie" and said:
            # The first repeat that was credited decides; later repeats of the same list add nothing.
            drafted = teams.get(query_id, [])
            judgement.outcome = credit(drafted, said).outcome
            judgement.plain = credit([(doc, team) for doc, team, _ in drafted], said).outcome

    fishing = {key for key, seen in sessions.items() if len(seen) > settings.max_sessions_per_client}
    counted = [j for j in judgements.values() if (j.client, j.window) not in fishing]
    kept, over = _within_client_bound(counted, client_bound(settings))
    outcomes = [j.outcome for j in kept if j.arm == "canary"]
    ranking: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for j in kept:
        if j.ranking_ms is not None:
            for a, ms in j.ranking_ms.items():
                ranking[a].append(ms)
    counted_votes = {
        arm: Votes(
            sum(1 for j in kept if j.arm == arm and (j.vote or 0) > 0),
            sum(1 for j in kept if j.arm == arm and (j.vote or 0) < 0),
        )
        for arm in ARMS
    }
    return CanaryEvidence(
        outcomes,
        plain_outcomes=[j.plain for j in kept if j.arm == "canary"],
        latencies_ms=latencies,
        ranking_ms=ranking,
        votes=counted_votes,
        queries=queries,
        over_client_bound=over,
        clients=len({j.client for j in kept if j.arm == "canary"}),
        clients_with_too_many_sessions=len({client for client, _window in fishing}),
    )


def _within_client_bound(judgements, bound: int) -> tuple[list[_Judgement], int]:
    """The judgements each client may add (per arm and window: at most `bound`, informative ones first, then the
    earliest), oldest first; and how many were left out."""
    by_client: dict[tuple, list[_Judgement]] = defaultdict(list)
    for j in judgements:
        by_client[(j.arm, j.client, j.window)].append(j)
    kept: list[_Judgement] = []
    for group in by_client.values():
        kept += sorted(group, key=lambda j: (not j.informative, j.order))[:bound]
    total = sum(len(group) for group in by_client.values())
    return sorted(kept, key=lambda j: j.order), total - len(kept)


def evaluate(evidence: CanaryEvidence, candidate: str, settings: CanarySettings | None = None) -> Decision:
    """The sequential test on the outcomes, overridden by a rollback when a guardrail is breached; a promotion
    waits until the latency guardrail has its min_latency_samples paired timings."""
    settings = settings or CanarySettings()
    wins, losses, ties = evidence.counts
    decision = sequential_decision(wins, losses, ties, candidate, settings)
    breaches = guardrail_breaches(
        evidence.ranking_ms.get("canary", []),
        evidence.ranking_ms.get("production", []),
        evidence.votes.get("canary", Votes(0, 0)),
        evidence.votes.get("production", Votes(0, 0)),
        settings,
    )
    decision = with_guardrails(decision, breaches)
    timed = min(len(evidence.ranking_ms.get("canary", [])), len(evidence.ranking_ms.get("production", [])))
    if decision.decision == "promote" and timed < settings.min_latency_samples:
        # A strong early edge can cross the test's threshold in a few dozen queries, before the latency guardrail
        # may judge: promotion waits until it can (every canary request is timed, so the wait is short).
        decision = replace(
            decision,
            decision="continue",
            reason=(
                f"{decision.reason.removesuffix(', promote')}; promotion waits for the latency guardrail: {timed} of "
                f"{settings.min_latency_samples} timed canary requests"
            ),
        )
    return decision


def past_max_days(
    decision: Decision, started_at: datetime, settings: CanarySettings | None = None, now: datetime | None = None
) -> Decision:
    """A "continue" turned into a rollback once the canary has run settings.max_days without a decision: too few
    users reached it, and retraining waits while a canary runs. Any other decision stands."""
    settings = settings or CanarySettings()
    age_days = ((now or datetime.now(timezone.utc)) - started_at).total_seconds() / 86400
    if decision.decision != "continue" or age_days <= settings.max_days:
        return decision
    return replace(
        decision,
        decision="rollback",
        reason=f"{decision.reason}; no decision {age_days:.1f} days after its start (max_days "
        f"{settings.max_days:g}): too few users reached it, roll back and let retraining resume",
    )


def _plain_counts(evidence: CanaryEvidence) -> dict:
    """What plain team draft (shared picks credited) would have counted on the same queries: reported to show what
    the shared-pick rule removes, never used to decide."""
    wins, losses, ties = tally(evidence.plain_outcomes, candidate="b")
    return {"plain_team_draft": f"wins {wins} / losses {losses} / ties {ties}"} if evidence.plain_outcomes else {}


def summary(decision: Decision, evidence: CanaryEvidence, settings: CanarySettings | None = None) -> dict:
    """Flat figures for logs, manifests and Dagster metadata; `queries_to_decide` projects, at the rates so far, when
    the test would cross (None: no edge yet), beside the horizon that rolls an undecided canary back."""
    import numpy as np

    settings = settings or CanarySettings()

    def p95(values: list[float]) -> float | None:
        return round(float(np.percentile(values, 95)), 1) if values else None

    return {
        "decision": decision.decision,
        "candidate": decision.candidate,
        "queries": decision.queries,
        "wins": decision.wins,
        "losses": decision.losses,
        "ties": decision.ties,
        "log_likelihood_ratio": round(decision.log_lr, 3),
        "threshold": round(decision.threshold, 3),
        # Only while the candidate loses more often: with more wins there is nothing for the harm test to weigh.
        **(
            {
                "harm_log_likelihood_ratio": round(decision.log_lr_harm, 3),
                "harm_threshold": round(decision.harm_threshold, 3),
            }
            if decision.harm_threshold is not None and decision.losses > decision.wins
            else {}
        ),
        "queries_to_decide": queries_to_decide(decision.wins, decision.losses, decision.ties, settings),
        "max_queries": settings.max_queries,
        **_plain_counts(evidence),
        "queries_production": evidence.queries.get("production", 0),
        "queries_canary": evidence.queries.get("canary", 0),
        "canary_clients": evidence.clients,
        "judgements_over_client_bound": evidence.over_client_bound,
        "clients_with_too_many_sessions": evidence.clients_with_too_many_sessions,
        "client_bound": client_bound(settings),
        "latency_p95_ms_production": p95(evidence.latencies_ms.get("production", [])),
        "latency_p95_ms_canary": p95(evidence.latencies_ms.get("canary", [])),
        "ranking_p95_ms_production": p95(evidence.ranking_ms.get("production", [])),
        "ranking_p95_ms_canary": p95(evidence.ranking_ms.get("canary", [])),
        **{f"answer_votes_{arm}": f"{v.up} up / {v.down} down" for arm, v in evidence.votes.items()},
        "breaches": "; ".join(decision.breaches),
        "reason": decision.reason,
    }
