"""Answer pipeline: steps, prompt assembly, citation parsing, attribution windows, generators, the Answerer on a
tiny index and on the sample corpus (citations with document and page; "not in context"), table QA, `rag ask`."""

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rag.embedding import load_embedder
from rag.index.bm25 import BM25Index
from rag.index.qdrant import QdrantSettings, close_client, get_client
from rag.index.sync import sync_bm25, sync_collection
from rag.llm.testing import FakeLLM
from rag.qa import NOT_IN_CONTEXT, Answerer, AnswerSettings
from rag.qa.attribution import CrossEncoderScorer, attribute, passage_scores, passage_sentences, window_pairs, windows
from rag.qa.generators import ExtractiveGenerator
from rag.qa.parse import parse_answer
from rag.qa.prompt import build_messages, fit_context, label_passages, passage_text
from rag.qa.steps import augment_prev_next, filter_hits, reorder_long_context
from rag.retrieval import Hit, Index

REPO = Path(__file__).resolve().parents[1]

# Three chunks of one document in a row (prev/next linked) and two loose ones.
TEXTS = {
    "oven-1": "Bread is baked from flour, water, yeast and salt.",
    "oven-2": "The dough rests for two hours before it goes into the oven at 230 degrees.",
    "oven-3": "After forty minutes the loaf is cooled on a rack.",
    "cats": "Cats are small domesticated felines that purr and chase mice.",
    "rockets": "Rockets burn fuel to reach orbit and launch satellites into space.",
}


def chunk_table(texts: dict[str, str]) -> pd.DataFrame:
    order = ["oven-1", "oven-2", "oven-3"]
    rows = []
    for cid, text in texts.items():
        i = order.index(cid) if cid in order else None
        rows.append(
            {
                "chunk_id": cid,
                "doc_id": "bread.pdf" if i is not None else f"{cid}.pdf",
                "strategy": "t",
                "text": text,
                "char_start": 0 if i is None else i * 100,
                "char_end": len(text) if i is None else i * 100 + len(text),
                "page_start": 1 if i is None else i + 1,
                "page_end": 1 if i is None else i + 1,
                "section_path": [],
                "prev_chunk_id": order[i - 1] if i else None,
                "next_chunk_id": order[i + 1] if i is not None and i < 2 else None,
                "n_tokens": len(text.split()),
                "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                "table_html": None,
            }
        )
    return pd.DataFrame(rows)


def hit(cid: str, rank: int, score: float = 1.0, **extra) -> Hit:
    return Hit(
        rank,
        score,
        {
            "chunk_id": cid,
            "doc_id": "d.pdf",
            "text": TEXTS.get(cid, cid),
            "page_start": 1,
            "page_end": 1,
            "char_start": 0,
            "char_end": 10,
            "table_html": None,
            **extra,
        },
    )


# --- steps -----------------------------------------------------------------------------------------------------
def test_filter_by_top_k_and_min_score():
    hits = [hit("a", 1, 0.9), hit("b", 2, 0.5), hit("c", 3, 0.4)]
    assert [h.chunk["chunk_id"] for h in filter_hits(hits, top_k=2)] == ["a", "b"]
    assert [h.chunk["chunk_id"] for h in filter_hits(hits, min_score=0.45)] == ["a", "b"]
    assert [h.rank for h in filter_hits(hits, top_k=1, min_score=0.1)] == [1]


def test_long_context_reorder_puts_the_best_at_both_ends():
    assert [h.rank for h in reorder_long_context([hit(str(i), i) for i in range(1, 6)])] == [1, 3, 5, 4, 2]
    assert [h.rank for h in reorder_long_context([hit(str(i), i) for i in range(1, 5)])] == [1, 3, 4, 2]
    assert reorder_long_context([]) == []


def test_prev_next_adds_neighbours_once():
    chunks = chunk_table(TEXTS).set_index("chunk_id")
    index = Index(chunks, None, None, None, None)
    record = index.record
    hits = [Hit(1, 0.9, record("oven-2")), Hit(2, 0.5, record("cats")), Hit(3, 0.4, record("oven-3"))]
    out = augment_prev_next(index, hits)
    # oven-1 rides along before oven-2; oven-3 is a hit itself so it keeps its own place; cats has no neighbours
    assert [h.chunk["chunk_id"] for h in out] == ["oven-1", "oven-2", "cats", "oven-3"]
    assert [h.rank for h in out] == [1, 2, 3, 4]
    assert out[0].chunk["neighbour_of"] == "oven-2" and out[0].score == 0.9


