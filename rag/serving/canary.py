"""Serving a canary: which arm answers a session, and the interleaved answer of the canary arm.

While a model kind's rollout state (rag.lifecycle.rollout, beside the registry) says "canary", each request gets an
arm from assign_arm: sha256 of the candidate version and the session's arm key (rag.serving.sessions: a keyed hash of
the session the server issued, so no client can choose or predict it), so a session stays on one arm on every
request and every server, and a new candidate draws a fresh set of sessions. Production sessions
are answered exactly as without a canary. A canary session is answered by team-draft interleaving: production's and
the candidate's rankings (each retrieve → rerank → filter) are drafted into one list, every passage tagged with the
team that picked it, and the candidate's answerer writes the answer from that list. The store records the arm of
each query and the team of each shown passage; rag.rollout.evidence credits clicks and ratings to the teams.

Requests without an arm key (a caller outside the API) stay outside the split: production answers them and no arm
is recorded.

With no canary running a request costs two stat() calls of the state files more than before; the candidate's index
(for an embedder: a serving replica of its collection <strategy>__<name>, built when the canary started) is opened
when a canary appears, in the background refresh or by the first request that needs it, and closed when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from rag.registry import KINDS, ModelRegistry, ModelVersion
from rag.rollout.interleaving import seed_from, team_draft_interleave
from rag.rollout.state import RolloutState, arm_for
from rag.lifecycle.rollout import read_state, state_marks
from rag.training.data import normalized_question

log = logging.getLogger(__name__)
TEAM_ARM = {"a": "production", "b": "canary"}  # production is team a, the candidate team b
RETRY_SECONDS = 60.0  # a candidate index that failed to open is tried again after this (not on every request)


@dataclass
class Served:
    result: object  # rag.qa.AnswerResult
    arm: str | None  # production | canary while a canary runs and the request has a session; else None
    model_version: str | None


def model_version(answerer) -> str | None:
    from rag.serving.app import model_version as version

    return version(answerer)


class CanaryFailed(RuntimeError):
    """The candidate's side of an interleaved answer failed; production's side did not."""


def _forget(answerer, question: str) -> None:
    index = getattr(answerer, "index", None)
    if hasattr(index, "forget_query"):
        index.forget_query(question)


def interleaved_answer(production, candidate, question: str, seed: int):
    """Team-draft interleaving of both answerers' rankings (production team a, the candidate team b), answered by the
    candidate's answerer from the interleaved list. Each passage's chunk carries `team` (production | canary) and
    `shared` (both rankings would have shown it at that pick).
    Latency covers both rankings and the answer: what the user waited. timings_ms holds each arm's own ranking time
    (rank_production, rank_canary), which the latency guardrail compares: both rankings encode the question afresh
    (a cached query vector of production's long-lived index, or of an index both arms share, would time a lookup
    against an encoding). Production ranks first, so a refused question fails as it would without a canary; a
    failure on the candidate's side raises CanaryFailed."""
    started = time.perf_counter()
    _forget(production, question)
    ranked_a = production.rank(question)
    _forget(candidate, question)
    lap = time.perf_counter()
    try:
        ranked_b = candidate.rank(question)
    except Exception as exc:
        raise CanaryFailed(f"the candidate could not rank: {type(exc).__name__}: {exc}") from exc
    ranked_at = time.perf_counter()
    hits = {"a": {h.chunk["chunk_id"]: h for h in ranked_a}, "b": {h.chunk["chunk_id"]: h for h in ranked_b}}
    # As many passages as one arm alone would show: the user sees a list of the usual length.
    k = max(len(ranked_a), len(ranked_b))
    shown = team_draft_interleave(list(hits["a"]), list(hits["b"]), k, seed)
    # The two arms' scores are on different scales (a learned ranker's probabilities beside hybrid scores), and the
    # answer's context budget drops the lowest-scoring passages first: kept as they are, one team's passages would
    # vanish from what users see and the comparison would be rigged. The interleaved order is the only shared scale;
    # each arm's own score stays in the chunk as `arm_score`.
    drafted = [
        replace(
            hits[team][doc],
            rank=rank,
            score=1.0 - (rank - 1) / len(shown),
            chunk={
                **hits[team][doc].chunk,
                "team": TEAM_ARM[team],
                "shared": shared,
                "arm_score": float(hits[team][doc].score),
            },
        )
        for rank, (doc, team, shared) in enumerate(shown, start=1)
    ]
    try:
        result = candidate.ask(question, ranked=drafted)
    except Exception as exc:
        raise CanaryFailed(f"the candidate could not answer: {type(exc).__name__}: {exc}") from exc
    timings = {
        "rank_production": round((lap - started) * 1000, 2),
        "rank_canary": round((ranked_at - lap) * 1000, 2),
        **result.timings_ms,
    }
    return result.model_copy(
        update={"latency_ms": round((time.perf_counter() - started) * 1000, 2), "timings_ms": timings}
    )


@dataclass
class _Active:
    kind: str
    state: RolloutState
    candidate: ModelVersion
    arm: object | None = None  # opened candidate arm: .current() -> answerer, .refresh(), .close()
    error: str | None = None
    failed_at: float | None = None
    failures: int = 0  # canary requests production had to answer because the candidate's side failed


