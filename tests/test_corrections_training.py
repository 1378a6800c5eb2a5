"""A corrected answer says where the answer was when none of the passages production showed held it: located in the
chunk set, it trains the embedder and the reranker, and keys a held-out question production failed, the questions
whose gains the gate could not see."""

from __future__ import annotations

from rag.feedback.dataset import Judgments
from rag.training import split_feedback, training_data
from tests.test_training import _chunks, _item

N = 24


def test_a_corrected_answer_keys_a_failed_question_by_the_chunks_that_hold_it_and_trains_on_them():
    texts = {f"d{i}": f"Report {i}. Revenue reached {400 + i},118 thousand pounds this year." for i in range(N)}
    items = [_item(f"q{i}", f"what about report {i}?", f"d{i}", 10, "train" if i < 12 else "dev") for i in range(N)]
    judged = Judgments(
        {f"u{i}": f"how much revenue did company {i} make?" for i in range(N)},
        texts,
        [(f"u{i}", f"d{(i + 1) % N}", -1) for i in range(N)],  # production showed the wrong report, rated down
        corrections={f"u{i}": [f"{400 + i},118 thousand pounds"] for i in range(N - 1)} | {f"u{N - 1}": ["yes"]},
    )

    held = training_data(items, _chunks(texts), feedback=split_feedback(judged, 1.0), min_feedback_gate=5)
    gate = held.gate
    assert gate is not None and set(gate.types.values()) == {"feedback"}  # people's questions decide
    keyed = {gate.queries[q]: rel for q, rel in gate.qrels.items()}
    chose = sum(q.startswith("feedback:") for q in held.selection.queries)
    assert len(keyed) + chose == N - 1  # "yes" names no passage; the others split between checkpoint and gate
    assert all(rel == {f"d{int(t.split()[-2])}": 1} for t, rel in keyed.items())  # the chunk holding the answer
    assert not set(gate.judged) & set(gate.qrels)  # scored on plain lists: the key does not come from production
    assert held.correction_gate_questions == len(gate) and held.summary["gate_questions_keyed_by_corrections"] > 0

    trained = training_data(items, _chunks(texts), feedback=split_feedback(judged, 0.0))
    assert trained.correction_pairs == N - 1
    assert (judged.queries["u3"], texts["d3"]) in trained.positives
    assert not any(q == judged.queries[f"u{N - 1}"] for q, _ in trained.positives)