# --- prompt ----------------------------------------------------------------------------------------------------
def test_prompt_has_role_task_context_with_ids_question_and_the_fixed_fallback():
    passages = label_passages([hit("oven-2", 1, page_start=3, page_end=4), hit("cats", 2)])
    system, user = build_messages("How hot is the oven?", passages)
    assert system["role"] == "system" and "assistant" in system["content"]
    text = user["content"]
    assert "cite the passages" in text and NOT_IN_CONTEXT in text
    assert "[1] (d.pdf, pages 3-4)\nThe dough rests" in text and "[2] (d.pdf, page 1)\nCats are" in text
    assert text.index("Context:") < text.index("Question: How hot is the oven?") and text.endswith("Answer:")
    closed = build_messages("How hot is the oven?", None)[1]["content"]
    assert "Context" not in closed and NOT_IN_CONTEXT in closed


def test_table_rows_reach_the_prompt_as_html():
    chunk = {
        "chunk_id": "t",
        "doc_id": "x.pdf",
        "page_start": 6,
        "page_end": 6,
        "text": "Estimated costs\nLabor cost | Parts cost\n$85 | $3,790\nSee above.",
        "table_html": (
            "<table><tr><th>Labor cost</th><th>Parts cost</th></tr><tr><td>$85</td><td>$3,790</td></tr></table>"
        ),
    }
    assert passage_text(chunk) == "Estimated costs\n" + chunk["table_html"] + "\nSee above."
    assert "Labor cost | Parts cost" not in build_messages("q", label_passages([Hit(1, 1.0, chunk)]))[1]["content"]


def test_context_budget_drops_the_lowest_ranked_whole_passages():
    hits = [hit("x" * 50, 2), hit("y" * 50, 1), hit("z" * 50, 3)]
    kept = fit_context(hits, max_chars=110)
    assert [h.rank for h in kept] == [2, 1]  # order kept, the lowest-scoring (all tie: rank 3) dropped
    scored = [
        Hit(1, 0.9, {**hit("a" * 50, 1).chunk}),
        Hit(2, 0.9, {**hit("b" * 50, 2).chunk}),
        Hit(3, 0.5, {**hit("c" * 50, 3).chunk}),
    ]
    assert [h.rank for h in fit_context(scored, max_chars=110)] == [1, 2]
    alone = fit_context([hit("w" * 500, 1)], max_chars=200)
    assert len(alone[0].chunk["text"]) == 200


# --- parsing messy output --------------------------------------------------------------------------------------
LABELS = {"1": "c-one", "2": "c-two", "3": "c-three"}


@pytest.mark.parametrize(
    "raw, answer, cited",
    [
        ("Answer: Paris is the capital [1][3].\nQuestion: and Rome?", "Paris is the capital.", ["c-one", "c-three"]),
        ("  It is 5 (2). [Passage 2, 3]", "It is 5.", ["c-two", "c-three"]),
        ("Bob [1 and 2].", "Bob.", ["c-one", "c-two"]),
        ("It was built in (1990) [sic] [7].", "It was built in (1990) [sic].", []),  # [7] was never shown
        ("The loaf [c-two] cools.", "The loaf cools.", ["c-two"]),  # a full chunk id
        ('"Forty minutes [source: 3]"', "Forty minutes", ["c-three"]),
        (
            "[3] (Amazon_rainforest#5, page 1)\nThe answer is 5 million [2].",
            "The answer is 5 million.",
            ["c-three", "c-two"],
        ),
        ("The answer is: It cools [1] (bread.pdf, pages 2-3).", "It cools.", ["c-one"]),
    ],
)
def test_citations_are_parsed_from_messy_output(raw, answer, cited):
    parsed = parse_answer(raw, LABELS)
    assert (parsed.answer, parsed.cited_chunk_ids, parsed.not_in_context) == (answer, cited, False)


@pytest.mark.parametrize(
    "raw",
    [
        NOT_IN_CONTEXT,
        "the answer is not in the provided documents [1]",
        "",
        "The answer is: [1] [2]",
        "The context does not mention the oven.",
        "I don't know.",
    ],
)
def test_not_in_context_in_its_variants(raw):
    parsed = parse_answer(raw, LABELS)
    assert parsed.not_in_context and parsed.answer == NOT_IN_CONTEXT and parsed.cited_chunk_ids == []


