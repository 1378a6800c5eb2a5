"""Span-anchored QA sets, loaders, synthetic filters, and a retrieval report checked by hand."""

import json

import pandas as pd
import pytest

from rag.chunking import chunk_document
from rag.evaluation.loaders import beir_documents, squad_articles
from rag.evaluation.metrics import evaluate_run, retrieval_score, weighted_average
from rag.evaluation.qaset import (
    Evidence,
    QAItem,
    Relevance,
    assign_splits,
    export_beir,
    export_squad,
    from_frame,
    import_squad,
    qrels_for_chunks,
    to_frame,
)
from rag.parsing.models import ElementDraft, assemble
from rag.synthetic import Passage, SynthSettings, _Filters, ask, generate_qa, is_verbatim, locate_answer
from tests.conftest import SHARED

PARAS = [
    "The lighthouse at Cape Wrath was built in 1828 by Robert Stevenson. Its light can be seen for 22 nautical miles.",
    "Keepers lived at the station until 1998, when the light was automated. Supplies arrived by boat twice a month.",
    "Today the area is a military training range. Visitors reach the cape by a minibus that runs in summer only.",
]


def make_doc(doc_id="cape.txt"):
    return assemble(
        [ElementDraft(type="title", text="Cape Wrath", heading_level=1)]
        + [ElementDraft(type="narrative", text=p) for p in PARAS],
        doc_id=doc_id,
        source_path=doc_id,
        content_hash="0" * 64,
        parser="test",
        n_pages=1,
    )


def chunks_frame(chunks):
    return pd.DataFrame([c.model_dump() for c in chunks])


def test_one_qa_set_scores_two_strategies_by_span_overlap():
    doc = make_doc()
    start = doc.canonical_text.index("1998")
    item = QAItem(
        qid="q1",
        question="When was the Cape Wrath light automated?",
        qtype="factual",
        doc_id=doc.doc_id,
        evidence=[Evidence(doc_id=doc.doc_id, start=start, end=start + 4)],
        answer="1998",
    )
    whole = chunks_frame(chunk_document(doc, "whole-document"))
    para = chunks_frame(chunk_document(doc, "paragraph"))
    assert qrels_for_chunks([item], whole) == {"q1": {whole.chunk_id[0]: 1}}
    rel = qrels_for_chunks([item], para)["q1"]
    hit = para[para.chunk_id.isin(rel)]
    assert len(hit) == 1 and "1998" in hit.text.iloc[0]
    # Coverage mode: a chunk covering only part of a long evidence span no longer counts.
    long_ev = QAItem(
        qid="q2",
        question="What happened at the station?",
        qtype="long-answer",
        doc_id=doc.doc_id,
        evidence=[Evidence(doc_id=doc.doc_id, start=doc.elements[1].char_start, end=doc.elements[3].char_end)],
    )
    assert len(qrels_for_chunks([long_ev], para, Relevance(mode="any"))["q2"]) >= 2
    assert qrels_for_chunks([long_ev], para, Relevance(mode="coverage", min_coverage=0.9)) == {}


