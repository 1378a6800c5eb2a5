"""Every text is encoded once per model version (issue 50 #2): index two chunk sets (chunk and sentence vectors), then
fine-tune an embedder (hard-negative mining, the untrained start's and the checkpoints' selection scores), counting
what the sentence-transformers model encodes, keyed by the weights that encode it: a text encoded twice by the same
weights fails. Before (this corpus and run, the whole chunk set scored): 182 encoder inputs for 83 distinct ones, 56
of them encoded more than once (the `sent` chunks, `para`'s sentences already; the base weights' passages again for
mining, for the untrained start's score and for a first checkpoint the warmup's zero learning rate left unchanged; the
model card's examples at every save). After: 82 inputs, 82 distinct."""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest

from rag.evaluation.qaset import Evidence, QAItem, to_frame
from rag.registry import ModelRegistry
from rag.store import CHUNKS_TABLE, TableStore
from tests.test_retrieval import chunk_table

TOPICS = [
    ("volcano", "Magma rises through the crust and erupts as lava", "What erupts from a volcano?"),
    ("glacier", "Compacted snow flows slowly downhill as ice", "How does a glacier move?"),
    ("desert", "Very little rain falls and dunes shift with the wind", "Why do dunes move in a desert?"),
    ("reef", "Corals build limestone skeletons in warm shallow seas", "What do corals build?"),
    ("tundra", "Permafrost keeps the ground frozen all year", "What keeps the tundra frozen?"),
    ("delta", "A river drops its sediment where it meets the sea", "Where does a river leave sediment?"),
    ("canyon", "Running water cuts deep gorges into layered rock", "What carves a canyon?"),
    ("geyser", "Heated groundwater bursts out of a vent at intervals", "What makes a geyser erupt?"),
    ("marsh", "Grasses grow in shallow water that floods with the tide", "What grows in a marsh?"),
    ("atoll", "A ring of coral surrounds a lagoon after an island sinks", "What surrounds the lagoon of an atoll?"),
    ("fjord", "Glaciers carved a narrow inlet with steep cliffs", "What carved a fjord?"),
    ("mesa", "A flat-topped hill remains where harder rock resisted erosion", "Why is a mesa flat on top?"),
    ("aquifer", "Porous rock holds groundwater that wells can pump", "What does an aquifer hold?"),
    ("monsoon", "Seasonal winds bring heavy summer rain", "What brings the summer rain of a monsoon?"),
    ("savanna", "Scattered trees stand in wide grassland with a dry season", "What grows on a savanna?"),
    ("estuary", "Fresh river water mixes with salty sea water", "What mixes in an estuary?"),
]


def corpus() -> tuple[dict[str, str], dict[str, str], list[QAItem]]:
    """Two chunk sets of the same documents: `para` (one chunk per topic, two sentences, and a one-sentence chunk)
    and `sent` (one chunk per sentence: its texts are sentences `para` has too); one question per topic."""
    para, sent, items = {}, {}, []
    for i, (name, fact, question) in enumerate(TOPICS):
        first = f"The {name} is a landform studied by geographers number {i}."
        second = f"{fact}."
        para[f"p{i:02d}"] = f"{first} {second}"
        sent[f"s{i:02d}a"], sent[f"s{i:02d}b"] = first, second
        items.append(
            QAItem(
                qid=f"q{i:02d}",
                question=question,
                qtype="dataset",
                doc_id=f"doc-p{i:02d}",
                split="train" if i % 2 else "dev",
                evidence=[Evidence(doc_id=f"doc-p{i:02d}", start=0, end=len(para[f"p{i:02d}"]))],
            )
        )
    para["p99"] = "Geographers map landforms with satellites."
    return para, sent, items


