"""Every non-PDF format, through unstructured's `partition` (auto-detects the type), offline."""

from __future__ import annotations

import os
from pathlib import Path

from rag.parsing.errors import ParseError, ParserBug, QuarantineReason, blames_the_file
from rag.parsing.models import ElementDraft, ElementType

# unstructured prints an advert and phones home for analytics unless told not to.
os.environ.setdefault("UNSTRUCTURED_DISABLE_NOTICE", "1")
os.environ.setdefault("SCARF_NO_ANALYTICS", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

_CATEGORY_TYPES: dict[str, ElementType] = {
    "Title": "title",
    "NarrativeText": "narrative",
    "ListItem": "list_item",
    "Table": "table",
    "Header": "header",
    "Footer": "footer",
    "CodeSnippet": "code",
    "FigureCaption": "caption",
    "UncategorizedText": "text",
    "Address": "text",
    "EmailAddress": "text",
    "Formula": "text",
}
# Layout markers and pictures carry no text worth indexing.
_SKIPPED_CATEGORIES = {"PageBreak", "Image", "PageNumber"}


def html_table_rows(table_html: str) -> tuple[list[list[str]], bool]:
    """Cells of an HTML table row by row, and whether its first row is a header row."""
    from lxml import html as lxml_html

    root = lxml_html.fromstring(table_html)
    rows, has_header = [], False
    for i, tr in enumerate(root.iter("tr")):
        cells = [c for c in tr if c.tag in ("th", "td")]
        if i == 0 and cells and all(c.tag == "th" for c in cells):
            has_header = True
        rows.append([" ".join(c.text_content().split()) for c in cells])
    return rows, has_header


def parse_with_unstructured(path: Path) -> tuple[list[ElementDraft], int]:
    from unstructured.partition.auto import partition

    try:
        elements = partition(filename=str(path))
    except ParseError:
        raise
    except Exception as exc:
        if not blames_the_file(exc):
            raise ParserBug(str(path), exc) from exc
        text = str(exc)
        reason = (
            QuarantineReason.UNSUPPORTED
            if "not supported" in text.lower() or "filetype" in text.lower()
            else QuarantineReason.MALFORMED
        )
        raise ParseError(reason, f"unstructured could not partition the file: {text[:300]}", exc) from exc
    if not elements:
        # unstructured returns [] instead of failing when a model it needs is missing, so an empty
        # result from a non-empty file is treated as a failure, never as an empty document.
        raise ParseError(
            QuarantineReason.EMPTY,
            "unstructured returned 0 elements for a non-empty file (no text, or a missing NLP model)",
        )
    drafts: list[ElementDraft] = []
    page = 1
    for el in elements:
        category = getattr(el, "category", type(el).__name__)
        if category in _SKIPPED_CATEGORIES:
            continue
        page = getattr(el.metadata, "page_number", None) or page
        kind = _CATEGORY_TYPES.get(category, "other")
        table_html_text = getattr(el.metadata, "text_as_html", None) if kind == "table" else None
        if table_html_text:
            rows, has_header = html_table_rows(table_html_text)
            drafts.append(ElementDraft(type="table", text=el.text or "", page=page, rows=rows, has_header=has_header))
            continue
        if kind == "table":
            kind = "text"  # a table without structure is only text to us
        depth = getattr(el.metadata, "category_depth", None)
        drafts.append(
            ElementDraft(
                type=kind, text=el.text or "", page=page, heading_level=(depth or 0) + 1 if kind == "title" else None
            )
        )
    n_pages = max((d.page for d in drafts), default=1)
    return drafts, n_pages
