"""Canary settings (pydantic): traffic share, the sequential test's error rate and horizon, and the guardrails."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CanarySettings(BaseModel):
    """How a canary is run and when it ends."""

    model_config = ConfigDict(extra="forbid")
    traffic_share: float = Field(0.10, gt=0, lt=1, description="share of sessions the canary serves")
    alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="largest probability that an arm no better than production "
        "is ever promoted, however often the canary is evaluated",
    )
    # A wrong rollback costs a candidate's chance, not users' answers: production stays, and an undecided canary is
    # rolled back at the horizon anyway. So harm is judged on weaker evidence than a promotion, by a one-sided test
    # that concentrates its prior on losses; bench/canary_rule.py measures what it costs better candidates.
    rollback_alpha: float | None = Field(
        0.10,
        gt=0,
        lt=1,
        description="largest probability that an arm at least as good as production is rolled back by the "
        "one-sided harm test before the horizon; None: roll back early only when the two-sided test at alpha crosses",
    )
    # One canary runs at a time, so a candidate near production's level holds the slot up to the horizon while
    # better ones wait. Wald's lower boundary stops it once its wins and losses favour "no better" (p = 0.5) over
    # the smallest edge worth a canary by (1 - alpha) / futility_beta: a rollback only, so alpha still holds; a
    # candidate whose win share is exactly futility_win_share is stopped with probability about futility_beta.
    # On by default: in three bench/loop.py runs on TAT-QA it stopped only losing configuration canaries (after 68 to
    # 102 canary queries), whose slot rerankers then took; bench/canary_rule.py measures what it costs better ones.
    futility_win_share: float | None = Field(
        0.6,
        gt=0.5,
        lt=1,
        description="the smallest win share among decisive canary queries worth promoting; set, a canary whose "
        "evidence favours a share of 0.5 over it by (1 - alpha) / futility_beta is rolled back (futility); "
        "None: off, a canary runs until the test, a guardrail or the horizon ends it",
    )
    futility_beta: float = Field(
        0.2, gt=0, lt=0.5, description="the chance a candidate winning futility_win_share is stopped for futility"
    )
    # The two-sided mixture spends half its prior on losses, which the harm test already watches; the one-sided one
    # mixes over wins only and promotes on less evidence at the same alpha. bench/canary_rule.py measures both.
    promotion_test: Literal["two-sided", "one-sided"] = Field(
        "two-sided",
        description="the mixture a promotion needs to cross: 'two-sided' over every win rate, or 'one-sided' over "
        "win rates above 0.5 only (valid at the same alpha; rollbacks are the harm test's and the two-sided one's)",
    )
    # Beta(1, 1) mixes evenly over all win rates. A prior concentrated near 0.5 (larger equal a, b) detects small
    # edges sooner and large ones later; the error rate holds for any prior.
    prior_a: float = Field(1.0, gt=0, description="Beta mixing prior of the win rate: a")
    prior_b: float = Field(1.0, gt=0, description="Beta mixing prior of the win rate: b")
    max_queries: int = Field(
        2000,
        ge=1,
        description="canary queries after which a canary without significant evidence "
        "is rolled back (never promoted without evidence)",
    )
    # Under the default promotion policy a canary starts for every candidate the gate could not show better; where
    # too few users reach it to decide, it would hold retraining back for good.
    max_days: float = Field(
        14.0,
        gt=0,
        description="days after its start when a canary still without significant evidence is rolled back "
        "(production stays; retraining, which waits while a canary runs, resumes)",
    )
    max_latency_p95_ratio: float = Field(
        1.5,
        gt=1,
        description="the candidate's ranking latency p95 may be at most this "
        "multiple of production's (both timed in the same canary requests)",
    )
    # A ratio over a p95 of a few milliseconds (production ranking without a reranker) would flag any reranker at all.
    latency_p95_allowance_ms: float = Field(
        25.0,
        ge=0,
        description="a canary over the ratio but slower than "
        "production's p95 by at most this many milliseconds is no breach",
    )
    min_latency_samples: int = Field(
        50, ge=1, description="timed canary requests before the latency guardrail can fire"
    )
    max_upvote_share_drop: float = Field(
        0.10,
        gt=0,
        lt=1,
        description="the canary's share of up-votes among answer "
        "votes may fall at most this far (absolute) below production's",
    )
    min_votes: int = Field(30, ge=1, description="answer votes per arm before the up-vote guardrail can fire")
    # The guardrail is looked at on every canary_sensor tick, so a point comparison fires on noise sooner or later: on
    # TAT-QA a reranker +2.4 points of recall@5 better on the test split was rolled back at 70 % of 117 votes against
    # production's 82 % of 146 (bench/results/loop-tatqa-reranker+configuration-experts100.json).
    upvote_alpha: float = Field(
        0.01,
        gt=0,
        lt=0.5,
        description="the up-vote drop must also be significant: a one-sided two-proportion test of the canary's share "
        "below production's at this level (small, as the guardrail is looked at on every tick)",
    )
    # One client (an address, or the user a trusted proxy names) can open any number of sessions and ask any number
    # of questions; counted as independent users, one script would decide a canary (8 straight wins cross the test
    # at alpha 0.05, 5 straight losses the harm test at 0.10). So each client's say is bounded, and bounded below
    # what could cross either test alone (rag.rollout.sequential.client_bound): a decision needs several clients.
    max_outcomes_per_client: int = Field(
        4,
        ge=1,
        description="questions one client can add to a canary's evidence (its outcomes, answer votes and latency "
        "samples) per client_window_days; the questions that credited an arm or carry a vote are kept first. "
        "Without a window it is also capped so that one client alone can never cross either test",
    )
    # A client that opens many sessions is drawing arms until it gets the one it wants (or is a script that keeps no
    # cookie, whose signals could not be tied to its answers anyway). A browser keeps one session in its cookie.
    max_sessions_per_client: int = Field(
        8,
        ge=1,
        description="sessions one client may open per client_window_days and still be counted: a client with more "
        "adds nothing to the canary's evidence in that window",
    )
    client_window_days: float | None = Field(
        None,
        gt=0,
        description="the window max_outcomes_per_client and max_sessions_per_client apply to (days since the "
        "canary's start); None: the whole canary. A window lets a client that returns add more, and lets one "
        "client decide a long canary",
    )


def promotion_policy() -> str:
    """What a gated candidate's release does ('auto', 'direct' or 'canary'): RAG_PROMOTION_POLICY, default auto.
    The rollout resource and `rag models promote` read it here, so they agree."""
    import os

    # 'auto' by default: a gate that finds a candidate no worse but cannot show it better (too few questions, or a
    # gain on generated questions alone) hands the decision to people through a canary instead of dropping a
    # model that may help them; the calibration bench found trained models of both kinds (docs/training.md).
    return os.environ.get("RAG_PROMOTION_POLICY") or "auto"
