"""The serving configuration learner's pieces (rag.training.configuration): people's passages as document spans any
chunk set can be judged by, corrected answers located in the documents, corrections weighted for the failures they
stand for, the search's choice, and serving that follows a promoted configuration unless an operator pinned a field.
The whole loop (sensor, retrain_job, gate, promotion, serving) runs in tests/test_loop_bench.py."""

from types import SimpleNamespace

import pandas as pd

from rag.training.answers import answer_spans
from rag.training.configuration import (
    ConfigurationSpace,
    Judged,
    PassageSpans,
    ServingConfiguration,
    choose,
    judged_questions,
)

DOCUMENTS = {
    "a.md": "Kestrel Group report.\n\nRevenue reached 412,118 thousand pounds this year.\n\nStaff: 2,310 people.",
    "b.md": "Bramble Group report.\n\nRevenue reached 377,902 thousand pounds this year.\n\nFounded in 1911.",
}


def chunks(strategy: str) -> pd.DataFrame:
    rows = []
    for doc, text in DOCUMENTS.items():
        if strategy == "whole-document":
            pieces = [(0, len(text))]
        else:
            pieces, start = [], 0
            for part in text.split("\n\n"):
                at = text.index(part, start)
                pieces.append((at, at + len(part)))
                start = at + len(part)
        rows += [
            {"chunk_id": f"{strategy}:{doc}:{s}", "doc_id": doc, "text": text[s:e], "char_start": s, "char_end": e}
            for s, e in pieces
        ]
    return pd.DataFrame(rows)


def test_a_rated_passage_is_relevant_in_any_chunk_set_that_holds_it():
    locate = PassageSpans(
        by_text={"Revenue reached 412,118 thousand pounds this year.": [("a.md", 23, 74)]}, documents=DOCUMENTS
    )
    (span,) = locate.spans("Revenue  reached 412,118 thousand pounds\nthis year.")  # spacing aside
    assert (span.doc_id, span.start, span.end) == ("a.md", 23, 74)
    judged = Judged(queries={"q": "What was Kestrel's revenue?"}, spans={"q": [span]})
    assert judged.qrels(chunks("paragraph")) == {"q": {"paragraph:a.md:23": 1}}
    assert judged.qrels(chunks("whole-document")) == {"q": {"whole-document:a.md:0": 1}}
    # A passage of a chunk set since re-chunked is found in the documents' text.
    assert locate.spans("Staff: 2,310 people.")[0].doc_id == "a.md"


def test_a_corrected_answer_marks_where_it_occurs_unless_it_is_everywhere():
    (found,) = answer_spans("412,118 thousand  pounds", DOCUMENTS)
    assert found.doc_id == "a.md" and DOCUMENTS["a.md"][found.start : found.end] == "412,118 thousand pounds"
    assert answer_spans("yes", DOCUMENTS) == []  # too short to name a passage
    many = {f"{i}.md": "Revenue reached a record this year." for i in range(5)}
    assert answer_spans("a record this year", many) == []  # in more documents than MAX_ANSWER_DOCUMENTS


def test_each_located_correction_stands_for_the_failures_of_its_side():
    split = SimpleNamespace(
        positives=[("What was Kestrel's revenue?", "Revenue reached 412,118 thousand pounds this year.")],
        corrections=[("When was Bramble founded?", "1911.")],
        failed_questions=4,  # four questions production failed on this side; people corrected one
        dev_queries={},
        dev_qrels={},
        dev_passages={},
        dev_corrections={},
        dev_failed_questions=0,
    )
    locate = PassageSpans(by_text={}, documents=DOCUMENTS)
    train, held = judged_questions(split, locate)
    weights = {train.queries[k]: train.weights.get(k, 1.0) for k in train.queries}
    assert weights == {"What was Kestrel's revenue?": 1.0, "When was Bramble founded?": 4.0}
    assert len(held) == 0
    table = pd.DataFrame({"qid": list(train.queries), "ndcg@10": [1.0, 0.0]})
    assert train.weight_of(table).tolist() == [0.4, 1.6]  # scaled to a mean of 1


def test_the_search_keeps_production_on_a_tie_and_offers_the_grid():
    production = ServingConfiguration(strategy="paragraph", mode="hybrid-cc", alpha=0.5)
    tied = pd.DataFrame(
        [
            {"strategy": "fixed-512", "mode": "bm25", "alpha": 0.5, "ndcg@10": 0.8, "mrr@10": 0.7},
            {"strategy": "paragraph", "mode": "hybrid-cc", "alpha": 0.5, "ndcg@10": 0.8, "mrr@10": 0.7},
        ]
    )
    assert choose(tied, production) == production
    better = tied.assign(**{"ndcg@10": [0.9, 0.8]})
    assert choose(better, production).label == "fixed-512 · bm25"
    grid = ConfigurationSpace().grid(["paragraph"])
    assert len(grid) == 8 and {c.mode for c in grid} == {"bm25", "dense", "hybrid-cc", "hybrid-rrf"}


