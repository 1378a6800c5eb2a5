"""Parsing real and broken files: every file ends parsed or quarantined with a reason."""

from pathlib import Path

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


def _parse_all(paths) -> dict:
    results = {}
    for path in paths:
        try:
            results[path.name] = parse_file(path, doc_id=path.name)
        except ParseError as exc:
            results[path.name] = exc
    return results


@pytest.fixture(scope="module")
def parsed_shared(shared_pdfs, shared_mixed):
    return _parse_all(
        sorted(shared_pdfs.glob("*.pdf")) + sorted(p for p in shared_mixed.iterdir() if p.name != "manifest.json")
    )


# The layout tests below read four files, parsed in seconds; all 38 shared files take about 50 s.
NAMED = ("senate-expenditures.pdf", "nics-background-checks-2015-11-rotated.pdf", "multi-column.pdf")


@pytest.fixture(scope="module")
def parsed_named(shared_pdfs, shared_mixed):
    return _parse_all([shared_pdfs / name for name in NAMED] + [shared_mixed / "docx-tables.docx"])


# slow: the named-file tests below, tests/test_ocr.py (the shared scans included) and tests/test_text_parsing.py keep
# parsing, OCR and quarantine reasons in make test; this one reads every shared file (make test-all).
@pytest.mark.slow
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


def test_each_element_sits_at_its_offsets_in_the_canonical_text(parsed_named):
    assert len(parsed_named) == 4 and not any(isinstance(r, ParseError) for r in parsed_named.values())
    for doc in parsed_named.values():
        _assert_offsets(doc)


def test_tables_are_kept_as_html_elements_with_pages(parsed_named):
    senate = parsed_named["senate-expenditures.pdf"]
    tables = [e for e in senate.elements if e.type == "table"]
    assert tables and tables[0].html.startswith("<table><tr><th>")
    assert "<td>" in tables[0].html and tables[0].page == 1
    docx = parsed_named["docx-tables.docx"]
    assert sum(e.type == "table" for e in docx.elements) == 3
    assert all(e.html and "<tr>" in e.html for e in docx.elements if e.type == "table")


def test_rotated_page_reads_as_words_not_one_letter_per_line(parsed_named):
    text = parsed_named["nics-background-checks-2015-11-rotated.pdf"].canonical_text
    assert "Background" in text and "Alabama" in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert sum(len(ln) <= 2 for ln in lines) / len(lines) < 0.05


def test_multi_column_pages_are_read_column_by_column(parsed_named):
    text = parsed_named["multi-column.pdf"].canonical_text
    # The abstract's sentence continues in the same column, not interleaved with the right column.
    assert "Open-domain question answering relies on ef-\nficient passage retrieval" in text


def test_headings_from_font_size_become_titles(parsed_named):
    doc = parsed_named["multi-column.pdf"]
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
    path = tmp_path / "note.rst"  # a format unstructured still reads (.txt and .md are read natively)
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


# --- tables and paragraphs of the sample corpus ------------------------------------------------------------------
SAMPLE = Path(__file__).resolve().parents[1] / "sample_corpus"


def test_a_table_s_title_row_column_labels_and_stacked_rows_are_read_apart():
    doc = parse_file(SAMPLE / "nics-background-checks-2015-11-rotated.pdf")
    caption, table = doc.elements[0], doc.elements[1]
    assert (caption.type, caption.text) == ("caption", "NICS Firearm Background Checks November - 2015")
    header = table.rows[0]
    # One label per column, under its group's ("Pre-Pawn" over Handgun, Long Gun, *Other).
    assert header[:4] == ["State / Territory", "Permit", "Handgun", "Long Gun"]
    assert header[7:10] == ["Pre-Pawn Handgun", "Pre-Pawn Long Gun", "Pre-Pawn *Other"] and header[-1] == "Totals"
    # Five states were ruled as one row; each is its own now, with as many cells as the header.
    states = [row[0] for row in table.rows[1:6]]
    assert states == ["Alabama", "Alaska", "Arizona", "Arkansas", "California"]
    assert table.rows[1][:3] == ["Alabama", "18,870", "23,022"] and all(len(r) == len(header) for r in table.rows)
    assert table.html.startswith("<table><tr><th>State / Territory</th><th>Permit</th>")
    # The sideways page's footer reads as words, not letters.
    assert doc.elements[-1].text == "Page 1 of 205"


def test_a_double_spaced_page_reads_as_paragraphs_not_one_line_each():
    doc = parse_file(SAMPLE / "scotus-transcript-p1.pdf")
    appearances = next(e for e in doc.elements if "APPEARANCES" in e.text)
    assert appearances.text.endswith(
        "CHARLES M. SEVILLA, ESQ., San Diego, Cal.; on behalf\nof the Respondent."
    ) and appearances.text.startswith("The above-entitled matter came on for oral\nargument")


def _chars(text: str, x: float, top: float, size: float = 8.0) -> list[dict]:
    """pdfplumber-like char dicts for one line of text, half an em per character."""
    width = size / 2
    return [
        {
            "text": ch,
            "x0": x + i * width,
            "x1": x + (i + 1) * width,
            "top": top,
            "bottom": top + size,
            "doctop": top,
            "upright": True,
            "size": size,
            "matrix": (1, 0, 0, 1, 0, 0),
            "fontname": "F",
        }
        for i, ch in enumerate(text)
    ]


def test_a_row_of_wrapped_prose_is_one_row_and_stacked_numbers_are_several():
    from rag.parsing.pdf_tables import read_table

    boxes = [(0, 0, 100, 30), (100, 0, 200, 30), (0, 30, 100, 60), (100, 30, 200, 60)]
    chars = _chars("Item", 2, 2) + _chars("Remarks", 102, 2)
    # Both cells wrap onto two lines of words: one row, its lines joined.
    chars += (
        _chars("Bolts and", 2, 32) + _chars("nuts", 2, 44) + _chars("Checked at", 102, 32) + _chars("noon", 102, 44)
    )
    assert read_table(boxes, chars).rows == [["Item", "Remarks"], ["Bolts and nuts", "Checked at noon"]]
    numbers = _chars("Item", 2, 2) + _chars("Count", 102, 2)
    numbers += _chars("Bolts", 2, 32) + _chars("Nuts", 2, 44) + _chars("1,200", 102, 32) + _chars("35", 102, 44)
    assert read_table(boxes, numbers).rows == [["Item", "Count"], ["Bolts", "1,200"], ["Nuts", "35"]]
