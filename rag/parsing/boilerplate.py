"""Page furniture: running headers and footers, page numbers and the lines a printer stamps on every page.

They repeat on most pages of a document, so left in the text they fill passages, generated questions and the expert
queue with the same line ("VerDate Sep<11>2014 ... Fmt 4702", a licence line) again and again. A PDF's are found by
position and repetition, not by their words: a line in the top or bottom rows of a page whose text, numbers aside,
comes back at the top or bottom of most pages. Office formats declare theirs (unstructured's Header / Footer). Either
way they are set aside at parse time and recorded in the document's metadata (`boilerplate`), never in its text.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Literal

from rag.parsing.models import ElementDraft
from rag.parsing.pdf_layout import Line

FURNITURE_TYPES = ("header", "footer")
METADATA_KEY = "boilerplate"

# Text rows at each end of a page where furniture sits: a running head and a rule-separated second line, a footer
# and the page number under it. Deeper rows are body text.
ZONE_ROWS = 2
# Lines whose vertical centres are this close (points) share a row, as a header split at column gutters does.
ROW_TOLERANCE = 3.0
# Repetition needed: on at least this many pages, and this share of the pages with text. Facing pages often
# alternate two running heads (the book's title, the chapter's), each on half the pages, hence under a half.
MIN_PAGES = 3
MIN_SHARE = 0.4
# A row cut into more lines than this is a table's row (a text table's last row repeats "$" page after page).
MAX_ROW_LINES = 3
# A zone line this similar to a running line is a variant of it (a stamp missing its last field on some pages).
VARIANT_RATIO = 0.8
MIN_VARIANT_CHARS = 12

Position = Literal["top", "bottom"]
_DIGITS = re.compile(r"\d+")
_LETTER = re.compile(r"[^\W\d_]")
# A line of numbers alone is furniture only as a page number ("12", "- 12 -"), never as an amount ("62,500.08").
_PAGE_NUMBER = re.compile(r"[^\w\s]*\s*\d{1,6}\s*[^\w\s]*")
# Page numbers move between a running head's ends on facing pages ("47700 Federal Register" / "Federal Register
# 47701"), so numbers and punctuation at either end are not part of what repeats.
_EDGES = " #-\u2013\u2014|/.,:;()[]"


def line_key(text: str) -> str:
    """What is compared across pages: case, spacing, numbers and the page number's place ignored. A page number
    alone keys as "#"; any other line without letters as "" (never furniture)."""
    text = " ".join(text.lower().split())
    if not _LETTER.search(text):
        return "#" if _PAGE_NUMBER.fullmatch(text) else ""
    return _DIGITS.sub("#", text).strip(_EDGES)


@dataclass(frozen=True)
class ZoneUnit:
    """A zone row's text, or one line of it: a footer cut at column gutters repeats whole, while a header beside
    the first line of a column repeats alone."""

    page: int  # index of the page in the sequence given
    lines: tuple[int, ...]  # indices of its lines in the page
    position: Position
    key: str


def _rows(lines: Sequence[Line]) -> list[list[int]]:
    """Indices of the page's lines grouped into text rows, top to bottom, each row left to right."""
    order = sorted(range(len(lines)), key=lambda i: lines[i].top + lines[i].bottom)
    rows: list[list[int]] = []
    centre = None
    for i in order:
        c = (lines[i].top + lines[i].bottom) / 2
        if centre is not None and abs(c - centre) <= ROW_TOLERANCE:
            rows[-1].append(i)
        else:
            rows.append([i])
            centre = c
    return [sorted(row, key=lambda i: lines[i].x0) for row in rows]


def zone_units(page: int, lines: Sequence[Line]) -> list[ZoneUnit]:
    """The page's first and last ZONE_ROWS rows, whole and line by line. A table counts as a row but is never
    furniture; nor is a row cut into more than MAX_ROW_LINES lines (a table set as text)."""
    rows = _rows(lines)
    # A short page's rows are shared between its ends, so a footer is never called a header.
    top = rows[: min(ZONE_ROWS, (len(rows) + 1) // 2)]
    bottom = rows[max(len(top), len(rows) - ZONE_ROWS) :]
    out = []
    for position, zone in (("top", top), ("bottom", bottom)):
        for row in zone:
            if len(row) > MAX_ROW_LINES or any(lines[i].table_index is not None for i in row):
                continue
            parts = [tuple(row)] + ([(i,) for i in row] if len(row) > 1 else [])
            for part in parts:
                if key := line_key(" ".join(lines[i].text for i in part)):
                    out.append(ZoneUnit(page, part, position, key))
    return out


def _is_variant(key: str, running: list[str]) -> bool:
    if len(key) < MIN_VARIANT_CHARS:
        return False
    return any(
        len(r) >= MIN_VARIANT_CHARS and SequenceMatcher(None, key, r, autojunk=False).ratio() >= VARIANT_RATIO
        for r in running
    )


def running_lines(pages: Sequence[Sequence[Line]]) -> dict[tuple[int, int], Position]:
    """(page index, line index) -> "top" or "bottom" for every line of page furniture in a document's pages."""
    with_text = sum(1 for lines in pages if lines)
    if with_text < MIN_PAGES:
        return {}
    units = [u for page, lines in enumerate(pages) for u in zone_units(page, lines)]
    pages_of: dict[str, set[int]] = defaultdict(set)
    for u in units:
        pages_of[u.key].add(u.page)
    need = max(MIN_PAGES, math.ceil(MIN_SHARE * with_text))
    running = [key for key, found_on in pages_of.items() if len(found_on) >= need]
    if not running:
        return {}
    known = set(running)
    return {(u.page, i): u.position for u in units if u.key in known or _is_variant(u.key, running) for i in u.lines}


def set_aside(drafts: list[ElementDraft]) -> tuple[list[ElementDraft], list[ElementDraft]]:
    """(body, furniture): headers and footers apart from the rest. A file whose every element is furniture keeps
    it as its body: its text is all there is to index."""
    body = [d for d in drafts if d.type not in FURNITURE_TYPES]
    furniture = [d for d in drafts if d.type in FURNITURE_TYPES]
    if not any(d.text.strip() or d.rows for d in body):
        return drafts, []
    return body, furniture


def record(furniture: list[ElementDraft]) -> str:
    """The metadata value recording what was set aside: a JSON list of {"page", "type", "text"}."""
    return json.dumps(
        [{"page": d.page, "type": d.type, "text": " ".join(d.text.split())} for d in furniture if d.text.strip()],
        ensure_ascii=False,
    )


def recorded(metadata: dict[str, str]) -> list[dict]:
    """The furniture a parsed document's metadata records (empty when none was set aside)."""
    return json.loads(metadata.get(METADATA_KEY) or "[]")
