"""Generators: an LLM of rag.llm (any backend), or an extractive one that needs no model beyond the embedder.

A generator takes the question and the labelled passages (None: closed book, no retrieval) and returns a
`Generation`: the raw reply, what `parse_answer` made of it, and the messages sent (for inspection).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol, TypeVar

import numpy as np

from rag.embedding import TextEmbedder
from rag.llm import LLM, Message
from rag.qa.attribution import passage_sentences
from rag.qa.models import NOT_IN_CONTEXT, AnswerSettings
from rag.qa.parse import ParsedAnswer, parse_answer
from rag.qa.prompt import Passage, build_messages, build_reflection_messages
from rag.qa.tables import Header, chunk_headers, header_of, is_row, render_row


@dataclass
class Generation:
    raw: str
    parsed: ParsedAnswer
    messages: list[Message] = field(default_factory=list)
    draft: str | None = None  # the reply before reflection, when reflection changed it
    support: float | None = None  # extractive: share of the question's terms found in the answer's passage
    continued: list[dict] = field(
        default_factory=list
    )  # extractive: chunks after the cited one the answer read on into


class Generator(Protocol):
    name: str

    def generate(self, question: str, passages: list[Passage] | None) -> Generation: ...


# Words that shape a question without saying what it is about (BM25's stopword list keeps most of them).
QUESTION_WORDS = (
    "what which who whom whose when where why how many much does did do is are was were can could name".split()
)


@lru_cache(maxsize=1)
def _question_stems() -> frozenset[str]:
    from rag.index.bm25 import tokenize

    return frozenset(t for tokens in tokenize(QUESTION_WORDS) for t in tokens)


def content_terms(texts: list[str]) -> list[set[str]]:
    """Stemmed content words of each text, by the tokenizer BM25 uses (stopwords out, Snowball stems), question
    words out. One call for many texts: the tokenizer has a fixed cost per call."""
    from rag.index.bm25 import tokenize

    if not texts:
        return []
    stems = _question_stems()
    return [set(tokens) - stems for tokens in tokenize(texts)]


class TermCache:
    """content_terms of texts seen before, bounded (cleared when full): the passages and their sentences come back
    question after question, and tokenizing them was most of an extractive answer's own time. Misses are tokenized
    in one call (the tokenizer's cost per call is fixed)."""

    def __init__(self, max_entries: int = 50_000):
        self.max_entries = max_entries
        self._terms: dict[str, frozenset[str]] = {}

    def __call__(self, texts: list[str]) -> list[set[str]]:
        found = {t: terms for t in dict.fromkeys(texts) if (terms := self._terms.get(t)) is not None}
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            new = {t: frozenset(terms) for t, terms in zip(missing, content_terms(missing))}
            found.update(new)
            if len(self._terms) + len(new) > self.max_entries:
                self._terms.clear()
            self._terms.update(new)
        return [set(found[t]) for t in texts]


def share(question_terms: set[str], terms: set[str]) -> float:
    # A question with no content word cannot be checked against any text: it gets no support.
    return len(question_terms & terms) / len(question_terms) if question_terms else 0.0


_WANTS_NUMBER = re.compile(
    r"\bhow (?:many|much|long|old|far|often|large|big|tall)\b|\bwhen\b"
    r"|\bwhat (?:year|date|percentage|number|amount|time)\b"
    r"|\b(?:total|number of|amount|cost|price|rate|percent|percentage|salar(?:y|ies)|sum|count|spen[dt])s?\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _wants_number(question: str) -> bool:
    return bool(_WANTS_NUMBER.search(question))


def numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in _NUMBER.findall(text)}


# Names, dates and numbers a question mentions after its first word ("... in Knowles v. Mirzayance", "... in
# Alabama, November 2015") say which document or row it is about; its other content words say what it asks.
_NAMED = re.compile(r"[A-Z0-9]")


def named_words(question: str) -> str:
    return " ".join(w for w in question.split()[1:] if _NAMED.match(w))


def document_support(passages: list[Passage], terms: list[set[str]], q_terms: set[str]) -> list[float]:
    """Each passage's share of the question's terms found in it or in the other given passages of its document,
    for a passage holding at least one itself: what a question names (a case) often stands in one passage of a
    document and what it asks (who argued for the respondent) in the next."""
    found: dict[str, set[str]] = {}
    for p, t in zip(passages, terms):
        found.setdefault(str(p.chunk.get("doc_id", p.chunk_id)), set()).update(t & q_terms)
    return [
        share(q_terms, found[str(p.chunk.get("doc_id", p.chunk_id))]) if t & q_terms else 0.0
        for p, t in zip(passages, terms)
    ]


# A sentence announcing what follows ("... would require the following actions:", "... as follows:") says nothing
# by itself: the answer is the list items or the sentence after it.
_LEAD_IN = re.compile(r"(?::|\b(?:the following|as follows)\b[^.;:]{0,40}[.:]?)\s*$", re.IGNORECASE)
# A list item: a bullet, "1." / "2)" / "(a)" / "(iv)".
_LIST_MARKER = re.compile(
    r"^\s*(?:[\u2022\u25e6\u25aa\u25cf\u25a0\u2023\u2043\u2013\u2014*-]|\(?\d{1,2}[.)]|\([a-z]{1,3}\)|[a-z][.)])"
    r"(?:\s+|$)",
    re.IGNORECASE,
)
T = TypeVar("T")
# Chunks after the answer's own that a continuation may read (a lead-in often ends a chunk, its list the next).
CONTINUATION_CHUNKS = 3
ANSWER_SEPARATOR = "\n\n"  # between a lead-in and its items: passage_sentences splits the answer where it was joined


def is_lead_in(sentence: str) -> bool:
    return bool(_LEAD_IN.search(sentence.strip()))


def is_list_item(unit: str) -> bool:
    return bool(_LIST_MARKER.match(unit))


def _merge_bare_markers(units: list[tuple[str, T]]) -> list[tuple[str, T]]:
    """Non-blank units, stripped, with a "\u2022" or "1." alone (PDF text often breaks after the marker) joined to the
    text it marks; each unit keeps its tag (where it was read), the marked text's when two are joined."""
    out: list[tuple[str, T]] = []
    for unit, tag in units:
        unit = unit.strip()
        if not unit:
            continue
        if out and _LIST_MARKER.fullmatch(out[-1][0] + " ") and not _LIST_MARKER.fullmatch(unit + " "):
            out[-1] = (f"{out[-1][0]} {unit}", tag)
        else:
            out.append((unit, tag))
    return out


def sentence_units(text: str) -> list[str]:
    """Every unit of a chunk an answer or its attribution may encode: its sentences (passage_sentences) and the list
    items an answer joins from a bare marker and its text. What index time stores (rag.qa.encoding)."""
    units = passage_sentences(text)
    known = set(units)
    return units + [u for u, _ in _merge_bare_markers([(u, None) for u in units]) if u not in known]


def _completing(lead_in: str, following: list[str], budget: int) -> int:
    """How many of `following` (merged units after a lead-in) complete it: the run of list items right after it, or,
    after a colon with no list, the one sentence that follows; whole units only, while the answer stays within
    `budget` characters."""
    if not following:
        return 0
    if is_list_item(following[0]):
        run = next((i for i, u in enumerate(following) if not is_list_item(u)), len(following))
    elif lead_in.rstrip().endswith(":"):
        run = 1
    else:
        return 0
    used = len(lead_in.strip())
    for n, unit in enumerate(following[:run]):
        used += len(ANSWER_SEPARATOR) + len(unit)
        if used > budget:
            return n
    return run


def continuation(lead_in: str, following: list[str], budget: int) -> list[str]:
    """The units completing a lead-in, from the units after it in reading order (see _completing)."""
    merged = [u for u, _ in _merge_bare_markers([(u, None) for u in following])]
    return merged[: _completing(lead_in, merged, budget)]


@dataclass
class _Candidate:
    passage: Passage
    units: list[str]  # the passage's sentences
    at: int  # this sentence's position in units
    support: float
    header: Header | None = None  # a table row's column labels

    @property
    def sentence(self) -> str:
        return self.units[self.at]


def _not_in_context(support: float) -> Generation:
    return Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), support=support)


