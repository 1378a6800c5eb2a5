"""The rollout state of one candidate and its legal transitions, plus the deterministic split of sessions
between production and the canary."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Stage = Literal["candidate", "canary", "production", "rolled_back"]
Arm = Literal["production", "canary"]


class IllegalTransition(ValueError):
    """A rollout step that the current stage does not allow; the message says which step would."""


class RolloutState(BaseModel):
    """Where a candidate stands: passed the offline gate (candidate), serving a share of sessions (canary), or
    finished (production / rolled_back). Immutable: the transition functions return a new state."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stage: Stage = "candidate"
    candidate_version: str = Field(min_length=1)
    production_version: str | None = Field(None, description="None: no model promoted yet (the base model serves)")
    traffic_share: float = Field(0.10, gt=0, lt=1, description="share of sessions the canary serves")
    started_at: datetime | None = None  # when the canary started
    decided_at: datetime | None = None  # when it was promoted or rolled back
    reason: str = ""
    force_reason: str | None = Field(
        None,
        description="an operator's override of the offline gate at the start "
        "(rag.lifecycle.rollout.start force_reason); None: started on a passing gate verdict",
    )

    @model_validator(mode="after")
    def _versions_differ(self) -> "RolloutState":
        if self.candidate_version == self.production_version:
            raise ValueError(
                f"candidate {self.candidate_version!r} is already production: a canary needs a different "
                "candidate version"
            )
        return self


def _moved(state: RolloutState, **changes) -> RolloutState:
    # model_copy would skip validation; a changed traffic share must still be checked
    return RolloutState.model_validate({**state.model_dump(), **changes})


def _require(state: RolloutState, allowed: tuple[str, ...], step: str, hint: str) -> None:
    if state.stage not in allowed:
        raise IllegalTransition(
            f"cannot {step} {state.candidate_version}: it is in stage {state.stage!r}, "
            f"{step} needs stage {' or '.join(map(repr, allowed))}; {hint}"
        )


def start_canary(
    state: RolloutState, now: datetime, traffic_share: float | None = None, reason: str = ""
) -> RolloutState:
    """candidate → canary: the candidate starts serving `traffic_share` of sessions (the state's share by default)."""
    _require(state, ("candidate",), "start a canary of", "register a new candidate that passed the offline gate")
    share = state.traffic_share if traffic_share is None else traffic_share
    return _moved(state, stage="canary", traffic_share=share, started_at=now, reason=reason)


def promote(state: RolloutState, now: datetime, reason: str) -> RolloutState:
    """canary → production: only a running canary can be promoted, so nothing skips the online test."""
    _require(state, ("canary",), "promote", "start_canary first and promote when the sequential test says so")
    return _moved(state, stage="production", decided_at=now, reason=reason)


def roll_back(state: RolloutState, now: datetime, reason: str) -> RolloutState:
    """candidate or canary → rolled_back: production keeps (or takes back) all traffic. A candidate may be
    withdrawn before its canary starts; a finished rollout cannot be rolled back (promote a new candidate)."""
    _require(state, ("candidate", "canary"), "roll back", "a finished rollout is changed by a new candidate's rollout")
    return _moved(state, stage="rolled_back", decided_at=now, reason=reason)


def assign_arm(session_id: str, share: float, salt: str) -> Arm:
    """ "canary" for a `share` of sessions, the same arm for a session on every request and every server.

    sha256(salt, session id) read as a number in [0, 1): below `share` is canary. The salt (the candidate
    version) gives each candidate a fresh draw of sessions, so the same users are not always the test subjects;
    with a fixed salt, raising the share keeps every session already in the canary there."""
    if not session_id:
        raise ValueError(
            "assign_arm needs a session id: give anonymous clients one (e.g. a cookie) so that their "
            "queries stay on one arm"
        )
    if not 0 <= share <= 1:
        raise ValueError(f"share must be within [0, 1], got {share}")
    digest = hashlib.sha256(f"{salt}\x1f{session_id}".encode("utf-8")).digest()  # separator: ("ab","c") != ("a","bc")
    return "canary" if int.from_bytes(digest[:8], "big") / 2.0**64 < share else "production"


def arm_for(state: RolloutState, session_id: str) -> Arm:
    """The arm serving a session under `state`: only a running canary splits traffic. After a promotion the
    candidate is what "production" serves."""
    if state.stage != "canary":
        return "production"
    return assign_arm(session_id, state.traffic_share, salt=state.candidate_version)


def version_for(state: RolloutState, session_id: str) -> str | None:
    """The model version that serves a session under `state` (None: no promoted model yet, the base model)."""
    if state.stage == "production":
        return state.candidate_version
    if arm_for(state, session_id) == "canary":
        return state.candidate_version
    return state.production_version
