"""bench/serving_memory.py: the synthetic chunk set has the chunk table's shape (every column, a document's chunks
linked in order), its BM25 terms batched equal one pass, and (slow) a tiny run measures the way before and the new way
in separate replica processes, finds the same passages both ways, and renders in docs/indexes.md's block."""

import json

import numpy as np
import pytest

from bench.lib.serving_memory import chunk_table, dense_vectors, passage_terms
from rag.chunk_sets import CHUNK_COLUMNS
from rag.index.bm25_sparse import PassageTerms
from tests.test_docs import copy_tree, load_renderer


def test_the_synthetic_chunk_set_is_shaped_like_a_chunk_table():
    table = chunk_table(45, 40, 20, seed=0)
    assert list(table.columns) == CHUNK_COLUMNS and table["chunk_id"].is_unique
    assert table["doc_id"].nunique() == 3 and table["text"].str.split().str.len().eq(40).all()
    for _, doc in table.groupby("doc_id"):
        ids = doc["chunk_id"].tolist()
        assert doc["prev_chunk_id"].tolist() == [None, *ids[:-1]] and doc["next_chunk_id"].tolist() == [*ids[1:], None]
        assert (doc["char_start"].iloc[1:].to_numpy() > doc["char_end"].iloc[:-1].to_numpy()).all()
    assert chunk_table(45, 40, 20, seed=0)["text"].tolist() == table["text"].tolist()  # one seed, one corpus
    vectors = dense_vectors(5, seed=0, start=0)
    assert vectors.shape == (5, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0)


def test_bm25_terms_tokenized_in_batches_equal_one_pass():
    texts = chunk_table(23, 30, 5, seed=1)["text"].tolist()
    batched, whole = passage_terms(texts, batch=7), PassageTerms.of(texts)
    for field in ("indices", "counts", "offsets", "lengths"):
        assert np.array_equal(getattr(batched, field), getattr(whole, field)), field


@pytest.mark.slow
def test_a_tiny_run_measures_both_ways_finds_the_same_passages_and_renders(tmp_path):
    from bench import serving_memory

    out = tmp_path / "serving-memory.json"
    args = ["--chunks", "2400", "--questions", "2", "--layouts", "default", "1m", "--json", str(out)]
    assert serving_memory.main(args) == 0
    record = json.loads(out.read_text())
    # before; records per hit over each layout, and beside the last one without the mapped-page budget and with the
    # copy left in the page cache (which copies this small, within the budget, are anyway)
    assert [r["holds_chunk_table"] for r in record["replicas"]] == [True, False, False, False, False]
    assert [r["float_model"] for r in record["replicas"]] == [True, False, False, False, False]
    assert [r["mapped_pages_mb"] is None for r in record["replicas"]] == [True, False, True, False, False]
    assert not any(r["page_cache_dropped"] for r in record["replicas"])
    # The float model (torch) is what the way before adds on top of the int8 twin every replica now pairs it with.
    before, new = (r["memory_mb"]["model"]["rss"] for r in record["replicas"][:2])
    assert before > new + 200, (before, new)
    assert record["same_passages"] and record["replicas"][1]["passages_shared_with_before"] == 1.0
    assert all(r["summary"]["steady_rss_mb"] > r["summary"]["model_rss_mb"] > 0 for r in record["replicas"])
    assert set(record["builds"]) == {"default", "1m"} and record["floor"]["chunks"] == 2000
    # Which files the mapped pages are: the libraries', and the parts of the replica's copy of the collection (which
    # a budget may have unmapped before the last question).
    for row in record["replicas"]:
        assert row["mapped_mb"]["libraries and model files"] > 0, row
        assert row["mapped_mb"]["write-ahead log"] > 0 or row["mapped_pages_mb"] is not None, row
        assert row["mapped_page_trims"] == 0 or row["mapped_pages_mb"] is not None, row

    (tmp_path / "render").mkdir()
    root = copy_tree(tmp_path / "render")
    (root / "bench" / "results" / "serving-memory.json").write_text(out.read_text())
    page = load_renderer().render(root)[root / "docs" / "indexes.md"]
    assert "| whole chunk table and the float model, layout default (before) | table in memory |" in page
    assert "| replica: mapped pages after the questions, MB |" in page
