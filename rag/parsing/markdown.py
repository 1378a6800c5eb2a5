"""Markdown read natively, block by block, into the elements unstructured made of it (through Python-Markdown's HTML):
ATX and setext headings as titles with their levels, paragraphs (lines joined by a space), list items (one per item,
nested ones too, markers dropped), fenced and indented code, pipe tables (and raw HTML tables) as table elements with
their rows, block quotes read as Markdown. Inline markup is dropped (emphasis, links keep their text, images go,
code spans keep their code, entities are decoded). Only headings are titles: a short paragraph is "text", as it was.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from rag.parsing.models import ElementDraft, ElementType
from rag.parsing.text import BULLET, alpha_share, read_text

ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*$")
FENCE = re.compile(r"( {0,3})(`{3,}|~{3,})(.*)$")
RULE = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
LIST_ITEM = re.compile(r"( *)([-*+]|\d{1,9}[.)])(?:[ \t]+|$)(.*)$")
DELIMITER_ROW = re.compile(r"[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
LINK_DEFINITION = re.compile(r" {0,3}\[[^\]]+\]:\s*\S+")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)

# Inline spans are bounded (SPAN characters), so a paragraph of unclosed markers costs linear time, not quadratic.
SPAN = 1000
_CODE_SPAN = re.compile(rf"(`+)(.{{1,{SPAN}}}?)\1", re.S)
_IMAGE = re.compile(rf"!\[[^\]]{{0,{SPAN}}}\](?:\([^)]{{0,{SPAN}}}\)|\[[^\]]{{0,{SPAN}}}\])")
_LINK = re.compile(rf"\[([^\]]{{0,{SPAN}}})\](?:\([^)]{{0,{SPAN}}}\)|\[[^\]]{{0,{SPAN}}}\])")
_AUTOLINK = re.compile(rf"<((?:https?|ftp|mailto):[^>\s]{{1,{SPAN}}})>")
_TAG = re.compile(rf"</?[A-Za-z][^>]{{0,{SPAN}}}>")
_STRONG = re.compile(rf"(\*\*|__)(?=\S)(.{{1,{SPAN}}}?)(?<=\S)\1")
_EM_STAR = re.compile(rf"(?<![\w*])\*(?=[^\s*])(.{{1,{SPAN}}}?)(?<=[^\s*])\*(?![\w*])")
_EM_UNDERSCORE = re.compile(rf"(?<![\w_])_(?=[^\s_])(.{{1,{SPAN}}}?)(?<=[^\s_])_(?![\w_])")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|~<>])")
_MARKUP = re.compile(r"[`*_\[\]<&\\!]")


def _plain(part: str) -> str:
    """Inline markup dropped from text outside code spans."""
    part = _IMAGE.sub("", part)
    part = _LINK.sub(r"\1", part)
    part = _AUTOLINK.sub(r"\1", part)
    part = _TAG.sub("", part)
    for pattern in (_STRONG, _EM_STAR, _EM_UNDERSCORE):
        part = pattern.sub(lambda m: m.group(m.lastindex), part)
    return html.unescape(_ESCAPE.sub(r"\1", part))


def inline_text(text: str) -> str:
    """What a reader sees of a line of Markdown: code spans keep their code, the rest loses its markup; runs of
    whitespace (no-break spaces too) are one space, as in the HTML unstructured read."""
    if not _MARKUP.search(text):
        return " ".join(text.split())
    out, at = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_plain(text[at : m.start()]))
        out.append(m.group(2).strip())
        at = m.end()
    out.append(_plain(text[at:]))
    return " ".join("".join(out).split())


def table_cells(line: str) -> list[str]:
    """The cells of a pipe-table row: outer pipes dropped, split on pipes that are not escaped."""
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [inline_text(c.strip().replace("\\|", "|")) for c in re.split(r"(?<!\\)\|", line)]


def paragraph_kind(text: str) -> ElementType:
    """narrative for prose, text for the rest (a label, figures), as unstructured typed Markdown paragraphs."""
    if alpha_share(text) < 0.5 or text.isupper():
        return "text"
    ends = text.rstrip("\"'”’)]»")[-1:]
    return "narrative" if ends in ".!?:" or len(text.split()) > 12 else "text"


@dataclass
class _Reader:
    """One pass over the lines; `drafts` collects the elements."""

    lines: list[str]
    at: int = 0
    drafts: list[ElementDraft] = field(default_factory=list)
    paragraph: list[str] = field(default_factory=list)

    def add(self, kind: ElementType, text: str, level: int | None = None) -> None:
        self.drafts.append(ElementDraft(type=kind, text=text, heading_level=level))

    def flush(self) -> None:
        if self.paragraph:
            text = inline_text(" ".join(self.paragraph))
            if BULLET.match(text):  # "• item" or "– item" in a paragraph: unstructured made it a list item
                self.add("list_item", BULLET.sub("", text, count=1))
            elif text:
                self.add(paragraph_kind(text), text)
            self.paragraph = []

    def read(self) -> list[ElementDraft]:
        while self.at < len(self.lines):
            self.step(self.lines[self.at])
        self.flush()
        return self.drafts

    def step(self, line: str) -> None:
        stripped = line.strip()
        if not stripped:
            self.flush()
            self.at += 1
        elif self.paragraph and SETEXT.match(line):
            self.setext(line)
        elif not self.block(line, stripped):
            self.paragraph.append(stripped)
            self.at += 1

    def setext(self, line: str) -> None:
        text = inline_text(" ".join(self.paragraph))
        self.paragraph = []
        if text:
            self.add("title", text, 1 if line.strip()[0] == "=" else 2)
        self.at += 1

    def block(self, line: str, stripped: str) -> bool:
        """Read the block starting at this line, if one does (a paragraph line is no block): True when read."""
        if m := ATX.match(line):
            self.flush()
            text = inline_text(m.group(2) or "")
            if text:
                self.add("title", text, len(m.group(1)))
            self.at += 1
        elif m := FENCE.match(line):
            if m.group(2)[0] == "`" and "`" in m.group(3):
                return False  # ```x``` on one line is a code span
            self.flush()
            self.fenced(m.group(2))
        elif RULE.match(line):
            self.flush()
            self.at += 1
        elif "|" in line and self.at + 1 < len(self.lines) and self.delimiter_row(self.lines[self.at + 1]):
            self.flush()
            self.pipe_table()
        elif (m := LIST_ITEM.match(line)) and (not self.paragraph or self.interrupts(m)):
            self.flush()
            self.list_items()
        elif stripped.startswith(">"):
            self.flush()
            self.quote()
        elif stripped.lower().startswith("<table"):
            self.flush()
            self.html_table()
        elif stripped.startswith("<!--"):
            self.flush()
            self.comment()
        elif not self.paragraph and (line.startswith("    ") or line.startswith("\t")):
            self.indented_code()
        elif not self.paragraph and LINK_DEFINITION.match(line):
            self.at += 1
        else:
            return False
        return True

    @staticmethod
    def interrupts(item: re.Match) -> bool:
        """Whether a list marker ends the paragraph above it: as in CommonMark, a non-empty item whose number, if
        any, is 1, so a wrapped line that starts "2019. Revenue" stays in its paragraph."""
        marker = item.group(2)
        return bool(item.group(3).strip()) and (not marker[0].isdigit() or marker[:-1] == "1")

    @staticmethod
    def delimiter_row(line: str) -> bool:
        return "|" in line and "-" in line and DELIMITER_ROW.match(line) is not None

    def fenced(self, fence: str) -> None:
        body = []
        self.at += 1
        while self.at < len(self.lines):
            line = self.lines[self.at]
            self.at += 1
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                break
            body.append(line)
        if any(b.strip() for b in body):
            self.add("code", "\n".join(body))

    def indented_code(self) -> None:
        body = []
        while self.at < len(self.lines):
            line = self.lines[self.at]
            if line.strip() and not (line.startswith("    ") or line.startswith("\t")):
                break
            body.append(line[4:] if line.startswith("    ") else line[1:])
            self.at += 1
        self.add("code", "\n".join(body).strip("\n"))

    def pipe_table(self) -> None:
        header = table_cells(self.lines[self.at])
        self.at += 2
        rows = [header]
        while self.at < len(self.lines) and self.lines[self.at].strip():
            cells = table_cells(self.lines[self.at])
            rows.append((cells + [""] * len(header))[: len(header)])
            self.at += 1
        has_header = any(header)
        if not has_header:
            rows = rows[1:]
        if any(any(r) for r in rows):
            self.drafts.append(ElementDraft(type="table", text="", rows=rows, has_header=has_header))

    def html_table(self) -> None:
        from lxml.etree import LxmlError

        from rag.parsing.office import html_table_rows

        start = self.at
        while self.at < len(self.lines) and "</table>" not in self.lines[self.at].lower():
            self.at += 1
        self.at += 1
        block = "\n".join(self.lines[start : self.at])
        try:
            rows, has_header = html_table_rows(block)
        except (LxmlError, ValueError):  # markup lxml cannot read: its text is still text
            self.paragraph.append(_TAG.sub(" ", block))
            return
        rows = [[html.unescape(c) for c in r] for r in rows]
        if any(any(r) for r in rows):
            self.drafts.append(ElementDraft(type="table", text="", rows=rows, has_header=has_header))

    def comment(self) -> None:
        start = self.at
        while self.at < len(self.lines) and "-->" not in self.lines[self.at]:
            self.at += 1
        self.at += 1
        rest = HTML_COMMENT.sub("", "\n".join(self.lines[start : self.at])).strip()
        if rest:
            self.paragraph.append(rest)

    def quote(self) -> None:
        inner = []
        while self.at < len(self.lines) and self.lines[self.at].strip():
            line = self.lines[self.at].strip()
            inner.append(re.sub(r"^>[ ]?", "", line))
            self.at += 1
        self.drafts.extend(_Reader(inner).read())

    def list_items(self) -> None:
        """Every item of a list (nested ones included) up to a blank line followed by an unindented non-item."""
        item: list[str] | None = None
        while self.at < len(self.lines):
            line = self.lines[self.at]
            m = LIST_ITEM.match(line)
            if m and not RULE.match(line):
                self.item(item)
                item = [m.group(3).strip()]
            elif not line.strip():
                following = self.lines[self.at + 1] if self.at + 1 < len(self.lines) else ""
                if not (LIST_ITEM.match(following) or following.startswith((" ", "\t"))):
                    break
            elif item is not None and (line.startswith((" ", "\t")) or not self.starts_block(line)):
                item.append(line.strip())
            else:
                break
            self.at += 1
        self.item(item)

    def starts_block(self, line: str) -> bool:
        return bool(ATX.match(line) or FENCE.match(line) or RULE.match(line) or line.lstrip().startswith(">"))

    def item(self, lines: list[str] | None) -> None:
        if lines:
            text = inline_text(" ".join(ln for ln in lines if ln))
            if text:
                self.add("list_item", text)


def markdown_drafts(text: str) -> list[ElementDraft]:
    return _Reader(text.split("\n")).read()


def parse_markdown(path: Path) -> tuple[list[ElementDraft], int]:
    """A Markdown file's elements (all on page 1, as unstructured gives them) and its page count."""
    return markdown_drafts(read_text(path)), 1
