"""Generation metrics on hand-computed cases."""

import numpy as np
import pytest

from rag.evaluation.generation import (
    answer_accuracy,
    answer_relevancy,
    exact_match,
    faithfulness,
    lcs_length,
    normalize_answer,
    rouge_l,
    score_answers,
    semantic_similarity,
    source_hit,
    summarize_answers,
    token_f1,
)
from rag.evaluation.qaset import Evidence, QAItem
from rag.llm.testing import FakeLLM
from rag.qa import NOT_IN_CONTEXT, AnswerResult


def test_squad_normalisation_and_exact_match():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert exact_match("the Denver Broncos.", ["Denver Broncos", "Broncos"]) == 1.0
    assert exact_match("Denver", ["Denver Broncos"]) == 0.0


def test_token_f1_by_hand():
    # pred "denver broncos win" (3 tokens) vs ref "denver broncos" (2): overlap 2 → P 2/3, R 1 → F1 0.8
    assert token_f1("the Denver Broncos win", ["Denver Broncos"]) == pytest.approx(0.8)
    # best reference counts: "broncos" → P 1/3, R 1 → 0.5; "carolina panthers" → 0
    assert token_f1("denver broncos win", ["Carolina Panthers", "Broncos"]) == pytest.approx(0.5)
    assert token_f1("x y", ["a b"]) == 0.0


def test_rouge_l_by_hand():
    assert lcs_length("a b c d e".split(), "a c e f".split()) == 3
    # "the cat sat on the mat" vs "the cat is on the mat": LCS the-cat-on-the-mat = 5 of 6 each → F = 5/6
    assert rouge_l("the cat sat on the mat", ["the cat is on the mat"]) == pytest.approx(5 / 6)
    # P = 2/2, R = 2/4 → F = 2·1·0.5/1.5 = 2/3
    assert rouge_l("police killed", ["police killed the gunman"]) == pytest.approx(2 / 3)
    assert rouge_l("nothing shared", ["other words"]) == 0.0


def test_answer_accuracy_is_a_whole_word_normalised_match():
    assert answer_accuracy("It was founded in 1990 by the city.", ["1990"]) == 1.0
    assert answer_accuracy("In the 1990s.", ["1990"]) == 0.0
    assert answer_accuracy("The total is $10,505 per product", ["$10,505"]) == 1.0


def test_semantic_similarity_is_the_cosine_of_normalised_rows():
    class Unit:
        def encode_passages(self, texts):
            table = {"a": [1.0, 0.0], "b": [0.6, 0.8], "c": [0.0, 1.0]}
            return np.array([table[t] for t in texts])

    assert semantic_similarity(Unit(), ["a", "a"], ["b", "c"]).tolist() == pytest.approx([0.6, 0.0])


CHUNKS = [
    {"chunk_id": "c1", "doc_id": "d", "char_start": 0, "char_end": 100, "text": "first"},
    {"chunk_id": "c2", "doc_id": "d", "char_start": 100, "char_end": 200, "text": "second"},
]


def test_source_hit_needs_a_cited_chunk_overlapping_the_evidence():
    evidence = [Evidence(doc_id="d", start=150, end=160)]
    assert source_hit(CHUNKS, ["c2"], evidence) == 1.0
    assert source_hit(CHUNKS, ["c1"], evidence) == 0.0
    assert source_hit(CHUNKS, [], evidence) == 0.0
    assert source_hit(CHUNKS, ["c2"], [Evidence(doc_id="other", start=150, end=160)]) == 0.0
    assert source_hit(CHUNKS, ["c1"], [Evidence(doc_id="d", start=99, end=101)]) == 1.0  # touches one char


def test_judge_metrics_follow_deepeval_verdicts():
    # two statements; the judge says yes then no → faithfulness 1/2; "idk" counts as faithful / relevant
    judge = FakeLLM(["yes", "No, it contradicts."])
    assert (
        faithfulness(judge, "Paris is in France. Paris has 90 million people.", ["Paris is the capital of France."])
        == 0.5
    )
    assert answer_relevancy(FakeLLM(["yes", "idk"]), "Where is Paris?", "Paris is in France. It is nice.") == 1.0
    assert faithfulness(FakeLLM([]), "", ["ctx"]) is None


def _result(answer, cited, nic=False, latency=10.0):
    return AnswerResult(
        question="q",
        answer=answer,
        cited_chunk_ids=cited,
        attributed_chunk_ids=cited,
        not_in_context=nic,
        latency_ms=latency,
        chunks=CHUNKS,
        generator="t",
        settings={},
    )


def test_summary_counts_coverage_and_leaves_judge_metrics_absent():
    items = [
        QAItem(
            qid=f"q{i}",
            question="q",
            qtype="dataset",
            doc_id="d",
            evidence=[Evidence(doc_id="d", start=150, end=160)],
            answer="Denver Broncos",
        )
        for i in range(4)
    ]
    results = [
        _result("Denver Broncos", ["c2"], latency=10),
        _result("the Broncos", ["c1"], latency=20),
        _result(NOT_IN_CONTEXT, [], nic=True, latency=30),
        _result("Carolina", ["c2"], latency=40),
    ]
    per_q = score_answers(items, results)
    summary = summarize_answers(per_q)
    assert per_q["exact_match"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert summary["exact_match"] == 0.25
    assert summary["f1"] == pytest.approx(round((1 + 2 / 3) / 4, 4))  # "broncos" vs "denver broncos": P 1, R 1/2
    assert summary["source_accuracy"] == 0.5
    assert summary["coverage"] == 0.75
    assert summary["latency_p50_ms"] == 25.0
    assert summary["faithfulness"] is None and summary["answer_relevancy"] is None
    assert summary["semantic_similarity"] is None  # no embedder given: absent, not zero