class CanaryRouter:
    """Reads the rollout state (re-read only when a state file changed) and routes each request.

    `open_arm(kind, candidate)` opens what serves the candidate: an object with current() (an answerer with rank()
    and ask(question, ranked=...)), refresh() and close(). `refuses(kind, state)` says why this server's answer
    configuration cannot run that canary (None when it can): e.g. an embedder canary needs the dense index of
    model "production", or the comparison would not be with production; such a canary is logged and ignored."""

    def __init__(
        self,
        registry: ModelRegistry,
        open_arm: Callable[[str, ModelVersion], object],
        refuses: Callable[[str, RolloutState], str | None] | None = None,
    ):
        self.registry, self.open_arm, self.refuses = registry, open_arm, refuses or (lambda kind, state: None)
        self._lock = threading.Lock()
        self._marks: tuple | None = None
        self._active: _Active | None = None
        self._ignored: str | None = None
        self.last_refresh_error: str | None = None

    def _file_marks(self) -> tuple:
        """The rollout state's change marks: file stats, or the state database's (rag.state), where a replica
        without the shared volume learns a canary from."""
        return state_marks(self.registry)

    def _sync(self) -> _Active | None:
        """The running canary (its arm possibly not opened yet), after re-reading state files that changed."""
        marks = self._file_marks()
        if marks == self._marks:
            return self._active
        with self._lock:
            if marks == self._marks:
                return self._active
            found = None
            for kind in KINDS:
                state = read_state(self.registry, kind)
                if state is not None and state.stage == "canary":
                    found = (kind, state)
                    break
            old, self._active, self._ignored = self._active, None, None
            if found is not None:
                kind, state = found
                why = self.refuses(kind, state)
                candidate = self.registry.resolve(kind, state.candidate_version)
                if candidate is None:
                    why = f"{kind} {state.candidate_version} is not registered under {self.registry.root}"
                if why:
                    self._ignored = f"canary of {kind} {state.candidate_version} not served: {why}"
                    log.warning("%s", self._ignored)
                elif old is not None and (old.kind, old.state.candidate_version) == (kind, state.candidate_version):
                    self._active = _Active(kind, state, candidate, old.arm, old.error, old.failed_at, old.failures)
                    old = None  # same candidate (e.g. a new share): keep its opened arm
                else:
                    self._active = _Active(kind, state, candidate)
            self._marks = marks
        if old is not None and old.arm is not None:
            log.info("canary of %s %s ended: closing its index", old.kind, old.candidate.name)
            timer = threading.Timer(30.0, old.arm.close)  # requests in flight finish on it first
            timer.daemon = True
            timer.start()
        return self._active

    def _opened(self, active: _Active) -> object | None:
        if active.arm is not None:
            return active.arm
        with self._lock:
            if active.arm is None and (active.failed_at is None or time.monotonic() - active.failed_at > RETRY_SECONDS):
                try:
                    active.arm = self.open_arm(active.kind, active.candidate)
                    active.error = None
                    log.info("canary of %s %s: candidate index opened", active.kind, active.candidate.name)
                except Exception as exc:  # noqa: BLE001 - production keeps serving; /health and the log say why
                    active.error, active.failed_at = f"{type(exc).__name__}: {exc}", time.monotonic()
                    log.exception(
                        "canary of %s %s: cannot open the candidate's index; production serves everyone "
                        "until it opens (retried every %.0f s)",
                        active.kind,
                        active.candidate.name,
                        RETRY_SECONDS,
                    )
        return active.arm

    def refresh(self) -> bool:
        """Background: follow the state file, open the candidate's index ahead of requests, refresh it."""
        active = self._sync()
        if active is not None:
            arm = self._opened(active)
            if arm is not None and hasattr(arm, "refresh"):
                arm.refresh()
        return True

    def answer(self, production, question: str, arm_key: str | None) -> Served:
        """`arm_key`: the session's key (rag.serving.sessions.SessionKeys.arm_key), never a client-chosen id."""
        active = self._sync()
        if active is None or not arm_key:
            return Served(production.ask(question), None, model_version(production))
        if arm_for(active.state, arm_key) == "production":
            return Served(production.ask(question), "production", model_version(production))
        opened = self._opened(active)
        if opened is None:  # the candidate's index is not available: outside the split rather than misattributed
            return Served(production.ask(question), None, model_version(production))
        candidate = opened.current()
        # The same list for a repeated question (case and spacing aside): rag.rollout.evidence counts one outcome
        # per (session, normalised question), so repeats cannot add evidence.
        seed = seed_from(active.state.candidate_version, arm_key, normalized_question(question))
        try:
            result = interleaved_answer(production, candidate, question, seed)
        except CanaryFailed as exc:
            # The user still gets production's answer; the query stays outside the comparison (no arm), and the
            # failures are counted where an operator looks (/health, the log).
            active.failures += 1
            active.error = str(exc)
            log.exception(
                "canary of %s %s failed on a request; production answered it", active.kind, active.candidate.name
            )
            return Served(production.ask(question), None, model_version(production))
        return Served(result, "canary", f"interleaved({model_version(production)}, {model_version(candidate)})")

    def info(self) -> dict:
        active = self._active
        if active is None:
            return {"running": False, **({"ignored": self._ignored} if self._ignored else {})}
        return {
            "running": True,
            "kind": active.kind,
            "candidate": active.candidate.name,
            "traffic_share": active.state.traffic_share,
            "index_open": active.arm is not None,
            "error": active.error,
            "failed_requests": active.failures,
        }

    def close(self) -> None:
        active, self._active = self._active, None
        if active is not None and active.arm is not None:
            active.arm.close()
