"""Rollout (canary) library: condensed lists, team-draft interleaving and its credit, the sequential test (hand
cases, error rate on simulated equal arms, power), guardrails, rollout states and deterministic arm assignment."""

import math
from datetime import datetime, timezone

import numpy as np
import pytest
from pydantic import ValidationError
from scipy.integrate import quad

from rag.rollout import (
    CanarySettings,
    IllegalTransition,
    RolloutState,
    Shown,
    Votes,
    arm_for,
    assign_arm,
    compare_offline,
    condensed_run,
    credit,
    guardrail_breaches,
    log_harm_ratio,
    log_likelihood_ratio,
    promote,
    queries_to_decide,
    replay,
    roll_back,
    sequential_decision,
    start_canary,
    tally,
    team_draft_interleave,
    version_for,
    with_guardrails,
)
from rag.rollout.sequential import client_bound

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


class Coins:
    """Scripted coin flips: rng.random() returns these in order and fails if the draft asks for one more."""

    def __init__(self, *values: float):
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


# --- condensed lists ---------------------------------------------------------------------------------------
JUDGMENTS = {
    "q1": {"d1": 1, "d2": 0},
    "q2": {"d5": 2, "d6": -1},  # d6 was shown and rated down: judged, so it stays in condensed lists
    "q3": {"d7": 0},  # no positive label: cannot separate two models, not scored
}


def test_condensed_run_drops_only_unjudged_docs_and_keeps_order():
    run = {"q1": ["u", "d1", "d2"], "q2": {"d6": 9.0, "x": 8.0, "d5": 7.0}, "q9": ["d1"]}
    assert condensed_run(run, JUDGMENTS) == {"q1": {"d1": 2.0, "d2": 1.0}, "q2": {"d6": 9.0, "d5": 7.0}, "q9": {}}


def test_condensed_scores_match_hand_computed_values():
    production = {"q1": ["d2", "d1"], "q2": ["d6", "d5"], "q3": ["d7"]}  # only judged docs: condensed == plain
    candidate = {
        "q1": ["u", "d1", "d2"],
        "q2": ["d6", "x", "d5"],
        "q3": ["d7"],
    }  # an unjudged doc above the relevant one
    cmp = compare_offline(production, candidate, JUDGMENTS)
    assert cmp.queries == 2  # q3 has no positive label
    # One relevant doc per query, so nDCG@10 = 1 / log2(rank + 1) whatever its grade.
    rank2, rank3 = 1 / math.log2(3), 1 / math.log2(4)
    plain = cmp.candidate.per_query.set_index("qid")
    condensed = cmp.candidate_condensed.per_query.set_index("qid")
    # q1: d1 at rank 2 behind the unjudged u; condensed [d1, d2] puts it first.
    assert plain.loc["q1", "ndcg@10"] == pytest.approx(rank2) and plain.loc["q1", "mrr@10"] == pytest.approx(0.5)
    assert condensed.loc["q1", "ndcg@10"] == pytest.approx(1.0) and condensed.loc["q1", "mrr@10"] == pytest.approx(1.0)
    # q2: d5 at rank 3 behind d6 (rated down, kept) and x (unjudged, removed) -> rank 2 when condensed.
    assert plain.loc["q2", "ndcg@10"] == pytest.approx(rank3) and plain.loc["q2", "mrr@10"] == pytest.approx(1 / 3)
    assert condensed.loc["q2", "ndcg@10"] == pytest.approx(rank2) and condensed.loc["q2", "mrr@10"] == pytest.approx(
        0.5
    )
    assert cmp.candidate_condensed.mean["ndcg@10"] == pytest.approx((1 + rank2) / 2)
    # Production showed only judged docs: condensing changes nothing, and both rank the relevant doc second.
    assert cmp.production.mean == pytest.approx(cmp.production_condensed.mean)
    assert cmp.production_condensed.mean["mrr@10"] == pytest.approx(0.5)
    # Plain, the candidate looks worse than production (0.565 vs 0.631 nDCG); condensed, it is better (0.815).
    assert cmp.candidate.mean["ndcg@10"] < cmp.production.mean["ndcg@10"] < cmp.candidate_condensed.mean["ndcg@10"]


