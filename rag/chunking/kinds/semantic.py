"""Semantic chunking: cut where the meaning of the text shifts, measured by embeddings."""

from __future__ import annotations

import bisect

import numpy as np
from pydantic import Field, field_validator

from rag.embedding import EMBEDDERS

from ..layout import Span
from ..registry import ChunkContext, KindParams, register_kind
from ..sentences import sentence_units


class SemanticParams(KindParams):
    # Sentences on each side of a candidate cut that are embedded together (smooths single lines).
    group_size: int = Field(3, gt=0)
    # Cut where similarity falls below this percentile of all similarities in the document.
    percentile: float = Field(20.0, ge=0.0, le=100.0)
    embedder: str = "wordllama"
    # No cut before a chunk reaches this size: page numbers and lone bullets otherwise become chunks.
    min_chars: int = Field(200, ge=0)

    @field_validator("embedder")
    @classmethod
    def _known_embedder(cls, v: str) -> str:
        if v not in EMBEDDERS:
            raise ValueError(f"unknown embedder {v!r} (known: {', '.join(sorted(EMBEDDERS))})")
        return v


def boundary_similarities(texts: list[str], group_size: int, embed) -> np.ndarray:
    """Cosine similarity, for each gap b between sentence b-1 and b, of the `group_size` sentences
    before the gap with the `group_size` sentences after it."""
    n = len(texts)
    # The text after gap b starts at sentence b; the text before it is the group starting at
    # b - group_size, clipped at the document start (those short heads are embedded separately).
    forward = [" ".join(texts[i : i + group_size]) for i in range(n)]
    heads = [" ".join(texts[:b]) for b in range(1, min(group_size, n))]
    vecs = np.asarray(embed(forward + heads), dtype=np.float32)
    # Renormalise: an injected embedder may not honour the unit-length contract.
    vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    fwd, head = vecs[:n], vecs[n:]
    sims = np.empty(max(n - 1, 0), dtype=np.float32)
    for b in range(1, n):
        before = head[b - 1] if b < group_size else fwd[b - group_size]
        sims[b - 1] = float(np.dot(before, fwd[b]))
    return sims


@register_kind("semantic", SemanticParams)
def semantic(params: SemanticParams, ctx: ChunkContext) -> list[Span]:
    """Sentences grouped and embedded; a chunk ends where consecutive groups are least similar."""
    units = sentence_units(ctx.doc, ctx.layout)
    if len(units) < 2:
        return units
    texts = [ctx.layout.text[s:e] for s, e in units]
    embedder = ctx.embedder(params.embedder)
    sims = boundary_similarities(texts, params.group_size, embedder.encode)
    threshold = np.percentile(sims, params.percentile)
    # A heading belongs with what follows it, however different it looks to the embedder.
    title_ends = {el.char_end for el in ctx.doc.elements if el.type == "title"}
    # Strongest breaks first, each accepted only if both pieces it creates keep min_chars, so a
    # weak early cut cannot crowd out the real topic change next to it.
    candidates = sorted(
        (sim, b) for b, sim in enumerate(sims, start=1) if sim < threshold and units[b - 1][1] not in title_ends
    )
    cuts: list[int] = []
    for _, b in candidates:
        i = bisect.bisect(cuts, b)
        left_start = units[cuts[i - 1]][0] if i else units[0][0]
        right_end = units[cuts[i] - 1][1] if i < len(cuts) else units[-1][1]
        if units[b - 1][1] - left_start >= params.min_chars and right_end - units[b][0] >= params.min_chars:
            bisect.insort(cuts, b)
    bounds = [0, *cuts, len(units)]
    return [(units[a][0], units[z - 1][1]) for a, z in zip(bounds, bounds[1:])]
