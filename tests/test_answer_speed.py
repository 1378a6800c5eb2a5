"""The fast answer stage and answers that carry their content: sentence vectors stored at index time (only the
question is encoded when answering, across restarts; a corrupt store falls back to encoding), lead-ins continued
into the list items or sentence completing them (also across a chunk boundary), and the stage times /ask and
/metrics report."""

import logging

import numpy as np
import pytest
from fastapi.testclient import TestClient

from rag.embedding import load_embedder
from rag.feedback import FeedbackStore
from rag.index.qdrant import QdrantSettings, close_client, get_client
from rag.pipeline import bm25_step, embed_step
from rag.qa import AnswerResult, Answerer, AnswerSettings
from rag.qa.attribution import passage_sentences
from rag.qa.encoding import CachedEmbedder, SentenceVectorStore, embedder_key, open_sentence_store, sentence_store_path
from rag.qa.generators import ExtractiveGenerator, continuation, is_lead_in, is_list_item
from rag.qa.prompt import label_passages
from rag.retrieval import Hit
from rag.serving.app import create_app
from rag.serving.settings import ServeSettings
from rag.store import CHUNKS_TABLE, TableStore
from tests.test_qa import TEXTS, chunk_table

LEAD_IN = "Proposed AD Requirements This proposed AD would require the following actions:"


# --- span continuation -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sentence, expected",
    [
        (LEAD_IN, True),
        ("This proposed AD would also require the following actions.", True),
        ("The procedure is as follows:", True),
        ("Costs were estimated as follows", True),
        ("The dough rests for two hours before it goes into the oven.", False),
        ("Labor cost | Parts cost", False),
    ],
)
def test_lead_ins_are_recognised(sentence, expected):
    assert is_lead_in(sentence) is expected


def test_a_lead_in_continues_into_its_list_items_and_stops_after_them():
    following = [
        "\u2022",
        "Installing new FCC OPS software.",
        "\u2022 Revising the existing AFM.",
        "(c) Changing the wire routing.",
        "For information on those procedures, see the docket.",
    ]
    assert continuation(LEAD_IN, following, budget=800) == [
        "\u2022 Installing new FCC OPS software.",
        "\u2022 Revising the existing AFM.",
        "(c) Changing the wire routing.",
    ]
    assert is_list_item("1. First") and is_list_item("(iv) Fourth") and not is_list_item("In 1990 it rained.")


def test_a_colon_without_a_list_takes_the_one_sentence_after_it():
    assert continuation("The court held:", ["The statute applies.", "It was argued later."], 800) == [
        "The statute applies."
    ]
    # "the following" without a colon announces a list; prose after it is not part of the answer
    assert continuation("It would also require the following actions.", ["For details see the docket."], 800) == []


def test_the_length_budget_keeps_whole_items_only():
    items = ["\u2022 " + "a" * 40, "\u2022 " + "b" * 40, "\u2022 " + "c" * 40]
    budget = len(LEAD_IN) + 2 * (2 + 42)  # the lead-in and two items with their separators
    assert continuation(LEAD_IN, items, budget) == items[:2]
    assert continuation(LEAD_IN, items, len(LEAD_IN)) == []


class CountingEmbedder:
    """Wraps an embedder and records every text it is asked to encode."""

    def __init__(self, inner):
        self.inner, self.name, self.dim, self.version = inner, inner.name, inner.dim, inner.version
        self.calls: list[tuple[str, list[str]]] = []

    def encode_queries(self, texts):
        self.calls.append(("query", list(texts)))
        return self.inner.encode_queries(texts)

    def encode_passages(self, texts):
        self.calls.append(("passage", list(texts)))
        return self.inner.encode_passages(texts)

    encode = encode_passages


@pytest.fixture(scope="module")
def wordllama():
    return load_embedder("wordllama")


def ad_chunks() -> dict[str, dict]:
    """A lead-in ending its chunk and its list in the next one (as the sample corpus's AD notice is chunked)."""
    first = {
        "chunk_id": "ad-1",
        "doc_id": "ad.pdf",
        "text": "FAA's Determination\nThe FAA is proposing this AD because "
        "the unsafe condition is likely to exist.\n" + LEAD_IN,
        "page_start": 5,
        "page_end": 5,
        "char_start": 0,
        "char_end": 100,
        "table_html": None,
        "next_chunk_id": "ad-2",
    }
    second = {
        "chunk_id": "ad-2",
        "doc_id": "ad.pdf",
        "text": "\u2022\n\nInstalling new FCC OPS software and doing a "
        "software installation verification.\n\n\u2022 Revising the existing AFM to incorporate new procedures.",
        "page_start": 5,
        "page_end": 5,
        "char_start": 100,
        "char_end": 300,
        "table_html": None,
        "next_chunk_id": "ad-3",
    }
    third = {
        "chunk_id": "ad-3",
        "doc_id": "ad.pdf",
        "text": "\u2022 Changing the horizontal stabilizer trim wire routing.\n"
        "This proposed AD would also require the following actions. For information see the docket.",
        "page_start": 5,
        "page_end": 6,
        "char_start": 300,
        "char_end": 450,
        "table_html": None,
        "next_chunk_id": None,
    }
    return {c["chunk_id"]: c for c in (first, second, third)}


