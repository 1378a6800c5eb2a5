"""Training weighs expert labels: graded (question, passage) pairs (2 relevant, 1 partially relevant, 0 irrelevant)
enter the trainers at a share λ (TrainingConfig.expert_weight) of the training signal, are held out by paraphrase
group like users' ratings, and decide the gate alone once there are enough of them. The end-to-end test fails if
training ignores them: expert labels that contradict the synthetic ones must move the ranking their way as λ grows."""

from __future__ import annotations

import csv
import hashlib
import json
import random
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from rag.evaluation.qaset import Evidence, QAItem
from rag.training import EmbedderTrainingConfig, RerankerTrainingConfig, TrainingConfig
from rag.training.data import (
    ExpertPair,
    FeedbackSplit,
    IRSet,
    TrainingData,
    expert_copies,
    expert_scale,
    normalized_question,
    split_feedback,
    training_data,
)

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc)


def _chunks(texts: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "chunk_id": c,
                "doc_id": c,
                "text": t,
                "char_start": 0,
                "char_end": len(t),
                "page_start": 1,
                "page_end": 1,
                "content_hash": hashlib.sha256(t.encode()).hexdigest(),
            }
            for c, t in texts.items()
        ]
    )


def _item(i: int, split: str) -> QAItem:
    return QAItem(
        qid=f"q{i}",
        question=f"what about topic {i}?",
        qtype="answer-aware",
        doc_id=f"d{i}",
        evidence=[Evidence(doc_id=f"d{i}", start=0, end=10)],
        split=split,
    )


TEXTS = {f"d{i}": f"document number {i} talks about topic {i}." for i in range(24)}
ITEMS = [_item(i, "train" if i < 12 else "dev") for i in range(24)]


def expert_judgments(n: int = 60) -> SimpleNamespace:
    """A feedback dataset with expert labels only: question i graded d(i%24) relevant, d(i+1) partial, d(i+2) not."""
    queries = {f"e{i}": f"expert question {i}" for i in range(n)}
    grades = [(f"e{i}", f"d{(i + k) % 24}", 2 - k) for i in range(n) for k in range(3)]
    return SimpleNamespace(queries=queries, corpus=TEXTS, chunk_qrels=[], expert_qrels=grades)


# --- λ: the experts' share ---------------------------------------------------------------------------------
def test_lambda_is_the_experts_share_of_the_training_signal():
    scales = expert_scale([1.0, 1.0, 0.5, 0.5], others=90, share=0.25)
    assert sum(scales) == pytest.approx(0.25 / 0.75 * 90)  # experts: 30 of 120 units of weight
    assert scales[0] == pytest.approx(2 * scales[2])  # within the share, in proportion to each pair's weight
    assert expert_scale([1.0, 1.0], others=90, share=0.0) == [0.0, 0.0]  # λ = 0: the experts do not train
    assert expert_scale([1.0, 3.0], others=0, share=0.5) == [0.5, 1.5]  # only experts: their weights, mean 1
    copies = expert_copies([2.4, 0.3, 0.3, 7.0], seed=1)
    assert sum(copies) == 10 and copies[0] in (2, 3) and copies[3] == 7  # whole copies, each as often as it weighs
    assert expert_copies([2.4, 0.3, 0.3, 7.0], seed=1) == copies  # seeded


def test_expert_grades_and_weights_are_checked():
    with pytest.raises(ValueError, match="use 2 .relevant., 1 .partially relevant. or 0"):
        ExpertPair("q", "p", 3)
    with pytest.raises(ValueError, match="weight >= 0"):
        ExpertPair("q", "p", 2, weight=-1)
    judged = expert_judgments(3)
    judged.expert_qrels.append(("e0", "no-such-passage", 2))
    with pytest.raises(ValueError, match="re-export the feedback dataset"):
        split_feedback(judged, 0.3)


def test_the_data_hash_changes_with_expert_labels():
    base = TrainingData([("q", "p")])
    graded = TrainingData([("q", "p")], expert=[ExpertPair("q2", "p2", 2)])
    assert base.data_hash != graded.data_hash
    assert graded.data_hash != TrainingData([("q", "p")], expert=[ExpertPair("q2", "p2", 1)]).data_hash  # the grade
    assert (
        graded.data_hash != TrainingData([("q", "p")], expert=[ExpertPair("q2", "p2", 2, 0.5)]).data_hash
    )  # the weight
    assert graded.data_hash == TrainingData([("q", "p")], expert=[ExpertPair("q2", "p2", 2)]).data_hash


