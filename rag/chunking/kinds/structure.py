"""Kinds that cut at structural boundaries (paragraphs, headings), sub-splitting oversized pieces."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..layout import Span, heading_level
from ..recursive import recursive_split
from ..registry import ChunkContext, KindParams, register_kind


def _subsplit(ctx: ChunkContext, spans: list[Span], max_chars: int, overlap: int) -> list[Span]:
    out: list[Span] = []
    for s, e in spans:
        out.extend(
            recursive_split(
                ctx.layout.text,
                s,
                e,
                chunk_size=max_chars,
                chunk_overlap=overlap,
                is_atomic=ctx.layout.within_one_row,
            )
        )
    return out


class _OversizeParams(KindParams):
    max_chars: int = Field(gt=0)
    overlap: int = Field(200, ge=0)

    @model_validator(mode="after")
    def _overlap_smaller(self):
        if self.overlap >= self.max_chars:
            raise ValueError(f"overlap ({self.overlap}) must be smaller than max_chars ({self.max_chars})")
        return self


class ParagraphParams(_OversizeParams):
    min_chars: int = Field(100, ge=0)
    max_chars: int = Field(2000, gt=0)


@register_kind("paragraph", ParagraphParams)
def paragraph(params: ParagraphParams, ctx: ChunkContext) -> list[Span]:
    """Paragraphs (elements); short ones merged forward, long ones split recursively."""
    merged: list[Span] = []
    pending: Span | None = None
    for el in ctx.doc.elements:
        pending = (pending[0], el.char_end) if pending else (el.char_start, el.char_end)
        if pending[1] - pending[0] >= params.min_chars:
            merged.append(pending)
            pending = None
    if pending:
        # A short tail has no next paragraph to join, so it joins the previous one if that fits.
        if merged and pending[1] - merged[-1][0] <= params.max_chars:
            merged[-1] = (merged[-1][0], pending[1])
        else:
            merged.append(pending)
    return _subsplit(ctx, merged, params.max_chars, params.overlap)


class SectionParams(_OversizeParams):
    # all: a new section at every title; top: only at titles of the document's highest level.
    headings: Literal["all", "top"] = "all"
    max_chars: int = Field(4000, gt=0)


@register_kind("section", SectionParams)
def section(params: SectionParams, ctx: ChunkContext) -> list[Span]:
    """Sections between headings (all headings or top-level only); oversized ones split recursively."""
    elements = ctx.doc.elements
    titles = [el for el in elements if el.type == "title"]
    top = min((heading_level(t) for t in titles), default=1)
    cut_at = {t.index for t in titles if params.headings == "all" or heading_level(t) == top}
    sections: list[Span] = []
    for el in elements:
        if not sections or el.index in cut_at:
            sections.append((el.char_start, el.char_end))
        else:
            sections[-1] = (sections[-1][0], el.char_end)
    return _subsplit(ctx, sections, params.max_chars, params.overlap)


class RecursiveParams(KindParams):
    chunk_size: int = Field(1000, gt=0)
    chunk_overlap: int = Field(200, ge=0)
    separators: list[str] = Field(default_factory=lambda: ["\n\n", "\n", " ", ""], min_length=1)

    @model_validator(mode="after")
    def _overlap_smaller(self):
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than chunk_size ({self.chunk_size})"
            )
        return self


@register_kind("recursive", RecursiveParams)
def recursive(params: RecursiveParams, ctx: ChunkContext) -> list[Span]:
    """Recursive character splitter (paragraphs, then lines, words, characters) with overlap."""
    text = ctx.layout.text
    return recursive_split(
        text,
        0,
        len(text),
        chunk_size=params.chunk_size,
        chunk_overlap=params.chunk_overlap,
        separators=params.separators,
        is_atomic=ctx.layout.within_one_row,
    )
