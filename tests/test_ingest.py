"""Incremental parsing and chunking: only what changed is redone; bad files never stop a run."""

import os
import shutil

import pytest

from rag.chunk_sets import update_chunk_set
from rag.chunking import get_chunker
from rag.ingest import update_documents
from rag.parsing import ParseSettings, parse_file
from rag.source import scan_folder


@pytest.fixture
def corpus(tmp_path, shared_pdfs, shared_mixed):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    shutil.copy(shared_pdfs / "scotus-transcript-p1.pdf", root)
    shutil.copy(shared_pdfs / "password-example.pdf", root / "sub")
    shutil.copy(shared_mixed / "fake-html.html", root / "sub")
    (root / "notes.txt").write_text("First note. It has two sentences.")
    (root / "broken.pdf").write_bytes(b"%PDF-1.4 garbage")
    return root


def counting_parser(calls):
    def parse(path, settings, **kw):
        calls.append(kw["doc_id"])
        return parse_file(path, settings, **kw)

    return parse


def test_second_run_parses_nothing_and_a_touched_file_alone_is_reparsed(corpus):
    settings = ParseSettings()
    first = update_documents(scan_folder(corpus), None, None, settings)
    assert sorted(first.parsed) == ["notes.txt", "scotus-transcript-p1.pdf", "sub/fake-html.html"]
    assert dict(zip(first.quarantine.doc_id, first.quarantine.reason)) == {
        "broken.pdf": "malformed",
        "sub/password-example.pdf": "encrypted",
    }

    calls = []
    second = update_documents(
        scan_folder(corpus), first.documents, first.quarantine, settings, parse=counting_parser(calls)
    )
    assert calls == [] and second.parsed == [] and len(second.unchanged) == 5
    assert second.documents.equals(first.documents)

    (corpus / "notes.txt").write_text("First note, edited. Now it says something else.")
    (corpus / "sub" / "fake-html.html").unlink()
    third = update_documents(
        scan_folder(corpus), second.documents, second.quarantine, settings, parse=counting_parser(calls)
    )
    assert calls == ["notes.txt"] and third.removed == ["sub/fake-html.html"]
    assert "edited" in third.documents.set_index("doc_id").loc["notes.txt", "canonical_text"]


def test_adding_a_password_retries_only_the_encrypted_file(corpus):
    first = update_documents(scan_folder(corpus), None, None, ParseSettings())
    calls = []
    second = update_documents(
        scan_folder(corpus),
        first.documents,
        first.quarantine,
        ParseSettings(pdf_passwords={"sub/password-example.pdf": "test"}),
        parse=counting_parser(calls),
    )
    # Settings changed, so everything is re-parsed once; the encrypted file now succeeds.
    assert "sub/password-example.pdf" in second.parsed
    assert list(second.quarantine.doc_id) == ["broken.pdf"]


def test_chunk_set_rechunks_only_changed_documents(corpus):
    settings = ParseSettings()
    docs = update_documents(scan_folder(corpus), None, None, settings)
    chunker = get_chunker("paragraph")
    first = update_chunk_set(None, docs.documents, chunker)
    assert sorted(first.rechunked) == sorted(docs.documents.doc_id)
    again = update_chunk_set(first.chunks, docs.documents, chunker)
    assert again.rechunked == [] and again.chunks.equals(first.chunks)

    (corpus / "notes.txt").write_text("A different note. " * 30)
    docs2 = update_documents(scan_folder(corpus), docs.documents, docs.quarantine, settings)
    third = update_chunk_set(again.chunks, docs2.documents, chunker)
    assert third.rechunked == ["notes.txt"]
    kept = third.chunks[third.chunks.doc_id != "notes.txt"].reset_index(drop=True)
    assert kept.equals(first.chunks[first.chunks.doc_id != "notes.txt"].reset_index(drop=True))


def test_outside_root_symlink_is_quarantined(corpus, tmp_path):
    (tmp_path / "elsewhere.txt").write_text("outside")
    (corpus / "link.txt").symlink_to(tmp_path / "elsewhere.txt")
    run = update_documents(scan_folder(corpus), None, None, ParseSettings())
    assert run.quarantine.set_index("doc_id").loc["link.txt", "reason"] == "outside-root"


class FailingChunker:
    """Wraps a chunker and fails on chosen documents, like a semantic chunker whose model failed to load."""

    def __init__(self, inner, fail_on):
        self.inner, self.fail_on = inner, set(fail_on)
        self.name, self.config = inner.name, inner.config
        self.fingerprint = inner.fingerprint + "-changed"  # a params change forces a re-chunk of every document

    def chunk(self, doc):
        if doc.doc_id in self.fail_on:
            raise OSError("embedding model failed to load")
        return self.inner.chunk(doc)


