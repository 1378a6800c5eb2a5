"""OCR (Tesseract) of PDF pages without a text layer: scans parse, and quarantine says why when they cannot."""

from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter

from rag.ingest import document_from_row, document_to_row
from rag.parsing import ParseError, ParseSettings, ocr, parse_file

needs_tesseract = pytest.mark.skipif(
    not ocr.available("eng"),
    reason=(
        "tesseract with English data is not installed "
        "(make install, or apt-get install tesseract-ocr tesseract-ocr-eng)"
    ),
)


def _scanned_pdf(path: Path, lines: list[str]) -> Path:
    """A one-page PDF that is only a picture of `lines` (US letter at 150 dpi): no text layer at all."""
    image = Image.new("L", (1275, 1650), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=44)
    for i, line in enumerate(lines):
        draw.text((120, 150 + 90 * i), line, font=font, fill=0)
    image.save(path, resolution=150)
    return path


def _pages(src: Path, dest: Path, numbers: list[int]) -> Path:
    writer = PdfWriter()
    reader = PdfReader(src)
    for n in numbers:
        writer.add_page(reader.pages[n - 1])
    with open(dest, "wb") as fh:
        writer.write(fh)
    return dest


def test_tesseract_tsv_becomes_paragraphs_in_order_and_specks_are_dropped():
    header = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext"
    rows = [
        "1\t1\t0\t0\t0\t0\t0\t0\t850\t1100\t-1\t",
        "5\t1\t1\t1\t1\t1\t10\t10\t50\t14\t96\tHarbour",
        "5\t1\t1\t1\t1\t2\t70\t10\t50\t14\t90\tcranes",
        "5\t1\t1\t1\t2\t1\t10\t30\t50\t14\t80\trepainted",
        "5\t1\t2\t1\t1\t1\t10\t90\t5\t14\t20\t|",
        "5\t1\t3\t1\t1\t1\t10\t120\t50\t14\t70\tInvoice",
    ]
    paragraphs = ocr.parse_tsv("\n".join([header, *rows]) + "\n")
    assert [p.text for p in paragraphs] == ["Harbour cranes\nrepainted", "Invoice"]
    assert paragraphs[0].confidence == pytest.approx(88.7)


def test_missing_tesseract_quarantines_with_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ocr, "tesseract_path", lambda: None)
    pdf = _scanned_pdf(tmp_path / "scan.pdf", ["Quarterly invoice 4821 is overdue"])
    with pytest.raises(ParseError) as err:
        parse_file(pdf)
    assert err.value.reason.value == "no-text-layer"
    assert "tesseract program is not installed" in err.value.message
    assert "apt-get install tesseract-ocr tesseract-ocr-eng" in err.value.message


def test_ocr_off_quarantines_and_says_so(tmp_path):
    pdf = _scanned_pdf(tmp_path / "scan.pdf", ["Quarterly invoice 4821 is overdue"])
    with pytest.raises(ParseError) as err:
        parse_file(pdf, ParseSettings(ocr=False))
    assert err.value.reason.value == "no-text-layer" and "OCR is off (ParseSettings.ocr)" in err.value.message


@needs_tesseract
def test_scanned_page_is_read_by_ocr_and_its_elements_say_so(tmp_path):
    pdf = _scanned_pdf(
        tmp_path / "scan.pdf", ["Quarterly invoice 4821 is overdue", "", "Harbour cranes need repainting"]
    )
    doc = parse_file(pdf, ParseSettings(ocr_dpi=200))
    assert "Quarterly invoice 4821 is overdue" in doc.canonical_text
    assert "Harbour cranes need repainting" in doc.canonical_text
    assert doc.metadata["ocr_pages"] == "1" and doc.parser == "pdfplumber"
    for e in doc.elements:
        assert e.page == 1 and e.type == "narrative"
        assert e.metadata["source"] == "ocr" and e.metadata["ocr"] is True
        assert e.metadata["ocr_language"] == "eng" and e.metadata["ocr_dpi"] == 200
        assert e.metadata["ocr_engine"].startswith("tesseract") and e.metadata["ocr_confidence"] > 50
    # The metadata survives the parsed_documents table.
    assert document_from_row(document_to_row(doc, "fp")).elements[0].metadata == doc.elements[0].metadata


