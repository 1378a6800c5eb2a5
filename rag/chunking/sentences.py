"""A fast, deterministic sentence splitter that returns spans into the canonical text.

spaCy would be more accurate but costs a model load and ~100x the time per document; chunking
only needs plausible cut points, and every cut must be an exact offset, which a regex gives for free.
"""

from __future__ import annotations

import re

from rag.parsing.models import ParsedDocument

from .layout import DocLayout, Span, strip_span

# A terminator run, optional closing quotes/brackets, then whitespace (or end of text); or a line
# break before a bullet, which starts a new list item even when the previous one has no full stop.
_CANDIDATE = re.compile(
    r"[.!?\u3002\uff01\uff1f]+[\"'\)\]\u00bb\u201d\u2019]*(?:\s+|$)"
    r"|(?P<bullet>\n[ \t]*)(?=[\u2022\u25e6\u25aa\u25cf\u25a0\u2013*-]\s)"
)
_OPENERS = "\"'([\u00ab\u201c\u2018"
_BULLETS = "\u2022\u25e6\u25aa\u25cf\u25a0\u2013\u2014*-"

# Lower-cased words that end with a period without ending a sentence.
_ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al approx ca inc ltd co corp dept univ est
    jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m ph.d""".split()
)
# Abbreviations only when a number follows ("No. 5", "Fig. 3"); "the answer was no. The" still ends.
_NUMBER_ABBREVIATIONS = frozenset("no nos vol vols fig figs eq eqs sec art ch para pp".split())


def _starts_sentence(ch: str) -> bool:
    # Capitals and digits start English sentences; scripts without case (CJK, Hangul...) always may.
    return ch.isupper() or ch.isdigit() or ch in _OPENERS or ch in _BULLETS or (ch.isalpha() and not ch.isascii())


def _is_abbreviation(text: str, dot: int, next_start: int) -> bool:
    """Whether the single '.' at `dot` closes an abbreviation or an initial rather than a sentence;
    `next_start` is where the following word begins."""
    word_start = dot
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:dot].lstrip(_OPENERS).lower()
    if word in _NUMBER_ABBREVIATIONS:
        return text[next_start].isdigit()
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def split_sentences(text: str, offset: int = 0) -> list[Span]:
    """Stripped, non-empty sentence spans of `text`, shifted by `offset`."""
    spans: list[Span] = []
    start = 0
    for m in _CANDIDATE.finditer(text):
        end = m.end()
        if end < len(text) and m.group("bullet") is None:
            if not _starts_sentence(text[end]):
                continue
            terminator = m.group().rstrip()
            if terminator.rstrip("\"')]\u00bb\u201d\u2019") == "." and _is_abbreviation(text, m.start(), end):
                continue
        spans.append((start, end))
        start = end
    if start < len(text):
        spans.append((start, len(text)))
    out = []
    for s, e in spans:
        s, e = strip_span(text, s, e)
        if s < e:
            out.append((s + offset, e + offset))
    return out


def sentence_units(doc: ParsedDocument, layout: DocLayout) -> list[Span]:
    """Sentence spans of the whole document in order: split per element so no sentence crosses an
    element boundary, and a table yields one unit per row so no strategy cuts inside a row."""
    units: list[Span] = []
    for el in doc.elements:
        if el.type == "table":
            units.extend(layout.table_rows(el.index))
        else:
            units.extend(split_sentences(el.text, el.char_start))
    return units