# --- attribution -----------------------------------------------------------------------------------------------
def test_attribution_windows_follow_the_thesis_sizes():
    assert windows(["a", "b", "c"], 2) == [(0, 2), (1, 3)]
    assert windows(["a"], 3) == [(0, 1)]
    # 1 answer sentence, 1 passage sentence: every size collapses to the one whole-text pair
    assert window_pairs(1, 1) == [((0, 1), (0, 1))]
    # 2 answer sentences (w_a = 2 only: one window), 3 passage sentences: w_p = 2 gives (0,2),(1,3); w_p >= 3 the whole
    assert window_pairs(2, 3) == [((0, 2), (0, 2)), ((0, 2), (0, 3)), ((0, 2), (1, 3))]
    # w_a = 3 answer windows never meet passage windows shorter than 3
    pairs = window_pairs(3, 10)
    assert all(p[1] - p[0] >= a[1] - a[0] for a, p in pairs)
    assert max(p[1] - p[0] for _, p in pairs) == 8 and {a for a, _ in pairs} == {(0, 2), (1, 3), (0, 3)}


class WordOverlap:
    """Jaccard of word sets: a transparent stand-in for a scorer."""

    name = "overlap"

    def score_pairs(self, queries, passages, pairs):
        words = lambda w: set(" ".join(w).lower().replace(".", "").split())  # noqa: E731
        return np.array(
            [
                len(words(queries[i]) & words(passages[j])) / len(words(queries[i]) | words(passages[j]))
                for i, j in pairs
            ]
        )


def test_attribution_scores_the_best_window_and_keeps_top_k_above_threshold():
    answer = "The dough rests two hours. It bakes at 230 degrees."
    passages = [
        "Salt is added. The dough rests two hours. It bakes at 230 degrees. Nothing else.",
        "Cats purr.",
        "It bakes at 230 degrees.",
    ]
    scores = passage_scores(answer, passages, WordOverlap())
    assert scores[0] == pytest.approx(1.0)  # the 2-sentence window matching the answer exactly
    assert scores[1] == 0.0
    picked, _ = attribute(answer, passages, WordOverlap(), top_k=1, threshold=0.3)
    assert picked == [0]
    assert attribute(answer, passages, WordOverlap(), top_k=3, threshold=0.3)[0] == [0, 2]


def test_cross_encoder_scorer_uses_the_reranker_protocol_and_squashes_logits():
    class FakeReranker:
        name = "fake-ce"
        scale = "logit"

        def __init__(self):
            self.calls = []

        def score(self, query, passages):
            self.calls.append((query, passages))
            return np.array([4.0 if "230" in p else -4.0 for p in passages])

    reranker = FakeReranker()
    picked, scores = attribute(
        "It bakes at 230 degrees.", ["It bakes at 230 degrees.", "Cats purr."], CrossEncoderScorer(reranker)
    )
    assert picked == [0] and scores[0] == pytest.approx(1 / (1 + np.exp(-4.0))) and scores[1] < 0.5
    assert reranker.calls[0][0] == "It bakes at 230 degrees."


def test_logits_are_squashed_in_every_batch_and_probabilities_never():
    from rag.rerank import probabilities

    class Logits:
        name, scale = "logit-ce", "logit"

    class Probabilities:
        name, scale = "prob-ce", "probability"

    # Logits that happen to fall inside [0, 1] are still logits: 0.4 means sigmoid(0.4), as in any other batch.
    assert probabilities(Logits(), [0.4, 0.9]) == pytest.approx(1 / (1 + np.exp(-np.array([0.4, 0.9]))))
    assert probabilities(Logits(), [0.4, 3.0])[0] == pytest.approx(1 / (1 + np.exp(-0.4)))
    assert probabilities(Probabilities(), [0.4, 0.9]) == pytest.approx([0.4, 0.9])
    with pytest.raises(ValueError, match="outside \\[0, 1\\].*scale = 'logit'"):
        probabilities(Probabilities(), [0.4, 3.0])


def test_passage_sentences_join_wrapped_lines_and_keep_table_rows_apart():
    text = "The proposed AD would require\ninstalling new software. It costs\nmoney.\nLabor | Parts\n$85 | $0"
    assert passage_sentences(text) == [
        "The proposed AD would require installing new software.",
        "It costs money.",
        "Labor | Parts",
        "$85 | $0",
    ]


