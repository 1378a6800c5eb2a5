"""The cross-fitted gate (rag.training.folds): each share of users' questions is held out by one fold, disjoint
from the others, paraphrases together; the gate scores each share with the ranker trained without it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rag.training.data import IRSet, normalized_question, split_feedback
from rag.training.folds import CrossFitted, people_only, pooled_gate
from tests.test_feedback_split import linked_judgments, sides


@pytest.mark.parametrize("seed", range(3))
def test_folds_hold_out_disjoint_shares_and_fold_0_is_the_split_as_before(seed):
    judged, groups = linked_judgments(seed, pairs=90)
    before = split_feedback(judged, 0.3)
    folds = [split_feedback(judged, 0.3, fold=f) for f in range(3)]
    assert folds[0].dev_queries == before.dev_queries and folds[0].positives == before.positives
    held = [sides(s)[0] for s in folds]
    assert all(held) and not held[0] & held[1] and not held[0] & held[2] and not held[1] & held[2]
    for s, h in zip(folds, held):  # what one fold holds out, it never trains on, and paraphrases stay together
        assert not h & sides(s)[1]
        assert all(set(g) <= h or not set(g) & h for g in groups)
    # each question's ratings sit in the training side of every fold that does not hold it out
    for f, s in enumerate(folds):
        for g, other in enumerate(held):
            if g != f:
                assert other <= sides(s)[1]


def test_a_fold_outside_the_feedback_is_an_error():
    judged, _ = linked_judgments(0)
    with pytest.raises(ValueError, match="outside the feedback"):
        split_feedback(judged, 0.3, fold=3)
    assert split_feedback(judged, 0.5, fold=1).dev_queries


def _ir(qids: list[str], types: dict[str, str]) -> IRSet:
    return IRSet(
        {q: f"question {q}" for q in qids},
        {"c1": "one", "c2": "two"},
        {q: {"c1": 1} for q in qids},
        {q: {"c1", "c2"} for q in qids},
        types,
    )


def test_pooled_gate_adds_other_folds_people_s_questions_once_and_says_whose_they_are():
    own = _ir(["feedback:a", "feedback:b"], {"feedback:a": "feedback", "feedback:b": "feedback"})
    one = _ir(["feedback:c", "expert:d", "g1"], {"feedback:c": "feedback", "expert:d": "expert", "g1": "keyword"})
    two = _ir(["feedback:a", "feedback:e"], {"feedback:a": "feedback", "feedback:e": "feedback"})
    pooled, by_fold = pooled_gate(own, {1: one, 2: two})
    assert by_fold == {0: ["feedback:a", "feedback:b"], 1: ["feedback:c", "expert:d"], 2: ["feedback:e"]}
    assert set(pooled.queries) == {"feedback:a", "feedback:b", "feedback:c", "expert:d", "feedback:e"}
    assert pooled.types["expert:d"] == "expert" and pooled.judged["feedback:e"] == {"c1", "c2"}
    assert people_only(pooled) and not people_only(one) and not people_only(None)


class _Constant:
    scale = "probability"
    needs_hits = True

    def __init__(self, value: float, name: str) -> None:
        self.value, self.name = value, name

    def score_hits(self, query, hits):
        return np.full(len(hits), self.value)


def test_each_question_is_scored_by_the_ranker_that_never_trained_on_it():
    own = _ir(["feedback:a"], {"feedback:a": "feedback"})
    one = _ir(["feedback:c"], {"feedback:c": "feedback"})
    pooled, by_fold = pooled_gate(own, {1: one})
    candidate, fold_one = _Constant(0.1, "v1"), _Constant(0.9, "v1 fold 1")
    ranker = CrossFitted(candidate, {1: fold_one}, by_fold, pooled.queries)
    assert ranker.ranker_for("question feedback:a") is candidate
    assert ranker.ranker_for("  Question   FEEDBACK:c ") is fold_one
    assert ranker.ranker_for("a question nobody held out") is candidate
    assert ranker.score_hits("question feedback:c", [1, 2]).tolist() == [0.9, 0.9]
    assert normalized_question("Question feedback:C") == "question feedback:c"


def test_retrain_trains_a_ranker_per_fold_and_the_gate_scores_every_fold_s_questions(tmp_path, monkeypatch):
    """Through the pipeline: users liked a keyword passage the generated questions never name; with gate_folds=3
    the candidate's directory holds two fold rankers, and the verdict scores the people's questions of all three
    shares, each fold's counted."""

    from rag.registry import ModelRegistry
    from rag.training import GateSettings, RerankerTrainingConfig
    from rag.training.folds import trained_folds
    from rag.training.pipeline import gate_candidate, train_candidate
    from tests.test_expert_training import _two_passages_per_question, ltr_pipeline_inputs

    texts, questions = _two_passages_per_question(random.Random(7), n=150)
    tables, dataset = ltr_pipeline_inputs(tmp_path, texts, questions, "u")
    (dataset / "qrels" / "chunk_qrels.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"u{i}\tx{i}\t1\nu{i}\ta{i}\t-1\n" for i in range(30, 150))
    )
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    registry = ModelRegistry(tmp_path / "models")
    config = RerankerTrainingConfig(
        trees=40,
        min_child_samples=5,
        rerank_depth=10,
        early_stopping_rounds=20,
        feedback_dataset=str(dataset),
        min_feedback_gate_questions=5,
        gate_folds=3,
    )
    mv, run, inputs = train_candidate("reranker", tables, registry, config, log=lambda _: None)
    assert inputs.data.gate_set.startswith("feedback: ")
    assert (
        run.fold_rankers == 2 and trained_folds(mv.path) == [1, 2] and mv.metrics["training"]["gate_fold_rankers"] == 2
    )
    gate_candidate("reranker", tables, registry, mv, GateSettings(resamples=1000))
    verdict = registry.resolve("reranker", mv.version).metrics["gate"]
    by_fold = {int(f): n for f, n in verdict["gate_questions_by_fold"].items()}
    assert set(by_fold) == {0, 1, 2} and all(by_fold.values())
    assert verdict["questions"] == sum(by_fold.values()) == verdict["type_feedback_questions"]
    assert by_fold[0] == len(inputs.data.gate)
    from rag.registry.cli import gate_report

    report = "\n".join(gate_report(registry, registry.resolve("reranker", mv.version)))
    assert f"cross-fitted: {by_fold[0]} of share 0, {by_fold[1]} of share 1, {by_fold[2]} of share 2" in report

    # Against a production ranker trained on every share but its own, the other shares are scored with its fold
    # rankers; a production ranker without them trained on those questions, so the gate keeps to the own share.
    registry.set_alias("reranker", "production", mv.version)
    successor, _, _ = train_candidate(
        "reranker", tables, registry, config.model_copy(update={"seed": 43}), log=lambda _: None
    )
    gate_candidate("reranker", tables, registry, successor, GateSettings(resamples=1000))
    verdict = registry.resolve("reranker", successor.version).metrics["gate"]
    assert verdict["against"] == mv.name and verdict["questions"] == sum(by_fold.values()), verdict
    import shutil

    shutil.rmtree(mv.path / "folds")
    gate_candidate("reranker", tables, registry, successor, GateSettings(resamples=1000))
    verdict = registry.resolve("reranker", successor.version).metrics["gate"]
    assert verdict["questions"] == by_fold[0] and "gate_questions_by_fold" not in verdict, verdict