class EncodeCounter:
    """Patches SentenceTransformer.encode (encode_query, encode_document and the index's embedder all call it) and
    counts each input by (weights, prompt, the length the model reads): one input twice under the same key is a text
    encoded twice by the same weights."""

    def __init__(self):
        self.seen: Counter = Counter()
        self.texts: dict[tuple[str, str], set[str]] = {}  # (stage, weights) -> texts encoded
        self.stage = "index"

    @staticmethod
    def weights(model) -> str:
        digest = hashlib.sha256()
        for tensor in model.state_dict().values():
            digest.update(tensor.detach().cpu().numpy().tobytes())
        return digest.hexdigest()[:12]

    def patch(self, monkeypatch) -> None:
        from sentence_transformers import SentenceTransformer

        original, counter = SentenceTransformer.encode, self

        def encode(model, inputs, *args, prompt_name=None, prompt=None, **kwargs):
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            name = prompt_name or (None if prompt is not None else model.default_prompt_name)
            said = prompt if prompt is not None else ((model.prompts.get(name) or "") if name else "")
            weights = counter.weights(model)
            for text in texts:
                counter.seen[(weights, said, model.max_seq_length, text)] += 1
            counter.texts.setdefault((counter.stage, weights), set()).update(texts)
            return original(model, inputs, *args, prompt_name=prompt_name, prompt=prompt, **kwargs)

        monkeypatch.setattr(SentenceTransformer, "encode", encode)

    def twice(self) -> list[tuple]:
        return [key for key, n in self.seen.items() if n > 1]

    def per_stage(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (stage, weights), texts in self.texts.items():
            out.setdefault(stage, {})[weights] = len(texts)
        return out


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    para, sent, items = corpus()
    tables = TableStore(tmp_path / "tables")
    tables.write(chunk_table(para).assign(strategy="para"), CHUNKS_TABLE, "para")
    tables.write(chunk_table(sent).assign(strategy="sent"), CHUNKS_TABLE, "sent")
    tables.write(to_frame(items), "synthetic_qa")
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    for name in ("RAG_QDRANT_PATH", "QDRANT_URL", "RAG_QDRANT_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_index_then_retrain_encodes_every_text_once_per_weights(data_dir, monkeypatch):
    from rag.embedding import load_embedder
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.pipeline import embed_step
    from rag.qa.generators import sentence_units
    from rag.training import EmbedderTrainingConfig
    from rag.training.pipeline import gate_candidate, train_candidate

    counter = EncodeCounter()
    counter.patch(monkeypatch)
    tables = TableStore(data_dir / "tables")
    embedder = load_embedder("minilm")
    base = counter.weights(embedder._model)
    settings = QdrantSettings(path=str(data_dir / "qdrant"))
    client = get_client(settings)
    lines: list[str] = []
    try:
        # The float model's sentence path, where a chunk's vector serves its sentence (the int8 twin's store takes
        # none of the float vectors: tests/test_sentence_encoder.py).
        runs = {
            s: embed_step(tables, client, s, "minilm", embedder, sentence_encoder="model") for s in ("para", "sent")
        }
        counter.stage = "retrain"
        # Each checkpoint scored on 8 of the 17 passages (selection_passages); the first one after a warmup step with
        # a learning rate of 0 has the base weights.
        config = EmbedderTrainingConfig(
            strategy="para", max_steps=2, batch_size=4, mini_batch_size=4, eval_steps=1, selection_passages=8
        )
        registry = ModelRegistry(data_dir / "models")
        _, run, inputs = train_candidate("embedder", tables, registry, config, log=lines.append)
        # The gate scores production (the base weights) and the candidate on the held-out questions' passages (4
        # here: below the fewest a verdict may rest on, which this test of what is encoded lets through).
        counter.stage = "gate"
        monkeypatch.setattr("rag.training.gate.check_gate_questions", lambda *args, **kwargs: None)
        verdict = gate_candidate("embedder", tables, registry, registry.resolve("embedder", "candidate"))
    finally:
        close_client(settings)
    twice = counter.twice()
    assert not twice, f"{len(twice)} inputs encoded more than once by the same weights, e.g. {twice[:3]}"

    # Indexing encoded every distinct text once: the `sent` chunks are `para`'s sentences (from the sentence store),
    # and p99, a one-sentence chunk, gave its sentence its vector.
    para, sent, _ = corpus()
    units = {u for text in para.values() for u in sentence_units(text)}
    assert counter.per_stage()["index"] == {base: len(set(para.values()) | set(sent.values()) | units)}
    assert runs["sent"].reused == len(sent) and runs["sent"].sentence_vectors["encoded"] == 0
    assert runs["para"].sentence_vectors["reused"] == 1

    # Retraining encoded no passage with the base weights (mining and the start's score read the index), and each
    # new set of weights scored 8 passages and the selection questions.
    retrained = counter.texts.get(("retrain", base), set())
    assert not retrained & set(para.values()), "mining or the start's score encoded a passage the index holds"
    assert any("read from the index" in line for line in lines)
    selection = inputs.data.selection
    new = [texts for (stage, w), texts in counter.texts.items() if stage == "retrain" and w != base]
    assert new and all(len(texts) == len(selection.queries) + 8 for texts in new)
    assert run.selection_passages == 8 and run.summary["selection_passages"] == 8

    # The gate read production's passage vectors from the index (and the candidate's: its best checkpoint here is the
    # first, whose warmup step left the base weights), so it encoded no passage; only its questions.
    assert verdict.questions >= 1
    gated = set().union(*(texts for (stage, _), texts in counter.texts.items() if stage == "gate"))
    assert gated and not gated & set(para.values()), "the gate encoded a passage the index holds for those weights"


def test_a_promotion_encodes_a_text_two_chunk_sets_share_once(data_dir, monkeypatch):
    """A promotion (or a canary's start) builds the embedder's collection of every chunk set: a chunk another chunk
    set has too (here `copy`, the very chunks of `para`) takes that collection's vector instead of being encoded."""
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.lifecycle.promotion import build_collections

    para, sent, _ = corpus()
    tables = TableStore(data_dir / "tables")
    tables.write(chunk_table(para).assign(strategy="copy"), CHUNKS_TABLE, "copy")
    counter = EncodeCounter()
    counter.patch(monkeypatch)
    settings = QdrantSettings(path=str(data_dir / "qdrant"))
    client = get_client(settings)
    lines: list[str] = []
    try:
        strategies = ["para", "copy", "sent"]
        built = build_collections(None, tables=tables, client=client, strategies=strategies, log=lines.append)
        points = {s: client.count(collection_name=c, exact=True).count for s, c in built.items()}
    finally:
        close_client(settings)
    assert points == {"para": len(para), "copy": len(para), "sent": len(sent)}
    assert not counter.twice()
    assert sum(len(texts) for texts in counter.texts.values()) == len(set(para.values()) | set(sent.values()))
    assert any(f"{len(para)} of them from another chunk set's vectors" in line for line in lines)


def test_selection_sample_keeps_the_questions_passages_and_fills_at_random():
    from rag.training.data import IRSet, selection_sample

    corpus = {f"c{i:02d}": f"passage {i}" for i in range(40)}
    ir = IRSet({"q1": "a", "q2": "b"}, corpus, {"q1": {"c03": 1}, "q2": {"c30": 1}}, judged={"q2": {"c30", "c31"}})
    assert selection_sample(ir, None, 0) is ir and selection_sample(ir, 40, 0) is ir
    sample = selection_sample(ir, 10, 0)
    assert len(sample.corpus) == 10 and {"c03", "c30", "c31"} <= set(sample.corpus)
    assert list(sample.corpus) == sorted(sample.corpus)  # the corpus order is kept
    assert sample.corpus == selection_sample(ir, 10, 0).corpus != selection_sample(ir, 10, 1).corpus
    assert (sample.queries, sample.qrels, sample.judged) == (ir.queries, ir.qrels, ir.judged)
    assert set(selection_sample(ir, 2, 0).corpus) == {"c03", "c30", "c31"}  # never fewer than the judged ones


def test_known_documents_answers_plain_calls_from_its_vectors_and_leaves_the_others_to_the_model(monkeypatch):
    from sentence_transformers import SentenceTransformer

    from rag.embedding import _minilm_dir
    from rag.training.vectors import known_documents, plain_documents

    model = SentenceTransformer(_minilm_dir(), device="cpu", local_files_only=True)
    assert plain_documents(model)  # MiniLM's prompts are empty strings
    texts = ["A first passage.", "A second, longer passage about glaciers and the ice they carry."]
    expected = model.encode_document(texts, normalize_embeddings=True)
    counter = EncodeCounter()
    counter.patch(monkeypatch)
    vectors: dict = {}
    with known_documents(model, vectors):
        # As the miner calls it: encoded once, remembered.
        mined = model.encode_document(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True, pool=None)
        assert set(vectors) == set(texts) and np.allclose(mined, expected, atol=1e-5)
        # As the selection evaluator calls it: a tensor, from the vectors, nothing encoded.
        scored = model.encode_document(
            texts[::-1], prompt_name=None, prompt=None, batch_size=32, convert_to_tensor=True, truncate_dim=None
        )
        assert np.allclose(scored.numpy(), expected[::-1], atol=1e-5)
        assert sum(counter.seen.values()) == len(texts)
        model.encode_document(texts[:1], prompt="passage: ")  # another input: the model encodes it
        assert sum(counter.seen.values()) == len(texts) + 1
    assert "encode_document" not in vars(model)  # the class's method is back
    model.prompts = {"document": "passage: "}
    assert not plain_documents(model)
