"""A search that opens a collection reads its hits' chunk records from the collection's payloads, per hit
(rag.retrieval.chunks.PayloadChunks): the same ranked chunks, scores and records as the whole chunk table in memory
(the way before, RAG_CHUNKS=table), the same answers, overview catalog and passage context, and no table of the
corpus held: an answer reads the records of what it returns, nothing else."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rag.index.qdrant import QdrantSettings, close_client
from rag.qa import Answerer, AnswerSettings
from rag.retrieval import RetrievalParams, SearchFilter, retrieve
from rag.retrieval.chunks import RECORD_FIELDS, PayloadChunks, TableChunks
from rag.retrieval.service import open_index
from rag.serving.app import context_of
from tests.test_passage_context import STRATEGY, index_documents, write_documents

MODEL = "wordllama"
NOTES = {
    "notes/oven.md": "# Baking\n\nBread dough rests two hours.\n\nThe oven is heated to 230 degrees for the loaf.\n\n"
    "## Cooling\n\nThe loaf cools on a rack for an hour before it is cut.\n",
    "notes/space.md": "Rockets burn fuel to reach orbit.\n\nSatellites circle the planet and send pictures home.\n",
}
QUESTIONS = ["how hot is the oven for the bread", "what does the keeper do at dusk", "which animal purrs"]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """(index over the whole chunk table, index reading the collection's payloads, data dir) of one indexed folder."""
    tmp = tmp_path_factory.mktemp("lookup")
    docs = write_documents(tmp / "docs")
    for name, text in NOTES.items():
        (docs / name).write_text(text)
    root = tmp / "data"
    index_documents(docs, root, models=(MODEL,))
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    table = open_index(STRATEGY, MODEL, root=root, qdrant=qdrant, chunk_source="table")
    engine = open_index(STRATEGY, MODEL, root=root, qdrant=qdrant)  # RAG_CHUNKS unset: auto
    yield table, engine, root
    close_client(qdrant)


def plain(record: dict) -> dict:
    """A record's chunk fields as plain Python values (a parquet list column reads as a numpy array)."""

    def value(v):
        if isinstance(v, np.ndarray):
            return v.tolist()
        return v.item() if isinstance(v, np.generic) else v

    return {field: value(record.get(field)) for field in RECORD_FIELDS}


def served(hits) -> list[tuple]:
    return [(h.rank, h.chunk["chunk_id"], round(float(h.score), 6), plain(h.chunk), h.signals) for h in hits]


def test_a_collection_s_search_holds_no_chunk_table_and_serves_what_the_table_did(indexes):
    table, engine, _ = indexes
    assert isinstance(table.lookup, TableChunks) and len(table.lookup) > 5
    assert isinstance(engine.lookup, PayloadChunks) and not isinstance(engine.chunks, pd.DataFrame)
    searches = [
        ("hybrid-cc", RetrievalParams(k=5)),
        ("hybrid-rrf", RetrievalParams(k=5)),
        ("dense", RetrievalParams(k=3)),
        ("bm25", RetrievalParams(k=4)),
        ("hybrid-cc", RetrievalParams(k=3, filters=SearchFilter(doc_ids=["lighthouse.pdf"]))),
        ("hybrid-cc", RetrievalParams(k=3, filters=SearchFilter(page_from=2, page_to=2))),
        ("hybrid-cc", RetrievalParams(k=4, mmr_lambda=0.5)),
    ]
    for mode, params in searches:
        for question in QUESTIONS:
            before, after = retrieve(table, question, mode, params), retrieve(engine, question, mode, params)
            assert before and served(after) == served(before), (mode, params, question)


def test_an_answer_reads_the_records_of_what_it_returns_and_nothing_else(indexes, monkeypatch):
    table, engine, root = indexes
    settings = AnswerSettings(strategy=STRATEGY, model=MODEL, mode="hybrid-cc", k=5, attribution=False)
    reads: list[int] = []
    client = engine.client
    original = client.retrieve

    def counted(collection, ids, **kw):
        reads.append(len(ids))
        return original(collection, ids, **kw)

    searched = client.query_points
    asked_payload: list = []

    def search(collection, **kw):
        asked_payload.append(kw.get("with_payload"))
        return searched(collection, **kw)

    monkeypatch.setattr(client, "retrieve", counted)
    monkeypatch.setattr(client, "query_points", search)
    monkeypatch.setattr(client, "scroll", lambda *a, **kw: pytest.fail("an answer scrolled the collection"))
    for question in QUESTIONS:
        reads.clear()
        before = Answerer(settings, root=root, index=table).ask(question)
        after = Answerer(settings, root=root, index=engine).ask(question)
        assert (after.answer, after.cited_chunk_ids) == (before.answer, before.cited_chunk_ids)
        assert [plain(c) for c in after.chunks] == [plain(c) for c in before.chunks]
        # The top k and their neighbours (prev / next), never more: bounded by what the answer returns.
        assert 0 < sum(reads) <= 3 * settings.k, reads
    # Both searches of hybrid-cc rank point ids: no candidate's payload is read beside its score.
    assert len(asked_payload) >= 2 * len(QUESTIONS) and not any(asked_payload), asked_payload


def test_overview_catalog_and_passage_context_from_the_engine_equal_the_tables(indexes):
    table, engine, _ = indexes
    from_table, from_engine = table.lookup.catalog(), engine.lookup.catalog()
    assert [(d.doc_id, d.title, d.name_words) for d in from_engine.documents] == [
        (d.doc_id, d.title, d.name_words) for d in from_table.documents
    ]
    assert {d.title for d in from_engine.documents} >= {"Baking"}  # a heading, not the file name
    for mine, theirs in zip(from_engine.documents, from_table.documents):
        assert [plain(c) for c in mine.chunks] == [plain(c) for c in theirs.chunks]
    assert engine.lookup.document_count() == table.lookup.document_count() == len(from_table.documents)
    # Some documents' entries (a question's hits'), from either store: those of the whole catalog, nothing else.
    some = [d.doc_id for d in from_table.documents][::2] + ["no-such-document"]
    for lookup in (table.lookup, engine.lookup):
        part = lookup.catalog(doc_ids=some)
        assert [(d.doc_id, d.title) for d in part.documents] == [
            (d.doc_id, d.title) for d in from_table.documents if d.doc_id in some
        ]
        assert lookup.catalog(doc_ids=[]).documents == []

    for chunk_id in table.chunks.index:
        row = engine.lookup.get_many([chunk_id])[chunk_id]
        assert context_of(row, engine.lookup, None) == context_of(table.record(chunk_id), table.lookup, None)
    assert engine.lookup.get_many(["no-such-chunk"]) == {}


def test_bm25_alone_opens_no_collection_and_reads_the_table(indexes):
    _, _, root = indexes
    index = open_index(STRATEGY, None, root=root, need_dense=False, chunk_source="auto")
    assert index.client is None and isinstance(index.lookup, TableChunks)
    with pytest.raises(ValueError, match="RAG_CHUNKS=engine"):
        open_index(STRATEGY, None, root=root, need_dense=False, chunk_source="engine")


def test_a_replica_without_the_chunk_table_serves_from_the_collection(indexes, tmp_path):
    _, engine, root = indexes
    bare = tmp_path / "replica-data"  # no tables/: what a replica without the shared disk has
    bare.mkdir()
    qdrant = QdrantSettings(path=str(Path(root) / "qdrant"))
    index = open_index(STRATEGY, MODEL, root=bare, qdrant=qdrant, bm25="engine")
    hits = retrieve(index, QUESTIONS[0], "hybrid-cc", RetrievalParams(k=3))
    assert served(hits) == served(retrieve(engine, QUESTIONS[0], "hybrid-cc", RetrievalParams(k=3)))


def test_past_catalog_max_chunks_a_question_names_a_document_among_its_hits_and_scans_nothing(indexes, monkeypatch):
    """A catalog of every document reads every chunk's payload; past overview.catalog_max_chunks an answer reads
    only its hits' documents (doc_id filter), and a question naming one of them gets the same overview."""
    table, engine, root = indexes
    whole = AnswerSettings(strategy=STRATEGY, model=MODEL, mode="hybrid-cc", k=5, attribution=False)
    hits_only = whole.model_copy(update={"overview": whole.overview.model_copy(update={"catalog_max_chunks": 0})})
    client = engine.client
    filters: list = []
    original = client.scroll

    def recorded(collection, **kw):
        filters.append(kw.get("scroll_filter"))
        return original(collection, **kw)

    monkeypatch.setattr(client, "scroll", recorded)
    named, ordinary = "what does oven.md cover?", "what about the oven for the bread?"
    before = Answerer(whole, root=root, index=table)
    answerer = Answerer(hits_only, root=root, index=engine)
    assert answerer.names_documents_among_hits() and not before.names_documents_among_hits()
    for question in (named, ordinary):
        filters.clear()
        expected, got = before.ask(question), answerer.ask(question)
        assert (got.answer, got.cited_chunk_ids, got.generator) == (
            expected.answer,
            expected.cited_chunk_ids,
            expected.generator,
        ), question
        # Every scroll is of named documents: a filter with a doc_id condition, never the whole collection.
        assert filters and all(
            f is not None and any(c.key == "doc_id" for c in f.must if hasattr(c, "key")) for f in filters
        ), filters
    assert expected.generator == "extractive" and got.generator == "extractive"
    assert before.ask(named).generator.startswith("overview:")
    assert answerer._catalog is None  # no catalog of every document was built