# --- the split: experts' questions by paraphrase group, their grades replace users' ratings -----------------
def test_expert_labels_split_by_paraphrase_group_and_replace_users_ratings():
    judged = expert_judgments(60)
    # Each expert question is rephrased by a user a moment later in the same session: one question, one side.
    judged.asked = {}
    for i in range(60):
        judged.queries[f"u{i}"] = f"rephrased question {i}"
        judged.asked[f"e{i}"] = SimpleNamespace(
            session_id=f"s{i}", created_at=T0 + timedelta(hours=i), reformulation_of=None
        )
        judged.asked[f"u{i}"] = SimpleNamespace(
            session_id=f"s{i}", created_at=T0 + timedelta(hours=i, seconds=20), reformulation_of=f"e{i}"
        )
    judged.chunk_qrels = [(f"u{i}", f"d{i % 24}", 1) for i in range(60)]
    judged.chunk_qrels += [(f"e{i}", f"d{(i + 2) % 24}", 1) for i in range(60)]  # a user liked what the expert graded 0

    split = split_feedback(judged, 0.3)
    held = {normalized_question(t) for t in split.expert_dev_queries.values()}
    trained = {normalized_question(e.query) for e in split.expert}
    assert 8 <= len(held) <= 30 and len(held) + len(trained) == 60 and not held & trained
    users_trained = {normalized_question(q) for q, _ in split.positives}
    users_held = {normalized_question(t) for t in split.dev_queries.values()}
    for i in range(60):  # the rephrasing sits on its expert question's side
        assert (
            (f"expert question {i}" in held)
            == (f"rephrased question {i}" in users_held)
            != (f"rephrased question {i}" in users_trained)
        )
    grades = {(e.query, e.passage): e.grade for e in split.expert}
    for text in trained:
        i = int(text.split()[-1])
        assert grades[(text, TEXTS[f"d{i % 24}"])] == 2 and grades[(text, TEXTS[f"d{(i + 1) % 24}"])] == 1
        assert grades[(text, TEXTS[f"d{(i + 2) % 24}"])] == 0
        assert (text, TEXTS[f"d{(i + 2) % 24}"]) not in split.positives  # the expert's 0 replaces the user's +1
    key = next(iter(split.expert_dev_qrels))
    assert sorted(split.expert_dev_qrels[key].values()) == [1, 2] and sorted(split.expert_dev_judged[key].values()) == [
        0,
        1,
        2,
    ]


def test_experts_who_disagree_meet_halfway():
    judged = SimpleNamespace(
        queries={"a": "Same question", "b": "same  question"},
        corpus=TEXTS,
        chunk_qrels=[],
        expert_qrels=[("a", "d0", 2), ("b", "d0", 0), ("a", "d1", 2), ("b", "d1", 1)],
    )
    split = split_feedback(judged, 0.0)
    assert {(e.passage, e.grade) for e in split.expert} == {(TEXTS["d0"], 1), (TEXTS["d1"], 2)}  # one question


def test_a_dataset_folder_with_expert_qrels_reaches_training(tmp_path):
    """The export's format (rag.feedback.dataset): queries.jsonl, corpus.jsonl and qrels/*.tsv."""
    from rag.feedback import judgments

    judged = expert_judgments(30)
    (tmp_path / "qrels").mkdir()
    with open(tmp_path / "queries.jsonl", "w") as fh:
        fh.writelines(json.dumps({"_id": q, "text": t, "metadata": {}}) + "\n" for q, t in judged.queries.items())
    with open(tmp_path / "corpus.jsonl", "w") as fh:
        fh.writelines(json.dumps({"_id": c, "title": c, "text": t}) + "\n" for c, t in judged.corpus.items())
    for name, rows in (("chunk_qrels.tsv", [("e0", "d5", 1)]), ("expert_qrels.tsv", judged.expert_qrels)):
        with open(tmp_path / "qrels" / name, "w", newline="") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
            writer.writerow(["query-id", "corpus-id", "score"])
            writer.writerows(rows)
    split = split_feedback(judgments(tmp_path), 0.3)
    assert len(split.expert) + 3 * len(split.expert_dev_queries) == 90
    data = training_data(ITEMS, _chunks(TEXTS), feedback=split)
    assert data.expert == split.expert and data.summary["expert_pairs"] == len(split.expert)
    assert data.summary["expert_pairs_grade_1"] == len(split.expert) // 3


