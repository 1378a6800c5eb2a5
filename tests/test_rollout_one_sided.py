"""The one-sided promotion test (CanarySettings.promotion_test "one-sided"): it mixes over win rates above 0.5 only,
so it promotes on less evidence than the two-sided test, never later, still ever promotes an arm no better than
production at most alpha of the time, and leaves rollbacks to the two-sided and harm tests."""

import numpy as np

from rag.rollout import CanarySettings, replay, sequential_decision
from rag.rollout.sequential import log_benefit_ratio, log_likelihood_ratio, queries_to_decide

ONE_SIDED = CanarySettings(promotion_test="one-sided", futility_win_share=None)
TWO_SIDED = CanarySettings(futility_win_share=None)


def test_with_more_wins_it_is_never_below_the_two_sided_ratio_and_with_more_losses_never_above():
    wins, losses = np.meshgrid(np.arange(0, 80), np.arange(0, 80))
    one, two = log_benefit_ratio(wins, losses), log_likelihood_ratio(wins, losses)
    assert (one[wins > losses] >= two[wins > losses] - 1e-9).all()
    assert (one[losses > wins] <= two[losses > wins] + 1e-9).all()


def test_it_promotes_where_the_two_sided_test_still_waits():
    # 28 wins to 10: the two-sided mixture's log LR is 2.7, short of log(1 / 0.05) = 3.0; the one-sided one's 3.4.
    assert sequential_decision(28, 10, 200, "c", TWO_SIDED).decision == "continue"
    decided = sequential_decision(28, 10, 200, "c", ONE_SIDED)
    assert decided.decision == "promote" and decided.log_lr > decided.threshold
    assert queries_to_decide(28, 10, 200, ONE_SIDED) < queries_to_decide(28, 10, 200, TWO_SIDED)


def test_losses_still_roll_back_without_the_harm_test():
    settings = ONE_SIDED.model_copy(update={"rollback_alpha": None})
    assert sequential_decision(10, 40, 100, "c", settings).decision == "rollback"
    assert sequential_decision(10, 40, 100, "c", ONE_SIDED).decision == "rollback"


def test_an_arm_as_good_as_production_is_promoted_at_most_alpha_of_the_time():
    rng = np.random.default_rng(3)
    runs, promoted = 400, 0
    for _ in range(runs):
        stream = rng.choice(["a", "b", "tie"], size=2000, p=[0.25, 0.25, 0.5])
        promoted += replay(stream, "c", ONE_SIDED).decision == "promote"
    assert promoted / runs <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / runs)  # alpha, with two standard errors of slack
