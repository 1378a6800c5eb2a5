"""The gate on people's questions, judged only in part: condensed lists keep the passages people rated (mostly the one
they opened), so a candidate that reorders what they were shown around it ties there on every question. Such a
candidate is no copy of production: the plain lists decide (they favour production, whose results were the only ones
people could rate), instead of "unchanged", which held a reranker trained on TAT-QA people's clicks back for good."""

from __future__ import annotations

from rag.training.config import GateSettings
from rag.training.data import IRSet
from rag.training.gate import compare_runs

PASSAGES = [f"c{i}" for i in range(10)]


def people(n: int = 30) -> IRSet:
    queries = {f"q{i:02d}": f"question {i}" for i in range(n)}
    return IRSet(
        queries=queries,
        corpus={c: f"passage {c}" for c in PASSAGES},
        qrels={q: {"c0": 1} for q in queries},  # the passage each person opened
        judged={q: {"c0"} for q in queries},
        types=dict.fromkeys(queries, "feedback"),
    )


def ranked(order: list[str]) -> dict[str, float]:
    return {c: float(len(order) - r) for r, c in enumerate(order)}


def runs(ir: IRSet, moved_up: int, moved_down: int) -> tuple[dict, dict]:
    """Production shows the opened passage second on the first `moved_up` questions (the candidate first), first on
    the next `moved_down` (the candidate second), and both rank alike elsewhere."""
    second, first = ranked(["c1", "c0", *PASSAGES[2:]]), ranked(PASSAGES)
    production, candidate = {}, {}
    for i, q in enumerate(ir.queries):
        if i < moved_up:
            production[q], candidate[q] = second, first
        elif i < moved_up + moved_down:
            production[q], candidate[q] = first, second
        else:
            production[q] = candidate[q] = first
    return production, candidate


SETTINGS = GateSettings(criterion="not_worse", resamples=2000)


def test_a_reordering_the_condensed_lists_cannot_see_goes_to_a_canary_when_plain_lists_show_no_loss():
    ir = people()
    result = compare_runs(ir, *runs(ir, moved_up=5, moved_down=5), SETTINGS)
    assert result.lists == "plain" and result.other.lists == "condensed" and result.other.changed_questions == 0
    assert result.changed_questions == 10 and result.not_worse and not result.better
    assert result.passed and result.outcome == "inconclusive"  # a canary decides
    assert result.metadata["condensed_delta_ndcg@10"] == 0.0


def test_a_reordering_that_plain_lists_find_worse_is_kept_from_people():
    ir = people()
    result = compare_runs(ir, *runs(ir, moved_up=0, moved_down=30), SETTINGS)
    assert result.lists == "plain" and result.changed_questions == 30
    assert not result.passed and result.outcome == "worse"


def test_a_gain_on_the_passages_people_opened_shows_on_plain_lists_and_promotes():
    ir = people()
    result = compare_runs(ir, *runs(ir, moved_up=20, moved_down=0), GateSettings(criterion="better", resamples=2000))
    assert result.lists == "plain" and result.better and result.passed and result.outcome == "better"


def test_a_candidate_that_ranks_alike_everywhere_is_unchanged():
    ir = people()
    result = compare_runs(ir, *runs(ir, moved_up=0, moved_down=0), SETTINGS)
    assert result.changed_questions == 0 and not result.passed and result.outcome == "unchanged"


def test_on_users_questions_alone_a_drop_within_chance_goes_to_a_canary_and_experts_grades_keep_the_strict_rule():
    """Users' held-out questions are keyed by what they liked in production's lists, so any other ranking reads lower
    there: a drop beyond max_drop that is not significant is left to the canary. Once an expert's graded question is
    among them, the set is not production's alone and max_drop holds again."""
    ir = people()
    production, candidate = runs(ir, moved_up=4, moved_down=6)  # -0.025 nDCG@10: beyond max_drop 0.02, by chance
    result = compare_runs(ir, production, candidate, SETTINGS)
    assert result.labels_from_production and result.metadata["labels_from_production"] is True
    assert result.metadata["delta_ndcg@10"] < -SETTINGS.max_drop and result.metadata["p_value_worse_ndcg@10"] > 0.05
    assert result.passed and result.not_worse and result.outcome == "inconclusive"
    graded = IRSet(ir.queries, ir.corpus, ir.qrels, ir.judged, {**ir.types, "q29": "expert"})
    result = compare_runs(graded, production, candidate, SETTINGS)
    assert not result.labels_from_production and not result.passed and result.outcome == "worse"
    assert "at most 0.02 lower" in result.reasons[0]


def test_on_users_questions_alone_one_question_out_of_the_top_20_is_no_veto_and_a_significant_loss_is():
    """Production's recall@20 on users' questions is 1.0 or near it by how they were keyed: one question of 40
    falling out of the candidate's top 20 (-0.025, beyond the 0.01 tolerance) is chance there, and is left to the
    canary; the same drop where generated questions decide keeps production, and so does a significant drop on users'
    questions."""
    import pandas as pd

    from rag.training.gate import gate_decision

    def table(recall: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {"qid": [f"q{i}" for i in range(40)], "ndcg@10": 0.8, "mrr@10": 0.8, "recall@20": recall}
        )

    production, one_lost = table([1.0] * 40), table([0.0] + [1.0] * 39)
    users = gate_decision(production, one_lost, SETTINGS, labels_from_production=True)
    assert users.not_worse and users.passed and users.metadata["delta_recall@20"] == -0.025
    assert users.metadata["p_value_worse_recall@20"] > 0.05
    generated = gate_decision(production, one_lost, SETTINGS)
    assert not generated.not_worse and "recall@20 dropped by 0.0250 (tolerance 0.01)" in generated.reasons
    many_lost = gate_decision(production, table([0.0] * 10 + [1.0] * 30), SETTINGS, labels_from_production=True)
    assert not many_lost.not_worse and "significantly" in many_lost.reasons[-1]