# --- the gate: expert-labelled questions first, once there are enough ----------------------------------------
def test_enough_expert_questions_decide_the_gate_alone_and_the_verdict_says_so():
    from rag.training.gate import compare_runs
    from rag.training.config import GateSettings

    split = split_feedback(expert_judgments(60), 1.0)  # every expert question held out
    data = training_data(ITEMS, _chunks(TEXTS), feedback=split, min_expert_gate=10)
    gate = data.gate
    assert (
        len(gate) >= 10
        and all(q.startswith("expert:") for q in gate.queries)
        and set(gate.types.values()) == {"expert"}
    )
    assert data.gate_set.startswith("expert: the ") and "decide alone" in data.gate_set
    assert data.summary["gate_questions_from_experts"] == len(gate) and data.summary["gate_set"] == data.gate_set
    assert {g for rel in gate.qrels.values() for g in rel.values()} == {1, 2}  # graded qrels
    assert all(len(gate.judged[q]) == 3 for q in gate.queries)  # the 0-graded passage is judged too (condensed lists)
    assert not set(data.selection.queries) & set(gate.queries)

    # Graded: the candidate ranks relevant > partial > irrelevant, production the reverse; the report names experts.
    def run(best_first: bool):
        return {
            q: {
                c: float(10 - r)
                for r, c in enumerate(sorted(gate.judged[q], reverse=best_first, key=lambda c: gate.qrels[q].get(c, 0)))
            }
            for q in gate.queries
        }

    result = compare_runs(gate, run(False), run(True), GateSettings(resamples=2000))
    assert result.passed and result.by_type["expert"]["questions"] == len(gate) and result.judged_questions == 0
    assert result.metadata["type_expert_questions"] == len(gate)

    few = training_data(ITEMS, _chunks(TEXTS), feedback=split, min_expert_gate=10_000)
    kinds = set(few.gate.types.values())
    assert "expert" in kinds and len(kinds) > 1  # too few: they join the synthetic questions
    assert few.gate_set.startswith("mixed: ") and "fewer than min_expert_gate_questions=10000" in few.gate_set


def test_expert_questions_a_model_trained_on_are_not_gate_questions():
    split = split_feedback(expert_judgments(60), 1.0)
    trained = [
        QAItem(
            qid="t",
            question="Expert question 7",
            qtype="answer-aware",
            doc_id="d7",
            evidence=[Evidence(doc_id="d7", start=0, end=10)],
            split="train",
        )
    ]
    data = training_data(ITEMS + trained, _chunks(TEXTS), feedback=split, min_expert_gate=1)
    assert "expert question 7" not in {normalized_question(t) for t in data.gate.queries.values()}
    assert "expert question 8" in {normalized_question(t) for t in data.gate.queries.values()} | {
        normalized_question(t) for t in data.selection.queries.values()
    }


def test_an_expert_grade_replaces_the_synthetic_label_of_the_same_pair():
    split = FeedbackSplit([], [], {}, {}, expert=[ExpertPair("What about topic 3?", TEXTS["d3"], 0)])
    data = training_data(ITEMS, _chunks(TEXTS), feedback=split)
    assert ("what about topic 3?", TEXTS["d3"]) not in data.positives and (
        "what about topic 4?",
        TEXTS["d4"],
    ) in data.positives


# --- the embedder and the cross-encoder: expert examples sampled at λ ----------------------------------------
def _expert_data() -> TrainingData:
    positives = [(f"synthetic {i}", TEXTS[f"d{i}"]) for i in range(12)] * 5  # 60 other examples
    expert = [
        ExpertPair("expert a", TEXTS["d20"], 2),
        ExpertPair("expert a", TEXTS["d21"], 0),
        ExpertPair("expert b", TEXTS["d22"], 1),
        ExpertPair("expert b", TEXTS["d23"], 0),
    ]
    return TrainingData(positives, expert=expert)