def _candidates(passage: Passage, support: float) -> list[_Candidate]:
    """The passage's sentences and table rows (with their tables' header rows) that may answer."""
    units = passage_sentences(passage.chunk.get("text") or "")
    headers = chunk_headers(passage.chunk)
    return [
        _Candidate(passage, units, i, support, header_of(u, headers) if headers and is_row(u) else None)
        for i, u in enumerate(units)
        if len(u.strip()) >= 3
    ]


class ExtractiveGenerator:
    """Picks the passage sentence best supporting the question and cites its passage, with no LLM.

    A passage's *support* is its share of the question's content terms; only passages with at least `min_support`
    may answer, and when none has it the honest answer is NOT_IN_CONTEXT: a passage sharing too few of the
    question's words rarely holds the answer, while embedding similarity alone finds a "nearest" sentence for
    any question at all. A passage's support counts the terms the other passages of its document hold, when it
    holds one itself: a case named in one passage, what is asked of it in the next. Among the supported passages'
    sentences the best scores cosine(question, sentence) + its own share of the question's terms + its passage's
    support. Passed over: sentences adding no term to the question's (headers, titles); when the question asks a
    quantity or a date, sentences without a number it does not give itself (a title's year); and when it names
    something (capitalised words, numbers), sentences holding none of the words it asks with, as those it names
    chose the document. A table row is read with its header row: matched with its column labels, and answered as
    "label: value" pairs of the columns the question names.

    A best sentence that only announces what follows (a lead-in: ends in ":" or says "the following") is continued
    into the list items (or the sentence) completing it, within `max_answer_chars`, reading on into the next chunks
    through `next_chunk` (chunk id -> chunk record, or None) when the lead-in ends its passage. The answer cites the
    chunks read that way; those not among the passages come back in Generation.continued, to be shown beside them."""

    name = "extractive"

    def __init__(
        self,
        embedder: TextEmbedder,
        min_support: float = 0.5,
        max_passages: int = 5,
        *,
        continue_lead_ins: bool = True,
        max_answer_chars: int = 800,
        next_chunk: Callable[[str], dict | None] | None = None,
    ):
        self.embedder, self.min_support, self.max_passages = embedder, min_support, max_passages
        self.continue_lead_ins, self.max_answer_chars, self.next_chunk = continue_lead_ins, max_answer_chars, next_chunk
        self._terms = TermCache()

    def generate(self, question: str, passages: list[Passage] | None) -> Generation:
        if not passages:
            return _not_in_context(0.0)
        ranked = sorted(passages, key=lambda p: p.hit.rank)[: self.max_passages]
        q_terms, *own = self._terms([question] + [p.chunk.get("text") or "" for p in ranked])
        own = [terms | self._header_terms(chunk_headers(p.chunk)) for p, terms in zip(ranked, own)]
        supports = document_support(ranked, own, q_terms)
        # Only supported passages may answer; when none is, nothing needs encoding.
        candidates = [c for p, sup in zip(ranked, supports) if sup >= self.min_support for c in _candidates(p, sup)]
        if not candidates:
            return _not_in_context(max(supports))
        unit_terms = self._unit_terms(candidates)
        keep = self._answerable(question, q_terms, candidates, unit_terms)
        if not keep:
            return _not_in_context(max(supports))
        candidates, unit_terms = [candidates[i] for i in keep], [unit_terms[i] for i in keep]
        q = self.embedder.encode_queries([question])[0]
        cosine = self.embedder.encode_passages([c.sentence for c in candidates]) @ q
        lexical = np.array([share(q_terms, terms) for terms in unit_terms])
        best = candidates[int(np.argmax(cosine + lexical + np.array([c.support for c in candidates])))]
        return self._answer(best, q_terms, passages)

    def _header_terms(self, headers: tuple[Header, ...]) -> set[str]:
        return set().union(*self._terms([" ".join(h) for h in headers])) if headers else set()

    def _unit_terms(self, candidates: list[_Candidate]) -> list[set[str]]:
        """Each candidate's content terms, a table row's with its column labels'."""
        terms = self._terms([c.sentence for c in candidates])
        return [t | self._header_terms((c.header,)) if c.header else t for c, t in zip(candidates, terms)]

    def _answerable(
        self, question: str, q_terms: set[str], candidates: list[_Candidate], unit_terms: list[set[str]]
    ) -> list[int]:
        """Positions of the candidates that may answer (see the class's "passed over"). Each preference gives way
        when no candidate meets it, but when some table row's cells hold a name the question gives (a state, not
        the document's name or the table's month), rows without one never answer: a row is looked up by name, and
        another state's count is a wrong answer, not a weak one."""
        # A sentence saying nothing the question does not (a table's header row, a title) cannot be the answer.
        keep = [i for i, terms in enumerate(unit_terms) if terms - q_terms] or list(range(len(candidates)))
        # Answer type: a question after a quantity or a date is answered by a sentence holding a number it lacks.
        if _wants_number(question):
            asked = numbers(question)
            keep = [i for i in keep if numbers(candidates[i].sentence) - asked] or keep
        named = self._terms([named_words(question)])[0] & q_terms
        if not named:
            return keep
        asks = q_terms - named
        if asks:
            keep = [i for i in keep if unit_terms[i] & asks] or keep
        rows = [i for i in keep if candidates[i].header]
        keyed = {i for i, terms in zip(rows, self._terms([candidates[i].sentence for i in rows])) if terms & named}
        return [i for i in keep if i in keyed or not candidates[i].header] if keyed else keep

    def _columns_asked(self, labels: list[str], q_terms: set[str]) -> list[int]:
        """The columns whose labels the question names: wholly if any, else in part."""
        terms = self._terms(labels)
        whole = [i for i, t in enumerate(terms) if t and t <= q_terms]
        return whole or [i for i, t in enumerate(terms) if t & q_terms]

    def _answer(self, best: _Candidate, q_terms: set[str], passages: list[Passage]) -> Generation:
        sentence, cited, continued = best.sentence.strip(), [best.passage.chunk_id], []
        if best.header:
            sentence = render_row(sentence, best.header, lambda labels: self._columns_asked(labels, q_terms))
        elif self.continue_lead_ins and is_lead_in(sentence):
            parts, read = self._continue(best)
            sentence = ANSWER_SEPARATOR.join([sentence, *parts])
            cited += [c["chunk_id"] for c in read]
            shown = {p.chunk_id for p in passages}
            continued = [c for c in read if c["chunk_id"] not in shown]
        raw = f"{sentence} [{best.passage.label}]"
        return Generation(raw, ParsedAnswer(sentence, cited, False), support=best.support, continued=continued)

    def _continue(self, best: _Candidate) -> tuple[list[str], list[dict]]:
        """(the units completing best's lead-in, the chunks after best's passage that some of them were read from)."""
        following: list[tuple[str, dict | None]] = [(u, None) for u in best.units[best.at + 1 :]]
        chunk = best.passage.chunk
        for _ in range(CONTINUATION_CHUNKS if self.next_chunk is not None else 0):
            merged = _merge_bare_markers(following)
            taken = _completing(best.sentence, [u for u, _ in merged], self.max_answer_chars)
            if taken < len(merged) or (merged and not taken):
                break  # it stops inside what was read: no need to read on
            next_id = chunk.get("next_chunk_id")
            chunk = self.next_chunk(next_id) if isinstance(next_id, str) and next_id else None
            if chunk is None:
                break
            following += [(u, chunk) for u in passage_sentences(chunk.get("text") or "")]
        merged = _merge_bare_markers(following)
        merged = merged[: _completing(best.sentence, [u for u, _ in merged], self.max_answer_chars)]
        sources = {c["chunk_id"]: c for _, c in merged if c is not None}
        return [u for u, _ in merged], list(sources.values())


