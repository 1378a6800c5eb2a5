"""Page geometry for PDFs: upright text for rotated pages, lines, columns and reading order.

Works on pdfplumber char/word dicts only (no pdfplumber Page), so it is testable on synthetic boxes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import median

Box = tuple[float, float, float, float]  # x0, top, x1, bottom in upright page coordinates


@dataclass(frozen=True)
class Rotation:
    """Maps boxes of a page whose text runs vertically into an upright frame.

    `clockwise` text runs top-to-bottom (the page was turned 90° clockwise when printed); the other
    case runs bottom-to-top. Width/height are the original page's.
    """

    kind: str  # "none" | "cw" | "ccw"
    width: float
    height: float

    def box(self, x0: float, top: float, x1: float, bottom: float) -> Box:
        if self.kind == "cw":
            return (top, self.width - x1, bottom, self.width - x0)
        if self.kind == "ccw":
            return (self.height - bottom, x0, self.height - top, x1)
        return (x0, top, x1, bottom)

    @property
    def upright_width(self) -> float:
        return self.width if self.kind == "none" else self.height


def detect_rotation(chars: list[dict], width: float, height: float) -> Rotation:
    """Rotation by majority vote of the char matrices: most glyphs sideways means a turned page."""
    if not chars:
        return Rotation("none", width, height)
    sideways = [c for c in chars if not c.get("upright", True)]
    if len(sideways) <= len(chars) / 2:
        return Rotation("none", width, height)
    # matrix (a, b, c, d): for a glyph turned 90°, b carries the direction along the page's y axis;
    # PDF y grows upwards, so b < 0 means text flows down the page.
    down = sum(1 for c in sideways if c["matrix"][1] < 0)
    return Rotation("cw" if down >= len(sideways) / 2 else "ccw", width, height)


def upright_chars(chars: list[dict], rotation: Rotation) -> list[dict]:
    if rotation.kind == "none":
        return [c for c in chars if c.get("upright", True)] or chars
    out = []
    for c in chars:
        x0, top, x1, bottom = rotation.box(c["x0"], c["top"], c["x1"], c["bottom"])
        out.append(
            {
                **c,
                "x0": x0,
                "x1": x1,
                "top": top,
                "bottom": bottom,
                "upright": True,
                "width": x1 - x0,
                "height": bottom - top,
                "doctop": top,
                # pdfplumber's size of a sideways glyph is its advance, which varies letter by letter and would
                # cut words apart; upright, the glyph's height is the font size.
                "size": bottom - top,
            }
        )
    return out


@dataclass
class Line:
    words: list[dict]
    x0: float
    top: float
    x1: float
    bottom: float
    size: float
    table_index: int | None = None  # a placeholder line standing for a whole table

    @property
    def text(self) -> str:
        return " ".join(w["text"] for w in self.words)

    @property
    def height(self) -> float:
        return max(1.0, self.bottom - self.top)


def words_to_lines(words: list[dict], tolerance: float = 3.0) -> list[Line]:
    """Group words whose vertical centres are within `tolerance` into lines, left to right."""
    lines: list[list[dict]] = []
    for w in sorted(words, key=lambda w: ((w["top"] + w["bottom"]) / 2, w["x0"])):
        centre = (w["top"] + w["bottom"]) / 2
        if lines:
            last = lines[-1]
            last_centre = median((x["top"] + x["bottom"]) / 2 for x in last)
            if abs(centre - last_centre) <= tolerance:
                last.append(w)
                continue
        lines.append([w])
    out = []
    for ws in lines:
        ws.sort(key=lambda w: w["x0"])
        sizes = [w.get("size", 0.0) or 0.0 for w in ws]
        out.append(
            Line(
                ws,
                min(w["x0"] for w in ws),
                min(w["top"] for w in ws),
                max(w["x1"] for w in ws),
                max(w["bottom"] for w in ws),
                median(sizes),
            )
        )
    return out


def find_gutters(lines: list[Line], width: float, bin_width: float = 2.0) -> list[tuple[float, float]]:
    """Vertical whitespace strips in the middle of the page that most text lines do not cross."""
    text_lines = [ln for ln in lines if ln.table_index is None and len(ln.words) > 0]
    if len(text_lines) < 6 or width <= 0:
        return []
    n_bins = int(width / bin_width) + 1
    coverage = [0] * n_bins
    for ln in text_lines:
        for w in ln.words:
            for b in range(max(0, int(w["x0"] / bin_width)), min(n_bins, int(w["x1"] / bin_width) + 1)):
                coverage[b] += 1
    # Full-width titles and author blocks cross the gutter on first pages; tolerate a few of them.
    limit = max(1, int(0.12 * len(text_lines)))
    lo, hi = int(0.15 * width / bin_width), int(0.85 * width / bin_width)
    gutters: list[tuple[float, float]] = []
    b = lo
    while b < hi:
        if coverage[b] <= limit:
            start = b
            while b < hi and coverage[b] <= limit:
                b += 1
            if (b - start) * bin_width >= 6.0:
                g0, g1 = start * bin_width, b * bin_width
                # Lines are not yet split at columns, so look at their words on each side.
                left = sum(1 for ln in text_lines if any(w["x1"] <= g0 for w in ln.words))
                right = sum(1 for ln in text_lines if any(w["x0"] >= g1 for w in ln.words))
                # A real gutter has a substantial column of text on each side.
                if left >= 0.2 * len(text_lines) and right >= 0.2 * len(text_lines):
                    gutters.append((g0, g1))
        b += 1
    return gutters


def _split_line(line: Line, gutters: list[tuple[float, float]]) -> list[tuple[int, Line]] | None:
    """Split a line at gutters into (column, part); None when a word straddles a gutter."""
    if line.table_index is not None:
        cols = {_column_of((line.x0 + line.x1) / 2, gutters)}
        spans_gutter = any(line.x0 < (g0 + g1) / 2 < line.x1 for g0, g1 in gutters)
        return None if spans_gutter else [(cols.pop(), line)]
    parts: dict[int, list[dict]] = {}
    for w in line.words:
        if any(w["x0"] < (g0 + g1) / 2 < w["x1"] for g0, g1 in gutters):
            return None
        parts.setdefault(_column_of((w["x0"] + w["x1"]) / 2, gutters), []).append(w)
    return [(col, words_to_lines(ws, tolerance=1e9)[0]) for col, ws in sorted(parts.items())]


def _column_of(x: float, gutters: list[tuple[float, float]]) -> int:
    return sum(1 for g0, g1 in gutters if x >= (g0 + g1) / 2)


def reading_order(lines: list[Line], width: float) -> list[Line]:
    """Column-aware order: full-width lines cut the page into bands; each band is read column by column."""
    lines = sorted(lines, key=lambda ln: (ln.top, ln.x0))
    gutters = find_gutters(lines, width)
    if not gutters:
        return lines
    ordered: list[Line] = []
    band: dict[int, list[Line]] = {}

    def flush() -> None:
        for col in sorted(band):
            ordered.extend(sorted(band[col], key=lambda ln: (ln.top, ln.x0)))
        band.clear()

    for ln in lines:
        parts = _split_line(ln, gutters)
        if parts is None:
            flush()
            ordered.append(ln)
        else:
            for col, part in parts:
                part.table_index = ln.table_index
                band.setdefault(col, []).append(part)
    flush()
    return ordered


@dataclass
class Block:
    lines: list[Line] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(ln.text for ln in self.lines)

    @property
    def size(self) -> float:
        return median(ln.size for ln in self.lines)


def body_font_size(lines: list[Line]) -> float:
    """The font size carrying most characters: the document's body text."""
    counts: Counter[float] = Counter()
    for ln in lines:
        if ln.table_index is None:
            counts[round(ln.size * 2) / 2] += sum(len(w["text"]) for w in ln.words)
    return counts.most_common(1)[0][0] if counts else 0.0


