"""Training: data, paired tests, the promotion gate (deliberately worse and better models), a tiny end-to-end
fine-tune, promotion swapping the serving alias, and the retrain job in Dagster (slow)."""

import numpy as np
import pandas as pd
import pytest

from rag.evaluation.qaset import Evidence, QAItem, to_frame
from rag.registry import ModelRegistry
from rag.rollout.drill import noisy_copy
from rag.store import CHUNKS_TABLE, TableStore
from rag.training import GateSettings, gate_decision, paired_p_value, training_data
from rag.training.data import IRSet, with_negatives
from rag.training.gate import reranker_gate
from rag.training.pseudo import inverse_cloze
from tests.conftest import SHARED
from tests.verdicts import sound

STRATEGY = "beir"


# --- paired tests and the gate decision, by hand -----------------------------------------------------------
def test_paired_p_values_match_hand_computed_cases():
    better = np.ones(8)
    # Sign-flip test, every difference +1: only the all-plus flip (1 in 2^8) is as extreme -> p = 1/256.
    p = paired_p_value(better, np.zeros(8), test="permutation", resamples=40_000, seed=1)
    assert abs(p - 1 / 256) < 0.002
    # Bootstrap of identical positive differences never resamples a mean <= 0: p = 1 / (resamples + 1).
    assert paired_p_value(better, np.zeros(8), test="bootstrap", resamples=999) == pytest.approx(1 / 1000)
    assert paired_p_value(np.full(5, 0.3), np.full(5, 0.3)) == 1.0  # identical models: no evidence at all
    # Half better, half worse by the same amount: the observed mean 0 is the median of the null.
    assert paired_p_value(np.array([1, 0] * 6, float), np.array([0, 1] * 6, float), seed=3) > 0.5
    with pytest.raises(ValueError, match="permutation or bootstrap"):
        paired_p_value(better, np.zeros(8), test="t-test")


def _table(ndcg, mrr, recall):
    return pd.DataFrame(
        {"qid": [f"q{i}" for i in range(len(ndcg))], "ndcg@10": ndcg, "mrr@10": mrr, "recall@20": recall}
    )


def test_gate_decision_needs_significant_gains_and_no_recall_loss():
    n = 12
    production = _table([0.5] * n, [0.5] * n, [0.8] * n)
    better = _table([0.7] * n, [0.6] * n, [0.8] * n)
    result = gate_decision(production, better, GateSettings(resamples=2000))
    assert result.passed and result.questions == n and result.reasons == []
    assert result.metadata["delta_ndcg@10"] == pytest.approx(0.2) and result.metadata["p_value_mrr@10"] < 0.01

    one_lucky_question = _table([0.5] * (n - 1) + [1.0], [0.5] * (n - 1) + [1.0], [0.8] * n)
    result = gate_decision(production, one_lucky_question, GateSettings(resamples=2000))
    assert not result.passed and "not a significant improvement" in result.reasons[0]  # p = 1/2 for one flip

    loses_recall = _table([0.7] * n, [0.6] * n, [0.7] * n)
    result = gate_decision(production, loses_recall, GateSettings(resamples=2000, recall_tolerance=0.05))
    assert not result.passed and result.reasons == ["recall@20 dropped by 0.1000 (tolerance 0.05)"]
    assert gate_decision(production, loses_recall, GateSettings(resamples=2000, recall_tolerance=0.15)).passed
    with pytest.raises(ValueError, match="same questions"):
        gate_decision(production, better.iloc[:5], GateSettings(resamples=2000))


def test_a_verdict_reports_its_interval_power_and_types_and_rag_retrain_prints_them(tmp_path):
    """The interval must hold the observed gain and shrink with more questions; an unproven candidate is
    'inconclusive' (a canary could decide), and `rag retrain`'s report shows before/after, interval, types and why."""
    from rag.registry.cli import gate_report
    from rag.training.gate import paired_interval, type_breakdown

    rng = np.random.default_rng(0)
    diff = rng.normal(0.03, 0.2, 400)
    low, high = paired_interval(diff, resamples=2000)
    assert low < diff.mean() < high and 0 < high - low < 0.06
    narrow = paired_interval(np.tile(diff, 4), resamples=2000)
    assert narrow[1] - narrow[0] < (high - low) * 0.7  # 4x the questions: about half the width

    n = 40
    production = _table([0.5] * n, [0.5] * n, [0.8] * n)
    noisy = _table([0.5 + (0.2 if i % 2 else -0.18) for i in range(n)], [0.5] * n, [0.8] * n)
    result = gate_decision(production, noisy, GateSettings(resamples=2000))
    result.by_type = type_breakdown(
        {q: ("keyword" if int(q[1:]) % 2 else "answer-aware") for q in production["qid"]}, production, noisy, "ndcg@10"
    )
    assert result.outcome == "inconclusive" and not result.passed
    assert result.by_type["keyword"]["delta"] == pytest.approx(0.2) and result.by_type["answer-aware"][
        "delta"
    ] == pytest.approx(-0.18)
    assert result.power["min_detectable_effect"] > abs(result.metadata["delta_ndcg@10"])  # too few questions to see it
    assert result.power["questions_needed"] > n

    registry = ModelRegistry(tmp_path / "models")
    mv = registry.register("embedder", _fake_model(tmp_path / "m"), {"base_model": "minilm"})
    registry.update_metrics(
        "embedder",
        mv.version,
        {
            "gate": {
                **sound(registry, "embedder"),
                **result.metadata,
                "against": "minilm (base, implicit v0)",
                "settings": GateSettings().model_dump(),
                "gate_set": "feedback: 40 users' questions",
            }
        },
    )
    report = "\n".join(gate_report(registry, registry.resolve("embedder", mv.version)))
    assert "  gate set (before copies are set aside): feedback: 40 users' questions" in report
    assert "ndcg@10    0.5000 -> 0.5100 (+0.0100, 95% CI" in report, report
    assert "answer-aware 20 questions -0.1800; keyword 20 questions +0.2000" in report
    assert (
        "kept production (inconclusive)" in report
        and "rag models rollout start --kind embedder --candidate v1" in report
    )