def test_a_chunking_failure_keeps_the_documents_previous_chunks(corpus):
    docs = update_documents(scan_folder(corpus), None, None, ParseSettings())
    chunker = get_chunker("paragraph")
    first = update_chunk_set(None, docs.documents, chunker)
    before = first.chunks[first.chunks.doc_id == "notes.txt"]
    assert len(before)

    failing = update_chunk_set(first.chunks, docs.documents, FailingChunker(chunker, {"notes.txt"}))
    after = failing.chunks[failing.chunks.doc_id == "notes.txt"]
    assert list(after.chunk_id) == list(before.chunk_id)  # still searchable
    assert list(failing.failures.doc_id) == ["notes.txt"]
    assert failing.failures.kept_previous_chunks.tolist() == [len(before)]
    assert "failed to load" in failing.failures.error.iloc[0]
    # The kept chunks carry the old fingerprint, so the next healthy run re-chunks the document.
    healed = update_chunk_set(failing.chunks, docs.documents, FailingChunker(chunker, set()))
    assert "notes.txt" in healed.rechunked and healed.failures.empty


def test_a_bug_in_our_parsing_code_fails_loudly_and_is_not_quarantined(corpus, monkeypatch):
    import rag.parsing.pdf
    from rag.parsing import ParserBug

    def buggy(path, **kw):
        return {}["missing key"]  # a bug raised by our code, not by an installed parser library

    monkeypatch.setenv("RAG_PARSE_PROCESSES", "1")  # PDFs parsed here, where the patch is: not in spawned processes
    monkeypatch.setattr(rag.parsing.pdf, "parse_pdf", buggy)
    with pytest.raises(ParserBug, match=r"parsing .*\.pdf failed in our code"):
        update_documents(scan_folder(corpus), None, None, ParseSettings())


def test_a_missing_module_fails_loudly_and_a_library_failure_on_the_file_is_quarantined(corpus, monkeypatch):
    import rag.parsing.pdf
    from rag.parsing import ParserBug

    def missing_module(path, **kw):
        raise ModuleNotFoundError("No module named 'pdfminer'")

    monkeypatch.setenv("RAG_PARSE_PROCESSES", "1")  # PDFs parsed here, where the patch is: not in spawned processes
    monkeypatch.setattr(rag.parsing.pdf, "parse_pdf", missing_module)
    with pytest.raises(ParserBug, match="ModuleNotFoundError"):
        update_documents(scan_folder(corpus), None, None, ParseSettings())
    monkeypatch.undo()
    monkeypatch.setenv("RAG_PARSE_PROCESSES", "1")

    import json

    # An installed library raising deep inside (here the standard library's JSON decoder) is the file's fault.
    monkeypatch.setattr(rag.parsing.pdf, "extract_words", lambda *a, **kw: json.loads("{not json"))
    run = update_documents(scan_folder(corpus), None, None, ParseSettings())
    reasons = dict(zip(run.quarantine.doc_id, run.quarantine.reason))
    assert reasons["scotus-transcript-p1.pdf"] == "parser-error"
    assert "notes.txt" in run.parsed


def _text_folder(root, texts: dict[str, str]):
    root.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (root / name).write_text(text)
    return root


def test_a_file_gone_or_unreadable_after_the_scan_is_quarantined_not_a_parser_bug(tmp_path):
    docs = _text_folder(tmp_path / "docs", {"kept.txt": "Still here to be read.", "gone.txt": "Deleted soon."})
    scan = scan_folder(docs)
    (docs / "gone.txt").unlink()
    run = update_documents(scan, None, None, ParseSettings())
    assert run.parsed == ["kept.txt"]
    row = run.quarantine.set_index("doc_id").loc["gone.txt"]
    assert row.reason == "unreadable" and "vanished before it could be read" in row.message


def test_a_document_over_the_character_cap_is_never_stored(tmp_path, shared_mixed):
    # An HTML file's text is only known once parsed: the cap is checked on the parsed text.
    docs = _text_folder(tmp_path / "docs", {"short.txt": "A short note."})
    shutil.copy(shared_mixed / "fake-html.html", docs / "page.html")
    run = update_documents(scan_folder(docs), None, None, ParseSettings(max_document_chars=20))
    assert list(run.documents.doc_id) == ["short.txt"]
    row = run.quarantine.set_index("doc_id").loc["page.html"]
    assert row.reason == "too-large"
    assert row.message.startswith("parsed text is ") and "; the cap is 20 (RAG_MAX_DOCUMENT_CHARS" in row.message


