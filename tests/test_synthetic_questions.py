"""Synthetic questions that look like users' questions, without an LLM: answer-aware wh-questions, keyword queries,
the question mix, and the style report that says how far each kind is from how people ask."""

from __future__ import annotations

import pytest

from rag.parsing.models import ElementDraft, assemble
from rag.synthetic import SynthSettings, generate_qa, is_verbatim
from rag.synthetic import mix as question_mix
from rag.synthetic.keywords import KeywordQueries
from rag.synthetic.style import Sample, report
from rag.synthetic.text import has_question_form, stop_words, tokens

PARAS = [
    "The Eiffel Tower was completed in March 1889 for the World's Fair in Paris. Gustave Eiffel completed the tower in "
    "1889, and it was the tallest structure until 1930. The tower was designed by Gustave Eiffel.",
    "The lighthouse at Cape Wrath was automated in 1998 by the Northern Lighthouse Board. About 40 engineers worked on "
    "the new foghorn for two years. In 1828, the Board built a new station in Durness.",
    "Sales of the company fell by 12% in the second quarter. The shipyard in Glasgow launched three ferries in 2004. "
    "The ferry service between Oban and Mull carried 600 passengers in August 2012.",
]


def make_doc(doc_id: str, paras: list[str] = PARAS):
    return assemble(
        [ElementDraft(type="narrative", text=p) for p in paras],
        doc_id=doc_id,
        source_path=doc_id,
        content_hash="0" * 64,
        parser="test",
        n_pages=1,
    )


def sentence_of(doc, item) -> str:
    ev = item.evidence[0]
    return doc.canonical_text[ev.start : ev.end]


@pytest.fixture(scope="module")
def answer_aware_set():
    docs = [make_doc(f"d{i}.txt") for i in range(2)]
    settings = SynthSettings(
        passages_per_document=3, questions_per_passage=3, passage_chars=(100, 400), question_mix={"answer-aware": 1.0}
    )
    return docs, generate_qa(docs, None, settings)


def test_answer_aware_questions_are_questions_about_an_answer_not_copies(answer_aware_set):
    docs, result = answer_aware_set
    by_id = {d.doc_id: d for d in docs}
    assert len(result.items) >= 6 and {i.qtype for i in result.items} == {"answer-aware"}
    for item in result.items:
        sentence = sentence_of(by_id[item.doc_id], item)
        assert sentence.endswith(".") and sentence[0].isupper(), sentence  # the evidence is one whole sentence
        assert tokens(item.question)[0] in {"when", "who", "what", "where", "how", "which", "by", "since", "until"}
        assert has_question_form(item.question, strict=True) and item.question.endswith("?")
        assert not is_verbatim(item.question, sentence), item.question
        assert item.answer and item.answer.lower() in sentence.lower()  # the answer is in its evidence ...
        answer = tokens(item.answer)
        q = tokens(item.question)
        assert not any(q[i : i + len(answer)] == answer for i in range(len(q))), (
            item.question
        )  # ... not in the question
        assert len(q) <= len(tokens(sentence))


def test_answer_aware_rules_invert_the_clause_that_holds_the_answer(answer_aware_set):
    _, result = answer_aware_set
    made = {(i.question, i.answer) for i in result.items}
    # do-support with the verb's lemma, the other clause ("and it was the tallest ...") dropped
    assert ("When did Gustave Eiffel complete the tower?", "1889") in made
    # a passive's agent: the preposition goes in front with "whom"
    assert ("By whom was the tower designed?", "Gustave Eiffel") in made
    # "in March 1889": the preposition goes with the answer; the auxiliary moves before the subject
    assert any(q.startswith("When was the Eiffel Tower completed") and a == "March 1889" for q, a in made)


def test_rejections_are_counted_by_reason_and_bad_candidates_are_not_emitted():
    from rag.synthetic import answer_aware
    from rag.synthetic.nlp import english

    nlp = english()
    # The only answer is the subject of a long predicate: "What automated ..." repeats the sentence: a copy.
    doc = make_doc(
        "copy.txt",
        [
            "The Northern Lighthouse Board automated the lighthouse at Cape Wrath on the north "
            "coast of Scotland in the north of the country."
        ],
    )
    result = generate_qa(
        [doc], None, SynthSettings(passages_per_document=1, passage_chars=(50, 400), question_mix={"answer-aware": 1.0})
    )
    assert all(not is_verbatim(i.question, doc.canonical_text) for i in result.items)
    assert sum(result.rejected.values()) > 0
    # A pronoun left in the question ("When was it completed?") needs a context the asker lacks.
    sent = next(nlp("It was completed in 1889 by the engineers.").sents)
    outcomes = [answer_aware.build(span, kind) for span, kind in answer_aware.candidates(sent)]
    assert "pronoun" in outcomes and not [o for o in outcomes if not isinstance(o, str) and "it" in tokens(o.question)]


