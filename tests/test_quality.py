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


def qa_of(questions_per_document: dict[str, int], dev: set[str]):
    """A QA set of valid questions, `questions_per_document[d]` of document d, the documents in `dev` in dev."""
    import json

    import pandas as pd

    rows = [
        {
            "qid": f"{doc}-{i}",
            "question": f"which keeper of {doc} tested the foghorn {i}?",
            "qtype": "answer-aware",
            "doc_id": doc,
            "evidence_json": json.dumps([{"doc_id": doc, "start": 0, "end": 10}]),
            "split": "dev" if doc in dev else "train",
        }
        for doc, n in questions_per_document.items()
        for i in range(n)
    ]
    documents = pd.DataFrame({"doc_id": list(questions_per_document), "n_chars": 100})
    return pd.DataFrame(rows), documents


@pytest.mark.parametrize(
    "counts, dev",
    [
        # The reported corpus: 98 papers, 4 questions each, the 20 dev ones topped up to 400 for the gate (56% dev).
        ({**{f"p{i}": 20 for i in range(20)}, **{f"p{i}": 4 for i in range(20, 98)}}, {f"p{i}" for i in range(20)}),
        ({"long.pdf": 60, "a.pdf": 2, "b.pdf": 1}, {"long.pdf"}),  # few documents, very unequal: 95% dev
        ({"long.pdf": 60, "a.pdf": 2, "b.pdf": 1}, {"b.pdf"}),  # 2% dev
    ],
)
def test_the_qa_set_dev_share_is_of_documents_whatever_their_question_counts(counts, dev):
    from rag.quality.suites import check_qa_set

    qa, documents = qa_of(counts, dev)
    assert check_qa_set(qa, documents).success


@pytest.mark.parametrize("dev", ["all", "none", "most"])
def test_a_broken_qa_split_fails_the_dev_share(dev):
    from rag.quality.suites import check_qa_set

    counts = {f"p{i}": 4 for i in range(10)}
    chosen = {"all": set(counts), "none": set(), "most": {f"p{i}" for i in range(6)}}[dev]
    qa, documents = qa_of(counts, chosen)
    assert failed(check_qa_set(qa, documents)) == {("expect_column_mean_to_be_between", "dev_document")}
