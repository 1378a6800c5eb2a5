"""The reranker ceiling bench labels completely: every chunk holding a question's answer is a positive of its
question, and the questions that pick the checkpoint are none of those it trains on."""

import pandas as pd

from bench.lib.learner_ceiling import labelled_data
from bench.lib.loop_data import Question


def test_complete_labels_and_disjoint_selection():
    questions = [Question(f"q{i}", f"question {i}", [f"d{i}"]) for i in range(40)]
    qrels = {f"q{i}": {f"c{i}a": 1, f"c{i}b": 1} for i in range(38)}  # two questions have no answer chunk
    chunks = pd.DataFrame(
        {
            "chunk_id": [f"c{i}{s}" for i in range(40) for s in "ab"],
            "text": [f"t{i}{s}" for i in range(40) for s in "ab"],
        }
    )
    data, counts = labelled_data(questions, qrels, chunks, seed=0)
    selected = set(data.selection.queries.values())
    trained = {q for q, _ in data.positives}
    assert counts["labelled"] == 38 and counts["selection_questions"] == len(selected) == 5
    assert not selected & trained and len(trained) == counts["training_questions"] == 33
    assert counts["training_pairs"] == len(data.positives) == 66  # both answer chunks of every training question
    assert all(data.selection.qrels[q] == {f"c{q[1:]}a": 1, f"c{q[1:]}b": 1} for q in data.selection.queries)
    again, _ = labelled_data(questions, qrels, chunks, seed=0)
    assert again.positives == data.positives  # seeded
