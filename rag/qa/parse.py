"""Turn a model's raw reply into (answer, cited chunk ids, not-in-context), tolerating what small models write:
"Answer:" prefixes, a run-on next "Question:", citations as [1], [1, 2], [1][3], [Passage 2], (2), or full chunk
ids, labels that were never shown, and paraphrases of the fixed not-in-context reply."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rag.qa.models import NOT_IN_CONTEXT

# Where a run-on reply starts inventing the next turn.
_RUN_ON = re.compile(r"\n\s*(?:question|q|context|user|passage)\s*[:\[]|\n\s*\n\s*\n", re.IGNORECASE)
_PREFIX = re.compile(r"^\s*(?:final\s+answer|answer|a|the answer is)\s*[:\-]\s*", re.IGNORECASE)
# A passage header copied from the prompt, "[3] (report.pdf, page 2)": the label is a citation, the rest noise.
_ECHOED_HEADER = re.compile(r"\(\s*[^()\n]{1,200},\s*pages?\s+\d+(?:-\d+)?\s*\)")
# [1], [1, 2], [1 and 3], [passage 2], [source: 2; 4], [chunk-id] ; also (1) / (2, 3) when only numbers
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,200})\]")
_PAREN_NUMBERS = re.compile(r"\((\s*\d+(?:\s*(?:,|;|and|&)\s*\d+)*\s*)\)")
_TOKEN = re.compile(r"[A-Za-z0-9_\-:.]+")
_NOT_IN_CONTEXT = re.compile(
    r"not (?:in|found in|present in|mentioned in|contained in|included in) the (?:provided |given )?"
    r"(?:context|documents?|passages?|text)"
    r"|(?:context|documents?|passages?|text) (?:does|do) not (?:contain|mention|provide|say|include|specify)"
    r"|(?:no|not enough) information (?:about|on|in|to)"
    r"|\bi (?:do not|don't) know\b|\bcannot be (?:answered|determined|found)\b",
    re.IGNORECASE,
)


@dataclass
class ParsedAnswer:
    answer: str
    cited_chunk_ids: list[str] = field(default_factory=list)
    not_in_context: bool = False


def _citation_tokens(inner: str) -> list[str]:
    inner = re.sub(
        r"^\s*(?:passages?|sources?|chunks?|docs?|documents?|refs?|ids?)\s*[:#]?\s*", "", inner, flags=re.IGNORECASE
    )
    return [t.strip(".:") for t in re.split(r"\s*(?:,|;|\band\b|&|\]\s*\[)\s*|\s+", inner) if t.strip(".:")]


def _resolve(token: str, labels: dict[str, str], chunk_ids: set[str]) -> str | None:
    token = re.sub(r"^(?:passage|source|chunk|doc|ref|s|p)[\s#:-]*(?=\d+$)", "", token, flags=re.IGNORECASE)
    if token in labels:
        return labels[token]
    return token if token in chunk_ids else None


def parse_answer(raw: str, labels: dict[str, str]) -> ParsedAnswer:
    """`labels` maps the prompt's passage labels ("1", "2", ...) to chunk ids; full chunk ids are accepted too.
    Citations of passages that were not shown are dropped; the answer text comes back without citation marks."""
    text = raw or ""
    cut = _RUN_ON.search(text)
    if cut:
        text = text[: cut.start()]
    text = _ECHOED_HEADER.sub("", text)
    text = _PREFIX.sub("", text.strip()).strip().strip('"').strip()
    chunk_ids = set(labels.values())
    cited: list[str] = []

    def take(match: re.Match, tokens: list[str]) -> str:
        found = [cid for cid in (_resolve(t, labels, chunk_ids) for t in tokens) if cid]
        for cid in found:
            if cid not in cited:
                cited.append(cid)
        if found or all(t.isdigit() for t in tokens):
            return ""  # a citation, or citation-shaped ([7]) but of a passage never shown: not answer text
        return match.group(0)  # e.g. "[sic]": part of the answer

    text = _BRACKETED.sub(lambda m: take(m, _citation_tokens(m.group(1))), text)
    text = _PAREN_NUMBERS.sub(
        lambda m: (
            m.group(0)
            if not any(_resolve(t, labels, chunk_ids) for t in _citation_tokens(m.group(1)))
            else take(m, _citation_tokens(m.group(1)))
        ),
        text,
    )  # "(1990)" stays unless it names a passage
    text = re.sub(r"\s+([.,;:!?])", r"\1", re.sub(r"[ \t]{2,}", " ", text)).strip()
    text = _PREFIX.sub("", text).strip()  # again: a reply may open with citations, then "The answer is:"
    # Citations with no statement ("The answer is: [1] [2]") answer nothing: counted as not answered.
    if (
        not re.search(r"\w", text)
        or text.rstrip(".").lower() == NOT_IN_CONTEXT.rstrip(".").lower()
        or _NOT_IN_CONTEXT.search(text)
    ):
        return ParsedAnswer(NOT_IN_CONTEXT, [], True)
    return ParsedAnswer(text, cited, False)