@pytest.mark.parametrize("lam", [0.1, 0.5])
def test_lambda_sets_how_often_the_embedder_sees_expert_pairs_and_grade_0_is_their_negative(lam):
    from rag.training.embedder import expert_triplets

    data, config = _expert_data(), EmbedderTrainingConfig(expert_weight=lam)
    known = {"expert a": {TEXTS["d20"]}, "expert b": {TEXTS["d22"]}}
    rejected = [(e.query, e.passage) for e in data.expert if e.grade == 0]
    triplets, weighed = expert_triplets(data, config, 60, {}, rejected, known)
    assert abs(len(triplets) - lam / (1 - lam) * 60) < 1  # λ of the examples, in whole copies
    assert weighed["expert_share"] == pytest.approx(lam, abs=0.01) and weighed["expert_weight"] == lam
    by_query = {q: [t for t in triplets if t[0] == q] for q in ("expert a", "expert b")}
    assert len(by_query["expert a"]) == pytest.approx(2 * len(by_query["expert b"]), abs=2)  # grade 1: half as often
    assert {n for _, _, n in by_query["expert a"]} == {TEXTS["d21"]} and {n for _, _, n in by_query["expert b"]} == {
        TEXTS["d23"]
    }
    assert expert_triplets(data, config.model_copy(update={"expert_weight": 0.0}), 60, {}, rejected, known) == ([], {})
    no_partial = config.model_copy(update={"expert_partial_weight": 0.0})
    assert {q for q, _, _ in expert_triplets(data, no_partial, 60, {}, rejected, known)[0]} == {"expert a"}


def test_the_cross_encoder_gets_graded_targets_at_lambda():
    from rag.training.reranker import expert_examples, expert_lists

    data, config = _expert_data(), RerankerTrainingConfig(kind="cross-encoder", expert_weight=0.5)
    lists = expert_lists(data, config, {("expert a", TEXTS["d20"]): ["a mined negative"]})
    targets = {q: t for q, t, _ in lists}
    assert targets == {
        "expert a": {TEXTS["d20"]: 1.0, TEXTS["d21"]: 0.0, "a mined negative": 0.0},
        "expert b": {TEXTS["d22"]: 0.5, TEXTS["d23"]: 0.0},
    }
    rows, weighed = expert_examples(lists, 50, config, rows=True)
    assert len(rows) == 50 and weighed["expert_share"] == 0.5 and {r[2] for r in rows} == {1.0, 0.5, 0.0}
    ranked, _ = expert_examples(lists, 30, config, rows=False)
    assert len(ranked) == 30 and {tuple(r[2]) for r in ranked} == {(1.0, 0.0, 0.0), (0.5, 0.0)}
    # Mined for the expert positives too: their negatives stay in the expert lists, out of the other groups.
    from rag.training.reranker import _grouped

    groups = _grouped(
        [("synthetic 0", "p0")],
        {("synthetic 0", "p0"): ["n0"], ("expert a", TEXTS["d20"]): ["n1"]},
        [("expert a", TEXTS["d21"])],
    )
    assert groups == {"synthetic 0": ({"p0"}, ["n0"])}


# --- LambdaRank: graded labels, group weights, and training that follows the experts as λ grows --------------
def test_lambdarank_group_weights_make_the_experts_lambda_of_the_total():
    from rag.rerank.features import text_key
    from rag.training.ltr import group_weights, training_grades

    weights, weighed = group_weights([None] * 8 + [1.0, 1.0], 0.2)
    assert weights[:8].tolist() == [1.0] * 8 and weights[8:].sum() / weights.sum() == pytest.approx(0.2)
    assert weighed == {"expert_examples": 2, "expert_share": 0.2, "expert_weight": 0.2, "expert_example_weight": 1.0}
    assert group_weights([None, None], 0.2)[1] == {}  # no expert group: unweighted
    grades, experts = training_grades(
        [("q", "text a")],
        [ExpertPair("q", "text b", 1), ExpertPair("r", "text a", 0)],
        {text_key("text a"): ["a"], text_key("text b"): ["b"]},
    )
    assert grades == {"q": {"a": 2, "b": 1}, "r": {"a": 0}} and experts == {"q": 1.0, "r": 1.0}


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3))