def test_keyword_queries_are_a_few_salient_terms_without_stop_words():
    passages = [
        "The keepers of the station at Cape Wrath tested the new foghorn every winter. The foghorn was made in Leith.",
        "The keepers of the station at Muckle Flugga painted the tower white. The station had two cottages.",
        "The keepers of the station at Bell Rock kept a log of storms. The station lay eleven miles offshore.",
    ]
    kw = KeywordQueries(passages)
    terms = kw.terms(passages[0])

    # tf-idf against the other passages: "foghorn" (here only, twice) before "station" and "keepers" (everywhere)
    def rank(word: str) -> int:
        return next(i for i, term in enumerate(terms) if word in term.split())

    assert rank("foghorn") < rank("station") and rank("foghorn") < rank("keepers")
    assert "new foghorn" in terms  # neighbouring content words stay one term
    import random

    stops = stop_words()
    queries = list(kw.queries(passages[0], random.Random(1), min_words=2))
    assert queries
    for query in queries:
        words = query.split()
        assert query == query.lower() and not stops & set(words)
        used = [t for t in terms if set(t.split()) <= set(words)]
        assert 2 <= len(used) <= 6 and sum(len(t.split()) for t in used) == len(words)
        assert set(words) <= set(tokens(passages[0]))


def test_keyword_items_in_a_qa_set():
    docs = [make_doc(f"k{i}.txt") for i in range(2)]
    result = generate_qa(
        docs, None, SynthSettings(passages_per_document=3, passage_chars=(100, 400), question_mix={"keyword": 1.0})
    )
    assert result.items and {i.qtype for i in result.items} == {"keyword"}
    stops = stop_words()
    for item in result.items:
        ev = item.evidence[0]
        passage = {d.doc_id: d for d in docs}[item.doc_id].canonical_text[ev.start : ev.end]
        assert not stops & set(item.question.split()) and not item.question.endswith("?")
        assert set(item.question.split()) <= set(tokens(passage))  # every term is the evidence passage's


def test_the_mix_is_honoured_and_deterministic():
    mix = question_mix.resolve({"answer-aware": 2, "keyword": 1, "inverse-cloze": 1}, has_llm=False)
    assert mix == {"answer-aware": 0.5, "keyword": 0.25, "inverse-cloze": 0.25}
    kinds = question_mix.slot_kinds(mix, 41, seed=7)
    counts = {k: kinds.count(k) for k in mix}
    assert all(abs(counts[k] - mix[k] * 41) <= 1 for k in mix) and sum(counts.values()) == 41
    assert kinds == question_mix.slot_kinds(mix, 41, seed=7) != question_mix.slot_kinds(mix, 41, seed=8)
    # Without an LLM the default favours the user-like kinds; an LLM alone keeps the LLM's types.
    assert question_mix.resolve(None, has_llm=False) == question_mix.DEFAULT_RULE_MIX
    assert question_mix.resolve(None, has_llm=True) == {"llm": 1.0}
    with pytest.raises(ValueError, match="llm_backend"):
        question_mix.resolve({"llm": 1.0}, has_llm=False)
    with pytest.raises(ValueError, match="unknown kinds"):
        SynthSettings(question_mix={"cloze": 1.0})

    docs = [make_doc(f"m{i}.txt") for i in range(6)]
    settings = SynthSettings(
        passages_per_document=3,
        passage_chars=(100, 400),
        question_mix={"keyword": 0.5, "inverse-cloze": 0.5},
        dev_questions=None,  # the dev top-up has its own test
    )
    result = generate_qa(docs, None, settings)
    by_type, slots = result.by_type, result.attempted
    planned = question_mix.slot_kinds(result.mix, slots, settings.seed)
    assert set(by_type) == {"keyword", "inverse-cloze"} and len(result.items) == slots == 18
    for kind in by_type:  # each slot got its planned kind, or gave it to the next kind (counted), nothing else
        moved_out = sum(n for k, n in result.fallbacks.items() if k.startswith(f"{kind}->"))
        moved_in = sum(n for k, n in result.fallbacks.items() if k.endswith(f"->{kind}"))
        assert by_type[kind] == planned.count(kind) - moved_out + moved_in
    assert planned.count("keyword") == 9 and sum(result.fallbacks.values()) <= 3
    assert all(i.qtype == i.source for i in result.items)  # the kind is recorded on every item
    again = generate_qa(docs, None, settings)
    assert [(i.qtype, i.question) for i in again.items] == [(i.qtype, i.question) for i in result.items]
    default = generate_qa(docs, None, SynthSettings(passages_per_document=3, passage_chars=(100, 400)))
    assert default.generator == "answer-aware+keyword+inverse-cloze"
    assert default.by_type.get("answer-aware", 0) >= len(default.items) * 0.3
    assert default.summary["type_keyword"] == default.by_type["keyword"]