def test_the_not_worse_gate_admits_an_unproven_candidate_and_refuses_a_worse_one():
    """Promotion policy 'canary': the gate only asks "no worse"; the two verdicts come from the same scores."""
    n = 12
    production = _table([0.5] * n, [0.5] * n, [0.8] * n)
    settings = GateSettings(resamples=2000, criterion="not_worse", max_drop=0.02)
    one_lucky_question = _table([0.5] * (n - 1) + [1.0], [0.5] * (n - 1) + [1.0], [0.8] * n)
    result = gate_decision(production, one_lucky_question, settings)
    assert result.passed and result.not_worse and not result.better and result.criterion == "not_worse"
    assert (
        result.metadata["better_reasons"].startswith("ndcg@10: +0.0417 (p=")
        and result.metadata["not_worse_reasons"] == "all criteria met"
    )
    assert not gate_decision(production, one_lucky_question, GateSettings(resamples=2000)).passed  # "better" refuses it

    worse = _table([0.4] * n, [0.4] * n, [0.8] * n)  # significantly worse on every question
    result = gate_decision(production, worse, settings)
    assert not result.passed and not result.not_worse and len(result.reasons) == 2
    assert (
        result.reasons[0].startswith("ndcg@10: -0.1000 is worse (p=")
        and result.metadata["p_value_worse_ndcg@10"] < 0.01
    )
    slightly_lower = _table(
        [0.5] * (n - 1) + [0.2], [0.5] * n, [0.8] * n
    )  # -0.025: not significant, but beyond max_drop
    assert not gate_decision(production, slightly_lower, settings).passed
    assert gate_decision(production, slightly_lower, settings.model_copy(update={"max_drop": 0.03})).passed
    loses_recall = _table([0.5] * n, [0.5] * n, [0.7] * n)
    result = gate_decision(production, loses_recall, settings)
    assert not result.passed and result.reasons == ["recall@20 dropped by 0.1000 (tolerance 0.01)"]


def test_on_labels_from_productions_own_lists_only_a_significant_drop_is_worse():
    """People could rate only what production showed, so its ranks of their passages are high by how the labels
    arose: a candidate lower by more than max_drop but not significantly is left to the canary, a significant drop is
    still worse."""
    n = 12
    production = _table([0.5] * n, [0.5] * n, [0.8] * n)
    settings = GateSettings(resamples=2000, criterion="not_worse", max_drop=0.02)
    lower_by_chance = _table([0.5] * (n - 2) + [0.2, 0.2], [0.5] * (n - 2) + [0.3, 0.3], [0.8] * n)  # -0.05, -0.033
    assert not gate_decision(production, lower_by_chance, settings).passed
    result = gate_decision(production, lower_by_chance, settings, labels_from_production=True)
    assert result.passed and result.not_worse and not result.better
    worse = _table([0.4] * n, [0.4] * n, [0.8] * n)
    result = gate_decision(production, worse, settings, labels_from_production=True)
    assert not result.passed and result.reasons[0].startswith("ndcg@10: -0.1000 is worse (p=")
    assert "at most" not in result.reasons[0]
    loses_recall = _table([0.5] * n, [0.5] * n, [0.7] * n)  # the recall guard stands
    assert not gate_decision(production, loses_recall, settings, labels_from_production=True).passed