def test_offline_comparison_needs_a_positive_judgment():
    with pytest.raises(ValueError, match="rated feedback"):
        compare_offline({"q": ["d"]}, {"q": ["d"]}, {"q": {"d": 0}})


# --- team-draft interleaving -------------------------------------------------------------------------------
def test_identical_rankings_reproduce_the_ranking_and_every_pick_is_shared():
    # Coin 0.3: a first (d1), then b takes its best untaken (d2); coin 0.7: b first (d3), then a (d4). Every pick was
    # the other team's next doc too: shared.
    shown = team_draft_interleave(["d1", "d2", "d3", "d4"], ["d1", "d2", "d3", "d4"], 4, Coins(0.3, 0.7))
    assert shown == [("d1", "a", True), ("d2", "b", True), ("d3", "b", True), ("d4", "a", True)]
    # Identical rankings only ever tie: no click can credit either team.
    assert credit(shown, {"d1": "click"}).outcome == "tie"
    everything = credit(shown, {d: "click" for d, _, _ in shown})
    assert (everything.a, everything.b) == (0, 0)
    # Plain team draft (the flag dropped) would hand this query to a, the team the coin gave d1.
    assert credit([(d, team) for d, team, _ in shown], {"d1": "click"}).outcome == "a"
    for seed in ("s1", "s2", "s3", "s4"):  # whatever the coins, the shown order is the common ranking
        assert [d for d, _, _ in team_draft_interleave(list("abcdef"), list("abcdef"), 6, seed)] == list("abcdef")


def test_disjoint_rankings_with_scripted_coins():
    # Round 1 coin 0.9 -> b first: b1, a1. Round 2 coin 0.1 -> a first: a2, b2. Round 3 coin 0.6 -> b first: b3,
    # and k = 5 stops the draft before a3. Nothing is in both lists: nothing shared.
    shown = team_draft_interleave(["a1", "a2", "a3"], ["b1", "b2", "b3"], 5, Coins(0.9, 0.1, 0.6))
    assert shown == [("b1", "b", False), ("a1", "a", False), ("a2", "a", False), ("b2", "b", False), ("b3", "b", False)]
    assert all(isinstance(s, Shown) for s in shown)


def test_disjoint_rankings_with_a_fixed_seed():
    # random.Random(seed_from("session-42")) flips 0.915, 0.054, 0.144: b first, then a first twice.
    shown = team_draft_interleave(["a1", "a2", "a3"], ["b1", "b2", "b3"], 6, "session-42")
    assert [(d, team) for d, team, _ in shown] == [
        ("b1", "b"),
        ("a1", "a"),
        ("a2", "a"),
        ("b2", "b"),
        ("a3", "a"),
        ("b3", "b"),
    ]
    assert team_draft_interleave(["a1", "a2", "a3"], ["b1", "b2", "b3"], 6, "session-42") == shown  # reproducible
    first_teams = {team_draft_interleave(["a1"], ["b1"], 2, f"s{i}")[0].team for i in range(20)}
    assert first_teams == {"a", "b"}  # the seed really decides who goes first


def test_duplicates_go_to_the_team_that_picks_them_first_and_a_common_next_doc_is_shared():
    # Round 1 (a first): a takes d1 (b's next was d2: not shared); then b's next and a's next are both d2: shared.
    # Round 2 (a first): a skips d2 -> d3, b skips d1 -> d4 (different: not shared); then a has nothing left.
    shown = team_draft_interleave(["d1", "d2", "d3"], ["d2", "d1", "d4"], 10, Coins(0.1, 0.1))
    assert shown == [("d1", "a", False), ("d2", "b", True), ("d3", "a", False), ("d4", "b", False)]
    assert credit(shown, {"d1": "click"}).outcome == "a"  # a put d1 first where b had d2
    assert credit(shown, {"d2": "click"}).outcome == "tie"  # both would have shown d2 second
    assert credit(shown, {"d4": "click", "d3": -1}).outcome == "b"
    assert credit(shown, {"d1": "click", "d3": -1, "d4": "click"}).outcome == "tie"  # a -1 takes nothing from a
    # A doc repeated inside one ranking is shown once; d1 tops both lists: shared.
    assert team_draft_interleave(["d1", "d1", "d2"], ["d1", "d3"], 10, Coins(0.1, 0.1)) == [
        ("d1", "a", True),
        ("d3", "b", False),
        ("d2", "a", False),
    ]


