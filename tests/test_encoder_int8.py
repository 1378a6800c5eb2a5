"""minilm-int8: MiniLM exported to ONNX, int8 weights, onnxruntime; exported once per weights version into the data
dir."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rag.embedding import EMBEDDERS, _minilm_dir, load_embedder
from rag.embedding.onnx_int8 import MODEL_FILE, OnnxInt8Embedder, _twin
from rag.index.qdrant import QdrantSettings, close_client, get_client
from rag.index.sync import sync_collection
from rag.registry import ModelRegistry
from rag.retrieval import Index, RetrievalParams, retrieve
from tests.test_retrieval import TEXTS, chunk_table

SENTENCES = [
    "A man is eating food.",
    "Vitamin D deficiency is associated with a higher risk of hip fractures in elderly patients.",
    "The rocket launched two satellites into low earth orbit.",
    "Mutations in BRCA1 increase the lifetime risk of breast and ovarian cancer.",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The export goes to a fresh data dir: it happens once for this module, in its first test that loads."""
    folder = tmp_path_factory.mktemp("int8-data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAG_DATA_DIR", str(folder))
        mp.delenv("RAG_ONNX_CACHE", raising=False)  # the default place, under the data dir
        # Twins an earlier test of this process exported (into RAG_ONNX_CACHE) are not this data dir's.
        load_embedder.cache_clear()
        _twin.cache_clear()
        yield folder
        load_embedder.cache_clear()
        _twin.cache_clear()


@pytest.fixture(scope="module")
def int8(data_dir):
    return load_embedder("minilm-int8")


@pytest.fixture(scope="module")
def minilm(data_dir):
    return load_embedder("minilm")


def test_registry_resolves_minilm_int8(int8, data_dir):
    assert "minilm-int8" in EMBEDDERS
    assert isinstance(int8, OnnxInt8Embedder) and int8.name == "minilm-int8"
    assert load_embedder("minilm-int8") is int8  # loaded once per process
    assert int8.model_path.parent.parent == data_dir / "onnx-int8"
    assert load_embedder("production-int8") is int8  # nothing promoted: production is minilm
    with pytest.raises(ValueError, match="cannot be quantized"):
        load_embedder("wordllama-int8")


def test_vectors_match_the_float_model(int8, minilm):
    assert (int8.dim, int8.window) == (minilm.dim, minilm.window) == (384, 256)
    assert int8.version != minilm.version  # other vectors, so other collections
    for encode in ("encode_queries", "encode_passages"):
        cos = (getattr(int8, encode)(SENTENCES) * getattr(minilm, encode)(SENTENCES)).sum(axis=1)
        assert cos.min() > 0.98, cos
    singles = np.vstack([int8.encode_queries([s]) for s in SENTENCES])  # the unpadded single-query path
    assert ((singles * minilm.encode_queries(SENTENCES)).sum(axis=1) > 0.98).all()
    # Similarities between texts are kept too.
    full = minilm.encode_queries(SENTENCES)
    assert np.abs(singles @ singles.T - full @ full.T).max() < 0.05


def test_shapes_normalisation_and_window(int8, minilm):
    assert int8.encode_queries([]).shape == (0, 384)
    many = int8.encode_passages(SENTENCES * 20)  # several batches, reordered by length inside
    assert many.shape == (80, 384) and many.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1.0, atol=1e-5)
    # Rows come back in input order (each is nearest its own sentence). Not bit-identical across batches: dynamic
    # quantisation scales each batch's activations by that batch's range.
    singles = np.vstack([int8.encode_passages([s]) for s in SENTENCES])
    assert ((many @ singles.T).argmax(axis=1) == np.arange(80) % 4).all()
    assert ((many * np.tile(singles, (20, 1))).sum(axis=1) > 0.99).all()
    # Truncation at max_seq_length 256, not the 128 of MiniLM's tokenizer.json: words past token 128 count,
    # words past token 256 do not.
    filler = "protein " * 150
    base = int8.encode_queries([filler])[0]
    assert float(base @ int8.encode_queries([filler + "galaxy rocket orbit " * 10])[0]) < 0.999
    long = "protein " * 300
    assert (
        float(int8.encode_queries([long])[0] @ int8.encode_queries([long + "galaxy rocket orbit " * 10])[0]) > 0.99999
    )
    assert int8.count_tokens(["", filler, long]) == minilm.count_tokens(["", filler, long]) == [2, 152, 302]