class ScriptedLLM:
    name = "scripted"

    def __init__(self):
        self.prompts: list[str] = []

    def complete(self, prompt, *, max_new_tokens=None, stop=None):
        self.prompts.append(prompt)
        return "1889" if prompt.endswith("Answer:") else "In which year was the Eiffel Tower finished?"


def test_with_an_llm_the_llm_types_stay_unless_the_mix_asks_for_more():
    docs = [make_doc("l.txt")]
    settings = dict(passages_per_document=3, passage_chars=(100, 400))
    alone = generate_qa(docs, ScriptedLLM(), SynthSettings(**settings))
    assert alone.generator == "llm:scripted" and alone.items
    assert {i.qtype for i in alone.items} <= {"factual", "interpretation", "long-answer"}
    mixed = generate_qa(docs, ScriptedLLM(), SynthSettings(**settings, question_mix={"llm": 1, "keyword": 2}))
    assert "keyword" in mixed.by_type and mixed.generator.startswith("keyword+llm:scripted")


def test_style_report_on_a_hand_made_example():
    context = "The lighthouse at Cape Wrath was automated in 1998. Keepers had lived there since 1828."
    samples = [
        Sample("cloze", "The lighthouse at Cape Wrath was automated in 1998.", context),  # a copy
        Sample("cloze", "When was the lighthouse at Cape Wrath automated?", context),  # not a copy
        Sample("cloze", "cape wrath keepers salary", context),  # keywords, one word new
        Sample("human", "Who built the lighthouse?", context),
    ]
    figures = report(samples)
    cloze = figures["cloze"]
    assert cloze["n"] == 3 and cloze["copy_share"] == pytest.approx(1 / 3, abs=1e-3)
    # content words present: 5/5, 4/4 (lighthouse cape wrath automated), 3/4 (salary is new)
    assert cloze["mean_overlap"] == pytest.approx((1 + 1 + 0.75) / 3, abs=1e-3)
    assert cloze["mean_words"] == pytest.approx((9 + 8 + 4) / 3, abs=0.05)
    assert cloze["question_form_share"] == pytest.approx(1 / 3, abs=1e-3)
    assert figures["human"] == {
        "n": 1,
        "copy_share": 0.0,
        "mean_overlap": 0.5,
        "mean_words": 4.0,
        "question_form_share": 1.0,
    }


def test_the_qa_set_check_lets_keyword_queries_be_short_and_no_other_kind():
    """A search-box query of two or three words is what people type; a three-word 'question' of another kind is not
    a question. The QA set's blocking check holds each kind to its own floor."""
    import json

    import pandas as pd

    from rag.quality.suites import check_qa_set

    evidence = json.dumps([{"doc_id": "d.txt", "start": 0, "end": 10}])

    def qa_set(qtype: str, question: str) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {
                    "qid": f"q{i}",
                    "question": question if i == 0 else f"which keeper tested the foghorn {i}?",
                    "qtype": qtype if i == 0 else "answer-aware",
                    "doc_id": "d.txt",
                    "evidence_json": evidence,
                    "split": "train",
                }
                for i in range(3)
            ]
        )

    documents = pd.DataFrame([{"doc_id": "d.txt", "n_chars": 100}])
    assert check_qa_set(qa_set("keyword", "cape wrath foghorn"), documents).success
    assert not check_qa_set(qa_set("answer-aware", "who tested it?"), documents).success
    assert not check_qa_set(qa_set("keyword", "foghorn"), documents).success


PLACES = "Oban Durness Wick Thurso Lerwick Portree Ullapool Mallaig Tobermory Stornoway".split()
BOARDS = ["Harbour Trust", "Northern Board", "Island Council", "Marine Office", "Ferry Company"]