def test_an_exhausted_ranking_leaves_the_picks_to_the_other_team():
    # One coin only: after round 1 a has nothing left, so b picks without another flip (Coins would fail).
    shown = team_draft_interleave(["x"], ["y1", "y2", "y3"], 4, Coins(0.1))
    assert shown == [("x", "a", False), ("y1", "b", False), ("y2", "b", False), ("y3", "b", False)]
    assert team_draft_interleave([], [], 5, 1) == []
    assert team_draft_interleave(["d1"], ["d2"], 0, 1) == []
    with pytest.raises(ValueError, match="k must be"):
        team_draft_interleave(["d1"], ["d2"], -1, 1)


def test_credit_rules():
    shown = [("d1", "a"), ("d2", "b"), ("d3", "a"), ("d4", "b")]
    r = credit(shown, {"d1": -1, "d2": "click"})  # a rated down, b clicked
    assert (r.a, r.b, r.outcome) == (0, 1, "b")
    r = credit(shown, {"d3": 1, "d4": -1, "d9": 1})  # d9 was not shown: nobody's credit
    assert (r.a, r.b, r.outcome) == (1, 0, "a")
    # -1s say which passages were read and were not the answer, not which ranking found it: they credit nobody
    r = credit(shown, {"d1": -1, "d3": -1, "d2": -1})
    assert (r.a, r.b, r.outcome) == (0, 0, "tie")
    r = credit(shown, {"d1": 0})
    assert (r.a, r.b, r.outcome) == (0, 0, "tie")
    assert credit(shown, {}).outcome == "tie"
    # A shared pick (third field True) credits nobody; False or absent credits its team.
    assert credit([("d1", "a", True), ("d2", "b", False)], {"d1": "click", "d2": "click"}).outcome == "b"
    assert credit([("d1", "a", False), ("d2", "b", False)], {"d1": "click", "d2": "click"}).outcome == "tie"
    with pytest.raises(ValueError, match="unknown signal"):
        credit(shown, {"d1": 2})
    # A +1 says which passage answered: bare clicks beside it credit nobody (counted, they cancel it: the rule before)
    assert credit(shown, {"d1": "click", "d2": 1}).outcome == "b"
    assert credit(shown, {"d1": "click", "d2": 1}, clicks_beside_a_like=True).outcome == "tie"
    assert credit(shown, {"d1": "click", "d2": -1}).outcome == "a"  # a -1 beside it: the click still counts
    assert tally(["b", "a", "tie", "b"]) == (2, 1, 1)  # candidate = b: wins, losses, ties
    assert tally(["b", "a", "tie", "b"], candidate="a") == (1, 2, 1)


# --- the sequential test -----------------------------------------------------------------------------------
# The harm test at rollback_alpha 0.10, without futility (on by default, tested on its own below).
UNIFORM = CanarySettings(alpha=0.05, prior_a=1, prior_b=1, max_queries=1000, futility_win_share=None)
TWO_SIDED = UNIFORM.model_copy(update={"rollback_alpha": None})  # the rule before the harm test