def test_a_stored_document_over_a_new_cap_is_quarantined_without_a_reparse(tmp_path, monkeypatch):
    """Documents stored before the cap existed (or under a higher one) are held to it from their n_chars: the
    default cap is left out of the settings fingerprint, so upgrading re-parses nothing."""
    import rag.parsing.settings

    docs = _text_folder(tmp_path / "docs", {"short.txt": "A short note.", "long.txt": "Many words here. " * 20})
    first = update_documents(scan_folder(docs), None, None, ParseSettings())
    assert sorted(first.parsed) == ["long.txt", "short.txt"]
    monkeypatch.setattr(rag.parsing.settings, "DEFAULT_MAX_DOCUMENT_CHARS", 100)  # as if the cap had just come
    settings = ParseSettings(max_document_chars=100)
    assert settings.fingerprint() == first.documents.settings_fingerprint.iloc[0]
    calls = []
    second = update_documents(
        scan_folder(docs), first.documents, first.quarantine, settings, parse=counting_parser(calls)
    )
    assert calls == [] and list(second.documents.doc_id) == ["short.txt"] and second.quarantined == ["long.txt"]
    assert "the cap is 100" in second.quarantine.set_index("doc_id").loc["long.txt", "message"]


def test_the_caps_read_their_environment_variables(monkeypatch):
    from rag.chunk_sets import ChunkLimits

    monkeypatch.setenv("RAG_MAX_DOCUMENT_CHARS", "1_000_000")
    monkeypatch.setenv("RAG_MAX_CHUNKS_PER_DOCUMENT", "2,500")
    assert ParseSettings().max_document_chars == 1_000_000
    assert ChunkLimits().max_chunks_per_document == 2500
    monkeypatch.setenv("RAG_MAX_DOCUMENT_CHARS", "lots")
    with pytest.raises(ValueError, match="RAG_MAX_DOCUMENT_CHARS='lots' is not a whole number"):
        ParseSettings()


class CountingChunker:
    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name, self.config, self.fingerprint = inner.name, inner.config, inner.fingerprint

    def chunk(self, doc):
        self.calls.append(doc.doc_id)
        return self.inner.chunk(doc)


def test_a_document_over_the_chunk_cap_leaves_no_rows_and_is_not_chunked_again(tmp_path):
    from rag.chunk_sets import ChunkLimits

    # Each over the paragraph strategy's min_chars (100), so each is a chunk of its own.
    paragraphs = [f"Paragraph {i} is about tides and the moon, long enough to be a chunk. " * 2 for i in range(6)]
    docs = _text_folder(tmp_path / "docs", {"short.txt": "One paragraph only, about comets.", "long.txt": "Intro."})
    parsed = update_documents(scan_folder(docs), None, None, ParseSettings())
    chunker = CountingChunker(get_chunker("paragraph"))
    first = update_chunk_set(None, parsed.documents, chunker, limits=ChunkLimits(max_chunks_per_document=3))
    assert set(first.chunks.doc_id) == {"long.txt", "short.txt"} and first.quarantine.empty

    (docs / "long.txt").write_text("\n\n".join(paragraphs))  # grows past the cap: its old chunks go too
    parsed = update_documents(scan_folder(docs), parsed.documents, parsed.quarantine, ParseSettings())
    capped = ChunkLimits(max_chunks_per_document=3)
    second = update_chunk_set(first.chunks, parsed.documents, chunker, limits=capped)
    assert set(second.chunks.doc_id) == {"short.txt"} and second.quarantined == ["long.txt"]
    assert second.quarantine.n_chunks.tolist() == [6] and second.summary["quarantined_documents"] == 1

    chunker.calls.clear()
    third = update_chunk_set(
        second.chunks, parsed.documents, chunker, limits=capped, previous_quarantine=second.quarantine
    )
    assert chunker.calls == [] and third.quarantine.equals(second.quarantine) and third.quarantined == []

    raised = update_chunk_set(
        third.chunks,
        parsed.documents,
        chunker,
        limits=ChunkLimits(max_chunks_per_document=10),
        previous_quarantine=third.quarantine,
    )
    assert chunker.calls == ["long.txt"] and raised.quarantine.empty
    assert (raised.chunks.doc_id == "long.txt").sum() == 6


# --- PDFs in parallel processes --------------------------------------------------------------------------------------
# The parse functions below are module-level so spawned processes can import them.