@needs_tesseract
def test_only_pages_without_a_text_layer_are_read_by_ocr(tmp_path, shared_pdfs):
    writer = PdfWriter()
    writer.append(str(shared_pdfs / "scotus-transcript-p1.pdf"))
    writer.append(str(_scanned_pdf(tmp_path / "scan.pdf", ["Harbour cranes need repainting"])))
    with open(tmp_path / "mixed.pdf", "wb") as fh:
        writer.write(fh)
    doc = parse_file(tmp_path / "mixed.pdf", ParseSettings(ocr_dpi=200))
    text_layer = [e for e in doc.elements if e.page == 1]
    scanned = [e for e in doc.elements if e.page == 2]
    assert text_layer and all(e.metadata is None for e in text_layer)
    assert "MIRZAYANCE" in " ".join(e.text for e in text_layer).upper()
    assert [e.text for e in scanned] == ["Harbour cranes need repainting"] and scanned[0].metadata["ocr"] is True
    assert doc.metadata["ocr_pages"] == "2"


@needs_tesseract
def test_blank_scan_is_quarantined_because_ocr_found_nothing(tmp_path):
    pdf = _scanned_pdf(tmp_path / "blank.pdf", [])
    with pytest.raises(ParseError) as err:
        parse_file(pdf, ParseSettings(ocr_dpi=150))
    assert (
        err.value.reason.value == "no-text-layer" and "OCR (tesseract, language eng) found no text" in err.value.message
    )


@needs_tesseract
def test_missing_language_data_names_the_package(tmp_path):
    pdf = _scanned_pdf(tmp_path / "scan.pdf", ["Quarterly invoice 4821 is overdue"])
    with pytest.raises(ParseError) as err:
        parse_file(pdf, ParseSettings(ocr_language="eng+zz_qq"))
    assert err.value.reason.value == "no-text-layer"
    assert "no language data for zz_qq: apt-get install tesseract-ocr-zz-qq" in err.value.message


@needs_tesseract
def test_installing_tesseract_changes_the_settings_fingerprint(monkeypatch):
    with_tesseract = ParseSettings().fingerprint()
    monkeypatch.setattr(ocr, "tesseract_path", lambda: None)
    # Files quarantined for lack of Tesseract are retried once it is installed.
    assert ParseSettings().fingerprint() != with_tesseract
    assert ParseSettings(ocr=False).fingerprint() != ParseSettings().fingerprint()


def test_huge_pages_are_rendered_at_a_lower_resolution(tmp_path, monkeypatch):
    import pdfplumber

    monkeypatch.setattr(ocr, "MAX_PIXELS", 100_000)
    pdf = _scanned_pdf(tmp_path / "scan.pdf", ["x"])
    with pdfplumber.open(pdf) as doc:
        image, dpi = ocr.render_page(doc.pages[0], 300)
    assert dpi < 300 and image.width * image.height <= 100_000 and image.mode == "L"


# The two scanned PDFs of the shared set (pages rendered and looked at: the words below are printed on them).


@needs_tesseract
def test_shared_scanned_lorem_ipsum_page_parses(shared_pdfs):
    doc = parse_file(shared_pdfs / "loremipsum-flat.pdf", ParseSettings(ocr_dpi=200))
    text = " ".join(doc.canonical_text.split())
    assert text.startswith("Lorem ipsum dolor sit amet, consectetur adipiscing elit.")
    for words in ("Pellentesque in gravida ante", "hac habitasse platea", "Phasellus ornare quis diam at vestibulum"):
        assert words in text
    assert len(doc.elements) == 5  # its five paragraphs
    assert all(e.metadata["ocr"] and e.page == 1 for e in doc.elements)


@needs_tesseract
def test_shared_scanned_chinese_page_parses_with_its_numbers(tmp_path, shared_pdfs):
    # Chinese text needs ocr_language="chi_sim" (tesseract-ocr-chi-sim); with English data the numbers still read.
    first_page = _pages(shared_pdfs / "issue-203-decimalize.pdf", tmp_path / "p1.pdf", [1])
    doc = parse_file(first_page, ParseSettings(ocr_dpi=200))
    for printed in ("2301914001", "C23067150841", "53KG", "668730"):
        assert printed in doc.canonical_text
    assert doc.metadata["ocr_pages"] == "1" and all(e.metadata["source"] == "ocr" for e in doc.elements)