class LLMGenerator:
    """The prompt of rag.qa.prompt through any rag.llm backend; optionally one critique-and-revise pass."""

    def __init__(self, llm: LLM, max_new_tokens: int = 128, reflect: bool = False):
        self.llm, self.max_new_tokens, self.reflect = llm, max_new_tokens, reflect
        self.name = f"llm:{llm.name}"

    def generate(self, question: str, passages: list[Passage] | None) -> Generation:
        labels = {p.label: p.chunk_id for p in passages or []}
        messages = build_messages(question, passages)
        raw = self.llm.chat(messages, max_new_tokens=self.max_new_tokens, stop=["\nQuestion:", "\nContext:"])
        parsed = parse_answer(raw, labels)
        if not self.reflect or not passages:
            return Generation(raw, parsed, messages)
        draft = parsed.answer if parsed.not_in_context else raw.strip()
        revision = build_reflection_messages(question, passages, draft)
        revised_raw = self.llm.chat(revision, max_new_tokens=self.max_new_tokens, stop=["\nQuestion:", "\nContext:"])
        revised = parse_answer(revised_raw, labels)
        changed = revised.answer != parsed.answer or revised.cited_chunk_ids != parsed.cited_chunk_ids
        return Generation(revised_raw, revised, messages + revision, draft=parsed.answer if changed else None)


GeneratorFactory = Callable[[AnswerSettings, TextEmbedder | None, LLM | None], Generator]


def _llm_generator(settings: AnswerSettings, embedder: TextEmbedder | None, llm: LLM | None) -> Generator:
    if llm is None:
        raise ValueError(
            'generator "llm" needs an LLM: set `llm: {backend: local-gguf, model: smollm2}` in the answer '
            'config (or RAG_LLM_BACKEND), or use generator "extractive"'
        )
    max_new_tokens = settings.llm.max_new_tokens if settings.llm else 128
    return LLMGenerator(llm, max_new_tokens=max_new_tokens, reflect=settings.reflect)


def _extractive_generator(settings: AnswerSettings, embedder: TextEmbedder | None, llm: LLM | None) -> Generator:
    if embedder is None:
        raise ValueError('generator "extractive" needs an embedding model: set `model` in the answer settings')
    return ExtractiveGenerator(
        embedder,
        min_support=settings.min_support,
        continue_lead_ins=settings.continue_lead_ins,
        max_answer_chars=settings.max_answer_chars,
    )


# One entry per generator; the key is AnswerSettings.generator.
GENERATORS: dict[str, GeneratorFactory] = {"extractive": _extractive_generator, "llm": _llm_generator}
