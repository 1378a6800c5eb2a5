"""The canary's sequential test: an always-valid mSPRT on per-query interleaving outcomes.

The canary is evaluated on every tick, so a fixed-sample test would be checked hundreds of times and its error
rate would grow with every look. The mixture sequential probability ratio test (Robbins 1970; Johari et al.
2017) stays valid however often it is looked at.

Model: among queries that are not ties, the candidate wins with probability p; H0: p = 0.5. Mixing the
likelihood over p ~ Beta(a, b) gives the likelihood ratio in closed form,

    LR_n = [B(a + wins, b + losses) / B(a, b)] / 0.5^(wins + losses),

a nonnegative martingale under H0, so P(LR ever >= 1/alpha | H0) <= alpha (Ville's inequality). The test is
two-sided (the mixture covers p on both sides of 0.5) and the direction is taken from the sign of
wins - losses: crossing with more wins promotes, crossing with more losses rolls back. So the chance of ever
promoting (or, on this test alone, ever rolling back) a candidate that is exactly as good as production is at most
alpha, in total for both. With equal wins and losses LR <= 1, so a crossing always has a direction. Ties carry no
information about p and are only counted.

Harm is judged on weaker evidence (settings.rollback_alpha, default 0.10): a wrong rollback keeps production and
costs the candidate its chance, and an undecided canary is rolled back at the horizon anyway. The harm test mixes
over p < 0.5 only (the prior Beta(a, b) restricted to (0, 0.5) and renormalised),

    LR-_n = [B(a + wins, b + losses) I_0.5(a + wins, b + losses) / (B(a, b) I_0.5(a, b))] / 0.5^(wins + losses),

where I_0.5 is the regularised incomplete beta function at 0.5. For every p >= 0.5 each alternative's ratio has
expectation at most 1, so LR-_n is a nonnegative supermartingale under any candidate at least as good as
production, and P(LR- ever >= 1/rollback_alpha) <= rollback_alpha. With a symmetric prior and more losses than
wins, LR- is at least the two-sided LR, so with rollback_alpha >= alpha it never rolls back later than before.

A one-sided promotion test (settings.promotion_test "one-sided") mixes over p > 0.5 only, the harm ratio's mirror,

    LR+_n = [B(a + wins, b + losses) (1 - I_0.5(a + wins, b + losses)) / (B(a, b) (1 - I_0.5(a, b)))]
            / 0.5^(wins + losses),

a nonnegative supermartingale under any candidate at most as good as production, so P(ever promoting one) <= alpha
still; with a symmetric prior and more wins than losses it is at least the two-sided LR, so it never promotes later.
Rollbacks stay the two-sided test's and the harm test's.

Futility (settings.futility_win_share, 0.6 by default, None: off): one canary runs at a time, so a candidate about
as good as production holds the slot until the horizon while candidates trained later wait. Wald's SPRT between p =
0.5 and p1 = futility_win_share, log LR_n = wins log(2 p1) + losses log(2 (1 - p1)), stops for futility once it
falls to log(beta / (1 - alpha)) (Wald 1945, settings.futility_beta): a candidate whose true win share is p1 is
stopped about beta of the time, one at 0.5 almost always and early. It only ever rolls back, so the promotion error
rate alpha holds as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy.special import betainc, betaincc, betaln

from rag.rollout.config import CanarySettings
from rag.rollout.interleaving import Outcome, Team

Verdict = Literal["promote", "rollback", "continue"]


@dataclass(frozen=True)
class Decision:
    """What the canary's evidence says now; `reason` states the evidence in words."""

    decision: Verdict
    candidate: str
    queries: int
    wins: int
    losses: int
    ties: int
    log_lr: float
    threshold: float
    reason: str
    breaches: tuple[str, ...] = ()  # guardrail messages that forced a rollback
    log_lr_harm: float = 0.0  # the one-sided harm test's log LR (mixing over p < 0.5)
    harm_threshold: float | None = None  # log(1 / rollback_alpha); None: no harm test


def log_likelihood_ratio(wins, losses, a: float = 1.0, b: float = 1.0):
    """log LR of the Beta(a, b) mixture against p = 0.5; numpy arrays broadcast."""
    wins = np.asarray(wins, dtype=np.float64)
    losses = np.asarray(losses, dtype=np.float64)
    return betaln(a + wins, b + losses) - betaln(a, b) + (wins + losses) * math.log(2.0)


def _log_half_mixture_ratio(wins, losses, a: float, b: float, above: bool):
    """log LR of the Beta(a, b) mixture restricted to one side of 0.5 (p > 0.5 when `above`) against p = 0.5; numpy
    arrays broadcast. -inf where that side's tail underflows: no evidence on that side at all."""
    wins = np.asarray(wins, dtype=np.float64)
    losses = np.asarray(losses, dtype=np.float64)
    tail = betaincc if above else betainc
    with np.errstate(divide="ignore"):
        side = np.log(tail(a + wins, b + losses, 0.5))
    return (
        betaln(a + wins, b + losses)
        + side
        - betaln(a, b)
        - math.log(float(tail(a, b, 0.5)))
        + (wins + losses) * math.log(2.0)
    )


