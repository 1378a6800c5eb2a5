"""Reading a ruled PDF table's cells into rows a reader (and the answer stage) can use row by row.

pdfplumber finds the cells; three layouts it leaves unusable are undone here, all from the cells' geometry:
- a title set in the table's first row, one cell across every column: it becomes the table's caption, so the column
  labels are the header row;
- a header cell spanning several columns whose labels stand apart over each column ("Permit   Handgun   Long Gun"),
  under an optional group label ("Pre-Pawn"): each column gets its own label ("Pre-Pawn Handgun");
- rows stacked in one ruled row (a statistics table ruled every five states): every filled cell holds the same
  number of lines, numbers in most of them, so the row is as many rows.

Works on boxes and char dicts in the upright frame (see pdf_layout), so it is testable without a PDF.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pdfplumber.utils import extract_text as chars_to_text
from pdfplumber.utils import extract_words

from rag.parsing.pdf_layout import Box, words_to_lines

# Boxes whose edges are this close (points) share a row or a column: rotated boxes differ by rounding.
EDGE_TOLERANCE = 2.0
# Labels over neighbouring columns stand at least this many ems apart; words of one label are a space apart.
LABEL_GAP_EMS = 1.0
_NUMBER = re.compile(r"[-\u2013+(]?[$\u20ac\u00a3]?\s*\d[\d.,\s]*%?\)?|[-\u2013\u2014]")


@dataclass
class Cell:
    box: Box
    chars: list[dict]
    column: int = 0
    span: int = 1  # columns covered

    @property
    def lines(self) -> list[str]:
        text = chars_to_text(self.chars) if self.chars else ""
        return [" ".join(line.split()) for line in text.split("\n") if line.strip()]


@dataclass
class TableText:
    rows: list[list[str]]
    title: str | None = None  # the caption set in the table's first row, when there was one


@dataclass
class _Grid:
    rows: list[list[Cell]] = field(default_factory=list)  # cells left to right
    n_columns: int = 0


def _cluster(values: list[float]) -> list[float]:
    """Distinct positions, those within EDGE_TOLERANCE of the previous one merged."""
    out: list[float] = []
    for v in sorted(values):
        if not out or v - out[-1] > EDGE_TOLERANCE:
            out.append(v)
    return out


def _index(edges: list[float], value: float) -> int:
    return min(range(len(edges)), key=lambda i: abs(edges[i] - value))


def _grid(boxes: list[Box], chars: list[dict]) -> _Grid:
    xs, tops = _cluster([b[0] for b in boxes]), _cluster([b[1] for b in boxes])
    grid = _Grid([[] for _ in tops], len(xs))
    for box in boxes:
        x0, top, x1, bottom = box
        inside = [
            c for c in chars if x0 <= (c["x0"] + c["x1"]) / 2 < x1 and top <= (c["top"] + c["bottom"]) / 2 < bottom
        ]
        column = _index(xs, x0)
        span = max(1, sum(1 for x in xs if x0 - EDGE_TOLERANCE <= x < x1 - EDGE_TOLERANCE))
        grid.rows[_index(tops, top)].append(Cell(box, inside, column, span))
    for row in grid.rows:
        row.sort(key=lambda c: c.column)
    grid.rows = [row for row in grid.rows if row]
    return grid


def _column_edges(grid: _Grid) -> list[tuple[float, float]]:
    """Each column's x range, from the cells covering only it."""
    edges: dict[int, tuple[float, float]] = {}
    for row in grid.rows:
        for cell in row:
            if cell.span == 1 and cell.column not in edges:
                edges[cell.column] = (cell.box[0], cell.box[2])
    return [edges.get(i, (0.0, 0.0)) for i in range(grid.n_columns)]


def _phrases(chars: list[dict]) -> list[tuple[float, float, str]]:
    """The words of one line joined into labels: (x0, x1, text), split where the gap is over LABEL_GAP_EMS."""
    words = sorted(extract_words(chars), key=lambda w: w["x0"])
    out: list[tuple[float, float, str]] = []
    for w in words:
        if out and w["x0"] - out[-1][1] < LABEL_GAP_EMS * (w["bottom"] - w["top"]):
            x0, _, text = out[-1]
            out[-1] = (x0, w["x1"], f"{text} {w['text']}")
        else:
            out.append((w["x0"], w["x1"], w["text"]))
    return out


def _column_labels(cell: Cell, columns: list[tuple[float, float]]) -> list[str] | None:
    """A spanning header cell's label for each column it covers: its last line holds one label over each column,
    the lines above it (if any) a group label they share. None when its last line is not laid out that way."""
    lines = words_to_lines(extract_words(cell.chars))
    if not lines:
        return None
    covered = range(cell.column, cell.column + cell.span)
    labels: dict[int, list[str]] = {i: [] for i in covered}
    last = [c for c in cell.chars if (c["top"] + c["bottom"]) / 2 >= lines[-1].top]
    for x0, x1, text in _phrases(last):
        centre = (x0 + x1) / 2
        column = next((i for i in covered if columns[i][0] <= centre < columns[i][1]), None)
        if column is None:
            return None
        labels[column].append(text)
    if any(not words for words in labels.values()):
        return None
    group = " ".join(ln.text for ln in lines[:-1])
    return [" ".join([group, *labels[i]]).strip() for i in covered]


def _is_number(line: str) -> bool:
    return bool(_NUMBER.fullmatch(line.strip()))


def _stacked(row: list[str | list[str]]) -> int:
    """How many rows one ruled row holds: every filled cell the same number of lines (k > 1), most of them numbers
    on every line; else 1."""
    filled = [cell for cell in row if isinstance(cell, list) and cell]
    counts = {len(cell) for cell in filled}
    if len(filled) < 2 or len(counts) != 1 or counts == {1}:
        return 1
    numeric = sum(all(_is_number(line) for line in cell) for cell in filled)
    return counts.pop() if numeric * 2 >= len(filled) else 1


def _row_texts(row: list[Cell], n_columns: int, columns: list[tuple[float, float]]) -> list[str | list[str]]:
    """One entry per column: a cell's lines, or its own label for each column of a spanning header cell, or ""
    for columns a cell spans."""
    out: list[str | list[str]] = [""] * n_columns
    for cell in row:
        labels = _column_labels(cell, columns) if cell.span > 1 else None
        if labels:
            out[cell.column : cell.column + cell.span] = labels
        else:
            out[cell.column] = cell.lines
    return out


def _unstack(row: list[str | list[str]]) -> list[list[str]]:
    k = _stacked(row)
    if k > 1:
        return [[cell[i] if isinstance(cell, list) and cell else "" for cell in row] for i in range(k)]
    return [[" ".join(cell) if isinstance(cell, list) else cell for cell in row]]


def read_table(boxes: list[Box], chars: list[dict]) -> TableText:
    """Rows of cell texts (one entry per column) of the table whose cells are `boxes`, read from `chars`."""
    grid = _grid(boxes, chars)
    title = None
    first = grid.rows[0] if grid.rows else []
    if len(grid.rows) > 1 and len(first) == 1 and first[0].span == grid.n_columns > 1:
        title = " ".join(first[0].lines) or None
        grid.rows = grid.rows[1:]
    columns = _column_edges(grid)
    rows = [r for row in grid.rows for r in _unstack(_row_texts(row, grid.n_columns, columns))]
    return TableText(rows, title)
