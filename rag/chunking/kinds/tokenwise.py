"""Kinds that cut purely by token count, ignoring sentences (table rows are still snapped whole)."""

from __future__ import annotations

from pydantic import Field

from ..layout import Span
from ..registry import ChunkContext, KindParams, register_kind


class SlidingWindowParams(KindParams):
    window_tokens: int = Field(1024, gt=0)
    # Fraction of a window shared with the next one (0.5 = stride of half a window).
    overlap: float = Field(0.5, ge=0.0, lt=1.0)


@register_kind("sliding-window", SlidingWindowParams)
def sliding_window(params: SlidingWindowParams, ctx: ChunkContext) -> list[Span]:
    """Fixed windows of window_tokens tokens, advancing by window_tokens * (1 - overlap)."""
    toks = ctx.tokenizer.spans(ctx.layout.text)
    if not toks:
        return []
    size = params.window_tokens
    stride = max(1, round(size * (1 - params.overlap)))
    spans: list[Span] = []
    for i in range(0, len(toks), stride):
        last = min(i + size, len(toks)) - 1
        spans.append((toks[i][0], toks[last][1]))
        if last == len(toks) - 1:
            break
    return spans