def log_harm_ratio(wins, losses, a: float = 1.0, b: float = 1.0):
    """log LR of the Beta(a, b) mixture restricted to p < 0.5 against p = 0.5; numpy arrays broadcast. -inf where
    I_0.5 underflows, i.e. far more wins than losses: no evidence of harm at all."""
    return _log_half_mixture_ratio(wins, losses, a, b, above=False)


def log_benefit_ratio(wins, losses, a: float = 1.0, b: float = 1.0):
    """log LR of the Beta(a, b) mixture restricted to p > 0.5 against p = 0.5 (the harm ratio's mirror); numpy
    arrays broadcast. -inf where the upper tail underflows, i.e. far more losses than wins."""
    return _log_half_mixture_ratio(wins, losses, a, b, above=True)


def promotion_ratio(wins, losses, settings: CanarySettings):
    """The log LR a promotion must take past log(1 / alpha): settings.promotion_test's mixture."""
    if settings.promotion_test == "one-sided":
        return log_benefit_ratio(wins, losses, settings.prior_a, settings.prior_b)
    return log_likelihood_ratio(wins, losses, settings.prior_a, settings.prior_b)


def _harm_threshold(settings: CanarySettings) -> float | None:
    return math.log(1.0 / settings.rollback_alpha) if settings.rollback_alpha is not None else None


def log_futility_ratio(wins, losses, win_share: float):
    """log LR of p = win_share against p = 0.5 (Wald's SPRT between the two points); numpy arrays broadcast."""
    wins = np.asarray(wins, dtype=np.float64)
    losses = np.asarray(losses, dtype=np.float64)
    return wins * math.log(2.0 * win_share) + losses * math.log(2.0 * (1.0 - win_share))


def _futility_threshold(settings: CanarySettings) -> float | None:
    """Wald's lower boundary, log(beta / (1 - alpha)); None without a futility_win_share."""
    if settings.futility_win_share is None:
        return None
    return math.log(settings.futility_beta / (1.0 - settings.alpha))


def _futile(wins, losses, settings: CanarySettings):
    """Whether the evidence favours "no better" enough to stop (False without a futility_win_share)."""
    threshold = _futility_threshold(settings)
    if threshold is None:
        return np.zeros(np.broadcast(np.asarray(wins), np.asarray(losses)).shape, dtype=bool)
    return log_futility_ratio(wins, losses, settings.futility_win_share) <= threshold


def evidence(candidate: str, wins: int, losses: int, ties: int, log_lr: float, threshold: float) -> str:
    return (
        f"canary {candidate}: {wins + losses + ties} queries, wins {wins} / losses {losses} / ties {ties}, "
        f"log-likelihood ratio {log_lr:.1f} of {threshold:.1f} needed"
    )


def sequential_decision(
    wins: int, losses: int, ties: int, candidate: str, settings: CanarySettings | None = None
) -> Decision:
    """Promote, roll back or continue on the candidate's wins, losses and ties so far.

    At settings.max_queries queries without a crossing the canary is rolled back: without evidence that the
    candidate is better, production stays."""
    settings = settings or CanarySettings()
    if min(wins, losses, ties) < 0:
        raise ValueError(f"counts cannot be negative: wins {wins}, losses {losses}, ties {ties}")
    threshold = math.log(1.0 / settings.alpha)
    log_lr = float(promotion_ratio(wins, losses, settings))
    two_sided = float(log_likelihood_ratio(wins, losses, settings.prior_a, settings.prior_b))
    harm_threshold = _harm_threshold(settings)
    log_harm = float(log_harm_ratio(wins, losses, settings.prior_a, settings.prior_b))
    queries = wins + losses + ties
    said = evidence(candidate, wins, losses, ties, log_lr, threshold)
    if losses > wins and harm_threshold is not None:
        said += f"; harm log-likelihood ratio {log_harm:.1f} of {harm_threshold:.1f} needed"
    harmed = losses > wins and harm_threshold is not None and log_harm >= harm_threshold
    if log_lr >= threshold and wins > losses:
        verdict, why = "promote", f"{said}: the candidate wins significantly more often, promote"
    elif losses > wins and (two_sided >= threshold or harmed):
        verdict, why = "rollback", f"{said}: the candidate loses significantly more often, roll back"
    elif bool(_futile(wins, losses, settings)):
        verdict, why = (
            "rollback",
            f"{said}: the evidence favours no edge over a win share of {settings.futility_win_share:g} "
            f"(futility), roll back",
        )
    elif queries >= settings.max_queries:
        verdict, why = (
            "rollback",
            (f"{said}: no significant difference after {queries} queries (horizon {settings.max_queries}), roll back"),
        )
    else:
        verdict, why = "continue", said
    return Decision(
        verdict,
        candidate,
        queries,
        wins,
        losses,
        ties,
        log_lr,
        threshold,
        why,
        log_lr_harm=log_harm,
        harm_threshold=harm_threshold,
    )


