"""Parsing real and broken files: every file ends parsed or quarantined with a reason."""

import pytest

from rag.parsing import ELEMENT_SEPARATOR, ParseError, ParseSettings, ocr, parse_file
from tests.fuzzed import make_bad_files, write_invalid_utf8

# The two scanned PDFs are read by OCR where Tesseract is installed, and quarantined where it is not.
SCANNED = ("issue-203-decimalize.pdf", "loremipsum-flat.pdf")
EXPECTED_QUARANTINE = {"password-example.pdf": "encrypted"}
if not ocr.available("eng"):
    EXPECTED_QUARANTINE.update({name: "no-text-layer" for name in SCANNED})


def _assert_offsets(doc):
    assert doc.canonical_text == ELEMENT_SEPARATOR.join(e.text for e in doc.elements)
    for e in doc.elements:
        assert doc.canonical_text[e.char_start : e.char_end] == e.text
        assert 1 <= e.page <= doc.n_pages
        assert ELEMENT_SEPARATOR not in e.text


@pytest.fixture(scope="module")
def parsed_shared(shared_pdfs, shared_mixed):
    results = {}
    for path in sorted(shared_pdfs.glob("*.pdf")) + sorted(
        p for p in shared_mixed.iterdir() if p.name != "manifest.json"
    ):
        try:
            results[path.name] = parse_file(path, doc_id=path.name)
        except ParseError as exc:
            results[path.name] = exc
    return results


def test_every_shared_file_is_parsed_or_quarantined_with_the_expected_reason(parsed_shared):
    assert len(parsed_shared) == 38
    quarantined = {name: r.reason.value for name, r in parsed_shared.items() if isinstance(r, ParseError)}
    assert quarantined == EXPECTED_QUARANTINE
    for name, doc in parsed_shared.items():
        if not isinstance(doc, ParseError):
            assert doc.canonical_text.strip(), name
            _assert_offsets(doc)
    for name in SCANNED:
        result = parsed_shared[name]
        if isinstance(result, ParseError):
            assert "apt-get install tesseract-ocr" in result.message
        else:
            assert result.metadata["ocr_pages"] and all(e.metadata["ocr"] for e in result.elements)
    # Only pages without a text layer go to OCR.
    assert not any(
        "ocr_pages" in doc.metadata
        for name, doc in parsed_shared.items()
        if name not in SCANNED and not isinstance(doc, ParseError)
    )


def test_password_map_opens_the_encrypted_pdf(shared_pdfs):
    doc = parse_file(
        shared_pdfs / "password-example.pdf",
        ParseSettings(pdf_passwords={"secret/*.pdf": "test"}),
        doc_id="secret/password-example.pdf",
    )
    assert doc.n_pages == 4 and "backup" in doc.canonical_text.lower()
    with pytest.raises(ParseError) as err:
        parse_file(
            shared_pdfs / "password-example.pdf",
            ParseSettings(pdf_passwords={"password-example.pdf": "wrong"}),
            doc_id="password-example.pdf",
        )
    assert err.value.reason.value == "encrypted" and "rejected" in err.value.message


def test_tables_are_kept_as_html_elements_with_pages(parsed_shared):
    senate = parsed_shared["senate-expenditures.pdf"]
    tables = [e for e in senate.elements if e.type == "table"]
    assert tables and tables[0].html.startswith("<table><tr><th>")
    assert "<td>" in tables[0].html and tables[0].page == 1
    docx = parsed_shared["docx-tables.docx"]
    assert sum(e.type == "table" for e in docx.elements) == 3
    assert all(e.html and "<tr>" in e.html for e in docx.elements if e.type == "table")


def test_rotated_page_reads_as_words_not_one_letter_per_line(parsed_shared):
    text = parsed_shared["nics-background-checks-2015-11-rotated.pdf"].canonical_text
    assert "Background" in text and "Alabama" in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert sum(len(ln) <= 2 for ln in lines) / len(lines) < 0.05


def test_multi_column_pages_are_read_column_by_column(parsed_shared):
    text = parsed_shared["multi-column.pdf"].canonical_text
    # The abstract's sentence continues in the same column, not interleaved with the right column.
    assert "Open-domain question answering relies on ef-\nficient passage retrieval" in text


def test_headings_from_font_size_become_titles(parsed_shared):
    doc = parsed_shared["multi-column.pdf"]
    titles = [e for e in doc.elements if e.type == "title"]
    assert titles[0].text.startswith("Dense Passage Retrieval") and titles[0].heading_level == 1


def test_fuzzed_files_are_quarantined_with_clear_reasons(tmp_path, shared_pdfs):
    expected = make_bad_files(tmp_path, shared_pdfs / "senate-expenditures.pdf")
    for name, reason in expected.items():
        with pytest.raises(ParseError) as err:
            parse_file(tmp_path / name, doc_id=name)
        assert err.value.reason.value == reason, (name, err.value)
        assert err.value.message


def test_invalid_utf8_text_is_parsed_not_crashed(tmp_path):
    path = tmp_path / "latin1.txt"
    write_invalid_utf8(path)
    doc = parse_file(path)
    assert "menu" in doc.canonical_text


def test_zero_elements_from_a_non_empty_file_is_an_error(tmp_path, monkeypatch):
    import unstructured.partition.auto as auto

    monkeypatch.setattr(auto, "partition", lambda **kwargs: [])
    path = tmp_path / "note.txt"
    path.write_text("Some real text that a working parser would return.")
    with pytest.raises(ParseError) as err:
        parse_file(path)
    assert err.value.reason.value == "empty" and "0 elements" in err.value.message


def test_file_size_limit(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("word " * 1000)
    with pytest.raises(ParseError) as err:
        parse_file(path, ParseSettings(max_file_bytes=1000))
    assert err.value.reason.value == "too-large"
