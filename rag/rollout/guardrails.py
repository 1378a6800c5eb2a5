"""Guardrails: a canary that is much slower or whose answers are liked less is rolled back whatever the
interleaving test says; the test compares rankings only and cannot see either.

Latency is compared on each arm's own ranking time measured back to back in the same canary requests
(rag.rollout.evidence): two arms served at different moments of a loaded machine differ by the load, and an
interleaved request ranks twice, so its total says nothing about the candidate alone. The times are paired (the same
question, ranked by both arms), and judged twice: the p95 of each arm, and the typical (median) request's ratio of
the candidate's ranking to production's. The pooled p95s alone let a few slow questions hide a slower candidate:
questions of thousands of characters slow both arms, fill both tails, and the tails then compare as near equal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rag.rollout.config import CanarySettings
from rag.rollout.sequential import Decision, forced_rollback


class Votes(NamedTuple):
    """Answer votes of one arm."""

    up: int
    down: int

    @property
    def total(self) -> int:
        return self.up + self.down

    @property
    def up_share(self) -> float:
        return self.up / self.total if self.total else float("nan")


@dataclass(frozen=True)
class Breach:
    guardrail: str  # "latency_p95", "latency_paired" or "upvote_share"
    observed: float
    limit: float
    message: str


def latency_breach(
    canary_ms: Sequence[float], production_ms: Sequence[float], settings: CanarySettings
) -> Breach | None:
    """Once both arms have min_latency_samples paired times (the ranking of each arm in the same canary requests,
    canary_ms[i] beside production_ms[i]): the canary's p95, or its median paired ratio, above max_latency_p95_ratio
    and more than latency_p95_allowance_ms slower than production's."""
    if min(len(canary_ms), len(production_ms)) < settings.min_latency_samples:
        return None
    canary = np.asarray(canary_ms, dtype=np.float64)
    production = np.asarray(production_ms, dtype=np.float64)
    canary_p95, production_p95 = float(np.percentile(canary, 95)), float(np.percentile(production, 95))
    if production_p95 > 0:
        ratio = canary_p95 / production_p95
        if ratio > settings.max_latency_p95_ratio and canary_p95 - production_p95 > settings.latency_p95_allowance_ms:
            return Breach(
                "latency_p95",
                ratio,
                settings.max_latency_p95_ratio,
                f"ranking latency p95 {canary_p95:.0f} ms is {ratio:.2f}x production's {production_p95:.0f} ms "
                f"(at most {settings.max_latency_p95_ratio:g}x, or {settings.latency_p95_allowance_ms:g} ms slower)",
            )
    if len(canary) != len(production):
        return None  # not paired: only the p95s compare
    timed = production > 0
    if not timed.any():
        return None
    ratio = float(np.median(canary[timed] / production[timed]))
    slower = float(np.median(canary - production))
    if ratio <= settings.max_latency_p95_ratio or slower <= settings.latency_p95_allowance_ms:
        return None
    return Breach(
        "latency_paired",
        ratio,
        settings.max_latency_p95_ratio,
        f"on the same questions the candidate ranks {ratio:.2f}x as long as production in the median request "
        f"({slower:.0f} ms slower; at most {settings.max_latency_p95_ratio:g}x, or "
        f"{settings.latency_p95_allowance_ms:g} ms slower)",
    )


def upvote_drop_p_value(canary: Votes, production: Votes) -> float:
    """One-sided p-value that the canary's up-vote share is below production's (two-proportion z-test, pooled)."""
    from statistics import NormalDist

    pooled = (canary.up + production.up) / (canary.total + production.total)
    se = (pooled * (1 - pooled) * (1 / canary.total + 1 / production.total)) ** 0.5
    if se == 0:
        return 1.0
    return 1 - NormalDist().cdf((production.up_share - canary.up_share) / se)


def upvote_breach(canary: Votes, production: Votes, settings: CanarySettings) -> Breach | None:
    """Canary up-vote share below production's by more than max_upvote_share_drop, and significantly so
    (upvote_alpha), once both arms have min_votes. Meant to stop gross regressions quickly; the significance keeps
    the noise of a few dozen votes, looked at on every tick, from rolling back a better candidate."""
    if min(canary.total, production.total) < settings.min_votes:
        return None
    drop = production.up_share - canary.up_share
    if drop <= settings.max_upvote_share_drop:
        return None
    p = upvote_drop_p_value(canary, production)
    if p >= settings.upvote_alpha:
        return None
    return Breach(
        "upvote_share",
        drop,
        settings.max_upvote_share_drop,
        f"up-vote share {canary.up_share:.0%} of {canary.total} votes is {drop * 100:.1f} points below "
        f"production's {production.up_share:.0%} of {production.total} (at most "
        f"{settings.max_upvote_share_drop * 100:g} points; p {p:.2g} < {settings.upvote_alpha:g})",
    )


def guardrail_breaches(
    canary_latencies_ms: Sequence[float],
    production_latencies_ms: Sequence[float],
    canary_votes: Votes,
    production_votes: Votes,
    settings: CanarySettings | None = None,
) -> list[Breach]:
    """Every breached guardrail (empty when the canary may go on)."""
    settings = settings or CanarySettings()
    found = [
        latency_breach(canary_latencies_ms, production_latencies_ms, settings),
        upvote_breach(Votes(*canary_votes), Votes(*production_votes), settings),
    ]
    return [b for b in found if b is not None]


def with_guardrails(decision: Decision, breaches: Sequence[Breach]) -> Decision:
    """The sequential decision, or a rollback when any guardrail is breached."""
    return forced_rollback(decision, [b.message for b in breaches])
