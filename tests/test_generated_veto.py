"""Generated questions may veto a direct promotion, never vouch for one. Feedback that was corrupted (a broken click
logger, a poisoned collection) agrees with itself: held-out judgements of the same kind call the model it trains
better. The held-out generated questions people's questions took the gate from are scored too, and a candidate
significantly worse there goes to a canary instead of production."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from rag.training import split_feedback, training_data
from rag.training.config import GateSettings
from rag.training.data import IRSet
from rag.training.gate import compare_runs, veto_by_generated
from rag.training.pipeline import guard_questions
from tests.test_training import _chunks, _item

N = 24
SETTINGS = GateSettings(resamples=2000)


def _run(order: list[str]) -> dict[str, float]:
    return {p: float(len(order) - r) for r, p in enumerate(order)}


def people_verdict():
    """People's held-out questions: production showed the passage they liked second, the candidate puts it first."""
    ir = IRSet(
        {f"feedback:{i}": f"people's question {i}" for i in range(N)},
        {**{f"liked{i}": "liked" for i in range(N)}, **{f"other{i}": "other" for i in range(N)}},
        {f"feedback:{i}": {f"liked{i}": 1} for i in range(N)},
        judged={f"feedback:{i}": {f"liked{i}", f"other{i}"} for i in range(N)},
        types=dict.fromkeys((f"feedback:{i}" for i in range(N)), "feedback"),
    )
    production = {f"feedback:{i}": _run([f"other{i}", f"liked{i}"]) for i in range(N)}
    candidate = {f"feedback:{i}": _run([f"liked{i}", f"other{i}"]) for i in range(N)}
    return compare_runs(ir, production, candidate, SETTINGS)


def guard_verdict(candidate_loses: bool):
    """Held-out generated questions, each with the passage it was made from: production ranks it first."""
    ir = IRSet(
        {f"g{i}": f"generated question {i}" for i in range(N)},
        {**{f"source{i}": "source" for i in range(N)}, **{f"x{i}": "x" for i in range(N)}},
        {f"g{i}": {f"source{i}": 1} for i in range(N)},
        types=dict.fromkeys((f"g{i}" for i in range(N)), "keyword"),
    )
    production = {f"g{i}": _run([f"source{i}", f"x{i}"]) for i in range(N)}
    order = (lambda i: [f"x{i}", f"source{i}"]) if candidate_loses else (lambda i: [f"source{i}", f"x{i}"])
    candidate = {f"g{i}": _run(order(i)) for i in range(N)}
    return compare_runs(ir, production, candidate, SETTINGS)


def test_a_candidate_people_found_better_but_generated_questions_find_worse_goes_to_a_canary():
    result = veto_by_generated(people_verdict(), guard_verdict(candidate_loses=True))
    assert not result.better and result.outcome == "inconclusive" and not result.passed  # criterion "better"
    assert result.not_worse  # a canary may still serve it: people judge it online
    assert not result.better_on_generated  # the gain was people's, not the generated questions'
    assert any("held-out generated questions" in r and "generated_veto" in r for r in result.why_not["better"])
    meta = result.metadata
    assert meta["generated_guard_outcome"] == "worse" and meta["generated_guard_questions"] == N
    assert meta["generated_guard_delta_ndcg@10"] < 0


def test_generated_questions_that_do_not_find_it_worse_leave_the_peoples_verdict_as_it_is():
    result = veto_by_generated(people_verdict(), guard_verdict(candidate_loses=False))
    assert result.better and result.passed and result.outcome == "better"
    assert result.metadata["generated_guard_outcome"] == "unchanged"


def test_training_data_keeps_the_held_out_generated_questions_as_the_guard_once_people_decide():
    texts = {f"d{i}": f"document number {i} talks about topic {i}." for i in range(48)}
    items = [_item(f"q{i}", f"what about topic {i}?", f"d{i}", 10, "train" if i < 12 else "dev") for i in range(48)]
    queries = {f"f{i}": f"user question {i % 100}" for i in range(300)}
    qrels = [(q, f"d{i % 48}", 1) for i, q in enumerate(queries)]
    split = split_feedback(SimpleNamespace(queries=queries, corpus=texts, chunk_qrels=qrels), 0.3)

    data = training_data(items, _chunks(texts), feedback=split, min_feedback_gate=5)
    assert data.gate and all(q.startswith("feedback:") for q in data.gate.queries)
    assert data.guard is not None and len(data.guard) > 0
    held = set(data.guard.queries)
    assert held <= {f"q{i}" for i in range(12, 48)}  # dev questions only: never trained on
    assert not held & (set(data.selection.queries) | set(data.gate.queries))  # nor picked a checkpoint
    assert training_data(items, _chunks(texts), feedback=split, min_feedback_gate=10_000).guard is None  # they decide
    assert training_data(items, _chunks(texts)).guard is None  # no people: generated questions decide themselves


def test_the_guard_needs_enough_uncopied_questions_and_can_be_turned_off():
    texts = {f"c{i}": f"passage {i} on its own topic." for i in range(N)}
    chunks = pd.DataFrame({"chunk_id": list(texts), "text": list(texts.values())})
    guard = IRSet(
        {f"g{i}": f"what is topic {i}?" for i in range(N)},
        texts,
        {f"g{i}": {f"c{i}": 1} for i in range(N)},
        types=dict.fromkeys((f"g{i}" for i in range(N)), "keyword"),
    )
    assert len(guard_questions(guard, chunks, GateSettings(min_questions=20))) == N
    assert guard_questions(guard, chunks, GateSettings(min_questions=20, generated_veto=False)) is None
    assert guard_questions(guard.subset([f"g{i}" for i in range(5)]), chunks, GateSettings(min_questions=20)) is None
    copied = IRSet(guard.queries, texts, guard.qrels, types=dict.fromkeys(guard.queries, "inverse-cloze"))
    assert guard_questions(copied, chunks, GateSettings(min_questions=20, copied_questions="include")) is None
