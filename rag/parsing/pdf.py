"""PDF backend (pdfplumber): per-page text in reading order, tables as their own HTML elements, OCR (Tesseract) for
pages without a text layer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pdfplumber
from pdfplumber.utils import extract_words

from rag.parsing.boilerplate import running_lines
from rag.parsing.errors import ParseError, QuarantineReason
from rag.parsing.models import ElementDraft
from rag.parsing.ocr import OcrUnavailable, check_available, ocr_image, render_page
from rag.parsing.pdf_tables import TableText, read_table
from rag.parsing.pdf_layout import (
    Line,
    body_font_size,
    detect_rotation,
    group_blocks,
    is_heading,
    reading_order,
    upright_chars,
    words_to_lines,
)
from rag.parsing.settings import ParseSettings

# A table needs at least this shape to be worth keeping as a table rather than as text.
MIN_TABLE_ROWS = 2
MIN_TABLE_COLS = 2
# Tightly set PDFs (LaTeX papers) have inter-word gaps under pdfplumber's default of 3 pt.
WORD_GAP_POINTS = 1.5


def _open(path: Path, password: str | None) -> pdfplumber.PDF:
    try:
        pdf = pdfplumber.open(path, password=password or "")
        _ = pdf.pages  # forces the document catalogue to be read, where most corruption shows
        return pdf
    except Exception as exc:  # pdfplumber wraps every pdfminer failure in one exception type
        cause = exc.__cause__ or exc.__context__ or exc
        name = type(cause).__name__
        if "Password" in name or "Encrypt" in name or "password" in str(exc).lower():
            hint = "the configured password was rejected" if password else "no password configured"
            raise ParseError(
                QuarantineReason.ENCRYPTED,
                f"PDF is encrypted ({hint}); add it to ParseSettings.pdf_passwords",
                cause,
            ) from exc
        raise ParseError(QuarantineReason.MALFORMED, f"cannot open PDF: {exc or name}", cause) from exc


def _page_lines(page, settings: ParseSettings, tables_out: list[TableText]) -> list[Line]:
    rotation = detect_rotation(page.chars, float(page.width), float(page.height))
    chars = upright_chars(page.chars, rotation)
    table_boxes: list[tuple[float, float, float, float]] = []
    placeholders: list[Line] = []
    if settings.extract_tables:
        for table in page.find_tables():
            # Read in the upright frame: a rotated page's rows and columns swap.
            read = read_table([rotation.box(*cell) for cell in table.cells], chars)
            read.rows = [r for r in read.rows if any(cell for cell in r)]
            if len(read.rows) < MIN_TABLE_ROWS or max((len(r) for r in read.rows), default=0) < MIN_TABLE_COLS:
                continue
            box = rotation.box(*table.bbox)
            table_boxes.append(box)
            placeholders.append(Line([], box[0], box[1], box[2], box[3], 0.0, table_index=len(tables_out)))
            tables_out.append(read)

    def outside_tables(c: dict) -> bool:
        cx, cy = (c["x0"] + c["x1"]) / 2, (c["top"] + c["bottom"]) / 2
        return not any(x0 <= cx <= x1 and t <= cy <= b for x0, t, x1, b in table_boxes)

    words = extract_words(
        [c for c in chars if outside_tables(c)],
        extra_attrs=["size"],
        keep_blank_chars=False,
        x_tolerance=WORD_GAP_POINTS,
    )
    return reading_order(words_to_lines(words) + placeholders, rotation.upright_width)


def _ocr_pages(
    pdf: pdfplumber.PDF, page_nos: list[int], settings: ParseSettings
) -> tuple[dict[int, list[ElementDraft]], str | None]:
    """OCR drafts for the given pages (1-based), or why OCR did not run (off, or Tesseract/language missing)."""
    if not page_nos:
        return {}, None
    if not settings.ocr:
        return {}, "OCR is off (ParseSettings.ocr)"
    try:
        version = check_available(settings.ocr_language)
    except OcrUnavailable as exc:
        return {}, f"OCR is unavailable: {exc}"
    out: dict[int, list[ElementDraft]] = {}
    for page_no in page_nos:
        image, dpi = render_page(pdf.pages[page_no - 1], settings.ocr_dpi)
        try:
            paragraphs = ocr_image(
                image, language=settings.ocr_language, dpi=dpi, timeout_s=settings.ocr_page_timeout_s
            )
        except subprocess.TimeoutExpired as exc:
            raise ParseError(
                QuarantineReason.PARSER_ERROR,
                f"OCR of page {page_no} took over {settings.ocr_page_timeout_s:g} s (ParseSettings.ocr_page_timeout_s)",
                exc,
            ) from exc
        except RuntimeError as exc:
            raise ParseError(QuarantineReason.PARSER_ERROR, f"OCR of page {page_no} failed: {exc}", exc) from exc
        meta = {
            "source": "ocr",
            "ocr": True,
            "ocr_engine": version,
            "ocr_language": settings.ocr_language,
            "ocr_dpi": dpi,
        }
        out[page_no] = [
            ElementDraft(type="narrative", text=p.text, page=page_no, metadata={**meta, "ocr_confidence": p.confidence})
            for p in paragraphs
        ]
    return out, None


def _set_aside_running_lines(
    page_lines: list[tuple[int, list[Line]]],
) -> tuple[list[tuple[int, list[Line]]], list[ElementDraft]]:
    """The pages' lines without their running headers and footers, and those as header / footer drafts."""
    furniture = running_lines([lines for _, lines in page_lines])
    if not furniture:
        return page_lines, []
    drafts = [
        ElementDraft(
            type="header" if position == "top" else "footer", text=page_lines[p][1][i].text, page=page_lines[p][0]
        )
        for (p, i), position in sorted(furniture.items())
    ]
    kept = [
        (page_no, [ln for i, ln in enumerate(lines) if (p, i) not in furniture])
        for p, (page_no, lines) in enumerate(page_lines)
    ]
    return kept, drafts


