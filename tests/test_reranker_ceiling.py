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
    arm = {"paired_vs_untrained_default": {"recall@5": {"delta": 0.06, "p_value": 0.001}}, "scores": {"recall@5": 0.56}}
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
    assert ceiling["reranker"]["complete_users_labels"] == {
        "questions": 1000,
        "score": 0.56,
        "delta": 0.06,
        "p_value": 0.001,
    }
    assert ceiling["reranker"]["in_sample_oracle"]["questions"] == 300


def _run(behaviour: str, rounds: list[tuple[int, str | None, float]], trained: list[float]) -> dict:
    """A TAT-QA loop record: per round (people's questions, the reranker served, its paired recall@5 delta), one
    retrain per round, and the rerankers those retrains trained with their paired deltas on the test split."""
    record = _loop_record(0.2, None, 0.0, 0)
    record["args"]["behaviour"] = behaviour
    retrain = {"job": "retrain_job", "success": True}
    record["corpus"]["rounds"] = [
        {
            "round": i,
            "asked_total": asked,
            "scores": {"recall@5": 0.5 + delta},
            "production": {"reranker": served},
            "paired_vs_untrained_default": {"recall@5": {"delta": delta, "p_value": 0.001 if delta else 1.0}},
            "operations": [retrain],
        }
        for i, (asked, served, delta) in enumerate(rounds, start=1)
    ]
    record["corpus"]["rerankers_on_test"] = [
        {
            "name": f"ce-ltr-v{i}",
            "gate": {"outcome": "inconclusive"},
            "paired_vs_untrained_default": {"recall@5": {"delta": delta, "p_value": 0.001}},
        }
        for i, delta in enumerate(trained, start=1)
    ]
    return record


def test_the_ablation_judges_each_asked_figure_at_its_round_and_counts_models_the_rollout_left_waiting(tmp_path):
    from bench.loop_ablation import ceilings, row_of, targets

    rows = [
        # served +0.07 from 1,000 questions: reached
        row_of("served", _run("consistent", [(500, None, 0.0), (1000, "ce-ltr-v2", 0.07)], [0.05, 0.07])),
        # +0.08 only after 1,500 questions, from a model trained then: neither served nor trained in time
        row_of("late", _run("consistent", [(1000, None, 0.0), (1500, "ce-ltr-v2", 0.08)], [0.03, 0.08])),
        # trained +0.07 at 1,000 and promoted nothing: the rollout left it waiting
        row_of("waited", _run("consistent", [(500, None, 0.0), (1000, None, 0.0)], [0.04, 0.07])),
        row_of("random", _run("random", [(1000, None, 0.0)], [-0.01])),
        row_of("harm", _run("inverted", [(1000, "ce-ltr-v1", -0.02)], [-0.02])),
    ]
    tatqa, harmful = [t for t in targets(rows, ceilings(rows, tmp_path)) if t["corpus"] == "tatqa"]
    assert (tatqa["runs"], tatqa["reached"], tatqa["trained_reaching"]) == (3, ["served"], ["served", "waited"])
    assert tatqa["best_run"]["source"] == "served" and tatqa["best_run"]["paired"]["delta"] == 0.07
    assert (tatqa["trained"]["which"], tatqa["trained"]["paired"]["delta"]) == ("best", 0.07)  # not late's 0.08
    assert tatqa["trained"]["score"] == 0.57  # its run's untrained default (0.5) plus its paired delta
    # the corrupted people's runs: one served its model, so not every run kept the untrained default
    assert (harmful["runs"], harmful["reached"], harmful["trained_reaching"]) == (2, ["random"], [])
    assert (harmful["trained"]["which"], harmful["trained"]["paired"]["delta"]) == ("worst", -0.02)


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
