"""Overview questions (rag.qa.overview): detection positives and negatives, the extractive answer listing every document
with its opening sentence and a citation, the named-document case, the setting that turns it off, the LLM map-reduce
with the fake LLM, and the HTTP API taking the same path."""

import hashlib
import re

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from rag.feedback import FeedbackStore
from rag.index.bm25 import BM25Index
from rag.index.sync import sync_bm25
from rag.llm.testing import FakeLLM
from rag.qa import Answerer, AnswerSettings
from rag.qa.overview import Catalog, OverviewRequest, detect_overview
from rag.retrieval import Index
from rag.serving.app import create_app
from rag.serving.settings import ServeSettings

# doc_id -> (section path of its chunks, chunk texts in order)
DOCS = {
    "bread.pdf": (
        ["Baking Bread"],
        [
            "Baking Bread\n\nBread is baked from flour, water, yeast and salt.",
            "The dough rests for two hours before it goes into the oven at 230 degrees.",
            "After forty minutes the loaf is cooled on a rack.",
        ],
    ),
    "notes/cats.md": (
        [],
        ["CATS\n\nName | Weight\nTom | 4 kg", "Cats are small domesticated felines that purr and chase mice."],
    ),
    "rockets.pdf": ([], ["Rockets burn fuel to reach orbit and launch satellites into space."]),
}


def chunk_table() -> pd.DataFrame:
    rows = []
    for doc_id, (section, texts) in DOCS.items():
        ids = [f"{doc_id}#{i}" for i in range(len(texts))]
        for i, text in enumerate(texts):
            rows.append(
                {
                    "chunk_id": ids[i],
                    "doc_id": doc_id,
                    "strategy": "t",
                    "text": text,
                    "char_start": i * 200,
                    "char_end": i * 200 + len(text),
                    "page_start": i + 1,
                    "page_end": i + 1,
                    "section_path": section,
                    "prev_chunk_id": ids[i - 1] if i else None,
                    "next_chunk_id": ids[i + 1] if i + 1 < len(ids) else None,
                    "n_tokens": len(text.split()),
                    "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                    "table_html": None,
                }
            )
    # Not in text order: the catalog must sort by position, not trust the table's order.
    return pd.DataFrame(rows[::-1])


class WordsEmbedder:
    """Bag of hashed words: enough for the extractive generator's cosine, no model to load."""

    name, dim, version = "words", 64, "words@1"

    def _encode(self, texts):
        out = np.zeros((len(texts), 64))
        for i, text in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", text.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % 64] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    encode_queries = encode_passages = _encode


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    chunks = chunk_table()
    root = tmp_path_factory.mktemp("overview")
    sync_bm25(chunks, root / "bm25")
    return Index(chunks.set_index("chunk_id"), BM25Index.load(root / "bm25"), None, None, None)


@pytest.fixture(scope="module")
def catalog(index):
    return Catalog.from_chunks(index.chunks)


def answerer(index, llm=None, **kw) -> Answerer:
    settings = AnswerSettings(
        **{"strategy": "t", "model": None, "mode": "bm25", "top_k": 3, "attribution": False, **kw}
    )
    return Answerer(settings, llm=llm, index=index, embedder=WordsEmbedder())


# --- detection -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "question",
    [
        "What is this document collection about?",
        "What are these documents about?",
        "Summarize the documents",
        "Summarise the collection, please.",
        "Give me an overview",
        "What topics do the files cover?",
        "What is this about?",
        "Can you give me a brief summary of all the documents?",
    ],
)
def test_collection_questions_are_detected(question, catalog):
    assert detect_overview(question, catalog) == OverviewRequest(None, "collection")
    assert detect_overview(question) == OverviewRequest(None, "collection")  # no document names needed


