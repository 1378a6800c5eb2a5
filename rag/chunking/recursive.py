"""Recursive character splitting over spans of the canonical text (LangChain's separators and
greedy merge with overlap, but returning offsets so chunks stay exact slices).

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
            while window and (window[-1][1] - window[0][0] > overlap or piece[1] - window[0][0] > size):
                window.popleft()
        window.append(piece)
    if window:
        out.append((window[0][0], window[-1][1]))
    return out


def _pieces(
    text: str,
    start: int,
    end: int,
    size: int,
    char_piece: int,
    seps: Sequence[str],
    is_atomic: Callable[[int, int], bool],
) -> list[Span]:
    """Contiguous pieces covering [start, end), each at most `size` chars unless atomic, cut at the
    coarsest separator that works (paragraphs before lines before words before characters)."""
    if end - start <= size or is_atomic(start, end):
        return [(start, end)]
    for i, sep in enumerate(seps):
        if sep == "":
            return [(a, min(a + char_piece, end)) for a in range(start, end, char_piece)]
        if text.find(sep, start, end) != -1:
            out: list[Span] = []
            for a, b in _partition(text, start, end, sep):
                out.extend(_pieces(text, a, b, size, char_piece, seps[i + 1 :], is_atomic))
            return out
    return [(start, end)]  # no separator applies and no character fallback was configured


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
    """Spans of at most `chunk_size` chars covering [start, end), consecutive ones sharing up to
    `chunk_overlap` chars; an atomic piece (a table row) larger than that is kept whole.

    Unlike LangChain, pieces from every recursion level are merged in one pass, so a heading or a
    short paragraph next to an oversized one joins it instead of becoming a chunk of its own.
    """
    # Character-level pieces are sized so that whole pieces can still carry the overlap.
    char_piece = min(chunk_overlap, chunk_size - chunk_overlap) if chunk_overlap else chunk_size
    pieces = _pieces(text, start, end, chunk_size, max(1, char_piece), list(separators), is_atomic)
    if len(pieces) == 1:
        return pieces
    return _merge(pieces, chunk_size, chunk_overlap)