def test_a_candidate_that_scores_every_question_as_production_gets_no_canary():
    """Training that kept its starting point registers the same model again: no worse, but a canary of it could only
    tie and would hold later retrains back, so the gate calls it unchanged and no policy releases it."""
    n = 12
    production = _table([0.5, 0.7] * (n // 2), [0.5] * n, [0.8] * n)
    for criterion in ("not_worse", "better"):
        result = gate_decision(production, production.copy(), GateSettings(resamples=2000, criterion=criterion))
        assert result.outcome == "unchanged" and not result.passed and not result.not_worse and not result.better
        assert result.metadata["changed_questions"] == 0
        assert "changes nothing a canary could test" in result.metadata["not_worse_reasons"]
    one_changed = _table([0.5, 0.7] * (n // 2 - 1) + [0.5, 0.6], [0.5] * n, [0.8] * n)
    result = gate_decision(production, one_changed, GateSettings(resamples=2000, criterion="not_worse"))
    assert result.outcome == "inconclusive" and result.passed and result.metadata["changed_questions"] == 1


class OracleReranker:
    """Scores the relevant passages high (or, reversed, low): a deliberately perfect / worst reranker."""

    def __init__(self, ir: IRSet, reverse: bool = False):
        self.name, self.sign = "oracle", -1.0 if reverse else 1.0
        self.scale = "logit"  # -1 / 0 / +1 are scores, not probabilities
        self.relevant = {(ir.queries[q], ir.corpus[c]) for q, rel in ir.qrels.items() for c in rel}

    def score(self, query, passages):
        return np.array([self.sign * float((query, p) in self.relevant) for p in passages])


def test_reranker_gate_promotes_a_better_and_rejects_a_worse_reranker():
    corpus = {f"d{i}": f"passage {i}" for i in range(30)}
    ir = IRSet({f"q{i}": f"question {i}" for i in range(15)}, corpus, {f"q{i}": {f"d{2 * i}": 1} for i in range(15)})
    # First stage: the relevant passage always at rank 5 of 20 candidates.
    first = {
        f"q{i}": [f"d{j}" for j in range(30) if j != 2 * i][:4]
        + [f"d{2 * i}"]
        + [f"d{j}" for j in range(30) if j != 2 * i][4:19]
        for i in range(15)
    }
    settings = GateSettings(resamples=2000)
    assert reranker_gate(first, None, OracleReranker(ir), ir, settings).passed  # vs no reranker (implicit v0)
    worse = reranker_gate(first, None, OracleReranker(ir, reverse=True), ir, settings)
    assert not worse.passed and worse.metadata["delta_mrr@10"] < 0 and worse.metadata["candidate_recall@20"] == 1.0
    # Generated questions alone: the gain of a reranker trained on such questions is recorded, not promoted (only a
    # canary can); with people's questions among those that decide, it promotes.
    ir.types = dict.fromkeys(ir.queries, "keyword")
    held = reranker_gate(first, None, OracleReranker(ir), ir, settings)
    assert held.better_on_generated and not held.passed and held.not_worse and held.outcome == "inconclusive"
    # A reranker that never trained on generated questions is not flattered by them: its gain there stands.
    assert reranker_gate(first, None, OracleReranker(ir), ir, settings, trained_on_generated=False).passed
    # One people's question among many generated ones does not let them vouch: the gain must hold on people's alone.
    ir.types["q0"] = "feedback"
    held = reranker_gate(first, None, OracleReranker(ir), ir, settings)
    assert held.better_on_generated and not held.passed and "people's questions alone" in held.why_not["better"][-1]
    ir.types.update(dict.fromkeys([f"q{i}" for i in range(10)], "feedback"))
    assert reranker_gate(first, None, OracleReranker(ir), ir, settings).passed


# --- training data -------------------------------------------------------------------------------------------
def _chunks(texts: dict[str, str]) -> pd.DataFrame:
    import hashlib

    rows = [
        {
            "chunk_id": cid,
            "doc_id": cid,
            "strategy": STRATEGY,
            "text": t,
            "char_start": 0,
            "char_end": len(t),
            "page_start": 1,
            "page_end": 1,
            "section_path": [],
            "prev_chunk_id": None,
            "next_chunk_id": None,
            "n_tokens": len(t.split()),
            "content_hash": hashlib.sha256(t.encode()).hexdigest(),
            "table_html": None,
        }
        for cid, t in texts.items()
    ]
    return pd.DataFrame(rows)


def _item(qid, question, doc, length, split):
    return QAItem(
        qid=qid,
        question=question,
        qtype="dataset",
        doc_id=doc,
        evidence=[Evidence(doc_id=doc, start=0, end=length)],
        split=split,
    )


def test_training_data_pairs_dev_split_and_negatives():
    texts = {f"d{i}": f"document number {i} talks about topic {i}." for i in range(24)}
    items = [_item(f"q{i}", f"what about topic {i}?", f"d{i}", 10, "train" if i < 12 else "dev") for i in range(24)]
    data = training_data(
        items,
        _chunks(texts),
        extra_positives=[("feedback question", "a liked passage")],
        extra_negatives=[("what about topic 0?", "a rejected passage")],
        selection_fraction=0.5,
    )
    assert len(data.positives) == 13 and ("what about topic 3?", texts["d3"]) in data.positives
    assert ("feedback question", "a liked passage") in data.positives
    assert len(data.selection) == 6 and len(data.gate) == 6 and not set(data.selection.queries) & set(data.gate.queries)
    assert data.gate.qrels[next(iter(data.gate.queries))] and len(data.gate.corpus) == 24
    assert (
        data.data_hash != training_data(items, _chunks(texts)).data_hash
    )  # feedback changes the training set's identity

    triplets = with_negatives(
        data.positives[:12], mined={("what about topic 1?", texts["d1"]): "mined one"}, feedback=data.negatives, seed=0
    )
    by_query = {q: n for q, _, n in triplets}
    assert by_query["what about topic 0?"] == "a rejected passage" and by_query["what about topic 1?"] == "mined one"
    assert all(n != p for _, p, n in triplets) and len(triplets) == 12
    with pytest.raises(ValueError, match="no training pairs"):
        training_data([i for i in items if i.split == "dev"], _chunks(texts))


def test_selection_and_gate_questions_are_disjoint_and_never_training_questions():
    from rag.training.data import split_dev
    from rag.training.gate import embedder_gate

    # Eight questions, each under two ids (the second differs in case and spacing only): a text stays on one side.
    queries = {f"a{i}": f"question {i}" for i in range(8)} | {f"b{i}": f"  Question  {i} " for i in range(8)}
    selection, gate = split_dev(queries, 0.5)
    assert sorted(selection + gate) == sorted(queries) and len(selection) == len(gate) == 8
    assert not {queries[q].lower().split()[1] for q in selection} & {queries[q].lower().split()[1] for q in gate}
    assert split_dev(queries, 0.5) == (selection, gate)  # deterministic

    texts = {f"d{i}": f"document number {i} talks about topic {i}." for i in range(24)}
    items = [_item(f"q{i}", f"what about topic {i}?", f"d{i}", 10, "train" if i < 12 else "dev") for i in range(24)]
    items += [
        _item("dup-train", "  What about TOPIC 3? ", "d3", 10, "dev"),  # a training question under another id
        _item("dup-feedback", "a question users rated", "d4", 10, "dev"),
    ]  # ...and a feedback training question
    data = training_data(items, _chunks(texts), extra_positives=[("A question users rated", "a liked passage")])
    dev = set(data.selection.queries) | set(data.gate.queries)
    assert dev == {f"q{i}" for i in range(12, 24)} and not set(data.selection.queries) & set(data.gate.queries)

    # Too few dev questions: no selection below 2 (training keeps its last step), and the gate refuses to decide.
    few = training_data(items[:12] + items[12:14], _chunks(texts))
    assert len(few.selection) == 0 and len(few.gate) == 1
    with pytest.raises(ValueError, match="only 1 held-out gate question.*generate a larger QA set"):
        embedder_gate(None, None, few.gate, GateSettings())
    three = training_data(items[:12] + items[12:15], _chunks(texts))
    assert len(three.selection) == 2 and len(three.gate) == 1  # still disjoint, however small


def test_feedback_questions_are_held_out_by_text_and_decide_the_gate_once_there_are_enough():
    from types import SimpleNamespace

    from rag.training import split_feedback

    texts = {f"d{i}": f"document number {i} talks about topic {i}." for i in range(24)}
    items = [_item(f"q{i}", f"what about topic {i}?", f"d{i}", 10, "train" if i < 12 else "dev") for i in range(24)]
    queries = {f"f{i}": f"user question {i % 100}" for i in range(300)}  # 100 texts, each asked three times
    qrels = [(q, f"d{i % 24}", 1) for i, q in enumerate(queries)] + [
        (q, f"d{(i + 1) % 24}", -1) for i, q in enumerate(queries)
    ]
    qrels += [("f-neg", "d0", -1)]  # a question with only a rejected passage has no answer key: training only
    judged = SimpleNamespace(queries={**queries, "f-neg": "nothing liked"}, corpus=texts, chunk_qrels=qrels)

    split = split_feedback(judged, 0.3)
    held = set(split.dev_queries.values())
    assert 10 <= len(held) <= 50 and not held & {
        q for q, _ in split.positives + split.negatives
    }  # a text is on one side only
    assert ("nothing liked", texts["d0"]) in split.negatives
    assert len(split.dev_queries) == len(held)  # a question asked three times is one dev question...
    assert all(len(rel) == 3 and set(rel.values()) == {1} for rel in split.dev_qrels.values())  # ...with all it liked

    data = training_data(items, _chunks(texts), feedback=split, min_feedback_gate=5)
    assert data.gate and all(q.startswith("feedback:") for q in data.gate.queries)  # users' questions decide
    assert any(q.startswith("feedback:") for q in data.selection.queries) and any(
        not q.startswith("feedback:") for q in data.selection.queries
    )
    assert not set(data.selection.queries) & set(data.gate.queries)
    assert data.summary["gate_questions_from_feedback"] == len(data.gate)
    mixed = training_data(items, _chunks(texts), feedback=split, min_feedback_gate=10_000)
    assert 0 < mixed.summary["gate_questions_from_feedback"] < len(mixed.gate)  # too few: synthetic questions join
    assert len(data.positives) == 12 + len(split.positives)


def test_user_judged_gate_questions_are_decided_on_condensed_lists():
    from rag.training.gate import compare_runs

    # Each question: users liked rel, disliked bad, and never saw unseen (production never showed it).
    n = 8
    queries = {f"feedback:{i}": f"question {i}" for i in range(n)}
    corpus = {f"{kind}{i}": f"{kind} passage {i}" for i in range(n) for kind in ("rel", "bad", "unseen", "x")}
    ir = IRSet(
        queries,
        corpus,
        {f"feedback:{i}": {f"rel{i}": 1} for i in range(n)},
        judged={f"feedback:{i}": {f"rel{i}", f"bad{i}"} for i in range(n)},
    )

    def run(order):
        return {f"feedback:{i}": {d.format(i=i): float(10 - r) for r, d in enumerate(order)} for i in range(n)}

    production = run(["bad{i}", "rel{i}", "x{i}"])  # rel at rank 2, both views: nDCG 1/log2(3) = 0.631
    candidate = run(["unseen{i}", "x{i}", "rel{i}", "bad{i}"])  # plain: rel at rank 3 (0.5); condensed: rank 1 (1.0)
    result = compare_runs(ir, production, candidate, GateSettings(resamples=2000))
    assert result.lists == "condensed" and result.passed and result.judged_questions == n
    table = result.table.set_index("metric")
    assert table.loc["ndcg@10", "candidate"] == pytest.approx(1.0)
    assert table.loc["ndcg@10", "production"] == pytest.approx(1 / np.log2(3))
    # The plain view, reported beside it, would have kept the candidate out.
    assert result.other.lists == "plain" and not result.other.passed
    assert (
        result.metadata["plain_candidate_ndcg@10"] == pytest.approx(0.5)
        and result.metadata["plain_would_pass"] is False
    )
    plain = compare_runs(ir, production, candidate, GateSettings(resamples=2000, feedback_lists="plain"))
    assert plain.lists == "plain" and not plain.passed and plain.other.lists == "condensed"


def test_feedback_gate_questions_carry_their_rated_passages_as_judgments():
    from rag.feedback.dataset import Judgments
    from rag.training.data import split_feedback

    judged = Judgments(
        {"q1": "how do cats purr", "q2": "what do cats eat"},
        {"c1": "cats purr with the larynx", "c2": "dogs bark", "c3": "cats eat mice"},
        [("q1", "c1", 1), ("q1", "c2", -1), ("q2", "c3", 1)],
    )
    split = split_feedback(judged, dev_fraction=1.0)
    chunks = pd.DataFrame(
        {
            "chunk_id": ["c1", "c2", "c3", "c4"],
            "doc_id": ["d"] * 4,
            "char_start": [0, 30, 60, 90],
            "char_end": [25, 39, 73, 99],
            "text": ["cats purr with the larynx", "dogs bark", "cats eat mice", "x"],
        }
    )
    data = training_data(
        [], chunks, extra_positives=[("unrelated", "x")], feedback=split, min_feedback_gate=1, selection_fraction=0.0
    )
    by_text = {data.gate.queries[q]: data.gate.judged[q] for q in data.gate.queries}
    assert by_text == {"how do cats purr": {"c1", "c2"}, "what do cats eat": {"c3"}}


def test_inverse_cloze_takes_one_sentence_out_of_its_passage():
    passages = {
        "a": "Cats purr when they are content and calm. They also purr when hurt or stressed badly.",
        "b": "Too short.",
        "c": "Glaciers carve deep valleys over many thousands of years. The ice moves slowly downhill under gravity.",
    }
    triples = inverse_cloze(passages, 5, seed=1, remove_probability=1.0)
    assert {pid for _, _, pid in triples} == {"a", "c"}  # one-sentence passages give no pair
    for query, passage, pid in triples:
        assert query in passages[pid] and query not in passage
        assert " ".join(passages[pid].replace(query, "").split()) == passage


# --- promotion only through the gate -----------------------------------------------------------------------------
def _fake_model(folder):
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"0")
    return folder


def _verdict(registry, kind, mv, *, passed, production, for_version=None):
    """A gate verdict as gate_candidate records it (rag.training.pipeline)."""
    registry.update_metrics(
        kind,
        mv.version,
        {
            "gate": {
                **sound(registry, kind),
                "passed": passed,
                "reasons": "all criteria met"
                if passed
                else "ndcg@10: -0.1000 (p=0.9000) is not a significant improvement",
                "candidate_version": for_version or mv.version,
                "production_version": production,
                "qa_set_version": "0123456789ab",
                "gated_at": "2025-01-01T00:00:00+00:00",
            }
        },
    )


def test_promote_needs_a_passing_gate_verdict_against_the_current_production(tmp_path):
    from rag.lifecycle.verdicts import PromotionRefused
    from rag.lifecycle.promotion import promote

    registry = ModelRegistry(tmp_path / "models")
    v1 = registry.register("reranker", _fake_model(tmp_path / "m1"), {"base_model": "minilm"})
    registry.set_alias("reranker", "candidate", v1.version)
    quiet = lambda _: None  # noqa: E731
    with pytest.raises(PromotionRefused, match="ce-minilm-v1: it has no gate verdict.*run retrain_job"):
        promote("reranker", registry, v1, log=quiet)
    _verdict(registry, "reranker", v1, passed=False, production=None)
    with pytest.raises(PromotionRefused, match="the gate rejected it against no reranker.*ndcg@10: -0.1000"):
        promote("reranker", registry, v1, log=quiet)
    assert registry.aliases()["reranker"] == {"candidate": "v1"}  # a refusal moves nothing

    _verdict(registry, "reranker", v1, passed=True, production=None)
    outcome = promote(
        "reranker", registry, v1, log=quiet
    )  # `v1` was read before the verdict: promote reads the manifest
    assert outcome["promoted"] == "ce-minilm-v1" and registry.aliases()["reranker"] == {"production": "v1"}
    assert registry.resolve("reranker", "v1").metrics["promotion"]["forced"] is False

    # A pass against the implicit v0 says nothing about beating v1, now production; nor does another version's verdict.
    v2 = registry.register("reranker", _fake_model(tmp_path / "m2"), {"base_model": "minilm"})
    _verdict(registry, "reranker", v2, passed=True, production=None)
    with pytest.raises(PromotionRefused, match="gated against the implicit v0 .* production is now ce-minilm-v1"):
        promote("reranker", registry, v2, log=quiet)
    _verdict(registry, "reranker", v2, passed=True, production="v1", for_version="v1")
    with pytest.raises(PromotionRefused, match="its gate verdict is for reranker v1, not v2"):
        promote("reranker", registry, v2, log=quiet)
    assert registry.resolve("reranker", "production").version == "v1"

    # An operator's deliberate bypass is possible, logged and recorded.
    lines = []
    promote("reranker", registry, v2, log=lines.append, force_reason="operator: rollback drill")
    record = registry.resolve("reranker", "v2").metrics["promotion"]
    assert registry.resolve("reranker", "production").version == "v2" and record["forced"] is True
    assert record["force_reason"] == "operator: rollback drill" and record["previous_version"] == "v1"
    assert "verdict is for reranker v1" in record["gate_refusal"] and lines[0].startswith(
        "WARNING: promoting reranker ce-minilm-v2"
    )


def test_materializing_production_embedder_alone_refuses_an_ungated_and_keeps_production_for_a_rejected_candidate(
    tmp_path,
):
    from pathlib import Path

    from dagster import DagsterInstance, materialize

    from assets.training import production_embedder
    from rag.embedding import _minilm_dir
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore
    from tests.test_rollout_release import QUIET_LOGS, failure_message

    root = tmp_path / "data"
    TableStore(root / "tables").write(_chunks({"d0": "a passage about cats."}), CHUNKS_TABLE, STRATEGY)
    registry = ModelRegistry(root / "models")
    candidate = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm", "strategy": STRATEGY})
    registry.set_alias("embedder", "candidate", candidate.version)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", [STRATEGY])
    qdrant = tmp_path / "qdrant"
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "qdrant": QdrantResource(url=None, path=str(qdrant)),
        "rollout": Rollout(promotion="direct"),
    }

    def failure() -> str:
        return failure_message(
            materialize(
                [production_embedder],
                instance=instance,
                resources=resources,
                raise_on_error=False,
                run_config=QUIET_LOGS,
            )
        )

    assert "PromotionRefused: refusing to promote embedder ft-minilm-v1: it has no gate verdict" in failure()
    # A rejection by its own current verdict is a normal end of a retrain: the run succeeds, production stays and
    # the production asset is not materialized.
    _verdict(registry, "embedder", candidate, passed=False, production=None)
    result = materialize(
        [production_embedder], instance=instance, resources=resources, raise_on_error=False, run_config=QUIET_LOGS
    )
    assert result.success and not result.get_asset_materialization_events()
    # Nothing moved, and no collection was built (the Qdrant folder was never opened).
    assert registry.aliases()["embedder"] == {"candidate": "v1"} and not qdrant.exists()


def test_mined_negatives_never_include_a_known_positive_of_the_query():
    from sentence_transformers import SentenceTransformer

    from rag.embedding import _minilm_dir
    from rag.training import EmbedderTrainingConfig
    from rag.training.data import positives_by_query
    from rag.training.embedder import mine_negatives

    query, ice = "How do cats purr?", ("What is a glacier?", "A glacier is a slow river of ice moving downhill.")
    liked = [
        "Cats purr by vibrating the muscles of their larynx.",
        "A purring cat twitches its laryngeal muscles.",
        "Purring in cats comes from the larynx and the diaphragm.",
    ]
    others = [
        "Dogs bark to warn their owners.",
        "Bread rises because yeast makes gas.",
        "The moon orbits the earth.",
        "Rockets burn liquid hydrogen.",
        "Tomatoes are fruit.",
        "Rain falls from clouds.",
    ]
    corpus = liked + others + [ice[1]]
    kept = [(query, liked[0]), ice]  # what max_pairs sampling kept of all positives
    known = positives_by_query([(query, p) for p in liked] + [ice])
    model = SentenceTransformer(_minilm_dir(), device="cpu", local_files_only=True)
    config = EmbedderTrainingConfig(negative_relative_margin=0.0, negative_range_max=10)
    unaware = mine_negatives(model, kept, corpus, config, 2)
    assert set(unaware[(query, liked[0])]) & set(liked[1:])  # the miner alone takes dropped positives for negatives
    mined = mine_negatives(model, kept, corpus, config, 2, known_positives=known)
    assert len(mined[(query, liked[0])]) == 2 and not set(mined[(query, liked[0])]) & set(liked)
    assert all(n not in known[q] for (q, _), negatives in mined.items() for n in negatives)

    # The triplets' fallbacks respect them too: a rejected passage the same question also liked is no negative.
    from rag.training.data import with_negatives

    triplets = with_negatives(kept, {}, [(query, liked[1])], seed=0, known_positives=known)
    assert {q: n for q, _, n in triplets} == {query: ice[1], ice[0]: liked[0]}


def test_default_schedule_selects_the_checkpoint_several_times_per_epoch():
    from rag.training import EmbedderTrainingConfig, RerankerTrainingConfig
    from rag.training.embedder import trainer_schedule

    default = EmbedderTrainingConfig()
    assert default.max_seq_length is None and RerankerTrainingConfig().max_seq_length == 256  # None: the serving length
    schedule = trainer_schedule(default, examples=4000, batch_size=64)  # 63 steps per epoch
    assert schedule["eval_steps"] == schedule["save_steps"] == 15 and 63 // schedule["eval_steps"] >= 4
    assert trainer_schedule(default, examples=100, batch_size=64)["eval_steps"] == 1  # 2 steps: evaluate both
    assert trainer_schedule(EmbedderTrainingConfig(evaluations_per_epoch=1), 4000, 64)["eval_steps"] == 63
    assert trainer_schedule(EmbedderTrainingConfig(eval_steps=7), 4000, 64)["eval_steps"] == 7


# --- real models on a SciFact slice --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scifact_tables(tmp_path_factory):
    """60 SciFact test claims (train/dev by claim) over their ~70 abstracts + 20 distractors, cut to 300 characters."""
    from rag.evaluation.beir import load_beir

    folder = SHARED / "scifact"
    if not (folder / "corpus.jsonl").exists():
        pytest.skip(f"SciFact not available at {folder}")
    ds = load_beir(folder, "test")
    qids = sorted(ds.qrels)[:60]
    docs = sorted({d for q in qids for d in ds.qrels[q]})
    texts = dict(zip(ds.corpus["chunk_id"], ds.corpus["text"].str.slice(0, 300)))
    docs += [d for d in sorted(texts) if d not in docs][:20]
    chunks = _chunks({d: texts[d] for d in docs})
    items = [
        QAItem(
            qid=f"s{q}",
            question=ds.queries[q],
            qtype="dataset",
            doc_id=d,
            split="train" if i % 2 else "dev",
            evidence=[Evidence(doc_id=d, start=0, end=len(texts[d])) for d in ds.qrels[q]],
        )
        for i, q in enumerate(qids)
        for d in [sorted(ds.qrels[q])[0]]
    ]
    root = tmp_path_factory.mktemp("train-data")
    tables = TableStore(root / "tables")
    tables.write(chunks, CHUNKS_TABLE, STRATEGY)
    tables.write(to_frame(items), "synthetic_qa")
    return root


@pytest.mark.slow  # about 40 s; the gate tests below register and load trained candidates in make test
def test_tiny_finetune_registers_a_loadable_candidate(scifact_tables, monkeypatch):
    from rag.embedding import load_embedder
    from rag.training import EmbedderTrainingConfig
    from rag.training.pipeline import train_candidate

    monkeypatch.setenv("RAG_DATA_DIR", str(scifact_tables))
    registry = ModelRegistry(scifact_tables / "models")
    config = EmbedderTrainingConfig(
        max_steps=2,
        max_seq_length=64,
        batch_size=8,
        mini_batch_size=4,
        eval_steps=2,
        extra_positives=[("does feedback count?", "Feedback pairs join the training data.")],
    )
    lines = []
    mv, run, inputs = train_candidate(
        "embedder", TableStore(scifact_tables / "tables"), registry, config, log=lines.append
    )
    assert (mv.version, mv.name) == ("v1", "ft-minilm-v1") and registry.resolve("embedder", "candidate").version == "v1"
    assert registry.resolve("embedder", "production") is None  # training alone never promotes
    assert run.steps == 2 and "cosine_ndcg@10" in run.selection_metrics
    start = run.start_selection_metrics["cosine_ndcg@10"]  # the untrained model competes as a checkpoint
    if run.best_checkpoint == "checkpoint-2":
        assert run.selection_metrics["cosine_ndcg@10"] > start
    else:
        assert run.best_checkpoint == "untrained start" and run.selection_metrics["cosine_ndcg@10"] == start
    assert any(line.startswith("step 2/2") for line in lines)
    manifest = registry.resolve("embedder", "ft-minilm-v1").manifest()
    assert manifest["base_model"] == "minilm" and manifest["seed"] == 42 and manifest["strategy"] == STRATEGY
    assert (
        manifest["training_data_hash"] == inputs.data.data_hash
        and manifest["hyperparameters"]["feedback_positives"] == 1
    )
    assert manifest["library_versions"]["sentence-transformers"] and manifest["metrics"]["dev_selection"]
    assert manifest["hyperparameters"]["max_seq_length"] == 64 == manifest["metrics"]["training"]["max_seq_length"]
    tuned, base = load_embedder("ft-minilm-v1"), load_embedder("minilm")
    assert tuned.dim == base.dim
    assert load_embedder("candidate") is tuned  # aliases resolve to the same once-loaded version
    assert tuned._model.max_seq_length == base._model.max_seq_length  # trained short, serves at the base length


def test_gate_rejects_a_worse_embedder_then_promotes_a_better_one_and_swaps_the_serving_alias(
    scifact_tables, monkeypatch, tmp_path
):
    from rag.embedding import _minilm_dir
    from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
    from rag.retrieval.service import search
    from rag.training import TrainingConfig
    from rag.lifecycle.promotion import promote, serving_alias
    from rag.lifecycle.target import ServingTarget
    from rag.training.pipeline import gate_candidate, load_inputs

    monkeypatch.setenv("RAG_DATA_DIR", str(scifact_tables))
    tables = TableStore(scifact_tables / "tables")
    registry = ModelRegistry(tmp_path / "models")
    worse = registry.register(
        "embedder", noisy_copy(_minilm_dir(), tmp_path / "noisy", 0.6), {"base_model": "minilm", "strategy": STRATEGY}
    )
    result = gate_candidate("embedder", tables, registry, worse, GateSettings(resamples=2000))
    assert not result.passed and result.metadata["delta_ndcg@10"] < 0 and result.questions >= 10
    verdict = registry.resolve("embedder", "v1").metrics["gate"]
    assert verdict["against"] == "minilm (base, implicit v0)" and verdict["passed"] is False
    assert (verdict["candidate_version"], verdict["production_version"]) == ("v1", None) and verdict["gated_at"]
    assert verdict["qa_set_version"] == load_inputs(tables, TrainingConfig(strategy=STRATEGY)).qa_version

    # A candidate trained on another QA set: its "held-out" questions may be training questions now, so no verdict.
    stale = registry.register(
        "embedder",
        _fake_model(tmp_path / "stale"),
        {"base_model": "minilm", "strategy": STRATEGY, "qa_set_version": "000000000000"},
    )
    with pytest.raises(ValueError, match="QA set changed since embedder ft-minilm-v2 was trained.*Retrain"):
        gate_candidate("embedder", tables, registry, stale, GateSettings(resamples=2000))

    # Now the noisy model is production (e.g. a bad promotion in the past) and the untouched base weights are the
    # candidate: a deliberately better model, which the gate must promote.
    registry.set_alias("embedder", "production", worse.version)
    # Registered as it is, it never saw the QA set: its gain on generated questions promotes it. (One trained on them
    # is only recorded better_on_generated: tests/test_training_learns.py gates a real fine-tune so.)
    better = registry.register("embedder", _minilm_dir(), {"base_model": "minilm", "strategy": STRATEGY})
    result = gate_candidate("embedder", tables, registry, better, GateSettings(resamples=2000))
    assert result.passed and not result.better_on_generated, result.reasons
    assert result.metadata["delta_ndcg@10"] > 0 and result.metadata["p_value_ndcg@10"] < 0.05

    settings = QdrantSettings(path=str(tmp_path / "qdrant"))
    client = get_client(settings)
    try:
        # The rejected model only serves through an operator's bypass (here: to have its collection to swap from).
        target = ServingTarget.of_client(tables, client, [STRATEGY])
        first = promote("embedder", registry, worse, target=target, force_reason="test: serve the past bad promotion")
        assert alias_target(client, serving_alias(STRATEGY)) == first["serving_aliases"][serving_alias(STRATEGY)]
        outcome = promote("embedder", registry, better, target=target)
        live = alias_target(client, serving_alias(STRATEGY))
        assert outcome["previous"] == worse.name and live == outcome["serving_aliases"][serving_alias(STRATEGY)]
        assert live.startswith(f"{STRATEGY}__{better.name}__") and client.collection_exists(
            first["serving_aliases"][serving_alias(STRATEGY)]
        )
        assert (
            registry.resolve("embedder", "production").version == better.version
            and registry.resolve("embedder", "candidate") is None
        )
        monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))  # serving resolves "production" through this registry
        question = "0-dimensional biomaterials show inductive properties."
        hits = search(
            question, strategy=STRATEGY, model="production", mode="dense", k=3, root=scifact_tables, qdrant=settings
        )
        direct = search(
            question, strategy=STRATEGY, model=better.name, mode="dense", k=3, root=scifact_tables, qdrant=settings
        )
        assert [h.chunk["chunk_id"] for h in hits] == [h.chunk["chunk_id"] for h in direct] and len(hits) == 3
    finally:
        close_client(settings)


