"""Records produced by parsing: ordered elements laid out in one canonical document text."""

from __future__ import annotations

import html
from typing import Literal

from pydantic import BaseModel, Field

# Elements are joined with this separator to form the canonical text. It is fixed (not configurable)
# because every character span stored downstream (chunks, QA evidence) is an offset into that text.
ELEMENT_SEPARATOR = "\n\n"

# Inside a table element's canonical text, one line per row and cells joined by this string, so a
# row boundary is always a "\n" and chunkers can split tables between rows, never inside one.
TABLE_CELL_SEPARATOR = " | "

ElementType = Literal[
    "title", "narrative", "list_item", "table", "text", "header", "footer", "code", "caption", "other"
]


class Element(BaseModel):
    index: int
    type: ElementType
    text: str
    page: int = 1
    char_start: int
    char_end: int
    # Heading depth for titles (1 = top level); None for body elements.
    heading_level: int | None = None
    # Tables only: cell texts row by row (first row is the header when has_header) and its HTML.
    rows: list[list[str]] | None = None
    has_header: bool = False
    html: str | None = None
    # Where the text came from when not the file's own text, e.g. OCR:
    # {"source": "ocr", "ocr": True, "ocr_engine": "tesseract 5.3.0", "ocr_language": "eng", "ocr_confidence": 91.2}.
    metadata: dict[str, str | bool | int | float] | None = None


class ParsedDocument(BaseModel):
    doc_id: str
    source_path: str
    content_hash: str
    parser: str
    n_pages: int
    canonical_text: str
    elements: list[Element]
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def n_tables(self) -> int:
        return sum(1 for e in self.elements if e.type == "table")


def table_text(rows: list[list[str]]) -> str:
    return "\n".join(TABLE_CELL_SEPARATOR.join(row).strip() for row in rows)


def table_html(rows: list[list[str]], has_header: bool) -> str:
    """HTML for a table (or a row range of one): `<th>` cells for the header row, `<td>` elsewhere."""
    out = ["<table>"]
    for i, row in enumerate(rows):
        tag = "th" if has_header and i == 0 else "td"
        cells = "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in row)
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "".join(out)


class ElementDraft(BaseModel):
    """An element before it has offsets: what a format backend emits."""

    type: ElementType
    text: str
    page: int = 1
    heading_level: int | None = None
    rows: list[list[str]] | None = None
    has_header: bool = False
    metadata: dict[str, str | bool | int | float] | None = None


def _clean(text: str) -> str:
    # Separators must only ever appear between elements, so a blank line inside an element is
    # collapsed to a single newline; offsets stay exact because this happens before layout.
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return "\n".join(ln for ln in lines if ln.strip()).strip()


def assemble(
    drafts: list[ElementDraft],
    *,
    doc_id: str,
    source_path: str,
    content_hash: str,
    parser: str,
    n_pages: int,
    metadata: dict[str, str] | None = None,
) -> ParsedDocument:
    """Lay drafts out into the canonical text, dropping empty ones, and record exact offsets."""
    elements: list[Element] = []
    parts: list[str] = []
    cursor = 0
    for draft in drafts:
        rows = None
        if draft.type == "table" and draft.rows:
            rows = [[" ".join(c.split()) for c in row] for row in draft.rows]
            rows = [r for r in rows if any(r)]
            text = table_text(rows)
        else:
            text = _clean(draft.text)
        if not text.strip():
            continue
        if parts:
            cursor += len(ELEMENT_SEPARATOR)
        start = cursor
        cursor += len(text)
        parts.append(text)
        elements.append(
            Element(
                index=len(elements),
                type=draft.type,
                text=text,
                page=max(1, draft.page),
                char_start=start,
                char_end=cursor,
                heading_level=draft.heading_level if draft.type == "title" else None,
                rows=rows,
                has_header=draft.has_header if rows else False,
                html=table_html(rows, draft.has_header) if rows else None,
                metadata=draft.metadata,
            )
        )
    return ParsedDocument(
        doc_id=doc_id,
        source_path=source_path,
        content_hash=content_hash,
        parser=parser,
        n_pages=max(1, n_pages),
        canonical_text=ELEMENT_SEPARATOR.join(parts),
        elements=elements,
        metadata=metadata or {},
    )