def parse_or_die(path, settings, **kw):
    """parse_file, except that a file named die*.pdf kills the process parsing it (as a crash in a native library
    would); never the test's own process."""
    import multiprocessing
    import signal

    if path.name.startswith("die") and multiprocessing.parent_process() is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    return parse_file(path, settings, **kw)


def parse_with_a_bug(path, settings, **kw):
    if path.suffix == ".pdf":
        return {}["missing key"]  # a bug in the parse function, raised in the process parsing the PDF
    return parse_file(path, settings, **kw)


def _tables(run):
    return run.documents.drop(columns="parsed_at"), run.quarantine.drop(columns="quarantined_at")


def test_pdfs_parsed_in_processes_give_the_tables_one_process_gives(corpus, monkeypatch, caplog):
    shutil.copy(corpus / "scotus-transcript-p1.pdf", corpus / "sub" / "copy.pdf")
    monkeypatch.setenv("RAG_PARSE_PROCESSES", "1")
    alone = update_documents(scan_folder(corpus), None, None, ParseSettings())
    monkeypatch.setenv("RAG_PARSE_PROCESSES", "2")
    with caplog.at_level("INFO", logger="rag.parsing.parallel"):
        pooled = update_documents(scan_folder(corpus), None, None, ParseSettings())
    assert "parsing 4 PDFs in 2 processes" in caplog.text
    for got, want in zip(_tables(pooled), _tables(alone)):
        assert got.equals(want)
    assert pooled.parsed == alone.parsed and pooled.quarantined == alone.quarantined


def test_a_parse_that_kills_its_process_quarantines_that_file_and_the_run_goes_on(corpus, monkeypatch):
    shutil.copy(corpus / "scotus-transcript-p1.pdf", corpus / "die.pdf")
    monkeypatch.setenv("RAG_PARSE_PROCESSES", "2")
    run = update_documents(scan_folder(corpus), None, None, ParseSettings(), parse=parse_or_die)
    row = run.quarantine.set_index("doc_id").loc["die.pdf"]
    assert row.reason == "parser-error" and "process parsing this file died" in row.message
    assert sorted(run.parsed) == ["notes.txt", "scotus-transcript-p1.pdf", "sub/fake-html.html"]
    assert dict(zip(run.quarantine.doc_id, run.quarantine.reason)) == {
        "broken.pdf": "malformed",
        "die.pdf": "parser-error",
        "sub/password-example.pdf": "encrypted",
    }


def test_a_bug_in_a_parse_process_fails_the_run_naming_the_file(corpus, monkeypatch):
    from rag.parsing import ParserBug

    monkeypatch.setenv("RAG_PARSE_PROCESSES", "2")
    with pytest.raises(ParserBug, match=r"parsing .*\.pdf failed in our code or environment \(KeyError"):
        update_documents(scan_folder(corpus), None, None, ParseSettings(), parse=parse_with_a_bug)


def test_processes_are_used_only_where_cores_are_free(monkeypatch):
    from rag.parsing import parallel

    monkeypatch.delenv("RAG_PARSE_PROCESSES", raising=False)
    monkeypatch.setattr(parallel, "available_cores", lambda: 8)
    for load, processes in [(1.0, 8), (3.5, 5), (9.0, 1)]:  # the load counts this process itself
        monkeypatch.setattr(parallel.os, "getloadavg", lambda load=load: (load, load, load))
        assert parallel.parse_processes() == processes
    monkeypatch.setenv("RAG_PARSE_PROCESSES", "3")
    assert parallel.parse_processes() == 3


UNGUARDED = """
import sys
from rag.ingest import update_documents
from rag.parsing import ParseSettings
from rag.source import scan_folder

run = update_documents(scan_folder(sys.argv[1]), None, None, ParseSettings())
print("parsed", sorted(run.parsed), "quarantined", sorted(run.quarantined), flush=True)
"""


def test_a_script_without_a_main_guard_still_parses_its_pdfs(tmp_path, shared_pdfs):
    """Spawned processes import the script, which starts processes again and dies: the PDFs are parsed in the
    script's process, not quarantined for it."""
    import subprocess
    import sys
    from pathlib import Path

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(shared_pdfs / "scotus-transcript-p1.pdf", docs / "a.pdf")
    shutil.copy(shared_pdfs / "scotus-transcript-p1.pdf", docs / "b.pdf")
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "RAG_PARSE_PROCESSES": "2", "PYTHONPATH": str(repo)}
    out = subprocess.run(
        [sys.executable, str(script), str(docs)], cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "parsed ['a.pdf', 'b.pdf'] quarantined []"
    assert "are parsed in this process instead" in out.stderr