def test_the_extractive_answer_reads_on_into_the_next_chunks(wordllama):
    chunks = ad_chunks()
    passages = label_passages([Hit(1, 1.0, chunks["ad-1"])])
    generator = ExtractiveGenerator(CachedEmbedder(wordllama), next_chunk=chunks.get)
    generation = generator.generate("What does the proposed AD require?", passages)
    answer = generation.parsed.answer
    assert answer.startswith(LEAD_IN)
    assert "\u2022 Installing new FCC OPS software" in answer and "\u2022 Revising the existing AFM" in answer
    assert "\u2022 Changing the horizontal stabilizer" in answer and "also require" not in answer
    assert generation.parsed.cited_chunk_ids == ["ad-1", "ad-2", "ad-3"]
    assert [c["chunk_id"] for c in generation.continued] == ["ad-2", "ad-3"]  # to be shown: no passage holds them
    among = label_passages([Hit(1, 1.0, chunks["ad-1"]), Hit(2, 0.5, chunks["ad-3"])])
    shown = generator.generate("What does the proposed AD require?", among)
    assert shown.parsed.cited_chunk_ids == ["ad-1", "ad-2", "ad-3"] and [c["chunk_id"] for c in shown.continued] == [
        "ad-2"
    ]
    # the budget ends the list early; turned off, the answer is the lead-in alone (as before)
    short = ExtractiveGenerator(CachedEmbedder(wordllama), next_chunk=chunks.get, max_answer_chars=len(LEAD_IN) + 100)
    assert short.generate("What does the proposed AD require?", passages).parsed.cited_chunk_ids == ["ad-1", "ad-2"]
    off = ExtractiveGenerator(CachedEmbedder(wordllama), next_chunk=chunks.get, continue_lead_ins=False)
    assert off.generate("What does the proposed AD require?", passages).parsed.answer == LEAD_IN


# --- stored sentence vectors ------------------------------------------------------------------------------------
@pytest.fixture
def indexed(tmp_path, wordllama):
    """A data dir indexed by the shared index step (chunks, BM25, collection and sentence vectors)."""
    root, qdrant = tmp_path / "data", QdrantSettings(path=str(tmp_path / "qdrant"))
    tables = TableStore(root / "tables")
    tables.write(chunk_table(TEXTS), CHUNKS_TABLE, "t")
    bm25_step(tables, root, "t")
    run = embed_step(tables, get_client(qdrant), "t", "wordllama", wordllama)
    yield root, qdrant, run
    close_client(qdrant)


def counting_answerer(root, qdrant, wordllama, monkeypatch) -> tuple[Answerer, CountingEmbedder]:
    """An Answerer over the indexed data dir whose (only) embedder counts what it encodes."""
    counting = CountingEmbedder(wordllama)
    monkeypatch.setattr("rag.retrieval.service.load_embedder", lambda name: counting)
    monkeypatch.setattr("rag.retrieval.service.load_for_queries", lambda name: counting)  # query_encoder int8
    settings = AnswerSettings(strategy="t", model="wordllama", mode="hybrid-rrf", reranker="none", top_k=3)
    return Answerer(settings, root=root, qdrant=qdrant), counting


QUESTION = "At how many degrees does the dough go into the oven?"


def test_only_the_question_is_encoded_when_the_sentences_were_stored_at_index_time(indexed, wordllama, monkeypatch):
    root, qdrant, run = indexed
    sentences = {u for text in TEXTS.values() for u in passage_sentences(text)}
    whole = sentences & set(TEXTS.values())  # a chunk that is one sentence gave it its vector (issue 50 #2)
    assert run.summary["sentence_vectors_sentences"] == len(sentences)
    assert (run.summary["sentence_vectors_encoded"], run.summary["sentence_vectors_reused"]) == (
        len(sentences) - len(whole),
        len(whole),
    )
    answerer, counting = counting_answerer(root, qdrant, wordllama, monkeypatch)
    result = answerer.ask(QUESTION)
    assert "230 degrees" in result.answer and result.attributed_chunk_ids  # generated and attributed
    assert counting.calls == [("query", [QUESTION])]  # retrieval's vector, reused by the generator