@pytest.mark.parametrize(
    "question, doc_id",
    [
        ("What does rockets.pdf cover?", "rockets.pdf"),
        ("Give me a summary of the cats document", "notes/cats.md"),
        ("What is Baking Bread about?", "bread.pdf"),  # its title (first heading), not its file name
        ("Summarize notes/cats.md", "notes/cats.md"),
    ],
)
def test_a_named_document_is_detected(question, doc_id, catalog):
    assert detect_overview(question, catalog) == OverviewRequest((doc_id,), "named")


@pytest.mark.parametrize(
    "question",
    [
        "What is the boiling point of liquid nitrogen?",
        "At how many degrees does the dough go into the oven?",
        "What does the collection say about the oven temperature?",
        "Summarize what the dough needs before baking",
        "Which documents mention satellites?",
        "What is the bread baked from?",
        "How about rockets and cats?",
        "What is orbit about?",
    ],
)
def test_ordinary_questions_are_not_overview_questions(question, catalog):
    assert detect_overview(question, catalog) is None


def test_a_factual_question_takes_the_normal_path(index):
    result = answerer(index).ask("At how many degrees does the dough go into the oven?")
    assert result.generator == "extractive" and "230 degrees" in result.answer
    assert result.cited_chunk_ids == ["bread.pdf#1"]


# --- extractive -------------------------------------------------------------------------------------------------
def test_extractive_overview_lists_every_document_with_its_opening_and_a_valid_citation(index):
    result = answerer(index).ask("What is this document collection about?")
    assert result.generator == "overview:extractive" and not result.not_in_context
    lines = result.answer.split("\n")
    assert lines[0] == "The collection holds 3 documents:"
    assert lines[1:] == [
        # title line skipped
        "- Baking Bread (bread.pdf), page 1: Bread is baked from flour, water, yeast and salt.",
        # heading, table rows skipped
        "- notes/cats.md, page 2: Cats are small domesticated felines that purr and chase mice.",
        "- rockets.pdf, page 1: Rockets burn fuel to reach orbit and launch satellites into space.",
    ]
    assert set(result.cited_chunk_ids) <= set(index.chunks.index)  # citations are chunks that exist
    assert result.cited_chunk_ids == ["bread.pdf#0", "notes/cats.md#1", "rockets.pdf#0"]
    for chunk in result.chunks:  # the chunk records say the same: each cited, its text holding the quoted sentence
        assert chunk["cited"] and chunk["text"] == index.chunks.loc[chunk["chunk_id"], "text"]
        assert chunk["doc_id"] == index.chunks.loc[chunk["chunk_id"], "doc_id"]
    assert [s["doc_id"] for s in result.sources()] == ["bread.pdf", "notes/cats.md", "rockets.pdf"]


def test_the_named_document_is_the_one_answered(index):
    result = answerer(index).ask("What does the bread document cover?")
    assert result.generator == "overview:extractive"
    assert result.answer.startswith("Baking Bread (bread.pdf) begins: Bread is baked from flour")
    assert "230 degrees" in result.answer and "forty minutes" in result.answer  # its first three sentences
    assert {c["doc_id"] for c in result.chunks} == {"bread.pdf"}
    assert result.cited_chunk_ids == ["bread.pdf#0", "bread.pdf#1", "bread.pdf#2"]


def test_max_documents_caps_the_list_and_says_so(index):
    result = answerer(index, overview={"max_documents": 2}).ask("Summarize the documents")
    assert result.answer.startswith("The collection holds 3 documents (2 listed):")
    assert len(result.cited_chunk_ids) == 2


def test_the_setting_turns_overview_answers_off(index):
    result = answerer(index, overview={"enabled": False}).ask("What is this document collection about?")
    assert result.generator == "extractive" and not result.generator.startswith("overview")
    assert AnswerSettings.model_validate({"overview": {"enabled": False}}).overview.enabled is False
    with pytest.raises(ValueError):
        AnswerSettings.model_validate({"overview": {"enable": False}})  # a typo fails loudly