def test_log_likelihood_ratio_hand_cases():
    # Beta(1, 1): B(1 + w, 1 + l) = w! l! / (w + l + 1)!, so 8 straight wins give LR = 2^8 / 9 = 28.4.
    assert float(log_likelihood_ratio(8, 0)) == pytest.approx(math.log(256 / 9))
    assert float(log_likelihood_ratio(7, 0)) == pytest.approx(math.log(16))
    assert float(log_likelihood_ratio(5, 5)) == pytest.approx(math.log(1024 * 120 * 120 / 39916800))  # < 0
    # Against the integral of the mixture, for a non-uniform prior too.
    for won, lost, a, b in [(61, 38, 1, 1), (20, 30, 5, 5), (3, 1, 2, 7)]:
        beta_ab = math.exp(math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
        mix = quad(lambda p: p ** (a - 1 + won) * (1 - p) ** (b - 1 + lost), 0, 1)[0] / beta_ab
        assert float(log_likelihood_ratio(won, lost, a, b)) == pytest.approx(
            math.log(mix / 0.5 ** (won + lost)), rel=1e-6
        )


def test_sequential_decision_hand_cases():
    threshold = math.log(20)  # alpha 0.05
    d = sequential_decision(8, 0, 3, "v4", UNIFORM)  # log LR 3.35 >= 3.00 with more wins
    assert (d.decision, d.queries, d.threshold) == ("promote", 11, pytest.approx(threshold))
    assert sequential_decision(7, 0, 3, "v4", UNIFORM).decision == "continue"  # log LR 2.77
    assert sequential_decision(0, 8, 0, "v4", UNIFORM).decision == "rollback"
    assert sequential_decision(5, 5, 989, "v4", UNIFORM).decision == "continue"
    horizon = sequential_decision(5, 5, 990, "v4", UNIFORM)  # 1000 queries, no evidence: production stays
    assert horizon.decision == "rollback" and "horizon 1000" in horizon.reason
    d = sequential_decision(61, 38, 44, "ft-minilm-v4", UNIFORM)
    # log LR 0.6 (checked against the integral above): a 62 % win rate over 99 decided queries is not enough yet.
    assert d.reason == (
        "canary ft-minilm-v4: 143 queries, wins 61 / losses 38 / ties 44, log-likelihood ratio 0.6 of 3.0 needed"
    )
    assert d.decision == "continue" and (d.wins, d.losses, d.ties) == (61, 38, 44)


def test_queries_to_decide_projects_the_crossing_at_the_observed_rates():
    # 8 straight wins cross (log LR 3.35) and 7 do not (2.77): 8 decisive queries at 8 of every 11 queries.
    assert queries_to_decide(8, 0, 3, UNIFORM) == 11
    assert queries_to_decide(16, 0, 6, UNIFORM) == 11  # the same rates, more queries seen so far
    # Nothing to project from: no decisive query yet, or no edge either way.
    assert queries_to_decide(0, 0, 50, UNIFORM) is None and queries_to_decide(40, 40, 900, UNIFORM) is None
    # A 56 % win share over 12 % decisive queries (a canary the bench saw) needs far more than a 2,000 horizon, and the
    # counts projected cross the test while a tenth fewer do not.
    needed = queries_to_decide(136, 105, 1761, UNIFORM)
    assert needed > 2000
    share, rate = 136 / 241, 241 / 2002
    for scale, crosses in ((1.0, True), (0.9, False)):
        decisive = needed * rate * scale
        assert (float(log_likelihood_ratio(share * decisive, (1 - share) * decisive)) >= math.log(20)) is crosses
    # Without the harm test losing as often projects the same way (the test is two-sided); with it, sooner.
    assert queries_to_decide(105, 136, 1761, TWO_SIDED) == queries_to_decide(136, 105, 1761, TWO_SIDED) == needed
    assert queries_to_decide(105, 136, 1761, UNIFORM) < needed
    # A larger edge needs fewer queries.
    assert queries_to_decide(160, 81, 1761, UNIFORM) < needed
    assert queries_to_decide(1001, 1000, 0, UNIFORM, limit=100_000) is None  # beyond the limit


def test_replay_stops_where_ticking_after_every_query_would():
    rng = np.random.default_rng(7)
    for p, settings in [(q, s) for q in (0.5, 0.7, 0.3, 0.42) for s in (UNIFORM, TWO_SIDED)]:
        stream = np.where(rng.random(400) < 0.3, "tie", np.where(rng.random(400) < p, "b", "a")).tolist()
        expected = None
        for n in range(1, len(stream) + 1):
            won, lost, tied = tally(stream[:n])
            step = sequential_decision(won, lost, tied, "v", settings)
            if step.decision != "continue":
                expected = step
                break
        expected = expected or sequential_decision(*tally(stream), "v", settings)
        assert replay(stream, "v", settings) == expected


def test_log_harm_ratio_hand_cases():
    # Uniform prior on p < 0.5 (density 2): k straight losses give 2 * int_0^0.5 (1 - p)^k dp / 0.5^k
    # = (2^(k+1) - 1) / (k + 1): 5 losses reach 10.5, past the default harm threshold of 10 (rollback_alpha 0.10).
    for k in range(1, 12):
        assert float(log_harm_ratio(0, k)) == pytest.approx(math.log((2 ** (k + 1) - 1) / (k + 1)))
    assert float(log_harm_ratio(0, 0)) == pytest.approx(0.0)
    assert float(log_harm_ratio(5000, 0)) == -math.inf  # I_0.5 underflows: no evidence of harm, never a crossing
    # Against the integral of the prior restricted to p < 0.5, for non-uniform priors too.
    for won, lost, a, b in [(38, 61, 1, 1), (30, 20, 5, 5), (1, 3, 2, 7)]:
        prior = quad(lambda p: p ** (a - 1) * (1 - p) ** (b - 1), 0, 0.5)[0]
        mix = quad(lambda p: p ** (a - 1 + won) * (1 - p) ** (b - 1 + lost), 0, 0.5)[0] / prior
        assert float(log_harm_ratio(won, lost, a, b)) == pytest.approx(math.log(mix / 0.5 ** (won + lost)), rel=1e-6)


def test_harm_test_rolls_a_losing_candidate_back_on_weaker_evidence():
    # Two-sided, 8 straight losses are needed (log LR 3.35 >= 3.00); the harm test at 0.10 needs 5 (log 10.5).
    assert sequential_decision(0, 4, 0, "v", UNIFORM).decision == "continue"
    five = sequential_decision(0, 5, 0, "v", UNIFORM)
    assert five.decision == "rollback" and five.reason == (
        "canary v: 5 queries, wins 0 / losses 5 / ties 0, log-likelihood ratio 1.7 of 3.0 needed; harm "
        "log-likelihood ratio 2.4 of 2.3 needed: the candidate loses significantly more often, roll back"
    )
    assert sequential_decision(0, 5, 0, "v", TWO_SIDED).decision == "continue"
    assert sequential_decision(0, 8, 0, "v", TWO_SIDED).decision == "rollback"
    # It never promotes, and wins as many as losses weigh nothing either way.
    assert sequential_decision(5, 0, 0, "v", UNIFORM).decision == "continue"
    assert sequential_decision(30, 30, 0, "v", UNIFORM).decision == "continue"


def test_harm_test_error_rate_and_what_it_saves():
    # Candidates at least as good as production are rolled back by the test before the horizon at most
    # rollback_alpha of the time (Ville's inequality, the harm ratio is a supermartingale for p >= 0.5) ...
    for p, seed in ((0.5, 31), (0.55, 32)):
        early = [d for d in _simulate(p, runs=400, seed=seed) if d.decision == "rollback" and d.queries < 1000]
        assert len(early) / 400 <= UNIFORM.rollback_alpha
    # ... and a candidate that loses 40 % to 60 % is rolled back much sooner than by the two-sided test alone.
    harm = _simulate(0.4, runs=200, seed=33)
    two_sided = _simulate(0.4, runs=200, seed=33, settings=TWO_SIDED)
    assert sum(d.decision == "rollback" for d in harm) == len(harm)
    assert np.median([d.queries for d in harm]) < 0.8 * np.median([d.queries for d in two_sided])


FUTILE = CanarySettings(alpha=0.05, max_queries=1000, futility_win_share=0.6)


def test_futility_rolls_back_a_candidate_whose_evidence_favours_no_edge():
    # Wald's lower boundary log(0.2 / 0.95) = -1.56; a win adds log 1.2 = 0.182, a loss log 0.8 = -0.223.
    assert sequential_decision(31, 33, 80, "v", UNIFORM).decision == "continue"  # off
    stopped = sequential_decision(31, 33, 80, "v", FUTILE)
    assert sequential_decision(31, 33, 80, "v", CanarySettings(alpha=0.05, max_queries=1000)) == stopped  # default
    assert stopped.decision == "rollback" and stopped.reason.endswith(
        "no edge over a win share of 0.6 (futility), roll back"
    )
    assert sequential_decision(0, 6, 0, "v", FUTILE.model_copy(update={"rollback_alpha": None})).decision == "continue"
    assert sequential_decision(0, 7, 0, "v", FUTILE.model_copy(update={"rollback_alpha": None})).decision == "rollback"
    assert sequential_decision(35, 13, 190, "v", FUTILE).decision == "promote"  # never stops a clear winner first
    assert sequential_decision(22, 17, 100, "v", FUTILE).decision == "continue"  # a lead keeps the canary going
    assert replay(["a"] * 7 + ["b"] * 50, "v", FUTILE.model_copy(update={"rollback_alpha": None})).queries == 7
    # Any one client adds fewer outcomes than could stop a canary alone.
    assert client_bound(FUTILE.model_copy(update={"max_outcomes_per_client": 10, "rollback_alpha": None})) == 6


def test_futility_frees_the_slot_from_candidates_near_production_and_seldom_stops_better_ones():
    # A candidate no better than production is stopped by futility long before the horizon ...
    level = _simulate(0.5, runs=300, seed=41, settings=FUTILE)
    assert sum(d.decision == "rollback" for d in level) >= 0.9 * len(level)
    assert np.median([d.queries for d in level]) < 0.2 * FUTILE.max_queries
    assert sum(d.decision == "promote" for d in level) / len(level) <= FUTILE.alpha  # alpha still holds
    # ... one at the smallest edge worth a canary about futility_beta of the time, a clear winner almost never.
    edge = _simulate(0.6, runs=300, seed=42, settings=FUTILE)
    assert sum(d.decision == "rollback" for d in edge) / len(edge) <= FUTILE.futility_beta + 0.05
    clear = _simulate(0.7, runs=300, seed=43, settings=FUTILE)
    assert sum(d.decision == "promote" for d in clear) >= 0.97 * len(clear)


def _simulate(win_rate: float, runs: int, seed: int, tie_rate: float = 0.3, queries: int = 1000, settings=UNIFORM):
    rng = np.random.default_rng(seed)
    ties = rng.random((runs, queries)) < tie_rate
    wins = rng.random((runs, queries)) < win_rate
    outcomes = np.where(ties, "tie", np.where(wins, "b", "a"))
    return [replay(row, "v", settings) for row in outcomes]


def test_equal_arms_are_promoted_at_most_alpha_of_the_time():
    decisions = _simulate(0.5, runs=500, seed=11)
    promoted = sum(d.decision == "promote" for d in decisions)
    assert promoted / len(decisions) <= UNIFORM.alpha
    assert all(d.decision != "continue" for d in decisions)  # the horizon ends every undecided run


def test_a_better_candidate_is_promoted_and_a_worse_one_rolled_back():
    better = _simulate(0.65, runs=200, seed=12)
    assert sum(d.decision == "promote" and d.queries < 500 for d in better) >= 0.9 * len(better)
    worse = _simulate(0.35, runs=200, seed=13)
    # Rolled back by the test itself, long before the horizon.
    assert sum(d.decision == "rollback" and d.queries < 500 for d in worse) >= 0.9 * len(worse)


def _interleaved_canary(
    noise_a: float,
    noise_b: float,
    runs: int,
    seed: int,
    queries: int = 400,
    docs: int = 30,
    k: int = 10,
    shared_rule: bool = True,
):
    """Canaries run end to end on simulated traffic: per query one relevant doc among `docs`; each arm ranks by the
    doc's relevance plus its own Gaussian noise (equal noise = equally good arms that still disagree), the lists are
    team-draft interleaved, a user examines rank r with probability r^-0.7 and clicks the relevant doc if examined.
    Returns the decision of each run as ticking after every query would reach it."""
    rng = np.random.default_rng(seed)
    settings = CanarySettings(alpha=0.05, max_queries=queries)
    decisions = []
    for run in range(runs):
        outcomes = []
        for q in range(queries):
            truth = np.zeros(docs)
            truth[rng.integers(docs)] = 3.0
            ranked = {
                team: [f"d{i}" for i in np.argsort(-(truth + rng.normal(0, noise, docs)))[:k]]
                for team, noise in (("a", noise_a), ("b", noise_b))
            }
            shown = team_draft_interleave(ranked["a"], ranked["b"], k, rng)
            relevant = f"d{int(np.argmax(truth))}"
            clicks = {
                doc: "click"
                for rank, (doc, _, _) in enumerate(shown, start=1)
                if doc == relevant and rng.random() < rank**-0.7
            }
            drafted = shown if shared_rule else [(doc, team) for doc, team, _ in shown]
            outcomes.append(credit(drafted, clicks).outcome)
        decisions.append(replay(outcomes, "v", settings))
    return decisions


def test_equally_good_arms_that_disagree_are_promoted_at_most_alpha_of_the_time():
    # Interleaving, clicks, shared-pick credit and the sequential test together: two rankers of the same quality
    # that order passages differently must not look like an improvement more than alpha of the time.
    decisions = _interleaved_canary(1.5, 1.5, runs=150, seed=21)
    promoted = sum(d.decision == "promote" for d in decisions)
    assert promoted / len(decisions) <= 0.05
    assert sum(d.wins + d.losses for d in decisions) > 0  # the arms did disagree: decisive queries were counted


def test_not_crediting_shared_picks_decides_sooner_on_the_same_traffic():
    # A better candidate (less noise) that agrees with production on most top passages: plain team draft spends
    # queries on coin flips over passages both would have shown; the shared-pick rule counts only disagreements.
    with_rule = _interleaved_canary(1.5, 1.0, runs=30, seed=22)
    plain = _interleaved_canary(1.5, 1.0, runs=30, seed=22, shared_rule=False)
    assert sum(d.decision == "promote" for d in with_rule) >= 0.9 * len(with_rule)
    assert all(d.decision != "rollback" or d.queries == 400 for d in with_rule)  # never rolled back by the test
    assert np.median([d.queries for d in with_rule]) < np.median([d.queries for d in plain])


# --- guardrails --------------------------------------------------------------------------------------------
def test_guardrails():
    settings = CanarySettings(
        max_latency_p95_ratio=1.5, min_latency_samples=50, max_upvote_share_drop=0.10, min_votes=30
    )
    production_ms = [100.0] * 100
    (breach,) = guardrail_breaches([160.0] * 100, production_ms, Votes(8, 2), Votes(80, 20), settings)
    assert breach.guardrail == "latency_p95" and breach.observed == pytest.approx(1.6)
    assert guardrail_breaches([140.0] * 100, production_ms, Votes(8, 2), Votes(80, 20), settings) == []
    assert guardrail_breaches([900.0] * 49, production_ms, Votes(8, 2), Votes(80, 20), settings) == []  # too few
    # Twice production's 20 ms but only 20 ms slower (a reranker over no reranker): within the 25 ms allowance.
    assert guardrail_breaches([40.0] * 100, [20.0] * 100, Votes(8, 2), Votes(80, 20), settings) == []
    (breach,) = guardrail_breaches([50.0] * 100, [20.0] * 100, Votes(8, 2), Votes(80, 20), settings)
    assert breach.observed == pytest.approx(2.5) and "or 25 ms slower" in breach.message
    # Up-votes: production 80 %, canary 15 of 30 = 50 %: 30 points lower > 10, and significant (p 0.0006).
    (breach,) = guardrail_breaches([], [], Votes(15, 15), Votes(80, 20), settings)
    assert breach.guardrail == "upvote_share" and breach.observed == pytest.approx(0.3)
    assert "p 0.00058 < 0.01" in breach.message
    # 20 of 30 = 66.7 %: 13.3 points lower, but 30 votes cannot tell it from noise (p 0.06): no rollback.
    assert guardrail_breaches([], [], Votes(20, 10), Votes(80, 20), settings) == []
    # TAT-QA's false rollback of a better reranker, 70 % of 117 against 82 % of 146: p 0.0104, not below 0.01.
    assert guardrail_breaches([], [], Votes(82, 35), Votes(120, 26), settings) == []
    assert guardrail_breaches([], [], Votes(200, 100), Votes(800, 200), settings)  # the same 13.3 points, 300 votes
    assert guardrail_breaches([], [], Votes(22, 8), Votes(80, 20), settings) == []  # 73.3 %: within 10 points
    assert guardrail_breaches([], [], Votes(10, 14), Votes(80, 20), settings) == []  # 24 votes < 30
    # A breach overrides even a promotion.
    promoted = sequential_decision(8, 0, 0, "v4", UNIFORM)
    breaches = guardrail_breaches([160.0] * 100, production_ms, Votes(15, 15), Votes(80, 20), settings)
    forced = with_guardrails(promoted, breaches)
    assert forced.decision == "rollback" and len(forced.breaches) == 2
    assert "guardrail breached: ranking latency p95 160 ms is 1.60x" in forced.reason
    assert with_guardrails(promoted, []) == promoted


# --- rollout states and arm assignment ---------------------------------------------------------------------
def test_rollout_transitions():
    state = RolloutState(candidate_version="ft-v4", production_version="ft-v3")
    assert (state.stage, state.traffic_share) == ("candidate", 0.10)
    canary = start_canary(state, NOW, traffic_share=0.2)
    assert (canary.stage, canary.traffic_share, canary.started_at) == ("canary", 0.2, NOW)
    done = promote(canary, NOW, "canary ft-v4: wins")
    assert (done.stage, done.decided_at, done.reason) == ("production", NOW, "canary ft-v4: wins")
    assert roll_back(canary, NOW, "guardrail").stage == "rolled_back"
    assert roll_back(state, NOW, "withdrawn").stage == "rolled_back"  # before its canary started


def test_illegal_transitions_raise():
    state = RolloutState(candidate_version="ft-v4", production_version="ft-v3")
    with pytest.raises(IllegalTransition, match="start_canary first"):
        promote(state, NOW, "no canary")
    canary = start_canary(state, NOW)
    with pytest.raises(IllegalTransition, match="stage 'canary'"):
        start_canary(canary, NOW)
    for finished in (promote(canary, NOW, "ok"), roll_back(canary, NOW, "bad")):
        with pytest.raises(IllegalTransition):
            roll_back(finished, NOW, "again")
        with pytest.raises(IllegalTransition):
            promote(finished, NOW, "again")
    with pytest.raises(ValidationError):
        start_canary(state, NOW, traffic_share=1.0)
    for share in (0.0, 1.0, -0.1):
        with pytest.raises(ValidationError):
            RolloutState(candidate_version="ft-v4", traffic_share=share)
    with pytest.raises(ValidationError, match="already production"):
        RolloutState(candidate_version="ft-v3", production_version="ft-v3")


def test_arm_assignment_is_deterministic_and_salted():
    ids = [f"session-{i}" for i in range(10_000)]
    arms = [assign_arm(s, 0.10, salt="ft-v4") for s in ids]
    assert arms == [assign_arm(s, 0.10, salt="ft-v4") for s in ids]  # same session, same arm
    canary = {s for s, arm in zip(ids, arms) if arm == "canary"}
    assert abs(len(canary) / len(ids) - 0.10) < 0.01  # sd of the share is 0.003
    other = {s for s in ids if assign_arm(s, 0.10, salt="ft-v5") == "canary"}
    assert len(canary & other) < 0.2 * len(canary)  # a new candidate draws new sessions (~10 % overlap)
    wider = {s for s in ids if assign_arm(s, 0.20, salt="ft-v4") == "canary"}
    assert canary < wider  # raising the share keeps the canary's sessions in the canary
    with pytest.raises(ValueError, match="session id"):
        assign_arm("", 0.1, salt="ft-v4")


def test_only_a_running_canary_splits_traffic():
    state = RolloutState(candidate_version="ft-v4", production_version="ft-v3", traffic_share=0.5)
    ids = [f"s{i}" for i in range(200)]
    assert {arm_for(state, s) for s in ids} == {"production"}
    canary = start_canary(state, NOW)
    assert {version_for(canary, s) for s in ids} == {"ft-v3", "ft-v4"}
    assert all(version_for(canary, s) == ("ft-v4" if arm_for(canary, s) == "canary" else "ft-v3") for s in ids)
    assert {version_for(promote(canary, NOW, "ok"), s) for s in ids} == {"ft-v4"}
    assert {version_for(roll_back(canary, NOW, "bad"), s) for s in ids} == {"ft-v3"}


def test_an_undecided_canary_is_rolled_back_after_max_days_and_a_decision_is_never_overridden():
    from datetime import UTC, datetime, timedelta

    from rag.rollout.evidence import past_max_days

    now = datetime(2026, 1, 20, tzinfo=UTC)
    settings = CanarySettings(max_days=14)
    undecided = sequential_decision(3, 2, 40, "ft-minilm-v2", settings)
    assert undecided.decision == "continue"
    assert past_max_days(undecided, now - timedelta(days=13), settings, now) == undecided
    aged = past_max_days(undecided, now - timedelta(days=15), settings, now)
    assert aged.decision == "rollback" and (aged.wins, aged.losses) == (3, 2)
    assert (
        aged.reason.startswith(undecided.reason)
        and "no decision 15.0 days after its start (max_days 14)" in aged.reason
    )
    decided = sequential_decision(60, 5, 10, "ft-minilm-v2", settings)
    assert decided.decision == "promote" and past_max_days(decided, now - timedelta(days=30), settings, now) == decided
