"""The one place where (start, end) spans become Chunk records, so every strategy shares the same
invariants: exact canonical-text spans, stripped, non-empty, never cut inside a table row."""

from __future__ import annotations

import hashlib
from typing import Iterable

from rag.parsing.models import TABLE_CELL_SEPARATOR, ParsedDocument, table_html

from .layout import DocLayout, Span, strip_span
from .models import Chunk
from .tokens import Tokenizer

# Part of every strategy fingerprint: bump when a change here alters the chunks it produces.
BUILDER_VERSION = 1


def chunk_id(doc_id: str, strategy: str, start: int, end: int) -> str:
    return hashlib.sha256(f"{doc_id}|{strategy}|{start}|{end}".encode()).hexdigest()[:32]


def normalize_spans(layout: DocLayout, spans: Iterable[Span]) -> list[Span]:
    """Clip, snap to table-row boundaries, strip, drop empties and duplicates, sort by position."""
    n = len(layout.text)
    seen: set[Span] = set()
    for start, end in spans:
        start, end = max(0, start), min(n, end)
        if start >= end:
            continue
        # Snap before stripping: stripping from a row boundary can only land on another boundary.
        s, e = strip_span(layout.text, *layout.snap(start, end))
        if s < e:
            seen.add((s, e))
    return sorted(seen)


def _table_html(layout: DocLayout, start: int, end: int) -> str | None:
    parts = []
    for i in layout.element_range(start, end):
        el = layout.elements[i]
        if el.type != "table":
            continue
        lines = layout.table_rows_in(el.index, start, end)
        if not lines:
            continue
        all_rows = el.rows or [line.split(TABLE_CELL_SEPARATOR) for line in el.text.split("\n")]
        # A chunk holding only later rows of a split table still gets the header, to stay readable.
        if el.has_header and lines[0] != 0:
            lines = [0, *lines]
        parts.append(table_html([all_rows[n] for n in lines if n < len(all_rows)], el.has_header))
    return "".join(parts) or None


def build_chunks(
    doc: ParsedDocument,
    strategy: str,
    spans: Iterable[Span],
    tokenizer: Tokenizer,
    layout: DocLayout | None = None,
) -> list[Chunk]:
    layout = layout or DocLayout(doc)
    clean = normalize_spans(layout, spans)
    ids = [chunk_id(doc.doc_id, strategy, s, e) for s, e in clean]
    chunks = []
    for k, (s, e) in enumerate(clean):
        text = layout.text[s:e]
        page_start, page_end = layout.pages(s, e)
        chunks.append(
            Chunk(
                chunk_id=ids[k],
                doc_id=doc.doc_id,
                strategy=strategy,
                text=text,
                char_start=s,
                char_end=e,
                page_start=page_start,
                page_end=page_end,
                section_path=layout.section_path(s),
                prev_chunk_id=ids[k - 1] if k > 0 else None,
                next_chunk_id=ids[k + 1] if k + 1 < len(ids) else None,
                n_tokens=tokenizer.count(text),
                content_hash=hashlib.sha256(text.encode()).hexdigest(),
                table_html=_table_html(layout, s, e),
            )
        )
    return chunks