def district_paragraphs(doc: int) -> list[str]:
    """Ten paragraphs of document `doc`, each with its own facts: enough passages for a dev top-up."""
    return [
        f"The {PLACES[k]} station of district {doc} opened in {1800 + 7 * k + doc}. About {20 + k + doc} "
        f"engineers from {PLACES[(k + 3) % 10]} worked there for {2 + k % 5} years. It was rebuilt by the "
        f"{BOARDS[(k + doc) % 5]} in {1900 + 3 * k + doc}."
        for k in range(10)
    ]


def test_dev_documents_get_more_questions_for_the_gate_and_the_training_documents_none():
    """A gate cut from a few dozen dev questions cannot see a 3-point change: the dev documents get more passages
    (no copies: copies never decide) until `dev_questions` are not copies; the training questions stay the same."""
    docs = [make_doc(f"g{i}.txt", district_paragraphs(i)) for i in range(5)]
    settings = SynthSettings(passages_per_document=2, passage_chars=(100, 400), dev_questions=None)
    plain = generate_qa(docs, None, settings)
    more = generate_qa(docs, None, settings.model_copy(update={"dev_questions": 8}))

    def of(result, split):
        return [(i.qid, i.qtype, i.question) for i in result.items if i.split == split]

    assert of(more, "train") == of(plain, "train") and of(plain, "train")
    before, after = of(plain, "dev"), of(more, "dev")
    added = after[len(before) :]
    assert after[: len(before)] == before and plain.dev_added == 0
    assert len(added) == more.dev_added == more.summary["dev_added"] > 0
    assert not any(qtype == "inverse-cloze" for _, qtype, _ in added)
    assert sum(qtype != "inverse-cloze" for _, qtype, _ in after) == 8  # up to the target, not beyond
    # The added questions come from passages the first sample did not take.
    first = [i.evidence[0] for i in plain.items if i.split == "dev"]
    for item in more.items[len(plain.items) :]:
        ev = item.evidence[0]
        assert not any(ev.start < f.end and f.start < ev.end for f in first)
    # Past the target of what the passages hold: up to three passes over the 8 passages left and the 2 already asked,
    # then it stops.
    (dev_doc,) = {i.doc_id for i in plain.items if i.split == "dev"}
    most = generate_qa(docs, None, settings.model_copy(update={"dev_questions": 1000}))
    n = settings.questions_per_passage
    assert 8 < most.dev_added <= 3 * 10 * n and {i.doc_id for i in most.items if i.split == "dev"} == {dev_doc}
    assert len({i.question for i in most.items}) == len(most.items)
    # A document of one passage (an abstract) has no other: its own passage gives the gate further questions.
    short = [make_doc(f"s{i}.txt", district_paragraphs(i)[:1]) for i in range(10)]
    one = SynthSettings(passages_per_document=2, passage_chars=(100, 400), dev_questions=None)
    few, topped = generate_qa(short, None, one), generate_qa(short, None, one.model_copy(update={"dev_questions": 50}))
    assert topped.dev_added > 0 and few.dev_added == 0
    assert {i.doc_id for i in topped.items[len(few.items) :]} <= {i.doc_id for i in few.items if i.split == "dev"}
    assert len({i.question for i in topped.items}) == len(topped.items)


def test_a_qa_set_whose_dev_documents_were_topped_up_passes_its_blocking_check():
    """The dev top-up makes most questions dev when the documents are few (or a hundred papers give 4 questions
    each beside 400 dev ones): the QA set's check judges the split by its documents, and still fails one that puts
    every document in dev or none."""
    import pandas as pd

    from rag.evaluation.qaset import to_frame
    from rag.quality.suites import check_qa_set

    docs = [make_doc(f"g{i}.txt", district_paragraphs(i)) for i in range(5)]
    settings = SynthSettings(passages_per_document=2, passage_chars=(100, 400), dev_questions=1000)
    qa = to_frame(generate_qa(docs, None, settings).items)
    documents = pd.DataFrame({"doc_id": [d.doc_id for d in docs], "n_chars": [len(d.canonical_text) for d in docs]})
    assert (qa["split"] == "dev").mean() > 0.5 and qa.groupby("doc_id").size().nunique() > 1
    assert check_qa_set(qa, documents).success
    for broken in ("dev", "train"):
        assert not check_qa_set(qa.assign(split=broken), documents).success