# --- the Answerer on a tiny index ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wordllama():
    return load_embedder("wordllama")


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory, wordllama):
    root = tmp_path_factory.mktemp("tiny")
    settings = QdrantSettings(path=str(root / "qdrant"))
    chunks = chunk_table(TEXTS)
    run = sync_collection(get_client(settings), chunks, wordllama, strategy="t", model="wordllama")
    sync_bm25(chunks, root / "bm25")
    yield Index(chunks.set_index("chunk_id"), BM25Index.load(root / "bm25"), get_client(settings), run.alias, wordllama)
    close_client(settings)


def tiny_settings(**kw) -> AnswerSettings:
    return AnswerSettings(**{"strategy": "t", "model": "wordllama", "mode": "hybrid-rrf", "top_k": 3, **kw})


def test_extractive_answer_cites_its_passage(tiny_index):
    result = Answerer(tiny_settings(), index=tiny_index).ask("At how many degrees does the dough go into the oven?")
    assert not result.not_in_context
    assert "230 degrees" in result.answer and result.cited_chunk_ids == ["oven-2"]
    assert "oven-2" in result.attributed_chunk_ids
    cited = [c for c in result.chunks if c["cited"]]
    assert cited[0]["doc_id"] == "bread.pdf" and cited[0]["page_start"] == 2
    assert set(result.timings_ms) == {"retrieve", "rerank", "generate", "attribute", "total"}
    assert result.latency_ms == result.timings_ms["total"] > 0


def test_extractive_says_not_in_context_for_an_unrelated_question(tiny_index):
    result = Answerer(tiny_settings(), index=tiny_index).ask("Who won the football world cup in 2014?")
    assert result.not_in_context and result.answer == NOT_IN_CONTEXT and result.cited_chunk_ids == []


def test_extractive_generator_needs_support_not_just_similarity(wordllama):
    passages = label_passages([hit("cats", 1)])
    gen = ExtractiveGenerator(wordllama, min_support=0.5)
    assert gen.generate("Which animals purr and chase mice?", passages).parsed.cited_chunk_ids == ["cats"]
    # nearest sentence exists, but "dogs bark loudly" shares no term with the passage
    assert gen.generate("Why do dogs bark loudly?", passages).parsed.not_in_context


def test_llm_answer_with_prev_next_long_context_and_reflection(tiny_index):
    def reply(messages):
        prompt = messages[-1]["content"]
        if "Draft answer:" in prompt:
            return "At 230 degrees [2], after resting two hours [2]."
        return "Answer: 230 degrees [2][9]\nQuestion: what else"

    llm = FakeLLM(reply, name="fake:oven")
    settings = tiny_settings(generator="llm", prev_next=True, prompt_order="long-context", reflect=True, top_k=1)
    result = Answerer(settings, llm=llm, index=tiny_index).ask("At how many degrees does the dough go into the oven?")
    prompt = llm.calls[0]["input"][-1]["content"]
    # top-1 is oven-2; its neighbours come along on either side, in reading order
    assert [(c["label"], c["chunk_id"]) for c in result.chunks] == [("1", "oven-1"), ("2", "oven-2"), ("3", "oven-3")]
    assert result.cited_chunk_ids == ["oven-2"]  # [9] was never shown
    assert "[1] (bread.pdf, page" in prompt and "Question: At how many degrees" in prompt
    assert result.answer == "At 230 degrees, after resting two hours." and result.draft == "230 degrees"
    assert result.generator == "llm:fake:oven" and llm.call_count == 2


def test_long_context_order_reaches_the_prompt(tiny_index):
    llm = FakeLLM("Forty minutes [1].")
    result = Answerer(tiny_settings(generator="llm", prompt_order="long-context"), llm=llm, index=tiny_index).ask(
        "bread dough oven loaf"
    )
    assert [c["rank"] for c in result.chunks] == [1, 3, 2]
    prompt = llm.calls[0]["input"][-1]["content"]
    first, last = result.chunks[0]["text"], result.chunks[-1]["text"]
    assert prompt.index(first) < prompt.index(result.chunks[1]["text"]) < prompt.index(last)