def parse_pdf(path: Path, *, doc_id: str, settings: ParseSettings) -> tuple[list[ElementDraft], int, dict[str, str]]:
    """Return element drafts in reading order, the page count, and document metadata."""
    pdf = _open(path, settings.password_for(doc_id))
    with pdf:
        n_pages = len(pdf.pages)
        if n_pages > settings.max_pages:
            raise ParseError(
                QuarantineReason.TOO_LARGE,
                f"{n_pages} pages exceeds the limit of {settings.max_pages} (ParseSettings.max_pages)",
            )
        tables: list[TableText] = []
        page_lines: list[tuple[int, list[Line]]] = []
        for page_no, page in enumerate(pdf.pages, start=1):
            page_lines.append((page_no, _page_lines(page, settings, tables)))
        # A page without a single word or table has no text layer (a scan, or a blank page): OCR reads it.
        no_text_layer = [page_no for page_no, lines in page_lines if not lines]
        ocr_drafts, ocr_skipped = _ocr_pages(pdf, no_text_layer, settings)
        metadata = {k: str(v) for k, v in (pdf.metadata or {}).items() if isinstance(v, (str, int, float))}
    if ocr_drafts:
        metadata["ocr_pages"] = ",".join(str(n) for n in ocr_drafts)
    if ocr_skipped:
        metadata["ocr_skipped"] = f"pages {','.join(map(str, no_text_layer))} have no text layer; {ocr_skipped}"

    drafts: list[ElementDraft] = []
    if settings.strip_boilerplate:
        page_lines, drafts = _set_aside_running_lines(page_lines)
    all_lines = [ln for _, lines in page_lines for ln in lines]
    body = body_font_size(all_lines)
    heading_sizes = sorted(
        {round(ln.size * 2) / 2 for ln in all_lines if ln.table_index is None and is_heading(ln, body)}, reverse=True
    )
    level_of = {size: i + 1 for i, size in enumerate(heading_sizes)}

    for page_no, lines in page_lines:
        drafts.extend(ocr_drafts.get(page_no, []))
        for block in group_blocks(lines, body):
            first = block.lines[0]
            if first.table_index is not None:
                table = tables[first.table_index]
                if table.title:
                    drafts.append(ElementDraft(type="caption", text=table.title, page=page_no))
                drafts.append(ElementDraft(type="table", text="", page=page_no, rows=table.rows, has_header=True))
            elif is_heading(first, body):
                drafts.append(
                    ElementDraft(
                        type="title",
                        text=block.text,
                        page=page_no,
                        heading_level=level_of.get(round(first.size * 2) / 2, 1),
                    )
                )
            else:
                drafts.append(ElementDraft(type="narrative", text=block.text, page=page_no))
    if not any(d.text.strip() or d.rows for d in drafts):
        message = f"no extractable text in {n_pages} page(s): scanned or image-only PDF"
        if ocr_skipped:
            message += f"; {ocr_skipped}"
        elif no_text_layer:
            message += (
                f"; OCR (tesseract, language {settings.ocr_language}) found no text either: blank pages, or "
                "text in another script or language (ParseSettings.ocr_language)"
            )
        raise ParseError(QuarantineReason.NO_TEXT_LAYER, message)
    return drafts, n_pages, metadata
