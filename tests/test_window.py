"""Chunks longer than the embedder's window: counted with the model's own tokenizer, reported with the fix."""

import pandas as pd
import pytest

from rag.embedding import load_embedder, window_fit
from rag.store import CHUNKS_TABLE, TableStore

LONG = "The pressure relief valve must be inspected before every flight. " * 40  # ~480 word-pieces
SHORT = "Inspect the valve."


class _FakeEmbedder:
    """Window of 6 tokens; a token per word plus 2 special tokens."""

    name, window = "fake", 6

    def count_tokens(self, texts):
        return [len(t.split()) + 2 for t in texts]


def test_chunks_over_the_window_are_counted_and_the_message_names_the_fix():
    fit = window_fit(_FakeEmbedder(), ["one two three four five", "a b", "one two three four"])
    assert (fit.truncated, fit.chunks, fit.longest, fit.overhead) == (1, 3, 7, 2)
    assert fit.summary == {
        "truncated_chunks": 1,
        "truncated_share": 0.3333,
        "longest_chunk_tokens": 7,
        "window_tokens": 6,
    }
    note = fit.message("para")
    assert "1 of 3 chunks (33%) of 'para' exceed fake's window of 6 tokens" in note
    assert "max_tokens: 4" in note and "sentence-pack" in note and "longer window" in note  # 6 minus 2 special tokens


def test_short_chunks_give_zero():
    fit = window_fit(_FakeEmbedder(), ["a b", "c d e f"])
    assert fit.truncated == 0 and fit.summary["truncated_chunks"] == 0 and fit.message("para") is None


def test_minilm_states_its_window_and_counts_with_its_tokenizer():
    minilm = load_embedder("minilm")
    assert minilm.window == 256
    long_n, short_n = minilm.count_tokens([LONG, SHORT])
    assert long_n > 256 and short_n == 6  # [CLS] inspect the valve . [SEP]
    fit = window_fit(minilm, [LONG, SHORT])
    assert fit.truncated == 1 and fit.overhead == 2 and "max_tokens: 254" in fit.message("page")


def test_wordllama_reads_whole_texts_so_states_no_window():
    wordllama = load_embedder("wordllama")
    assert wordllama.window is None and window_fit(wordllama, [LONG]) is None
    assert wordllama.count_tokens([SHORT])[0] > 0


@pytest.fixture
def one_long_one_short(tmp_path):
    tables = TableStore(tmp_path / "data" / "tables")
    tables.write(
        pd.DataFrame(
            {"chunk_id": ["long", "short"], "doc_id": ["d", "d"], "text": [LONG, SHORT], "content_hash": ["h1", "h2"]}
        ),
        CHUNKS_TABLE,
        "tiny",
    )
    return tmp_path


def test_embedding_collections_metadata_reports_truncated_chunks(one_long_one_short):
    from dagster import DagsterInstance, MultiPartitionKey, materialize

    from assets.indexing import embedding_collections
    from resources.models import EmbeddingModels
    from resources.qdrant import QdrantResource
    from resources.storage import DataStore

    root = one_long_one_short
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", ["tiny"])
    instance.add_dynamic_partitions("embedding_model", ["minilm"])
    result = materialize(
        [embedding_collections],
        instance=instance,
        partition_key=MultiPartitionKey({"strategy": "tiny", "model": "minilm"}),
        resources={
            "data_store": DataStore(data_dir=str(root / "data")),
            "qdrant": QdrantResource(path=str(root / "qdrant")),
            "embedding_models": EmbeddingModels(config_path=str(root / "none.yaml")),
        },
    )
    meta = result.asset_materializations_for_node("embedding_collections")[0].metadata
    assert meta["truncated_chunks"].value == 1 and meta["truncated_share"].value == 0.5
    assert meta["window_tokens"].value == 256 and "sentence-pack" in meta["window_note"].value


@pytest.mark.slow  # parses, chunks, builds BM25 and a Qdrant collection
def test_rag_index_prints_the_note(tmp_path, monkeypatch, capsys):
    from orchestration.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "manual.txt").write_text(LONG)
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    assert main(["index", str(docs), "--strategy", "page", "--model", "minilm"]) == 0
    out = capsys.readouterr().out
    assert "note: 1 of 1 chunks (100%) of 'page' exceed minilm's window of 256 tokens" in out and "longer window" in out