@pytest.mark.slow  # the Dagster test trains one too; keeps the fast suite within its budget
def test_tiny_cross_encoder_training_is_loadable(scifact_tables, monkeypatch):
    """kind=cross-encoder stays an option in the reranker registry (the learned ranker is the default)."""
    from rag.rerank import load_reranker, rerank
    from rag.retrieval import Hit
    from rag.training import RerankerTrainingConfig
    from rag.training.pipeline import train_candidate

    monkeypatch.setenv("RAG_DATA_DIR", str(scifact_tables))
    registry = ModelRegistry(scifact_tables / "models")
    config = RerankerTrainingConfig(
        kind="cross-encoder", max_steps=2, max_seq_length=64, batch_size=8, negatives_per_positive=1, eval_steps=2
    )
    mv, run, _ = train_candidate(
        "reranker", TableStore(scifact_tables / "tables"), registry, config, log=lambda _: None
    )
    assert mv.name.startswith("ce-minilm-v") and run.steps == 2 and "mrr@10" in run.selection_metrics
    reranker = load_reranker("candidate", registry=registry)
    hits = [
        Hit(rank=i + 1, score=0.0, chunk={"chunk_id": str(i), "text": t})
        for i, t in enumerate(["alpha beta", "gamma", "delta"])
    ]
    out = rerank(reranker, "alpha?", hits, k=2)
    assert [h.rank for h in out] == [1, 2] and out[0].score >= out[1].score
    assert load_reranker("production", registry=registry) is None