# --- LLM map-reduce ---------------------------------------------------------------------------------------------
def test_llm_overview_maps_each_document_and_reduces_once(index):
    calls = {"map": [], "reduce": []}

    def reply(messages):
        user = messages[-1]["content"]
        if user.endswith("Summary:"):
            calls["map"].append(user)
            labels = re.findall(r"^\[(\d+)\] \(", user, flags=re.MULTILINE)
            return f"A summary [{labels[-1]}]."
        calls["reduce"].append(user)
        return "Bread, cats and rockets [1][4]."

    llm = FakeLLM(reply)
    result = answerer(index, llm=llm, generator="llm", overview={"map_chunks": 2}).ask("Summarize the documents")
    assert result.generator == "overview:llm:fake:scripted" and llm.call_count == 4
    assert len(calls["map"]) == 3 and len(calls["reduce"]) == 1
    # each map call sees only its own document's first two chunks
    assert "[1] (bread.pdf, page 1)" in calls["map"][0] and "[2] (bread.pdf, page 2)" in calls["map"][0]
    assert "230 degrees" in calls["map"][0] and "forty minutes" not in calls["map"][0] and "Cats" not in calls["map"][0]
    assert "[3] (notes/cats.md" in calls["map"][1] and "Rockets" in calls["map"][2]
    # the reduce call gets every summary with the labels its map step cited, and the question
    reduce = calls["reduce"][0]
    assert "Document: Baking Bread (bread.pdf)\nSummary: A summary. [2]" in reduce
    assert "Summary: A summary. [4]" in reduce and "Summary: A summary. [5]" in reduce
    assert "Question: Summarize the documents" in reduce
    assert result.answer == "Bread, cats and rockets." and not result.not_in_context
    assert result.cited_chunk_ids == ["bread.pdf#0", "notes/cats.md#1"]  # labels [1] and [4] resolved to chunks
    assert [c["chunk_id"] for c in result.chunks if c["cited"]] == result.cited_chunk_ids


def test_llm_overview_falls_back_to_the_map_citations(index):
    replies = iter(["Rockets reach orbit [1].", "An overview without citations."])
    llm = FakeLLM(lambda messages: next(replies))
    result = answerer(index, llm=llm, generator="llm").ask("What does rockets.pdf cover?")
    assert llm.call_count == 2  # one document: one map, one reduce
    assert result.answer == "An overview without citations." and result.cited_chunk_ids == ["rockets.pdf#0"]


# --- the API takes the same path ------------------------------------------------------------------------------------
def test_api_answers_an_overview_question(index, tmp_path):
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    token = "test-token-0123456789"
    app = create_app(lambda: answerer(index), store, ServeSettings(api_token=token))
    with TestClient(app) as client:
        response = client.post(
            "/ask", json={"question": "What are these documents about?"}, headers={"Authorization": f"Bearer {token}"}
        )
    store.close()
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["answer"].startswith("The collection holds 3 documents:") and not body["not_in_context"]
    assert body["cited_chunk_ids"] == ["bread.pdf#0", "notes/cats.md#1", "rockets.pdf#0"]
    assert [p["doc_id"] for p in body["passages"]] == ["bread.pdf", "notes/cats.md", "rockets.pdf"]


def test_several_named_documents_are_listed_as_matches(index):
    table = index.chunks.reset_index()
    table["doc_id"] = table["doc_id"].map(
        {"bread.pdf": "faa/bread.pdf", "rockets.pdf": "faa/rockets.pdf", "notes/cats.md": "notes/cats.md"}
    )
    renamed = Index(table.set_index("chunk_id"), None, None, None, None)
    request = detect_overview("What do the FAA files cover?", Catalog.from_chunks(renamed.chunks))
    assert request == OverviewRequest(("faa/bread.pdf", "faa/rockets.pdf"), "named")
    result = answerer(renamed).ask("What do the FAA files cover?")
    assert result.answer.split("\n") == [
        "2 documents match:",
        "- Baking Bread (faa/bread.pdf), page 1: Bread is baked from flour, water, yeast and salt.",
        "- faa/rockets.pdf, page 1: Rockets burn fuel to reach orbit and launch satellites into space.",
    ]
