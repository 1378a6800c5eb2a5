"""AnswerSettings.sentence_encoder / embed_step(sentence_encoder=...) (issue 50 #3): with "int8" the index stores
the chunks' sentence vectors under the int8 twin's own key (never the model's, and no chunk vector of the model is
reused for them), and the answer stage reads them without encoding a sentence; a twin that cannot load falls back
to the model. The twin here is a stand-in (no ONNX export in a fast test) that counts what it encodes."""

from __future__ import annotations

import hashlib
import logging

import numpy as np

from rag.qa.generators import sentence_units
from tests.test_encode_once import EncodeCounter, corpus
from tests.test_encode_once import data_dir  # noqa: F401  (fixture)


class CountingTwin:
    """Deterministic unit vectors per text; `passages` / `queries` list what it was asked to encode."""

    name, version, dim, query_prefix, passage_prefix = "minilm-int8", "twin0001", 384, "", ""

    def __init__(self):
        self.passages: list[str] = []
        self.queries: list[str] = []

    @staticmethod
    def _vectors(texts: list[str]) -> np.ndarray:
        rows = [
            np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=384) for t in texts
        ]
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), 384)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def encode_passages(self, texts):
        self.passages += list(texts)
        return self._vectors(list(texts))

    encode = encode_passages

    def encode_queries(self, texts):
        self.queries += list(texts)
        return self._vectors(list(texts))


def _index_para(data_dir, monkeypatch, twin):  # noqa: F811
    from rag.embedding import load_embedder
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.pipeline import embed_step
    from rag.store import TableStore

    monkeypatch.setattr(
        "rag.embedding.onnx_int8.int8_query_encoder",
        lambda model, embedder, threads=None: (
            (twin, None) if twin is not None else (None, "no int8 twin in this test")
        ),
    )
    embedder = load_embedder("minilm")
    settings = QdrantSettings(path=str(data_dir / "qdrant"))
    try:
        run = embed_step(
            TableStore(data_dir / "tables"), get_client(settings), "para", "minilm", embedder, sentence_encoder="int8"
        )
    finally:
        close_client(settings)
    return embedder, run


def test_int8_sentence_vectors_are_stored_under_the_twins_key_and_answering_encodes_no_sentence(
    data_dir,  # noqa: F811
    monkeypatch,
):
    from rag.qa import Answerer, AnswerSettings
    from rag.qa.encoding import open_sentence_store

    twin = CountingTwin()
    embedder, run = _index_para(data_dir, monkeypatch, twin)
    para, _, items = corpus()
    units = {u for text in para.values() for u in sentence_units(text)}
    # Every sentence by the twin, none from the model's chunk vectors (p99 is a one-sentence chunk).
    assert set(twin.passages) == units and len(twin.passages) == len(units)
    assert run.sentence_vectors["reused"] == 0
    assert open_sentence_store(data_dir, twin).count() == len(units)
    assert open_sentence_store(data_dir, embedder).count() == 0  # no int8 vector under the model's key

    counter = EncodeCounter()
    counter.patch(monkeypatch)
    twin.passages.clear()
    settings = AnswerSettings(
        strategy="para", model="minilm", reranker="none", mode="dense", query_encoder="int8", sentence_encoder="int8"
    )
    result = Answerer(settings, root=data_dir).ask(items[0].question)
    assert result.answer
    assert twin.passages == []  # every sentence read from the store
    assert twin.queries == [items[0].question]  # the question once: retrieval's vector reused by the answer stage
    assert not counter.seen  # the float model encoded nothing


def test_without_a_twin_int8_sentences_fall_back_to_the_model(data_dir, monkeypatch, caplog):  # noqa: F811
    from rag.qa.encoding import open_sentence_store

    with caplog.at_level(logging.WARNING, logger="rag.qa.encoding"):
        embedder, run = _index_para(data_dir, monkeypatch, None)
    para, _, _ = corpus()
    units = {u for text in para.values() for u in sentence_units(text)}
    assert open_sentence_store(data_dir, embedder).count() == len(units)
    assert run.sentence_vectors["reused"] == 1  # as "model": p99's sentence takes its chunk's vector
    assert any("no int8 twin in this test" in r.getMessage() for r in caplog.records)