def test_serving_follows_the_production_configuration_unless_a_field_is_pinned(tmp_path):
    from rag.qa import AnswerSettings
    from rag.registry import ModelRegistry
    from rag.training.configuration import served_settings

    registry = ModelRegistry(tmp_path / "models")
    base = AnswerSettings()
    assert served_settings(base, registry) == base  # nothing promoted: the server's own settings
    folder = tmp_path / "cfg"
    ServingConfiguration(strategy="whole-document", mode="bm25").save(folder)
    mv = registry.register("configuration", folder, {"base_model": "serving", "family": "serving"})
    registry.set_alias("configuration", "production", mv.version)
    assert mv.name == "cfg-serving-v1"
    served = served_settings(base, registry)
    assert (served.strategy, served.mode) == ("whole-document", "bm25")
    pinned = served_settings(base, registry, pinned={"strategy"})
    assert (pinned.strategy, pinned.mode) == (base.strategy, "bm25")


def test_a_configuration_canary_is_served_from_its_own_chunk_set_and_settings(tmp_path, monkeypatch):
    """canary_router opens a configuration candidate's arm over its chunk set with its retrieval settings, on top of
    what production serves; a server that pins a field the configuration sets ignores the canary."""
    from rag.qa import AnswerSettings
    from rag.registry import ModelRegistry
    from rag.serving import server

    registry = ModelRegistry(tmp_path / "models")
    folder = tmp_path / "cfg"
    ServingConfiguration(strategy="whole-document", mode="bm25").save(folder)
    candidate = registry.register("configuration", folder, {"base_model": "serving", "family": "serving"})
    opened = []
    monkeypatch.setattr(server, "serving_index", lambda settings, **kw: opened.append((settings, kw)) or "arm")
    production = AnswerSettings(model="production", top_k=10)
    served = SimpleNamespace(settings=lambda: production, pinned=frozenset(), current=lambda: None)
    router = server.canary_router(served, root=tmp_path)
    assert router.refuses("configuration", None) is None
    assert router.open_arm("configuration", candidate) == "arm"
    ((settings, options),) = opened
    assert (settings.strategy, settings.mode) == ("whole-document", "bm25")
    assert (settings.top_k, settings.model) == (10, "production")  # the rest as production serves
    assert options["lock_wait_seconds"] == 5.0
    pinned = SimpleNamespace(settings=lambda: production, pinned=frozenset({"strategy"}), current=lambda: None)
    assert "pins strategy" in server.canary_router(pinned, root=tmp_path).refuses("configuration", None)


def test_a_configuration_is_judged_on_what_the_answer_reads():
    """The first top_k passages, fewer when they overflow the context budget (the best always stays): a chunk set of
    whole documents cannot win on passages the prompt never holds."""
    from rag.training.configuration import ReadBudget

    budget = ReadBudget(top_k=3, max_chars=1000)
    sizes = {"a": 400, "b": 500, "c": 300, "d": 10, "huge": 5000}
    assert budget.cut(["a", "b", "c", "d"], sizes.get) == ["a", "b"]  # c would overflow 1,000 characters
    assert budget.cut(["d", "a", "b", "c"], sizes.get) == ["d", "a", "b"]  # top_k 3
    assert budget.cut(["huge", "a"], sizes.get) == ["huge"]  # the best stays, alone
    assert budget.cut([], sizes.get) == []
    # How much of each is read: all of it, but a passage alone over the budget only up to the cut.
    assert budget.chars_read(["a", "b"], sizes.get) == {"a": 400, "b": 500}
    assert budget.chars_read(["huge"], sizes.get) == {"huge": 1000}


def test_a_whole_document_holding_the_answer_past_the_cut_is_no_hit():
    """A whole document cut to the context budget answers only when the answer is before the cut: judged as a chunk,
    it held every answer of its document, and on ConditionalQA's long pages a whole-document configuration passed
    its gate "significantly better" on that alone."""
    from rag.evaluation.qaset import NOT_RELEVANT_IN_CONTEXT, Evidence
    from rag.training.configuration import Judged, ReadBudget

    judged = Judged(
        queries={"early": "q1", "late": "q2"},
        spans={
            "early": [Evidence(doc_id="d", start=200, end=260)],
            "late": [Evidence(doc_id="d", start=4000, end=4060)],
        },
    )
    budget, length = ReadBudget(top_k=5, max_chars=1000), {"d#whole": 9000, "d#p4": 900}.get
    starts = {"d#whole": ("d", 0, 9000), "d#p4": ("d", 3600, 4500)}
    whole = {q: budget.chars_read(budget.cut(["d#whole"], length), length) for q in judged.queries}
    run = judged.read_run(whole, starts, depth=10)
    assert list(run["early"]) == ["d#whole"]  # the answer lies in the first 1,000 characters read
    assert list(run["late"]) == ["d#whole" + NOT_RELEVANT_IN_CONTEXT]  # past the cut: read, but no hit
    paragraph = judged.read_run({"late": budget.chars_read(["d#p4"], length)}, starts, depth=10)
    assert list(paragraph["late"]) == ["d#p4"]  # the paragraph holding it, read whole
