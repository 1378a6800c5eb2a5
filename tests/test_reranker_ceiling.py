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


def _loop_record(p_correction: float, served: str | None, delta: float, corrections: int, rounds: int = 2) -> dict:
    scores = {"recall@5": 0.5, "answer_read": 0.7, "recall@20": 0.6}
    paired = {"recall@5": {"delta": delta, "p_value": 0.01}, "answer_read": {"delta": delta, "p_value": 0.01}}
    return {
        "commit": "c0ffee",
        "args": {"corpus": "tatqa", "rounds": rounds, "p_correction": p_correction, "out": f"x-{p_correction}.json"},
        "corpus": {
            "corpus": "tatqa",
            "headline": "recall@5",
            "round_0": {"scores": scores},
            "rounds": [
                {
                    "round": 1,
                    "asked_total": 250,
                    "people": {"corrections": corrections},
                    "scores": scores,
                    "production": {"reranker": served},
                    "paired_vs_untrained_default": paired,
                    "operations": [],
                }
            ],
        },
    }


def test_the_ablation_sets_runs_that_differ_only_in_corrections_side_by_side_and_reads_the_ceiling(tmp_path):
    import json

    from bench.loop_ablation import ceilings, corrections, row_of

    rows = [
        row_of("with", _loop_record(0.2, "ce-ltr-v5", 0.04, 39)),
        row_of("without", _loop_record(0.0, None, 0.0, 0)),
        row_of("other-setting", _loop_record(0.0, None, 0.0, 0, rounds=4)),  # not the same run otherwise
    ]
    side = corrections(rows)
    assert [(r["source"], r["p_correction"], r["corrections_sent"]) for r in side] == [
        ("without", 0.0, 0),
        ("with", 0.2, 39),
    ]
    assert side[1]["production"] == {"reranker": "ce-ltr-v5"} and side[1]["paired"]["recall@5"]["delta"] == 0.04
    assert ceilings(rows, tmp_path)[0]["reranker"] is None  # no reranker_ceiling result yet
    arm = {"paired_vs_untrained_default": {"recall@5": {"delta": 0.06, "p_value": 0.001}}}
    (tmp_path / "reranker-ceiling-tatqa.json").write_text(
        json.dumps(
            {
                "commit": "abc",
                "corpus": {
                    "headline": "recall@5",
                    "first_stage": {"depth": 50, "recall@50": 0.7},
                    "arms": [
                        {"arm": "users-1000", "questions": 1000, **arm},
                        {"arm": "users-1000+generated", "questions": 1000, **arm},
                        {"arm": "test-in-sample", "questions": 300, **arm},
                    ],
                },
            }
        )
    )
    ceiling = ceilings(rows, tmp_path)[0]
    assert ceiling["served_recall@10"] == 0.6
    assert ceiling["reranker"]["first_stage_recall_at_depth"] == 0.7
    assert ceiling["reranker"]["complete_users_labels"] == {"questions": 1000, "delta": 0.06, "p_value": 0.001}
    assert ceiling["reranker"]["in_sample_oracle"]["questions"] == 300


def test_an_ablation_arm_changes_one_validated_learner_setting():
    import pytest

    from bench.reranker_ceiling import ablation, arm_suffix

    assert ablation("early_stopping_rounds=50") == {"early_stopping_rounds": 50}
    assert ablation("document_features=false") == {"document_features": False}
    assert arm_suffix({"document_features": False}) == "without document_features"
    assert arm_suffix({"early_stopping_rounds": 50}) == "early_stopping_rounds=50"
    for bad in ("no_such_field=1", "early_stopping_rounds", "early_stopping_rounds=0"):
        with pytest.raises((SystemExit, ValueError)):
            ablation(bad)


def test_the_ceiling_counts_its_people_labels_as_likes_as_the_loops_retrain_does(monkeypatch, tmp_path):
    """The loop's learner reads feedback priors (how often people liked a passage for other questions); a ceiling
    without them measured another learner (SciFact: 0.745 for 0.78). Generated pairs never count as likes."""
    import rag.training.ltr as ltr
    from bench.lib.learner_ceiling import train_arm

    seen = []

    def fake_train(data, config, out, **kwargs):
        seen.append((kwargs["feedback"], config.document_features))
        return type("Run", (), {"steps": 1, "examples": 2, "selection_metrics": {}})()

    monkeypatch.setattr(ltr, "train_learned_ranker", fake_train)
    liked = [("question", "passage")]
    train_arm("users-1", None, None, None, None, tmp_path, 0, {"document_features": False}, liked)
    train_arm("users-1 without feedback_priors", None, None, None, None, tmp_path, 0, {}, [])
    assert seen == [((liked, []), False), (([], []), True)]