def test_export_happens_once_per_weights_version(int8, data_dir):
    model_file = int8.model_path
    stamp = os.stat(model_file).st_mtime_ns
    again = OnnxInt8Embedder("again", _minilm_dir())
    assert again.model_path == model_file and os.stat(model_file).st_mtime_ns == stamp
    assert again.version == int8.version
    folders = [p.name for p in (data_dir / "onnx-int8").iterdir()]
    assert len(folders) == 1 and not any(name.startswith(".staging") for name in folders)
    assert (data_dir / "onnx-int8" / folders[0] / MODEL_FILE).exists()


def test_fine_tuned_names_take_the_int8_suffix(int8, data_dir, tmp_path):
    # A registered copy of MiniLM's folder stands in for a fine-tuned model (same weights: same export reused).
    import shutil

    saved = tmp_path / "saved"
    shutil.copytree(_minilm_dir(), saved)
    registry = ModelRegistry(data_dir / "models")
    registry.register("embedder", saved, {"base_model": "minilm"})
    tuned = load_embedder("ft-minilm-v1-int8")
    assert isinstance(tuned, OnnxInt8Embedder) and tuned.name == "ft-minilm-v1-int8"
    assert tuned.model_path == int8.model_path  # keyed by the weights' hash, not the name
    registry.set_alias("embedder", "production", "v1")
    assert load_embedder("production-int8") is tuned
    np.testing.assert_allclose(tuned.encode_queries(SENTENCES[:1]), int8.encode_queries(SENTENCES[:1]), atol=1e-6)


def test_a_collection_built_with_it_has_its_own_version(int8, minilm):
    settings = QdrantSettings(path=":memory:")
    client = get_client(settings)
    try:
        chunks = chunk_table(TEXTS)
        quantized = sync_collection(client, chunks, int8, strategy="t", model="minilm-int8")
        full = sync_collection(client, chunks, minilm, strategy="t", model="minilm")
        assert quantized.collection == f"t__minilm-int8__{int8.version}__cosine"
        assert quantized.collection != full.collection and quantized.alias != full.alias
        index = Index(chunks.set_index("chunk_id"), None, client, quantized.alias, int8)
        hits = retrieve(index, "which planet is the biggest?", "dense", RetrievalParams(k=2))
        assert hits[0].chunk["chunk_id"] == "planets"
    finally:
        close_client(settings)


class Counting:
    """An embedder wrapper that records which texts it encoded as questions."""

    def __init__(self, inner):
        self.inner, self.questions = inner, []
        self.name, self.version, self.dim = inner.name, inner.version, inner.dim

    def encode_queries(self, texts):
        self.questions.extend(texts)
        return self.inner.encode_queries(texts)


def test_questions_are_encoded_by_the_int8_twin_against_the_float_passages(int8, minilm):
    from rag.embedding.onnx_int8 import int8_query_encoder

    twin, why_not = int8_query_encoder("minilm", minilm)
    assert why_not is None and twin.name == "minilm-int8" and twin.model_path == int8.model_path
    assert int8_query_encoder("minilm", minilm)[0] is twin  # one session per model folder and process
    assert int8_query_encoder("minilm-int8", int8) == (None, None)  # already int8: nothing to pair
    settings = QdrantSettings(path=":memory:")
    client = get_client(settings)
    try:
        chunks = chunk_table(TEXTS)
        full = sync_collection(client, chunks, minilm, strategy="t", model="minilm")
        passages, questions = Counting(minilm), Counting(int8)
        index = Index(chunks.set_index("chunk_id"), None, client, full.alias, passages, query_encoder=questions)
        plain = Index(chunks.set_index("chunk_id"), None, client, full.alias, minilm)
        for question, relevant in (("which planet is the biggest?", "planets"), ("how do cats behave", "cats")):
            served = retrieve(index, question, "dense", RetrievalParams(k=3))
            reference = retrieve(plain, question, "dense", RetrievalParams(k=3))
            assert served[0].chunk["chunk_id"] == reference[0].chunk["chunk_id"] == relevant
            assert abs(served[0].score - reference[0].score) < 0.02  # the same similarity, up to int8's rounding
        assert questions.questions == ["which planet is the biggest?", "how do cats behave"]
        assert passages.questions == []  # the float model encoded no question
    finally:
        close_client(settings)