def _two_passages_per_question(rng: random.Random, n: int = 60) -> tuple[dict[str, str], list[str]]:
    """`n` questions, each with a prose passage a<i> and a keyword list x<i> of the same two words: which one is the
    answer is for the labels to say (synthetic pairs name a<i>, experts may name x<i>)."""
    texts, questions = {}, []
    for i in range(n):
        w1, w2 = _word(rng), _word(rng)
        texts[f"a{i}"] = f"Field notes say the {w1} {w2} was seen near the river and recorded over several seasons."
        texts[f"x{i}"] = f"{w1} {w1} tags, {w2} {w2} tags: {w1} lists, {w2} lists."
        questions.append(f"what about the {w1} {w2}?")
    return texts, questions


def test_expert_labels_that_contradict_the_synthetic_ones_win_as_lambda_grows(tmp_path, monkeypatch):
    """Synthetic questions say the chunk holding the question's phrase answers it; experts (other questions of
    the same kind) say the chunk repeating its words does (and grade the phrase chunk 0). Untrained on experts, the
    ranker follows the synthetic labels on held-out questions; the larger λ, the more it follows the experts."""
    import lightgbm as lgb

    from rag.embedding import load_embedder
    from rag.rerank import load_reranker, rerank
    from rag.training.ltr import train_learned_ranker
    from rag.training.pipeline import hybrid_candidates

    texts, questions = _two_passages_per_question(random.Random(3))
    chunks, embedder = _chunks(texts), load_embedder("wordllama")
    positives = [(questions[i], texts[f"a{i}"]) for i in range(20)]
    expert = [
        e
        for i in range(20, 40)
        for e in (
            ExpertPair(questions[i], texts[f"x{i}"], 2 if i % 2 else 1),
            ExpertPair(questions[i], texts[f"a{i}"], 0),
        )
    ]
    held = IRSet({f"h{i}": questions[i] for i in range(40, 60)}, texts, {f"h{i}": {f"x{i}": 1} for i in range(40, 60)})
    first = hybrid_candidates(chunks, held, embedder, 10)

    seen = []
    fit = lgb.LGBMRanker.fit
    monkeypatch.setattr(lgb.LGBMRanker, "fit", lambda self, X, y, **kw: seen.append((y, kw)) or fit(self, X, y, **kw))
    followed = {}
    for lam in (0.0, 0.5, 0.9):
        config = RerankerTrainingConfig(trees=40, min_child_samples=5, rerank_depth=10, expert_weight=lam)
        run = train_learned_ranker(
            TrainingData(positives, expert=expert),
            config,
            tmp_path / str(lam),
            chunks=chunks,
            embedder=embedder,
            log=lambda _: None,
        )
        reranker = load_reranker(str(tmp_path / str(lam)))
        order = {
            q: [h.chunk["chunk_id"] for h in rerank(reranker, held.queries[q], hits, k=10)] for q, hits in first.items()
        }
        followed[lam] = sum(
            ids.index(f"x{q[1:]}") < ids.index(f"a{q[1:]}")
            for q, ids in order.items()
            if f"x{q[1:]}" in ids and f"a{q[1:]}" in ids
        )
        labels, kw = seen[-1]
        if lam == 0.0:
            assert kw["sample_weight"] is None and set(labels) == {0.0, 2.0} and run.expert == {}
        else:  # graded labels reach LambdaRank, and the expert groups weigh λ of the total
            group_weight = np.asarray(kw["sample_weight"])[np.cumsum([0, *kw["group"][:-1]])]  # constant per group
            experts, weight = run.expert["expert_examples"], run.expert["expert_example_weight"]
            assert set(labels) == {0.0, 1.0, 2.0} and 10 <= experts <= 20
            assert set(group_weight.round(4)) == {1.0, weight} and np.isclose(group_weight, weight).sum() >= experts
            assert experts * weight / group_weight.sum() == pytest.approx(lam, abs=1e-3)
            assert run.expert["expert_share"] == pytest.approx(lam) and run.expert["expert_weight"] == lam
    assert followed[0.0] <= 2 < followed[0.5] < followed[0.9] and followed[0.9] >= 15, followed