def test_qa_table_roundtrip_and_beir_squad_exports(tmp_path):
    doc = make_doc()
    s = doc.canonical_text.index("1828")
    items = [
        QAItem(
            qid="q1",
            question="When was the lighthouse at Cape Wrath built?",
            qtype="factual",
            doc_id=doc.doc_id,
            evidence=[Evidence(doc_id=doc.doc_id, start=s, end=s + 4)],
            answer="1828",
            split="train",
        )
    ]
    assert from_frame(to_frame(items)) == items
    chunks = chunks_frame(chunk_document(doc, "paragraph"))
    folder = export_beir(items, chunks, tmp_path / "beir")
    qrels = (folder / "qrels" / "test.tsv").read_text().splitlines()
    assert qrels[0] == "query-id\tcorpus-id\tscore" and len(qrels) == 2
    assert sum(1 for _ in open(folder / "corpus.jsonl")) == len(chunks)
    path = export_squad(items, {doc.doc_id: doc.canonical_text}, tmp_path / "squad.json")
    docs_back, items_back = import_squad(path)
    ans = json.loads(path.read_text())["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]
    assert ans["text"] == "1828" and items_back[0].evidence == items[0].evidence


def test_split_is_by_document_and_deterministic():
    docs = [f"d{i}" for i in range(20)]
    splits = assign_splits(docs)
    assert sum(v == "dev" for v in splits.values()) == 4 and assign_splits(list(reversed(docs))) == splits
    assert list(assign_splits(["a", "b"]).values()).count("dev") == 1 and assign_splits(["only"]) == {"only": "train"}


def test_filters_and_answer_location():
    f = _Filters(SynthSettings())
    passage = "Keepers lived at the station until 1998, when the light was automated by the board."
    assert not f.accept("When?", passage) and f.rejected["length"] == 1
    assert not f.accept("Keepers lived at the station until 1998 when the light was automated", passage)
    assert f.rejected["verbatim"] == 1
    assert f.accept("Until which year did keepers live at the lighthouse station?", passage)
    assert (
        not f.accept("until WHICH year did keepers live at the lighthouse station", passage)
        and f.rejected["duplicate"] == 1
    )
    assert not f.accept("Bis zu welchem Jahr wohnten die Wärter auf der Station am Leuchtturm?", passage)
    assert f.rejected["language"] == 1
    assert is_verbatim("the light was automated by the board", passage)
    p = Passage("x", 100, 100 + len(passage), passage)
    ev = locate_answer("1998", p)
    assert (ev.start, ev.end) == (100 + passage.index("1998"), 100 + passage.index("1998") + 4)
    assert locate_answer("in the year nineteen ninety", p) is None
    assert ask(ScriptedLLM([" How old is it?", " 200 years"]), "P") == ("How old is it?", "200 years")
    assert ask(ScriptedLLM([" Answer: nothing"]), "P") is None and ask(ScriptedLLM([" Q?", "  "]), "P") is None


class ScriptedLLM:
    name = "scripted"

    def __init__(self, completions):
        self.completions, self.prompts = list(completions), []

    def complete(self, prompt, *, max_new_tokens=None, stop=None):
        self.prompts.append(prompt)
        return self.completions.pop(0) if self.completions else " ???"


def test_generation_with_an_llm_keeps_answerable_questions_and_counts_rejections():
    docs = [make_doc("a.txt"), make_doc("b.txt")]
    llm = ScriptedLLM(
        [
            " When was the lighthouse at Cape Wrath built?",
            " 1828",
            " What is the capital city of the country of France?",
            " Paris",
            " Short?",
            " x",
            " Answer: the model lost the pattern",
        ]
    )
    result = generate_qa(docs, llm, SynthSettings(passages_per_document=2, passage_chars=(50, 400)))
    assert result.attempted == 4 and [i.answer for i in result.items] == ["1828"]
    assert (
        result.rejected["unanswerable"] == 1 and result.rejected["length"] == 1 and result.rejected["unparseable"] == 1
    )
    item = result.items[0]
    assert docs[0].canonical_text[item.evidence[0].start : item.evidence[0].end] == "1828"
    assert llm.prompts[0].endswith("Question type: factual\nQuestion:") and llm.prompts[0].count("Passage:") == 5
    assert llm.prompts[1].endswith("Question: When was the lighthouse at Cape Wrath built?\nAnswer:")


def test_inverse_cloze_fallback_without_llm():
    docs = [make_doc(f"d{i}.txt") for i in range(5)]
    result = generate_qa(
        docs, None, SynthSettings(passages_per_document=1, passage_chars=(50, 400), question_mix={"inverse-cloze": 1.0})
    )
    assert result.generator == "inverse-cloze" and result.items
    for item in result.items:
        ev = item.evidence[0]
        assert item.question in " ".join(docs[0].canonical_text[ev.start : ev.end].split())
    assert {i.split for i in result.items} == {"train", "dev"}


def record_doc(doc_id: str, n: int = 8):
    """n paragraphs of two distinct sentences each: n passages of 100-400 characters."""
    name = doc_id.split(".")[0]
    paras = [
        f"Record {i} of station {name} notes that {i + 2} keepers served there in winter. "
        f"The supply boat number {i} reached station {name} every {i + 3} days in the summer."
        for i in range(n)
    ]
    return assemble(
        [ElementDraft(type="narrative", text=p) for p in paras],
        doc_id=doc_id,
        source_path=doc_id,
        content_hash="0" * 64,
        parser="test",
        n_pages=1,
    )


def test_run_settings_size_the_qa_set():
    docs = [record_doc("a.txt"), record_doc("b.txt")]

    def size(**kw):
        return generate_qa(
            docs, None, SynthSettings(passage_chars=(100, 400), question_mix={"inverse-cloze": 1.0}, **kw)
        )

    assert len(size(passages_per_document=2).items) == 4 and len(size(passages_per_document=6).items) == 12
    pairs = size(passages_per_document=6, questions_per_passage=2)
    assert len(pairs.items) == 24 and pairs.attempted == 24 and len({i.question for i in pairs.items}) == 24
    by_passage = {}
    for item in pairs.items:  # both sentences of a passage, with that passage as their evidence
        by_passage.setdefault((item.doc_id, item.evidence[0].start), []).append(item.question)
    assert len(by_passage) == 12 and all(len(qs) == 2 for qs in by_passage.values())
    # The cap stops generation and spreads it over documents (round-robin), not the first document's passages.
    capped = size(passages_per_document=6, max_questions=5)
    assert len(capped.items) == 5 and capped.attempted == 5
    assert sorted(i.doc_id for i in capped.items) == ["a.txt"] * 3 + ["b.txt"] * 2


def test_llm_questions_per_passage_take_the_question_types_in_turn():
    llm = ScriptedLLM([])
    generate_qa(
        [record_doc("a.txt", 2)],
        llm,
        SynthSettings(
            passage_chars=(100, 400),
            questions_per_passage=2,
            question_types=["factual", "interpretation", "long-answer"],
        ),
    )
    asked = [p.rsplit("Question type: ", 1)[1].split("\n")[0] for p in llm.prompts if p.endswith("Question:")]
    assert asked == ["factual", "interpretation", "long-answer", "factual"]


def test_an_evaluation_embeds_its_questions_in_batches():
    import numpy as np

    from rag.retrieval import Index

    class Counting:
        def __init__(self):
            self.calls = []

        def encode_queries(self, texts):
            self.calls.append(list(texts))
            return np.ones((len(texts), 2), dtype=np.float32)

    index = Index(pd.DataFrame(), None, None, None, Counting())
    index.embed_queries(["a", "b", "a"])
    index.embed_queries(["b", "c"])
    assert index.query_vector("a").shape == (2,) and index.embedder.calls == [["a", "b"], ["c"]]


def test_paired_comparison_of_per_question_scores():
    from scipy.stats import ttest_rel

    from rag.evaluation.metrics import paired_comparison

    control = pd.Series([0.0, 0.5, 1.0, 1.0, 0.2, 0.4], index=list("abcdef"))
    treatment = pd.Series([1.0, 0.5, 1.0, 0.8, 0.6, 0.9, 0.3], index=list("abcdefg"))  # g has no pair: left out
    out = paired_comparison(treatment, control)
    delta = (1.0 + 0 + 0 - 0.2 + 0.4 + 0.5) / 6
    assert out["n"] == 6 and (out["better"], out["tied"], out["worse"]) == (3, 2, 1)
    assert out["delta"] == pytest.approx(delta) and out["ci_low"] < delta < out["ci_high"]
    assert out["p_value"] == pytest.approx(ttest_rel(treatment[:6], control).pvalue)
    assert out == paired_comparison(treatment, control)  # seeded: the same interval every run
    assert paired_comparison(control, control)["p_value"] == 1.0
    with pytest.raises(ValueError, match="same questions"):
        paired_comparison(treatment, control.rename(lambda q: q + "x"))


def test_summary_says_how_sure_the_best_beats_the_baseline():
    from rag.evaluation.retrieval_eval import best_vs_baseline, describe_comparison, summarize

    qids = [f"q{i}" for i in range(8)]
    scores = {
        ("paragraph", "bm25"): [1, 1, 1, 1, 1, 1, 0.5, 0],
        ("recursive-1000-200", "dense"): [0, 0.5, 0.2, 1, 0, 0.3, 0.5, 0],
    }
    per_query = {
        s: pd.DataFrame(
            [
                {"mode": mode, "qid": q, **{f"{m}@5": x for m in ("recall", "map", "ndcg", "mrr")}}
                for (strategy, mode), xs in scores.items()
                if strategy == s
                for q, x in zip(qids, xs)
            ]
        )
        for s in ("paragraph", "recursive-1000-200")
    }
    reports = pd.DataFrame(
        [
            {
                "strategy": s,
                "model": "m",
                "mode": mode,
                "n_questions": 8,
                "retrieval_score": sum(xs) / 8,
                "recall@5": 0.0,
                "ndcg@10": 0.0,
            }
            for (s, mode), xs in scores.items()
        ]
    )
    comparison = best_vs_baseline(summarize(reports), lambda strategy, model: per_query.get(strategy))
    assert comparison["best"] == "paragraph · bm25" and comparison["n"] == comparison["n_questions"] == 8
    assert comparison["delta"] == pytest.approx((sum(scores[("paragraph", "bm25")]) - 2.5) / 8)
    assert (comparison["better"], comparison["tied"], comparison["worse"]) == (5, 3, 0) and 0 < comparison[
        "p_value"
    ] < 0.05
    line = describe_comparison(comparison)
    assert "on 8 paired questions" in line and f"p = {comparison['p_value']:.2g}" in line and "95% CI" in line
    # The baseline winning, or missing per-question scores, is said instead of a test.
    alone = best_vs_baseline(summarize(reports[reports["mode"] == "dense"]), lambda s, m: per_query.get(s))
    assert alone["note"] == "the best configuration is the baseline" and "8 questions" in describe_comparison(alone)
    assert "note" in best_vs_baseline(summarize(reports), lambda s, m: None)


def test_report_metrics_match_a_hand_computation():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}, "q3": {"z": 1}}
    run = {"q1": {"a": 3.0, "x": 2.0, "y": 1.0}, "q2": {"x": 3.0, "b": 2.0, "y": 1.0}}
    mean, per_query = evaluate_run(qrels, run)
    assert mean["recall@1"] == pytest.approx(1 / 3)  # q1 only
    assert mean["recall@3"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert mean["mrr@3"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert mean["precision@3"] == pytest.approx((1 / 3 + 1 / 3 + 0) / 3)
    assert mean["hit_rate@3"] == pytest.approx(2 / 3)
    assert mean["map@3"] == pytest.approx((1 + 0.25 + 0) / 3)  # q2: (1/2) / 2 relevant
    assert set(per_query.qid) == {"q1", "q2", "q3"}
    assert retrieval_score(mean) == pytest.approx(
        (mean["recall@5"] + mean["map@5"] + mean["ndcg@5"] + mean["mrr@5"]) / 4
    )


@pytest.mark.skipif(not (SHARED / "squad-dev").is_dir(), reason="shared SQuAD dev not available")
def test_squad_loader_reanchors_every_answer():
    docs, items = squad_articles(SHARED / "squad-dev" / "dev-v1.1.json.gz", max_articles=3)
    assert len(docs) == 3 and len(items) > 300
    texts = {d.doc_id: d.canonical_text for d in docs}
    for item in items:
        for ev in item.evidence:
            assert texts[ev.doc_id][ev.start : ev.end].strip()
        assert texts[item.doc_id][item.evidence[0].start : item.evidence[0].end] == item.answer


@pytest.mark.skipif(not (SHARED / "scifact").is_dir(), reason="shared SciFact not available")
def test_beir_loader_gives_whole_document_evidence():
    docs, items = beir_documents(SHARED / "scifact", "test")
    assert len(docs) == 5183 and len(items) == 300
    lengths = {d.doc_id: len(d.canonical_text) for d in docs}
    assert all(ev.start == 0 and ev.end == lengths[ev.doc_id] for i in items for ev in i.evidence)


def test_evaluate_index_report_on_a_tiny_corpus_by_hand():
    from rag.evaluation.metrics import METRICS, metrics_at
    from rag.evaluation.retrieval_eval import (
        EvaluationSettings,
        current_reports,
        evaluate_index,
        report_metrics,
        summarize,
    )
    from rag.index.bm25 import BM25Index
    from rag.retrieval import Index

    texts = {
        "c1": "lighthouse keepers lived at the station",
        "c2": "the minibus runs in summer to the cape",
        "c3": "military training range near the cape",
        "c4": "robert stevenson built the lighthouse in 1828",
    }
    chunks = pd.DataFrame(
        [
            {
                "chunk_id": c,
                "doc_id": "d",
                "text": t,
                "char_start": 100 * i,
                "char_end": 100 * i + 50,
                "page_start": 1,
                "page_end": 1,
            }
            for i, (c, t) in enumerate(texts.items())
        ]
    )
    ev = lambda i: [Evidence(doc_id="d", start=100 * i + 10, end=100 * i + 20)]  # noqa: E731 (inside chunk i only)
    items = [
        QAItem(
            qid="q1", question="who built the lighthouse", qtype="factual", doc_id="d", evidence=ev(3)
        ),  # c4 ranks 1st
        QAItem(
            qid="q2", question="when does the minibus run", qtype="factual", doc_id="d", evidence=ev(1)
        ),  # c2 ranks 1st
        QAItem(
            qid="q3", question="where did keepers train", qtype="factual", doc_id="d", evidence=ev(2)
        ),  # rank of c3 read off BM25 below
        QAItem(
            qid="q4",
            question="evidence outside every chunk",
            qtype="factual",
            doc_id="d",
            evidence=[Evidence(doc_id="d", start=60, end=70)],
        ),
    ]
    index = Index(chunks.set_index("chunk_id"), BM25Index.build(list(texts), list(texts.values())), None, None, None)
    report = evaluate_index(index, items, chunks, strategy="s", model="-", modes=["bm25"])
    row = report.summary.iloc[0]
    # q4's evidence lies in no chunk: it stays in the question set as a miss.
    assert row["n_questions"] == 4 and row["n_without_relevant_chunk"] == 1
    per_q = report.per_query.set_index("qid")
    ranks = {q: index.bm25.search(i.question, 5) for q, i in zip(["q1", "q2", "q3"], items)}
    first_hit = {
        q: next((r for r, (cid, _) in enumerate(hits, start=1) if cid == {"q1": "c4", "q2": "c2", "q3": "c3"}[q]), None)
        for q, hits in ranks.items()
    }
    assert first_hit["q1"] == 1 and first_hit["q2"] == 1
    expected_mrr = sum(1 / r if r else 0 for r in first_hit.values()) / 4
    assert row["mrr@10"] == pytest.approx(expected_mrr)
    assert row["recall@1"] == pytest.approx(sum(r == 1 for r in first_hit.values()) / 4)
    assert per_q.loc["q1", "recall@1"] == 1.0 and per_q.loc["q1", "top_chunk"] == "c4"
    assert per_q.loc["q4", "mrr@10"] == 0.0 and per_q.loc["q4", "recall@20"] == 0.0
    summary = summarize(report.summary)
    assert bool(summary.loc[0, "best"]) and summary.loc[0, "delta_retrieval_score"] is None
    # A report of the old overlap rule (no relevance column) is not summarized beside it.
    old = report.summary.drop(columns=["relevance", "max_context_chars", "context_chars@5"])
    kept, stale = current_reports({"s__-": report.summary, "page__-": old})
    assert stale == ["page__-"] and len(kept) == 1 and kept[0] is report.summary
    # Other cutoffs: only those metrics, and the report says which (the GX check reads them from it).
    narrow = evaluate_index(index, items, chunks, strategy="s", model="-", modes=["bm25"], ks=[5, 10])
    assert report_metrics(narrow.summary) == metrics_at([5, 10]) and "recall@20" not in narrow.summary
    assert narrow.summary.loc[0, "mrr@10"] == pytest.approx(row["mrr@10"]) and report_metrics(old) == METRICS
    with pytest.raises(ValueError, match="include"):
        EvaluationSettings(ks=[1, 3])


def test_span_relevance_ignores_a_grazing_chunk_and_keeps_pieces_of_a_long_span():
    doc = make_doc()
    sentence = "Keepers lived at the station until 1998, when the light was automated."
    start = doc.canonical_text.index(sentence)
    item = QAItem(
        qid="q",
        question="Until when did keepers live at the station?",
        qtype="factual",
        doc_id=doc.doc_id,
        evidence=[Evidence(doc_id=doc.doc_id, start=start, end=start + len(sentence))],
    )
    spans = {
        "grazing": (0, start + 5),  # a big chunk whose end touches 5 of the sentence's 70 characters
        "piece": (start + 10, start + 30),  # a small chunk that is all evidence, 20 of the 70 characters
        "holds-it": (start - 40, start + len(sentence) + 40),
    }
    chunks = pd.DataFrame(
        [{"chunk_id": c, "doc_id": doc.doc_id, "char_start": a, "char_end": b} for c, (a, b) in spans.items()]
    )
    assert set(qrels_for_chunks([item], chunks)["q"]) == {"piece", "holds-it"}  # the default: span
    assert set(qrels_for_chunks([item], chunks, Relevance(mode="any"))["q"]) == {"grazing", "piece", "holds-it"}
    assert set(qrels_for_chunks([item], chunks, Relevance(mode="coverage"))["q"]) == {"holds-it"}


def ledger(n_docs=3, n_paras=60):
    """Long documents of numbered entries (each entry's code word is its own), and one question per listed entry
    whose answer lies inside that entry."""
    docs, items = [], []
    for d in range(n_docs):
        paras = [
            f"Entry {i} of ledger {d}: the keeper wrote that crate zq{d}x{i} held {i + 3} barrels of lamp oil, stored "
            f"in the north shed beside the old signal mast until the autumn supply boat came to collect the empties."
            for i in range(n_paras)
        ]
        doc = assemble(
            [ElementDraft(type="narrative", text=p) for p in paras],
            doc_id=f"ledger{d}",
            source_path=f"ledger{d}",
            content_hash=f"{d}" * 64,
            parser="test",
            n_pages=1,
        )
        docs.append(doc)
        for i in (1, 20, 40, 55):
            answer = f"{i + 3} barrels"
            at = doc.canonical_text.index(answer, doc.elements[i].char_start)
            items.append(
                QAItem(
                    qid=f"q{d}-{i}",
                    question=f"How many barrels did crate zq{d}x{i} hold?",
                    qtype="factual",
                    doc_id=doc.doc_id,
                    evidence=[Evidence(doc_id=doc.doc_id, start=at, end=at + len(answer))],
                    answer=answer,
                )
            )
    return docs, items


def chunk_table(docs, per_element: bool):
    rows = []
    for doc in docs:
        spans = [(e.char_start, e.char_end) for e in doc.elements] if per_element else [(0, len(doc.canonical_text))]
        rows += [
            {
                "chunk_id": f"{doc.doc_id}:{a}",
                "doc_id": doc.doc_id,
                "text": doc.canonical_text[a:b],
                "char_start": a,
                "char_end": b,
                "page_start": 1,
                "page_end": 1,
            }
            for a, b in spans
        ]
    return pd.DataFrame(rows)


def bm25_index(chunks):
    from rag.index.bm25 import BM25Index
    from rag.retrieval import Index

    return Index(
        chunks.set_index("chunk_id"),
        BM25Index.build(chunks["chunk_id"].tolist(), chunks["text"].tolist()),
        None,
        None,
        None,
    )


def test_a_whole_document_chunk_scores_only_the_evidence_a_prompt_would_hold():
    from rag.evaluation.retrieval_eval import CONTEXT_CHARS, evaluate_index

    docs, items = ledger()
    assert all(len(d.canonical_text) > 1.5 * CONTEXT_CHARS for d in docs)
    focused, whole = chunk_table(docs, per_element=True), chunk_table(docs, per_element=False)

    def score(chunks, **kw):
        return evaluate_index(
            bm25_index(chunks), items, chunks, strategy="s", model="-", modes=["bm25"], **kw
        ).summary.iloc[0]

    f, w = score(focused), score(whole)
    assert f["recall@5"] == 1.0 and f["n_questions"] == w["n_questions"] == len(items)
    # Each whole document holds every answer in it, but a prompt holds its first CONTEXT_CHARS characters only: the
    # other documents do not fit beside it, so a question is a hit only when its answer lies in that first part.
    within = sum(i.evidence[0].end <= CONTEXT_CHARS for i in items) / len(items)
    assert 0 < within < 1 and w["recall@5"] == pytest.approx(within) and w["retrieval_score"] < f["retrieval_score"]
    # ...and the context cost is reported beside it: the budget, against five short entries.
    assert w["context_chars@5"] == CONTEXT_CHARS and f["context_chars@5"] < CONTEXT_CHARS / 3
    # The old rule stays available on request: any overlap over whole chunks scores the whole document perfect.
    old = score(whole, relevance=Relevance(mode="any"), max_context_chars=None)
    assert old["recall@5"] == 1.0 and old["context_chars@5"] > 3 * CONTEXT_CHARS


def test_strategies_are_scored_on_the_same_questions():
    from rag.evaluation.retrieval_eval import evaluate_index

    docs, items = ledger(n_docs=1)
    full = chunk_table(docs, per_element=True)
    lost = full[~full["text"].str.contains("crate zq0x40 ")]  # a strategy that dropped one entry's text
    reports = {
        name: evaluate_index(bm25_index(c), items, c, strategy=name, model="-", modes=["bm25"])
        for name, c in (("full", full), ("lost", lost))
    }
    a, b = reports["full"].summary.iloc[0], reports["lost"].summary.iloc[0]
    assert a["n_questions"] == b["n_questions"] == 4 and (
        a["n_without_relevant_chunk"],
        b["n_without_relevant_chunk"],
    ) == (0, 1)
    assert a["recall@5"] == 1.0 and b["recall@5"] == pytest.approx(3 / 4)  # the uncovered question is a miss
    per_q = reports["lost"].per_query.set_index("qid")
    assert len(per_q) == 4 and per_q.loc["q0-40", "recall@20"] == 0.0


def test_evaluate_run_scores_queries_without_hits_as_zeros():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    for run in ({}, {"q1": {}, "q2": {}}):  # nothing retrieved for any query (ranx itself fails on these)
        mean, per_query = evaluate_run(qrels, run)
        assert set(mean.values()) == {0.0} and list(per_query.qid) == ["q1", "q2"]
    mean, _ = evaluate_run({"q1": {}, "q2": {}}, {"q1": {"a": 1.0}})  # no query has a relevant chunk
    assert set(mean.values()) == {0.0}
    # A query with no relevant chunk is a miss beside scored ones; rows stay with their query whatever ranx's order.
    mean, per_query = evaluate_run(
        {"z": {"a": 1}, "e": {}, "b": {"c": 1}},
        {"z": {"a": 1.0}, "e": {"a": 1.0}, "b": {"x": 2.0, "c": 1.0}},
        ["mrr@5", "recall@5"],
    )
    assert per_query.set_index("qid")["mrr@5"].to_dict() == {"z": 1.0, "e": 0.0, "b": 0.5}
    assert mean["mrr@5"] == pytest.approx(0.5) and mean["recall@5"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no queries"):
        evaluate_run({}, {})


def test_weighted_average_needs_every_component():
    parts = {"context_recall": 0.8, "faithfulness": 0.5, "context_precision_ref": 0.4, "context_precision_noref": 1.0}
    assert weighted_average(parts) == pytest.approx(0.35 * 0.8 + 0.30 * 0.5 + 0.25 * 0.4 + 0.10 * 1.0)
    assert weighted_average({**parts, "faithfulness": None}) is None