def test_gates_are_blocking_checks_and_retrain_job_holds_the_training_stage():
    from assets.training import finetuned_embedder_gate, trained_configuration_gate, trained_reranker_gate
    from orchestration.definitions import defs

    for checks, asset in (
        (finetuned_embedder_gate, "finetuned_embedder"),
        (trained_reranker_gate, "trained_reranker"),
        (trained_configuration_gate, "trained_configuration"),
    ):
        (spec,) = checks.check_specs
        assert spec.blocking and spec.asset_key.to_user_string() == asset
    graph = defs.resolve_asset_graph()
    assert {
        graph.get(k).group_name
        for k in graph.get_all_asset_keys()
        if k.to_user_string()
        in {"finetuned_embedder", "trained_reranker", "production_embedder", "production_reranker"}
    } == {"training"}
    job = defs.resolve_job_def("retrain_job")
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {
        "finetuned_embedder",
        "production_embedder",
        "trained_reranker",
        "production_reranker",
        "trained_configuration",
        "production_configuration",
    }


# --- the retrain job in Dagster --------------------------------------------------------------------------------
@pytest.mark.slow
def test_retrain_job_rejects_then_promotes_and_reindexes(scifact_tables, monkeypatch, tmp_path):
    import shutil

    from dagster import DagsterInstance, materialize

    from assets.training import finetuned_embedder, finetuned_embedder_gate, production_embedder
    from orchestration.definitions import defs
    from rag.embedding import _minilm_dir
    from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore

    root = tmp_path / "data"
    shutil.copytree(scifact_tables / "tables", root / "tables")
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", [STRATEGY])
    qdrant_path = str(tmp_path / "qdrant")
    resources = {
        "data_store": DataStore(data_dir=str(root)),
        "qdrant": QdrantResource(path=qdrant_path),
        "rollout": Rollout(promotion="direct"),
    }
    tiny = {"max_steps": 1, "max_seq_length": 64, "batch_size": 8}
    run_config = {
        "ops": {"finetuned_embedder": {"config": tiny}, "trained_reranker": {"config": tiny}},
        "loggers": {"console": {"config": {"log_level": "ERROR"}}},
    }
    job = defs.resolve_job_def("retrain_job")
    registry = ModelRegistry(root / "models")

    # One step at warmup learning rate 0 leaves the base weights: not better than production (the base) -> blocked.
    first = job.execute_in_process(instance=instance, resources=resources, run_config=run_config, raise_on_error=False)
    assert first.success  # a rejected candidate is a normal outcome: the run succeeds and production stays
    checks = {e.check_name: e for e in first.get_asset_check_evaluations()}
    assert not checks["finetuned_embedder_gate"].passed
    assert checks["finetuned_embedder_gate"].metadata["delta_ndcg@10"].value == 0.0
    materialized = {m.asset_key.to_user_string() for m in first.get_asset_materialization_events()}
    assert "finetuned_embedder" in materialized and "production_embedder" not in materialized
    assert ("production_reranker" in materialized) == checks["trained_reranker_gate"].passed
    # A rejected model gets no embedding_model partition: a backfill of "all missing" would index it for nobody.
    assert registry.resolve("embedder", "production") is None
    assert "ft-minilm-v1" not in instance.get_dynamic_partitions("embedding_model")

    # With a deliberately worse production (noisy weights), the same candidate passes, is promoted and indexed, once
    # the gate lets a gain on generated questions alone promote (by default only a canary or people's questions can).
    noisy = registry.register("embedder", noisy_copy(_minilm_dir(), tmp_path / "noisy", 0.6), {"base_model": "minilm"})
    registry.set_alias("embedder", "production", noisy.version)
    second = materialize(
        [finetuned_embedder, finetuned_embedder_gate, production_embedder],
        instance=instance,
        resources=resources,
        raise_on_error=False,
        run_config={
            "ops": {
                "finetuned_embedder": {"config": tiny},
                "finetuned_embedder_finetuned_embedder_gate": {"config": {"generated_gain": "promote"}},
            },
            "loggers": run_config["loggers"],
        },
    )
    gate = {e.check_name: e for e in second.get_asset_check_evaluations()}["finetuned_embedder_gate"]
    assert gate.passed and gate.metadata["production"].value == noisy.name
    promoted = registry.resolve("embedder", "production")
    assert promoted.version == "v3" and promoted.metrics["gate"]["passed"] is True
    close_client(QdrantSettings(path=qdrant_path))
    client = get_client(QdrantSettings(path=qdrant_path))
    try:
        assert alias_target(client, f"{STRATEGY}__production").startswith(f"{STRATEGY}__{promoted.name}__")
    finally:
        close_client(QdrantSettings(path=qdrant_path))
