"""Kinds built from sentence units (table rows count as sentences): packing and windows."""

from __future__ import annotations

import hashlib

from pydantic import Field, model_validator

from ..layout import Span
from ..registry import ChunkContext, KindParams, register_kind
from ..sentences import sentence_units


def _token_windows(ctx: ChunkContext, span: Span, size: int) -> list[Span]:
    # Cuts a sentence longer than the budget at token edges, so no chunk exceeds the budget.
    s, e = span
    toks = ctx.tokenizer.spans(ctx.layout.text[s:e])
    return [(s + toks[i][0], s + toks[min(i + size, len(toks)) - 1][1]) for i in range(0, len(toks), size)]


class SentencePackParams(KindParams):
    max_tokens: int = Field(512, gt=0)


@register_kind("sentence-pack", SentencePackParams)
def sentence_pack(params: SentencePackParams, ctx: ChunkContext) -> list[Span]:
    """Consecutive sentences packed greedily up to max_tokens (no sentence is cut unless it alone
    exceeds the budget; a table row never is)."""
    budget = params.max_tokens
    units: list[tuple[Span, int]] = []
    for unit in sentence_units(ctx.doc, ctx.layout):
        n = ctx.tokenizer.count(ctx.layout.text[unit[0] : unit[1]])
        if n > budget and not ctx.layout.within_one_row(*unit):
            units.extend(
                (w, ctx.tokenizer.count(ctx.layout.text[w[0] : w[1]])) for w in _token_windows(ctx, unit, budget)
            )
        else:
            units.append((unit, n))
    spans: list[Span] = []
    start = end = None
    used = 0
    for (s, e), n in units:
        if start is not None and used + n > budget:
            spans.append((start, end))
            start = None
        if start is None:
            start, used = s, 0
        end, used = e, used + n
    if start is not None:
        spans.append((start, end))
    return spans


class SentenceWindowParams(KindParams):
    window: int = Field(4, gt=0)
    stride: int = Field(2, gt=0)
    min_chars: int = Field(150, ge=0)
    max_chars: int = Field(2048, gt=0)
    # Drop a window whose text (SHA-256) was already emitted: repeated boilerplate is indexed once.
    dedup: bool = True

    @model_validator(mode="after")
    def _sane(self):
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) exceeds max_chars ({self.max_chars})")
        return self


@register_kind("sentence-window", SentenceWindowParams)
def sentence_window(params: SentenceWindowParams, ctx: ChunkContext) -> list[Span]:
    """Windows of `window` sentences every `stride` sentences; too short/long windows dropped,
    identical window texts kept once."""
    units = sentence_units(ctx.doc, ctx.layout)
    if not units:
        return []
    starts = list(range(0, max(len(units) - params.window, 0) + 1, params.stride))
    # The stride may step over the tail; one extra window ending at the last sentence covers it.
    if starts[-1] + params.window < len(units):
        starts.append(len(units) - params.window)
    spans: list[Span] = []
    seen: set[str] = set()
    text = ctx.layout.text
    for i in starts:
        s, e = units[i][0], units[min(i + params.window, len(units)) - 1][1]
        if not params.min_chars <= e - s <= params.max_chars:
            continue
        if params.dedup:
            digest = hashlib.sha256(text[s:e].encode()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
        spans.append((s, e))
    return spans