def test_no_retrieval_baseline_asks_closed_book(tiny_index):
    llm = FakeLLM("Paris.")
    result = Answerer(tiny_settings(generator="llm", mode="none"), llm=llm, index=tiny_index).ask("Capital of France?")
    assert result.answer == "Paris." and result.chunks == [] and "Context" not in llm.calls[0]["input"][-1]["content"]
    extractive = Answerer(tiny_settings(mode="none"), index=tiny_index).ask("Capital of France?")
    assert extractive.not_in_context


def test_reranker_reorders_before_filtering(tiny_index):
    class PreferRockets:
        name = "rockets-first"

        def score(self, query, passages):
            return np.array([1.0 if "Rockets" in p else 0.0 for p in passages])

    result = Answerer(
        tiny_settings(top_k=1, generator="llm"), llm=FakeLLM("Orbit [1]."), index=tiny_index, reranker=PreferRockets()
    ).ask("What is baked from flour?")
    assert [c["chunk_id"] for c in result.chunks] == ["rockets"]


def test_a_server_hands_a_remembering_reranker_the_index_passages_before_the_first_question(tiny_index):
    import threading

    class Remembering:
        name = "remembering"

        def __init__(self):
            self.warmed, self.done = [], threading.Event()

        def warm(self, passages):
            self.warmed = list(passages)
            self.done.set()
            return len(self.warmed)

        def score(self, query, passages):
            return np.zeros(len(passages))

    reranker = Remembering()
    answerer = Answerer(tiny_settings(), index=tiny_index, reranker=reranker)
    assert not reranker.done.is_set()  # building alone warms nothing: a one-question `rag ask` would pay for it
    answerer.warm_reranker_in_background()
    assert reranker.done.wait(30)  # in a thread: the caller does not wait for it
    assert sorted(reranker.warmed) == sorted(tiny_index.chunks["text"].astype(str))


def test_a_reranker_canary_arm_warms_its_candidate_before_its_first_timed_request(tiny_index, monkeypatch, tmp_path):
    import threading

    import rag.qa.pipeline as pipeline
    from rag.serving.server import RerankerArm

    warmed = threading.Event()

    class Candidate:
        name = "candidate"

        def warm(self, passages):
            warmed.set()
            return len(list(passages))

        def score(self, query, passages):
            return np.zeros(len(passages))

    monkeypatch.setattr(pipeline, "load_reranker_spec", lambda spec, root: Candidate())
    production = Answerer(tiny_settings(), index=tiny_index)
    arm = RerankerArm(lambda: production, "candidate", tmp_path)
    assert arm.current().reranker is arm.reranker and warmed.wait(30)


def test_bad_settings_fail_clearly(tiny_index):
    with pytest.raises(ValueError, match="unknown retrieval mode"):
        Answerer(tiny_settings(mode="telepathy"), index=tiny_index)
    with pytest.raises(ValueError, match="needs an LLM"):
        Answerer(tiny_settings(generator="llm", llm={"backend": "none"}), index=tiny_index)
    with pytest.raises(ValueError, match="empty"):
        Answerer(tiny_settings(), index=tiny_index).ask("  ")


# --- the sample corpus: citations with document and page, "not in context", tables ----------------------------
@pytest.fixture(scope="module")
def sample_root(tmp_path_factory):
    from rag.pipeline import index_folder

    root = tmp_path_factory.mktemp("sample") / "data"
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    index_folder(REPO / "sample_corpus", root, strategies=["paragraph"], models=["wordllama"], qdrant=qdrant)
    yield root, qdrant
    close_client(qdrant)


@pytest.fixture(scope="module")
def sample_answerer(sample_root):
    root, qdrant = sample_root
    return Answerer(AnswerSettings(strategy="paragraph", model="wordllama"), root=root, qdrant=qdrant)


def test_sample_corpus_answer_cites_document_and_page(sample_answerer):
    result = sample_answerer.ask("Which flight control computer software must be installed on the airplanes?")
    assert not result.not_in_context and "flight control computer (FCC) software" in result.answer
    source = result.sources()[0]
    assert source["cited"] and source["doc_id"] == "federal-register-2020-17221.pdf" and source["page_start"] == 1


def test_sample_corpus_lead_in_is_answered_with_its_list(sample_answerer):
    """The issue's example: the lead-in ends its chunk and the required actions are the next chunks' list items."""
    result = sample_answerer.ask("What does the proposed AD require?")
    lead_in, *items = result.answer.split("\n\n")
    assert lead_in.endswith("would require the following actions:")
    assert items[0] == "\u2022 Installing new FCC OPS software and doing a software installation verification."
    assert items[1].startswith("\u2022 Revising the existing AFM") and all(i.startswith("\u2022 ") for i in items)
    shown = {c["chunk_id"]: c for c in result.chunks}
    assert len(result.cited_chunk_ids) > 1 and all(cid in shown for cid in result.cited_chunk_ids)
    assert all(shown[cid]["cited"] for cid in result.cited_chunk_ids)


