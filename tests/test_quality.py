"""The GX suites pass on good tables and fail, naming the expectation, on corrupted ones."""

import pytest

from rag.chunk_sets import update_chunk_set
from rag.chunking import get_chunker
from rag.ingest import update_documents
from rag.parsing import ParseSettings
from rag.quality.suites import check_chunks, check_documents
from rag.source import scan_folder


@pytest.fixture(scope="module")
def tables(tmp_path_factory, shared_mixed):
    root = tmp_path_factory.mktemp("docs")
    for name in ["book-war-and-peace-1p.txt", "fake-html.html", "docx-tables.docx"]:
        (root / name).write_bytes((shared_mixed / name).read_bytes())
    docs = update_documents(scan_folder(root), None, None, ParseSettings()).documents
    chunks = update_chunk_set(None, docs, get_chunker("recursive-1000-200")).chunks
    return docs, chunks


def failed(outcome):
    return {(e.expectation, e.column) for e in outcome.failed}


def test_clean_tables_pass(tables):
    docs, chunks = tables
    assert check_documents(docs).success
    assert check_chunks(chunks, docs, max_chars=1000).success


def test_corrupted_documents_fail(tables):
    docs, _ = tables
    bad = docs.copy()
    bad.loc[1, "doc_id"] = bad.loc[0, "doc_id"]
    bad.loc[2, "canonical_text"] = "   "
    bad.loc[2, "n_pages"] = 0
    assert failed(check_documents(bad)) == {
        ("expect_column_values_to_be_unique", "doc_id"),
        ("expect_column_values_to_be_between", "text_chars"),
        ("expect_column_values_to_be_between", "n_pages"),
    }


def test_corrupted_chunks_fail(tables):
    docs, chunks = tables
    bad = chunks.copy()
    bad.loc[0, "char_start"] += 3  # span no longer reproduces the text
    bad.loc[1, "chunk_id"] = bad.loc[2, "chunk_id"]
    outcome = check_chunks(bad, docs, max_chars=1000)
    assert failed(outcome) == {
        ("expect_column_values_to_be_in_set", "span_consistent"),
        ("expect_column_values_to_be_unique", "chunk_id"),
    }
    too_long = check_chunks(chunks, docs, max_chars=50)
    assert ("expect_column_values_to_be_between", "text_chars_without_tables") in failed(too_long)