def replay(
    outcomes: Sequence[Outcome], candidate: str, settings: CanarySettings | None = None, candidate_team: Team = "b"
) -> Decision:
    """The first decision other than "continue" along a stream of per-query outcomes (in the order they were
    recorded), as ticking after every query would have reached it; "continue" at the end of an undecided stream.
    For backtesting the rule on logged outcomes and for simulating it."""
    settings = settings or CanarySettings()
    if candidate_team not in ("a", "b"):
        raise ValueError(f"candidate_team must be 'a' or 'b', got {candidate_team!r}")
    stream = np.asarray(outcomes, dtype=object)
    if not len(stream):
        return sequential_decision(0, 0, 0, candidate, settings)
    unknown = set(stream.tolist()) - {"a", "b", "tie"}
    if unknown:
        raise ValueError(f"unknown outcome(s) {sorted(map(str, unknown))}: use 'a', 'b' or 'tie'")
    other = "a" if candidate_team == "b" else "b"
    wins = np.cumsum(stream == candidate_team)
    losses = np.cumsum(stream == other)
    queries = np.arange(1, len(stream) + 1)
    threshold = math.log(1.0 / settings.alpha)
    promoted = (promotion_ratio(wins, losses, settings) >= threshold) & (wins > losses)
    losing = (log_likelihood_ratio(wins, losses, settings.prior_a, settings.prior_b) >= threshold) & (losses > wins)
    stop = promoted | losing | (queries >= settings.max_queries)
    harm_threshold = _harm_threshold(settings)
    if harm_threshold is not None:
        stop |= (losses > wins) & (log_harm_ratio(wins, losses, settings.prior_a, settings.prior_b) >= harm_threshold)
    stop |= _futile(wins, losses, settings)
    i = int(np.argmax(stop)) if stop.any() else len(stream) - 1
    won, lost = int(wins[i]), int(losses[i])
    return sequential_decision(won, lost, int(queries[i]) - won - lost, candidate, settings)


def queries_to_decide(
    wins: int, losses: int, ties: int, settings: CanarySettings | None = None, *, limit: int = 10_000_000
) -> int | None:
    """Canary queries at which the test would cross if wins, losses and ties went on at the rates seen so far: a
    projection for judging whether the horizon (max_queries) can decide an edge this size, never evidence; with
    more losses, the first crossing of either the two-sided or the harm test; with futility on, its boundary too.
    None when no query was decisive yet, wins equal losses, or the crossing lies beyond `limit` queries."""
    settings = settings or CanarySettings()
    decisive, queries = wins + losses, wins + losses + ties
    if decisive == 0 or wins == losses:
        return None
    share, rate = wins / decisive, decisive / queries
    threshold = math.log(1.0 / settings.alpha)
    harm_threshold = _harm_threshold(settings) if losses > wins else None

    def crossed(n: int) -> bool:  # n decisive queries at the observed win share
        won, lost = share * n, (1 - share) * n
        if won > lost and float(promotion_ratio(won, lost, settings)) >= threshold:
            return True
        if lost > won and float(log_likelihood_ratio(won, lost, settings.prior_a, settings.prior_b)) >= threshold:
            return True
        if bool(_futile(won, lost, settings)):
            return True
        return (
            harm_threshold is not None
            and float(log_harm_ratio(won, lost, settings.prior_a, settings.prior_b)) >= harm_threshold
        )

    high = 1
    while not crossed(high):
        high *= 2
        if high / rate > limit:
            return None
    low = high // 2  # not crossed (or 0); the ratio rises with n at a fixed share once it nears the threshold
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if crossed(middle) else (middle, high)
    return math.ceil(high / rate)


def client_bound(settings: CanarySettings | None = None) -> int:
    """Questions one client may add to a canary's evidence per window: settings.max_outcomes_per_client, and without
    a window (one window: the whole canary) no more than the largest run of outcomes, all one way, that crosses
    neither the test nor the harm test: one client alone never decides."""
    settings = settings or CanarySettings()
    bound = settings.max_outcomes_per_client
    if settings.client_window_days is not None:
        return bound
    harm_threshold = _harm_threshold(settings)

    def decides(n: int) -> bool:
        a, b = settings.prior_a, settings.prior_b
        if float(promotion_ratio(n, 0, settings)) >= math.log(1.0 / settings.alpha):
            return True
        if float(log_likelihood_ratio(0, n, a, b)) >= math.log(1.0 / settings.alpha):
            return True
        if bool(_futile(0, n, settings)):
            return True
        return harm_threshold is not None and float(log_harm_ratio(0, n, a, b)) >= harm_threshold

    while bound > 1 and decides(bound):
        bound -= 1
    return bound


def forced_rollback(decision: Decision, breaches: Sequence[str]) -> Decision:
    """The decision overridden by guardrail breaches: any breach rolls back, whatever the test says."""
    if not breaches:
        return decision
    said = evidence(
        decision.candidate, decision.wins, decision.losses, decision.ties, decision.log_lr, decision.threshold
    )
    return replace(
        decision,
        decision="rollback",
        breaches=tuple(breaches),
        reason=f"{said}; guardrail breached: {'; '.join(breaches)}, roll back",
    )