@pytest.mark.parametrize(
    "question",
    [
        "What is the boiling point of liquid nitrogen?",
        "Who painted the Mona Lisa?",
        "How do I bake sourdough bread at home?",
    ],
)
def test_sample_corpus_out_of_corpus_questions_get_not_in_context(sample_answerer, question):
    result = sample_answerer.ask(question)
    assert result.not_in_context and result.answer == NOT_IN_CONTEXT


# Hand-verified against federal-register-2020-17221.pdf pages 5-6 (the "Estimated costs" tables): labour is
# billed at $85 per work-hour; the row of the page-6 table gives parts up to $3,790 and up to $10,505 per product.
@pytest.mark.parametrize(
    "question, expected",
    [("What is the labor rate per hour?", "$85 per hour"), ("What is the parts cost per product?", "Up to $3,790")],
)
def test_table_qa_extractive_finds_the_row(sample_answerer, question, expected):
    result = sample_answerer.ask(question)
    assert expected in result.answer
    cited = [c for c in result.chunks if c["cited"]][0]
    assert cited["doc_id"] == "federal-register-2020-17221.pdf" and cited["page_start"] in (5, 6)


def test_table_chunks_reach_the_llm_as_html(sample_root):
    root, qdrant = sample_root
    llm = FakeLLM("The total is 2,236,457 [1].")
    settings = AnswerSettings(strategy="paragraph", model="wordllama", mode="bm25", generator="llm", top_k=3)
    result = Answerer(settings, llm=llm, root=root, qdrant=qdrant).ask(
        "NICS firearm background checks totals November 2015"
    )
    prompt = llm.calls[0]["input"][-1]["content"]
    tables = [c for c in result.chunks if c["table_html"]]
    # The title set in the table's first row is its caption, not its header: the column labels are.
    assert tables and "<table><tr><th>State / Territory</th><th>Permit</th><th>Handgun</th>" in prompt
    assert "<th>NICS Firearm" not in prompt
    assert "<td>2,236,457</td>" in prompt or "<td>Totals</td>" in prompt