def test_an_int8_twin_that_disagrees_or_cannot_load_is_refused(minilm, int8):
    from rag.embedding.onnx_int8 import int8_query_encoder

    class OtherWeights:  # same dimension, unrelated vectors: what a twin of other weights would give
        name, version, dim, batch_size = "other", "x", 384, 64
        source, query_prefix, passage_prefix = str(_minilm_dir()), "", ""

        def encode_queries(self, texts):
            rng = np.random.default_rng(0)
            rows = rng.normal(size=(len(texts), 384)).astype(np.float32)
            return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    twin, why_not = int8_query_encoder("minilm", OtherWeights())
    assert twin is None and "disagrees" in why_not
    twin, why_not = int8_query_encoder("wordllama", load_embedder("wordllama"))
    assert twin is None and "no int8 twin" in why_not


def test_a_recorded_pairing_spares_a_server_the_float_model(int8, minilm, data_dir):
    from rag.embedding.onnx_int8 import PAIRING_FILE, PairedEmbedder, int8_query_encoder, paired_embedder

    twin, why_not = int8_query_encoder("minilm", minilm)  # both loaded and the probe passed: the pair is recorded
    assert why_not is None
    recorded = twin.model_path.parent / PAIRING_FILE
    record = json.loads(recorded.read_text())
    assert (record["float_version"], record["dim"], record["window"]) == (minilm.version, 384, 256)
    assert record["probe_cosine"] >= 0.95
    question = "which planet is the biggest?"
    # A fresh process, as a server starts: the float model's name and version (its collections'), the twin's
    # question vectors, and neither torch nor sentence-transformers imported.
    code = (
        "import json, sys; from rag.embedding import load_for_queries; e = load_for_queries('minilm'); "
        f"v = e.encode_queries([{question!r}])[0].tolist(); "
        "print(json.dumps([type(e).__name__, e.name, e.version, e.window, "
        "[m for m in ('torch', 'sentence_transformers') if m in sys.modules], v]))"
    )
    env = {**os.environ, "RAG_DATA_DIR": str(data_dir)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    kind, name, version, window, imported, vector = json.loads(done.stdout.splitlines()[-1])
    assert (kind, name, version, window, imported) == ("PairedEmbedder", "minilm", minilm.version, 256, [])
    np.testing.assert_allclose(vector, twin.encode_queries([question])[0], atol=1e-5)

    loads = []
    paired, why_not = paired_embedder("minilm", _minilm_dir(), "", "", 64, lambda: loads.append(1) or minilm)
    assert why_not is None and isinstance(paired, PairedEmbedder) and paired.twin is twin
    assert int8_query_encoder("minilm", paired) == (twin, None)
    assert paired.count_tokens(["", "protein " * 150]) == minilm.count_tokens(["", "protein " * 150])
    assert loads == []  # questions and token counts need no float model
    np.testing.assert_array_equal(paired.encode_passages(SENTENCES), minilm.encode_passages(SENTENCES))
    paired.encode_passages(SENTENCES[:1])
    assert loads == [1]  # passages are the float model's vectors: loaded at the first, once
    other = paired_embedder("minilm", _minilm_dir(), "", "", 64, lambda: int8)[0]
    with pytest.raises(RuntimeError, match="not the ones its int8 twin was paired with"):
        other.encode_passages(SENTENCES[:1])
    # Other prefixes than the pairing's, or no pairing recorded: None, and the caller loads the float model.
    assert "other prefixes" in paired_embedder("minilm", _minilm_dir(), "query: ", "", 64, lambda: minilm)[1]
    recorded.unlink()
    assert "paired yet" in paired_embedder("minilm", _minilm_dir(), "", "", 64, lambda: minilm)[1]
    int8_query_encoder("minilm", minilm)
    assert json.loads(recorded.read_text()) == record  # pairing again records it again
