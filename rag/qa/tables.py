"""Table rows read with their column labels, for the extractive answer.

A row ("Alabama | 18,870 | 23,022 | ...") says nothing by itself: what each number counts is in the header row,
which a chunk holding later rows of a split table only carries in its `table_html`. A row is matched against a
question together with its header, and answers as "label: value" pairs of the columns the question names.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from functools import lru_cache

from rag.parsing.models import TABLE_CELL_SEPARATOR

_TABLE = re.compile(r"<table>(.*?)</table>", re.S)
_FIRST_ROW = re.compile(r"\s*<tr>(.*?)</tr>", re.S)
_HEADER_CELL = re.compile(r"<th>(.*?)</th>", re.S)
_LEADER_DOTS = re.compile(r"\.{3,}")

Header = tuple[str, ...]


def is_row(unit: str) -> bool:
    return TABLE_CELL_SEPARATOR in unit


def row_cells(row: str) -> list[str]:
    # Rows are stripped, so an empty first or last cell has lost its outer space.
    return [cell.strip() for cell in f" {row} ".split(TABLE_CELL_SEPARATOR)]


@lru_cache(maxsize=4096)
def _headers(table_html: str) -> tuple[Header, ...]:
    out = []
    for body in _TABLE.findall(table_html):
        first = _FIRST_ROW.match(body)
        cells = _HEADER_CELL.findall(first.group(1)) if first else []
        if cells:
            out.append(tuple(" ".join(html.unescape(c).split()) for c in cells))
    return tuple(out)


def chunk_headers(chunk: dict) -> tuple[Header, ...]:
    """The header row of each table in a chunk (from its table_html), in order."""
    table_html = chunk.get("table_html")
    return _headers(table_html) if isinstance(table_html, str) and table_html else ()


def header_of(row: str, headers: tuple[Header, ...]) -> Header | None:
    """The header of the chunk's table this row belongs to (the first with as many cells), unless it is the header."""
    cells = row_cells(row)
    header = next((h for h in headers if len(h) == len(cells)), None)
    return None if header is None or list(header) == cells else header


def render_row(row: str, header: Header, pick: Callable[[list[str]], list[int]]) -> str:
    """The row as "label: value" pairs: its first cell (what the row is about) and the columns `pick` chooses from
    the labels (all of them when it chooses none)."""
    cells = row_cells(row)
    chosen = pick(list(header)) or list(range(len(header)))
    columns = [0, *(i for i in chosen if i != 0)]
    pairs = [(header[i], " ".join(_LEADER_DOTS.sub(" ", cells[i]).split())) for i in columns]
    return "; ".join(f"{label}: {value}" if label else value for label, value in pairs if value)
