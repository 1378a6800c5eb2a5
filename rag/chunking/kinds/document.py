"""Kinds that follow the document's own layout without any size target: whole document, page."""

from __future__ import annotations

from ..layout import Span
from ..registry import ChunkContext, KindParams, register_kind


class WholeDocumentParams(KindParams):
    pass


@register_kind("whole-document", WholeDocumentParams)
def whole_document(params: WholeDocumentParams, ctx: ChunkContext) -> list[Span]:
    """The whole canonical text as one chunk (baseline for long-context readers)."""
    return [(0, len(ctx.doc.canonical_text))]


class PageParams(KindParams):
    pass


@register_kind("page", PageParams)
def page(params: PageParams, ctx: ChunkContext) -> list[Span]:
    """One chunk per page, spanning that page's elements."""
    spans: list[Span] = []
    current_page = None
    for el in ctx.doc.elements:
        # Runs of consecutive elements, not a page->span map: a span may never cover another page's
        # elements, even if a parser emitted a page out of order.
        if el.page == current_page:
            spans[-1] = (spans[-1][0], el.char_end)
        else:
            spans.append((el.char_start, el.char_end))
            current_page = el.page
    return spans
