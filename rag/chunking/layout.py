"""Per-document lookups shared by every chunker: element, table-row and heading positions.

Built once per (document, chunking call) so that the span builder and the chunkers answer
"which elements/rows/headings touch this span" by binary search instead of scanning.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from rag.parsing.models import Element, ParsedDocument

Span = tuple[int, int]


def strip_span(text: str, start: int, end: int) -> Span:
    """Shrink [start, end) past leading/trailing whitespace of `text`."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def heading_level(el: Element) -> int:
    # A title the parser could not grade is treated as top level rather than dropped.
    return el.heading_level if el.heading_level is not None else 1


class DocLayout:
    def __init__(self, doc: ParsedDocument) -> None:
        self.doc = doc
        self.text = doc.canonical_text
        self.elements = doc.elements
        self._elem_starts = [e.char_start for e in doc.elements]
        self._elem_ends = [e.char_end for e in doc.elements]

        # Table rows as stripped content spans; a position strictly inside one is a forbidden cut.
        self._rows_by_table: dict[int, list[Span]] = {}
        self._row_lines: dict[int, list[int]] = {}  # line number of each row, to index el.rows
        self._row_starts: list[int] = []
        self._row_ends: list[int] = []
        for el in doc.elements:
            if el.type != "table":
                continue
            rows, lines = [], []
            pos = el.char_start
            for n, line in enumerate(el.text.split("\n")):
                s, e = strip_span(self.text, pos, pos + len(line))
                if s < e:
                    rows.append((s, e))
                    lines.append(n)
                pos += len(line) + 1
            self._rows_by_table[el.index] = rows
            self._row_lines[el.index] = lines
            self._row_starts.extend(s for s, _ in rows)
            self._row_ends.extend(e for _, e in rows)

        # Heading path in force after each title: a title of level L closes open levels >= L.
        self._title_starts: list[int] = []
        self._title_paths: list[list[str]] = []
        stack: list[tuple[int, str]] = []
        for el in doc.elements:
            if el.type != "title":
                continue
            level = heading_level(el)
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, " ".join(el.text.split())))
            self._title_starts.append(el.char_start)
            self._title_paths.append([t for _, t in stack])

    # -- elements -------------------------------------------------------------------------------

    def element_range(self, start: int, end: int) -> range:
        """Indices of the elements overlapping [start, end)."""
        first = bisect_right(self._elem_starts, start) - 1
        if first < 0 or self._elem_ends[first] <= start:
            first += 1
        last = bisect_left(self._elem_starts, end)
        return range(first, last)

    def pages(self, start: int, end: int) -> tuple[int, int]:
        pages = [self.elements[i].page for i in self.element_range(start, end)]
        if not pages:
            return 1, 1
        return min(pages), max(pages)

    def section_path(self, pos: int) -> list[str]:
        i = bisect_right(self._title_starts, pos) - 1
        return list(self._title_paths[i]) if i >= 0 else []

    # -- table rows -----------------------------------------------------------------------------

    def table_rows(self, element_index: int) -> list[Span]:
        return self._rows_by_table.get(element_index, [])

    def row_at(self, pos: int) -> Span | None:
        """The row whose content strictly contains `pos` (cutting at `pos` would split it)."""
        i = bisect_right(self._row_starts, pos) - 1
        if i >= 0 and self._row_starts[i] < pos < self._row_ends[i]:
            return self._row_starts[i], self._row_ends[i]
        return None

    def within_one_row(self, start: int, end: int) -> bool:
        """Whether the stripped span lies inside a single row, i.e. may not be cut any further."""
        s, e = strip_span(self.text, start, end)
        i = bisect_right(self._row_starts, s) - 1
        return s < e and i >= 0 and self._row_starts[i] <= s and e <= self._row_ends[i]

    def snap(self, start: int, end: int) -> Span:
        """Move span ends that fall inside a table row to the nearest row boundary.

        Ties include the row (a chunk never loses content it asked for). A span lying inside a single
        row grows to the whole row rather than vanishing, as rows are the smallest unit of a table.
        """
        s, e = start, end
        row = self.row_at(s)
        if row is not None:
            s = row[0] if s - row[0] <= row[1] - s else row[1]
        row = self.row_at(e)
        if row is not None:
            e = row[1] if row[1] - e <= e - row[0] else row[0]
        if s >= e:
            first, last = self.row_at(start), self.row_at(end)
            s = first[0] if first else start
            e = last[1] if last else end
        return s, e

    def table_rows_in(self, element_index: int, start: int, end: int) -> list[int]:
        """Line numbers (0-based, within the table text) of the rows overlapping [start, end)."""
        rows = self._rows_by_table.get(element_index, [])
        lines = self._row_lines.get(element_index, [])
        return [n for (s, e), n in zip(rows, lines) if s < end and e > start]
