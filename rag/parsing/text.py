"""Plain text read natively: decoded as the unstructured path decodes it, cut into paragraphs the way its text
partitioner cuts them, and typed by rules that need no part-of-speech tagger.

unstructured spent nine tenths of its time on plain text running a spaCy pipeline over every paragraph (sentences and
parts of speech, to tell a heading from a sentence); these rules need none, and read text about a hundred times
faster. What chunkers use is kept: paragraph boundaries, headings and list items.

Paragraphs: a file where under a tenth of the first 2,000 lines are blank has one paragraph per line (exports that
never leave a blank line); otherwise blank lines separate paragraphs, a paragraph's lines are joined by a space, and
a block whose every line has under five words (an address, a title page) is a paragraph per line. A line that starts
with a bullet (•, ◦, *, or - and – followed by a space) starts a list item, and "1. " or "2) " a numbered one.
A heading is a paragraph of one line, of at most 12 words, mostly letters, starting with a capital or a digit and
not ending like a sentence (. , ; : ! ?): "CHAPTER I", "Early life"; in text without blank lines, not a line the next
continues (it starts in lower case). unstructured looked for a verb instead, so a short line with a verb and no full
stop ("Aspirin reduces mortality") was a sentence to it and is a heading here, and one with a full stop and no verb
("Geometry, epistasis, and patterning.") the other way round. One more difference: a paragraph whose later lines
start bullets ("Ingredients:" then "- eggs") is split into its items here, where unstructured kept it one paragraph
with the bullets in its text.
"""

from __future__ import annotations

import codecs
import re
import warnings
from pathlib import Path

from rag.parsing.errors import ParseError, QuarantineReason
from rag.parsing.models import ElementDraft, ElementType

# The UTF-32 little-endian mark begins with the UTF-16 one, so it is tried first.
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# unstructured's auto paragraph grouper: a file with fewer blank lines than this share reads as a paragraph per line.
BLANK_LINE_SHARE = 0.1
SAMPLED_LINES = 2000
SHORT_LINE_WORDS = 5  # a block whose lines all have fewer words is a paragraph per line
HEADING_MAX_WORDS = 12

# unstructured's bullet glyphs (its UNICODE_BULLETS).
_UNAMBIGUOUS_BULLETS = (
    "\u0095\u2022\u2023\u2043\u3164\u204c\u204d\u2219\u25cb\u25cf\u25d8\u25e6\u2619\u2765\u2767\u29be\u29bf*·"
)
# A hyphen or en dash is a bullet only with whitespace (or nothing) after it: "-12.5" is a number.
BULLET = re.compile(rf"[{re.escape(_UNAMBIGUOUS_BULLETS)}]\s*|[-\u2013](?:\s+|$)")
NUMBERED = re.compile(r"\d+[.)]\s\S")
_SENTENCE_END = ".,;:!?"
_CLOSERS = "\"'”’)]»"
_TRAILING_REFERENCES = re.compile(r"(?:\[\w{1,4}\])+$")  # "... for Norwich.[61]": footnote marks after the stop


def decode(data: bytes) -> str:
    """The text of a file's bytes: by its byte-order mark, else as UTF-8, else by the character-set detection the
    unstructured path uses (a Latin-1 or Shift-JIS file reads as it did there). Newlines become "\\n"."""
    encoding = next((enc for bom, enc in BOMS if data.startswith(bom)), None)
    try:
        if encoding is not None:
            text = data.decode(encoding)
        elif b"\x00" not in data:  # NUL bytes: UTF-16 or UTF-32 without a mark, which the detector tells apart
            text = _utf8_or_detected(data)
        else:
            text = _detected(data)
    except UnicodeDecodeError as exc:
        raise ParseError(
            QuarantineReason.MALFORMED,
            f"not valid {exc.encoding} text although it starts with that encoding's byte-order mark: "
            "re-save the file as UTF-8",
            exc,
        ) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _utf8_or_detected(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return _detected(data)


def _detected(data: bytes) -> str:
    from unstructured.file_utils.encoding import EncodingDetectionWarning, detect_file_encoding

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EncodingDetectionWarning)  # a guess is what this path is for
            return detect_file_encoding(file=data)[1]
    except Exception as exc:  # unstructured's UnprocessableEntityError: no encoding decodes it
        raise ParseError(
            QuarantineReason.MALFORMED,
            f"no text encoding reads this file ({str(exc)[:200]}): if it is text, re-save it as UTF-8",
            exc,
        ) from exc