def test_a_restart_reuses_the_stored_vectors_and_new_text_is_stored(indexed, wordllama, monkeypatch):
    root, qdrant, _ = indexed
    first, counting = counting_answerer(root, qdrant, wordllama, monkeypatch)
    first.embedder.encode_passages(["A sentence no chunk holds."])  # e.g. an LLM's answer, attributed
    assert counting.calls == [("passage", ["A sentence no chunk holds."])]
    restarted, counting = counting_answerer(root, qdrant, wordllama, monkeypatch)  # fresh process state
    restarted.ask(QUESTION)
    restarted.embedder.encode_passages(["A sentence no chunk holds."])
    assert counting.calls == [("query", [QUESTION])]
    # indexing again encodes nothing: every sentence is stored for this model
    again = embed_step(TableStore(root / "tables"), get_client(qdrant), "t", "wordllama", wordllama)
    assert again.summary["sentence_vectors_encoded"] == 0


def test_a_corrupt_store_falls_back_to_encoding_and_says_so(indexed, wordllama, monkeypatch, caplog):
    root, qdrant, _ = indexed
    reference = counting_answerer(root, qdrant, wordllama, monkeypatch)[0].ask(QUESTION)
    path = sentence_store_path(root)
    for leftover in path.parent.glob(path.name + "-*"):  # WAL files of the healthy store
        leftover.unlink()
    path.write_bytes(b"this is not a database" * 100)
    answerer, counting = counting_answerer(root, qdrant, wordllama, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="rag.qa.encoding"):
        result = answerer.ask(QUESTION)
    assert result.answer == reference.answer and result.attributed_chunk_ids == reference.attributed_chunk_ids
    assert any(kind == "passage" for kind, _ in counting.calls)  # the sentences were encoded instead
    assert any("unusable" in r.getMessage() and "encoded at question time" in r.getMessage() for r in caplog.records)


def test_vectors_are_keyed_by_model_and_weights(tmp_path):
    class Fake:
        def __init__(self, name, version):
            self.name, self.version, self.dim = name, version, 3

    old, promoted = Fake("ft-minilm", "aaa111"), Fake("ft-minilm", "bbb222")
    assert embedder_key(old) != embedder_key(promoted) != embedder_key(Fake("minilm", "bbb222"))
    store = open_sentence_store(tmp_path, old)
    store.put({"h": np.ones(3, dtype=np.float32)})
    assert set(store.get(["h", "other"])) == {"h"}
    assert open_sentence_store(tmp_path, promoted).get(["h"]) == {}  # another model never reads these
    wrong_size = SentenceVectorStore(sentence_store_path(tmp_path), embedder_key(old), dim=4)
    assert wrong_size.get(["h"]) == {}  # a row of the wrong size counts as missing


# --- stage times in /ask and /metrics ---------------------------------------------------------------------------
class TimedAnswerer:
    model_version = "fake@1"

    def __init__(self):
        self.n = 0

    def ask(self, question: str) -> AnswerResult:
        self.n += 1
        timings = {"retrieve": 10.0 * self.n, "rerank": 0.0, "generate": 2.0, "attribute": 1.0}
        timings["total"] = sum(timings.values())
        return AnswerResult(
            question=question,
            answer="a",
            cited_chunk_ids=[],
            attributed_chunk_ids=[],
            not_in_context=False,
            latency_ms=timings["total"],
            chunks=[],
            generator="fake",
            settings={},
            timings_ms=timings,
        )


def test_ask_returns_its_stage_times_and_metrics_summarises_them(tmp_path):
    token, answerer = "t" * 24, TimedAnswerer()
    auth = {"Authorization": f"Bearer {token}"}
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    with TestClient(create_app(lambda: answerer, store, ServeSettings(api_token=token))) as client:
        answers = [client.post("/ask", json={"question": f"question {i}"}, headers=auth).json() for i in range(3)]
        assert [a["timings_ms"]["retrieve"] for a in answers] == [10.0, 20.0, 30.0]
        assert answers[0]["timings_ms"]["total"] == 13.0
        stages = client.get("/metrics", headers=auth).json()["ask_stages"]
    store.close()
    assert set(stages) == {"retrieve", "rerank", "generate", "attribute", "total"}
    assert stages["retrieve"] == {"n": 3, "p50_ms": 20.0, "p95_ms": 29.0}
