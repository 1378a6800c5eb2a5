"""A running canary's evidence, read from the feedback store: one interleaving outcome per canary query and the
guardrails' inputs per arm. The store records which arm served each query (queries.arm) and which team contributed
each shown passage of an interleaved answer (retrievals.team); this module turns them into a Decision.

- One outcome per (session, normalised question): a session repeating a question is shown the same interleaved
  list (the coin is seeded by candidate, session and question), so its repeats are one judgement, not several;
  the first of them that received a credited signal decides (none: a tie).
- Signals count only from the session that was shown the query: a rating whose submission, or a click whose
  event, names another session (or none) says nothing about what that session saw.
- Outcome of a canary query: credit() of its signals on the shown passages — a passage rated +1 or clicked
  credits its team, one rated -1 debits it; a passage both clicked and rated counts its rating only (the later
  rating wins when a user changed their mind); a shared pick (retrievals.shared: both rankings would have shown it
  there) credits nobody. A query without credited signals is a tie: it counts towards the horizon (max_queries)
  and tells the test nothing. The outcomes plain team draft would have given (shared picks credited to the team
  that drew them) are kept beside them, for reports only.
- Guardrails: ranking latency and answer votes (the latest ±1 per query) of each arm. The latency compared is each
  arm's own ranking (retrieve → rerank) inside the same canary requests (queries.timings_ms rank_production and
  rank_canary, timed back to back): what the candidate would cost serving alone, under the same machine load as
  production's. The whole request (queries.latency_ms, two rankings for a canary query) is reported, not judged:
  interleaving's second ranking is the canary's own overhead and ends with it. Only sessions in the split count:
  requests without a session id are served by production outside it (arm NULL).
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
from rag.rollout.sequential import Decision, queries_to_decide, sequential_decision

ARMS = ("production", "canary")
TEAM = {"production": "a", "canary": "b"}  # interleaving teams as retrievals.team stores them; the candidate is "b"


@dataclass(frozen=True)
class CanaryEvidence:
    outcomes: list[str]  # per canary query, oldest first: "a" (production won), "b" (the candidate won), "tie"
    plain_outcomes: list[str] = field(default_factory=list)  # the same, shared picks credited (reported, not judged)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)  # per arm: whole requests (reported)
    ranking_ms: dict[str, list[float]] = field(default_factory=dict)  # per arm: own ranking in canary requests (judged)
    votes: dict[str, Votes] = field(default_factory=dict)  # answer votes per arm
    queries: dict[str, int] = field(default_factory=dict)  # per arm

    @property
    def counts(self) -> tuple[int, int, int]:
        """(candidate wins, losses, ties)."""
        return tally(self.outcomes, candidate="b")


def collect(store, since: datetime) -> CanaryEvidence:
    """The evidence of queries asked at or after `since` (the canary's start) in a FeedbackStore (or an Engine)."""
    engine = getattr(store, "engine", store)
    q, r, f, e, sub = s.queries, s.retrievals, s.feedback, s.implicit_events, s.submissions
    in_canary = (q.c.arm.in_(ARMS), q.c.created_at >= since.astimezone(timezone.utc))
    canary = (q.c.arm == "canary", q.c.created_at >= since.astimezone(timezone.utc))
    with engine.connect() as conn:
        asked = conn.execute(
            select(q.c.query_id, q.c.arm, q.c.latency_ms, q.c.timings_ms, q.c.session_id, q.c.text)
            .where(*in_canary)
            .order_by(q.c.created_at, q.c.query_id)
        ).all()
        shown = conn.execute(
            select(r.c.query_id, r.c.chunk_id, r.c.team, r.c.shared)
            .join(q, q.c.query_id == r.c.query_id)
            .where(*canary, r.c.team.in_(ARMS))
        ).all()
        ratings = conn.execute(
            select(f.c.query_id, f.c.chunk_id, f.c.score)
            .join(q, q.c.query_id == f.c.query_id)
            .join(sub, sub.c.submission_id == f.c.submission_id)
            .where(*canary, f.c.target == "passage", sub.c.session_id == q.c.session_id)
            .order_by(f.c.event_id)
        ).all()
        clicks = conn.execute(
            select(e.c.query_id, e.c.chunk_id)
            .join(q, q.c.query_id == e.c.query_id)
            .where(*canary, e.c.kind == "click", e.c.chunk_id.is_not(None), e.c.session_id == q.c.session_id)
        ).all()
        answer_votes = conn.execute(
            select(q.c.arm, f.c.query_id, f.c.score)
            .join(q, q.c.query_id == f.c.query_id)
            .where(*in_canary, f.c.target == "answer")
            .order_by(f.c.event_id)
        ).all()

    teams: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for query_id, chunk_id, team, shared in shown:
        teams[query_id].append((chunk_id, TEAM[team], bool(shared)))
    signals: dict[str, dict[str, int | str]] = defaultdict(dict)
    for query_id, chunk_id in clicks:
        signals[query_id][chunk_id] = "click"
    for query_id, chunk_id, score in ratings:  # after the clicks and in event order: the latest rating wins
        signals[query_id][chunk_id] = int(score)

    outcomes, plain, latencies, queries = [], [], {arm: [] for arm in ARMS}, {arm: 0 for arm in ARMS}
    ranking: dict[str, list[float]] = {arm: [] for arm in ARMS}
    judged: dict[tuple, int] = {}  # (session, normalised question) -> index of its outcome
    for query_id, arm, latency, timings, session_id, text in asked:
        queries[arm] += 1
        if latency is not None:
            latencies[arm].append(float(latency))
        if arm == "canary":
            drafted, said = teams.get(query_id, []), signals.get(query_id, {})
            outcome = credit(drafted, said).outcome
            plain_outcome = credit([(doc, team) for doc, team, _ in drafted], said).outcome
            key = (session_id, normalized_question(text))
            if key not in judged:
                judged[key] = len(outcomes)
                outcomes.append(outcome)
                plain.append(plain_outcome)
            elif outcomes[judged[key]] == "tie" and said:
                # The first repeat that was credited decides; later repeats of the same list add nothing.
                outcomes[judged[key]], plain[judged[key]] = outcome, plain_outcome
            timed = {a: (timings or {}).get(f"rank_{a}") for a in ARMS}
            if all(v is not None for v in timed.values()):  # paired: both rankings of the same request
                for a, ms in timed.items():
                    ranking[a].append(float(ms))
    latest: dict[str, tuple[str, int]] = {}
    for arm, query_id, score in answer_votes:
        latest[query_id] = (arm, int(score))
    votes = {
        arm: Votes(
            sum(1 for a, v in latest.values() if a == arm and v > 0),
            sum(1 for a, v in latest.values() if a == arm and v < 0),
        )
        for arm in ARMS
    }
    return CanaryEvidence(
        outcomes, plain_outcomes=plain, latencies_ms=latencies, ranking_ms=ranking, votes=votes, queries=queries
    )


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
        "latency_p95_ms_production": p95(evidence.latencies_ms.get("production", [])),
        "latency_p95_ms_canary": p95(evidence.latencies_ms.get("canary", [])),
        "ranking_p95_ms_production": p95(evidence.ranking_ms.get("production", [])),
        "ranking_p95_ms_canary": p95(evidence.ranking_ms.get("canary", [])),
        **{f"answer_votes_{arm}": f"{v.up} up / {v.down} down" for arm, v in evidence.votes.items()},
        "breaches": "; ".join(decision.breaches),
        "reason": decision.reason,
    }