def read_text(path: Path) -> str:
    return decode(Path(path).read_bytes())


def alpha_share(text: str) -> float:
    """Letters among the characters other than whitespace (1.0 for none)."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / len(chars) if chars else 1.0


def is_heading(line: str) -> bool:
    """A one-line paragraph set as a heading: see the module's docstring."""
    words = line.split()
    if not words or len(words) > HEADING_MAX_WORDS:
        return False
    first = next((c for c in line if c.isalnum()), "")
    if not (first.isupper() or first.isdigit()):
        return False
    if _TRAILING_REFERENCES.sub("", line).rstrip(_CLOSERS)[-1:] in _SENTENCE_END:
        return False
    return alpha_share(line) >= 0.5 and not line.replace(" ", "").isnumeric()


def prose_kind(text: str, one_line: bool) -> ElementType:
    """title, narrative or text (mostly digits and signs: figures, codes, dates), as unstructured names them."""
    if alpha_share(text) < 0.5:
        return "text"
    if one_line and is_heading(text):
        return "title"
    return "narrative"


def _typed_line(line: str) -> tuple[str, ElementType]:
    if BULLET.match(line):
        return BULLET.sub("", line, count=1).strip(), "list_item"
    if NUMBERED.match(line):
        return line, "list_item"
    return line, prose_kind(line, True)


def _block_paragraphs(block: list[str]) -> list[tuple[str, ElementType]]:
    """The paragraphs of a run of non-blank (stripped) lines, typed: one per line when every line is short (and the
    first is no bullet), else the lines joined by a space, except that a bulleted or numbered line starts a list item
    (its continuation lines joined to it)."""
    starts_list = BULLET.match(block[0]) is not None  # as in unstructured: bullets first, then short lines
    if len(block) == 1 or (not starts_list and all(len(ln.split(" ")) < SHORT_LINE_WORDS for ln in block)):
        return [_typed_line(ln) for ln in block]
    out: list[tuple[str, ElementType]] = []
    lines: list[str] = []

    def flush() -> None:
        if lines:
            first = _typed_line(lines[0])
            joined = " ".join([first[0], *lines[1:]])
            out.append((joined, "list_item" if first[1] == "list_item" else prose_kind(joined, len(lines) == 1)))
            lines.clear()

    for line in block:
        if lines and (BULLET.match(line) or NUMBERED.match(line)):
            flush()
        lines.append(line)
    flush()
    return out


def _line_paragraphs(lines: list[str]) -> list[tuple[str, ElementType]]:
    """A paragraph per line, for text that never leaves a blank line. Such text is mostly prose wrapped at a width,
    so a line the next continues (it starts in lower case) is no heading, however short."""
    out = []
    for i, line in enumerate(lines):
        text, kind = _typed_line(line)
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if kind == "title" and following[:1].islower():
            kind = "narrative"
        out.append((text, kind))
    return out


def paragraphs(text: str) -> list[tuple[str, ElementType]]:
    """(text, element type) of every paragraph of a plain text, in order."""
    lines = text.split("\n")
    sample = lines[:SAMPLED_LINES]
    blank = sum(1 for ln in sample if not ln.strip())
    if blank < BLANK_LINE_SHARE * len(sample):
        return _line_paragraphs([s for ln in lines if (s := ln.strip())])
    out: list[tuple[str, ElementType]] = []
    block: list[str] = []
    for line in [*lines, ""]:
        if stripped := line.strip():
            block.append(stripped)
        elif block:
            out.extend(_block_paragraphs(block))
            block = []
    return [(t, k) for t, k in out if t]


def parse_text(path: Path) -> tuple[list[ElementDraft], int]:
    """A plain-text file's elements (all on page 1, as unstructured gives them) and its page count."""
    drafts = [
        ElementDraft(type=kind, text=text, heading_level=1 if kind == "title" else None)
        for text, kind in paragraphs(read_text(path))
    ]
    return drafts, 1
