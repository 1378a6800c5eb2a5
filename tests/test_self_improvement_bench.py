"""bench/self_improvement.py: the users who decide a canary never ask a question that is scored (no data needed)."""

from dataclasses import dataclass

from bench.lib.canary import split_users


@dataclass
class _Item:
    qid: str


def test_users_questions_and_judged_questions_are_disjoint_and_cover_every_question():
    items = [_Item(f"q{i}") for i in range(101)]
    users, judged = split_users(items, 0.5, seed=11)
    assert {i.qid for i in users}.isdisjoint({i.qid for i in judged})
    assert len(users) + len(judged) == 101 and abs(len(users) - len(judged)) <= 1
    # The same seed splits the same way whatever order the questions came in; no users leaves every question judged.
    again, _ = split_users(list(reversed(items)), 0.5, seed=11)
    assert [i.qid for i in again] == [i.qid for i in users]
    nobody, everything = split_users(items, 0.0, seed=11)
    assert nobody == [] and {i.qid for i in everything} == {i.qid for i in items}