def is_heading(line: Line, body_size: float) -> bool:
    text = line.text.strip()
    return (
        body_size > 0 and line.size >= body_size * 1.15 and 2 <= len(text) <= 200 and any(ch.isalpha() for ch in text)
    )


# A double-spaced page (a transcript, a draft) sets every line about a line's height below the last, so no gap is
# small enough for the single-spaced rule and every line became a paragraph. When most gaps on a page are one
# width, a gap that wide (up to MAX_GAP_HEIGHTS line heights) still continues the paragraph.
MIN_GAPS = 6
REGULAR_GAP_SHARE = 0.5
MAX_GAP_HEIGHTS = 1.6


def regular_gap(lines: list[Line]) -> float:
    """The gap (points, to 0.5) between most consecutive text lines of a page in reading order, else 0."""
    text = [ln for ln in lines if ln.table_index is None]
    gaps = [round(2 * (b.top - a.bottom)) / 2 for a, b in zip(text, text[1:]) if b.top >= a.bottom]
    if len(gaps) < MIN_GAPS:
        return 0.0
    gap, count = Counter(gaps).most_common(1)[0]
    return gap if count >= REGULAR_GAP_SHARE * len(gaps) else 0.0


def group_blocks(lines: list[Line], body_size: float) -> list[Block]:
    """Paragraphs: consecutive lines close together vertically with the same heading/body role."""
    blocks: list[Block] = []
    prev: Line | None = None
    regular = regular_gap(lines) + 0.5
    for ln in lines:
        if ln.table_index is not None:
            blocks.append(Block([ln]))
            prev = None
            continue
        if prev is not None and blocks:
            gap = ln.top - prev.bottom
            height = max(prev.height, ln.height)
            same_role = is_heading(ln, body_size) == is_heading(prev, body_size)
            same_size = abs(ln.size - prev.size) <= 0.6
            if -2.0 <= gap <= max(height * 0.8, min(regular, height * MAX_GAP_HEIGHTS)) and same_role and same_size:
                blocks[-1].lines.append(ln)
                prev = ln
                continue
        blocks.append(Block([ln]))
        prev = ln
    return blocks