def test_training_config_describes_lambda():
    field = TrainingConfig.model_fields["expert_weight"]
    assert "share" in field.description and TrainingConfig().expert_weight == 0.2
    with pytest.raises(ValueError):
        TrainingConfig(expert_weight=1.0)  # all the weight on experts would drop every other pair: use < 1


def ltr_pipeline_inputs(tmp_path, texts: dict[str, str], questions: list[str], prefix: str):
    """A chunk set "ltr" of `texts`, a QA set of the first 30 questions naming a<i> (20 train, 10 dev), and a feedback
    dataset folder asking the others as <prefix><i>, with the corpus and an empty qrels folder for the caller's
    labels: (the table store, the dataset folder)."""
    from rag.evaluation.qaset import to_frame
    from rag.store import CHUNKS_TABLE, TableStore

    chunks = _chunks(texts).assign(
        strategy="ltr",
        section_path=[[]] * len(texts),
        prev_chunk_id=None,
        next_chunk_id=None,
        n_tokens=10,
        table_html=None,
    )
    items = [
        QAItem(
            qid=f"q{i}",
            question=questions[i],
            qtype="dataset",
            doc_id=f"a{i}",
            split="train" if i < 20 else "dev",
            evidence=[Evidence(doc_id=f"a{i}", start=0, end=len(texts[f"a{i}"]))],
        )
        for i in range(30)
    ]
    tables = TableStore(tmp_path / "tables")
    tables.write(chunks, CHUNKS_TABLE, "ltr")
    tables.write(to_frame(items), "synthetic_qa")
    dataset = tmp_path / "feedback"
    (dataset / "qrels").mkdir(parents=True)
    (dataset / "queries.jsonl").write_text(
        "".join(
            json.dumps({"_id": f"{prefix}{i}", "text": questions[i], "metadata": {}}) + "\n"
            for i in range(30, len(questions))
        )
    )
    (dataset / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": c, "title": c, "text": t}) + "\n" for c, t in texts.items())
    )
    return tables, dataset


@pytest.mark.slow  # two first stages over minilm through the registry: about a minute on 2 busy cores
def test_retrain_logs_lambda_and_the_gate_verdict_says_experts_decided(tmp_path, monkeypatch):
    """Through the pipeline: a feedback dataset folder with expert labels reaches the learned ranker, λ and the
    expert counts are the run's parameters, and the gate (enough held-out expert questions) records that they
    decided."""
    from rag.registry import ModelRegistry
    from rag.training import GateSettings
    from rag.training.pipeline import gate_candidate, train_candidate

    texts, questions = _two_passages_per_question(random.Random(5))
    tables, dataset = ltr_pipeline_inputs(tmp_path, texts, questions, "e")
    (dataset / "qrels" / "chunk_qrels.tsv").write_text("query-id\tcorpus-id\tscore\n")
    (dataset / "qrels" / "expert_qrels.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"e{i}\tx{i}\t2\ne{i}\ta{i}\t0\n" for i in range(30, 60))
    )
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    registry = ModelRegistry(tmp_path / "models")
    config = RerankerTrainingConfig(
        trees=40,
        min_child_samples=5,
        rerank_depth=10,
        early_stopping_rounds=20,
        feedback_dataset=str(dataset),
        feedback_dev_fraction=0.5,
        min_expert_gate_questions=5,
        expert_weight=0.5,
    )
    mv, run, inputs = train_candidate("reranker", tables, registry, config, log=lambda _: None)
    assert inputs.data.expert and inputs.data.gate_set.startswith("expert: ")
    hyper = mv.hyperparameters
    assert (
        hyper["expert_weight"] == 0.5
        and hyper["expert_pairs"] == len(inputs.data.expert)
        and hyper["expert_questions"] > 0
    )
    params = registry.mlflow_client().get_run(registry.resolve("reranker", mv.version).run_id).data.params
    assert params["expert_weight"] == "0.5" and params["expert_pairs"] == str(len(inputs.data.expert))
    assert run.expert["expert_share"] == pytest.approx(0.5)

    gate_candidate("reranker", tables, registry, mv, GateSettings(resamples=1000))
    verdict = registry.resolve("reranker", mv.version).metrics["gate"]
    assert verdict["gate_set"].startswith("expert: ") and verdict["type_expert_questions"] == verdict["questions"] >= 5