def test_rag_ask_cli(sample_root, monkeypatch, capsys, tmp_path):
    from rag.qa.cli import cmd_ask
    import argparse

    root, qdrant = sample_root
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    monkeypatch.setenv("RAG_QDRANT_PATH", qdrant.path)
    config = tmp_path / "answer.yaml"
    config.write_text("strategy: paragraph\nmodel: wordllama\ntop_k: 4\n")
    args = argparse.Namespace(
        question="Which flight control computer software must be installed on the airplanes?",
        config=config,
        strategy=None,
        model=None,
        mode=None,
        reranker=None,
        generator=None,
        top_k=None,
        json=True,
    )
    assert cmd_ask(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cited_chunk_ids"] and out["settings"]["top_k"] == 4 and not out["not_in_context"]
    # --json names what answered; the config sets no mode, so the default (hybrid-cc) and the production reranker
    # (none promoted: retrieval order) serve.
    assert out["served"] == {
        "embedder": "wordllama",
        "query_encoder": "embedder",  # WordLlama has no int8 twin: it encodes its questions itself
        "reranker": "none",
        "mode": "hybrid-cc",
        "strategy": "paragraph",
        "model": "wordllama",
        "reranker_spec": "production",
    }
    config.write_text("strategy: paragraph\nmodel: wordllama\ntypo_field: 1\n")
    with pytest.raises(ValueError, match="invalid answer settings"):
        cmd_ask(args)
    # Without --config, the applied (active) configuration serves the question.
    from rag.tuning.active import apply_configuration

    best = tmp_path / "best_config.yaml"
    best.write_text("strategy: paragraph\nmodel: wordllama\nmode: bm25\ntop_k: 2\n")
    apply_configuration(best, root, reason="test")
    assert cmd_ask(argparse.Namespace(**{**vars(args), "config": None})) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["mode"] == "bm25" and out["settings"]["top_k"] == 2 and out["served"]["mode"] == "bm25"


def test_attribution_uses_the_registered_production_cross_encoder(tiny_index, tmp_path, monkeypatch):
    import rag.rerank

    class Registered:
        name, scale = "ce-test", "logit"

        def score(self, query, passages):
            return np.array([3.0 if "230" in p else -3.0 for p in passages])

    asked = []
    monkeypatch.setattr(rag.rerank, "load_reranker", lambda spec, registry=None: asked.append(spec) or Registered())
    answerer = Answerer(tiny_settings(), index=tiny_index, root=tmp_path)
    assert asked == ["production"] and answerer.attribution_scorer.name == "cross-encoder:ce-test"
    result = answerer.ask("At how many degrees does the dough go into the oven?")
    assert result.attributed_chunk_ids == ["oven-2"]
    # nothing registered (None) → embedding similarity
    monkeypatch.setattr(rag.rerank, "load_reranker", lambda spec, registry=None: None)
    assert Answerer(tiny_settings(), index=tiny_index, root=tmp_path).attribution_scorer.name == "embedding:wordllama"


def test_a_broken_production_cross_encoder_falls_back_and_says_so(tiny_index, tmp_path, monkeypatch, caplog):
    import rag.rerank

    def broken(spec, registry=None):
        raise OSError("model.safetensors is truncated")

    monkeypatch.setattr(rag.rerank, "load_reranker", broken)
    with caplog.at_level("WARNING"):
        answerer = Answerer(tiny_settings(), index=tiny_index, root=tmp_path)
    assert answerer.attribution_scorer.name == "embedding:wordllama"
    assert "failed to load" in caplog.text and "truncated" in caplog.text
    result = answerer.ask("At how many degrees does the dough go into the oven?")
    assert result.attribution_scorer == "embedding:wordllama"
    assert len(result.warnings) == 1 and "production reranker failed to load" in result.warnings[0]


def test_answer_evaluation_asset_bakeoff(sample_root, monkeypatch):
    from dagster import materialize

    from assets.answers import answer_evaluation
    from rag.evaluation.qaset import Evidence, QAItem, to_frame
    from rag.store import DOCUMENTS_TABLE, TableStore
    from resources.chunking import ChunkingStrategies
    from resources.llm import LLMResource
    from resources.models import EmbeddingModels
    from resources.qdrant import QdrantResource
    from resources.storage import DataStore

    root, qdrant = sample_root
    monkeypatch.setenv("RAG_ACTIVE_MODELS", "wordllama")
    tables = TableStore(root / "tables")
    doc_id = "federal-register-2020-17221.pdf"
    text = tables.read(DOCUMENTS_TABLE).set_index("doc_id").loc[doc_id, "canonical_text"]
    answer = "new flight control computer (FCC) software"
    found = re.search(r"\s+".join(re.escape(w) for w in answer.split()), text)  # the PDF wraps lines
    start = found.start()
    item = QAItem(
        qid="q-fcc",
        question="Which flight control computer software must be installed on the airplanes?",
        qtype="factual",
        doc_id=doc_id,
        evidence=[Evidence(doc_id=doc_id, start=start, end=found.end())],
        answer=answer,
    )
    tables.write(to_frame([item]), "synthetic_qa")
    result = materialize(
        [answer_evaluation],
        resources={
            "data_store": DataStore(data_dir=str(root)),
            "qdrant": QdrantResource(path=qdrant.path),
            "llm": LLMResource(backend="none"),
            "embedding_models": EmbeddingModels(),
            "chunking": ChunkingStrategies(),
        },
        run_config={"ops": {"answer_evaluation": {"config": {"modes": ["none", "bm25", "hybrid-rrf"]}}}},
    )
    assert result.success
    summary = tables.read("answer_evaluation").set_index("mode")
    assert list(summary.index) == ["none", "bm25", "hybrid-rrf"] and set(summary["strategy"]) == {"-", "paragraph"}
    assert summary.loc["none", "coverage"] == 0.0 and summary.loc["none", "answer_accuracy"] == 0.0
    assert summary.loc["hybrid-rrf", "answer_accuracy"] == 1.0 and summary.loc["hybrid-rrf", "source_accuracy"] == 1.0
    assert summary["faithfulness"].isna().all()  # no judge: absent, not zero
    meta = result.asset_materializations_for_node("answer_evaluation")[0].metadata
    assert meta["questions"].value == 1 and "data:image/png;base64" in meta["bakeoff_plot"].value
