"""Recursive character splitting over spans of the canonical text (LangChain's algorithm, but
returning offsets so chunks stay exact slices).

Used by the `recursive` kind and as the fallback that sub-splits oversized paragraphs and sections.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

from .layout import Span

DEFAULT_SEPARATORS: tuple[str, ...] = ("\n\n", "\n", " ", "")


def _partition(text: str, start: int, end: int, sep: str) -> list[Span]:
    """Cut [start, end) before each occurrence of `sep` (the separator opens the next piece)."""
    cuts = [start]
    pos = text.find(sep, start, end)
    while pos != -1:
        if pos > cuts[-1]:
            cuts.append(pos)
        pos = text.find(sep, pos + len(sep), end)
    cuts.append(end)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _merge(pieces: list[Span], size: int, overlap: int) -> list[Span]:
    """Greedily join contiguous pieces up to `size` chars, carrying up to `overlap` chars of
    trailing pieces into the next chunk."""
    out: list[Span] = []
    window: deque[Span] = deque()
    for piece in pieces:
        if window and piece[1] - window[0][0] > size:
            out.append((window[0][0], window[-1][1]))
            while window and (
                window[-1][1] - window[0][0] > overlap or piece[1] - window[0][0] > size
            ):
                window.popleft()
        window.append(piece)
    if window:
        out.append((window[0][0], window[-1][1]))
    return out


def _fixed_windows(start: int, end: int, size: int, overlap: int) -> list[Span]:
    # The last resort ("" separator): plain character windows, the same result as merging chars.
    step = max(1, size - overlap)
    out = []
    pos = start
    while True:
        out.append((pos, min(pos + size, end)))
        if pos + size >= end:
            return out
        pos += step


def recursive_split(
    text: str,
    start: int,
    end: int,
    *,
    chunk_size: int,
    chunk_overlap: int,
    separators: Sequence[str] = DEFAULT_SEPARATORS,
    is_atomic: Callable[[int, int], bool] = lambda s, e: False,
) -> list[Span]:
    """Spans of at most `chunk_size` chars covering [start, end), unless an atomic piece (a table
    row) is larger on its own: such a piece is kept whole rather than cut."""
    if end - start <= chunk_size:
        return [(start, end)]
    seps = list(separators)
    # Use the first separator present; later ones are for the pieces that are still too big.
    for i, sep in enumerate(seps):
        if sep == "" or text.find(sep, start, end) != -1:
            break
    else:
        return [(start, end)]  # no separator applies and no char fallback was asked for
    if sep == "":
        return [(start, end)] if is_atomic(start, end) else _fixed_windows(
            start, end, chunk_size, chunk_overlap
        )
    rest = seps[i + 1 :]
    out: list[Span] = []
    good: list[Span] = []
    for piece in _partition(text, start, end, sep):
        if piece[1] - piece[0] <= chunk_size or is_atomic(*piece):
            good.append(piece)
            continue
        if good:
            out.extend(_merge(good, chunk_size, chunk_overlap))
            good = []
        if rest:
            out.extend(
                recursive_split(
                    text, *piece, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
                    separators=rest, is_atomic=is_atomic,
                )
            )
        else:
            out.append(piece)
    if good:
        out.extend(_merge(good, chunk_size, chunk_overlap))
    return out
