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
_DIGIT = re.compile(r"\d")


def _wants_number(question: str) -> bool:
    return bool(_WANTS_NUMBER.search(question))


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

    @property
    def sentence(self) -> str:
        return self.units[self.at]


class ExtractiveGenerator:
    """Picks the passage sentence best supporting the question and cites its passage, with no LLM.

    A passage's *support* is its share of the question's content terms; only passages with at least `min_support`
    may answer, and when none has it the honest answer is NOT_IN_CONTEXT: a passage sharing too few of the
    question's words rarely holds the answer, while embedding similarity alone finds a "nearest" sentence for
    any question at all. Among the supported passages' sentences the best scores cosine(question, sentence) +
    its own share of the question's terms + its passage's support. Passed over: sentences adding no term to the
    question's (headers, titles) and, when the question asks a quantity or a date, sentences without a number.

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
            return Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), support=0.0)
        ranked = sorted(passages, key=lambda p: p.hit.rank)[: self.max_passages]
        q_terms, *passage_terms = self._terms([question] + [p.chunk.get("text") or "" for p in ranked])
        supports = [(p, share(q_terms, terms)) for p, terms in zip(ranked, passage_terms)]
        # Only supported passages may answer; when none is, nothing needs encoding.
        candidates = []
        for p, sup in supports:
            if sup >= self.min_support:
                units = passage_sentences(p.chunk.get("text") or "")
                candidates += [_Candidate(p, units, i, sup) for i, s in enumerate(units) if len(s.strip()) >= 3]
        best_support = max(sup for _, sup in supports)
        if not candidates:
            return Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), support=best_support)
        sentence_terms = self._terms([c.sentence for c in candidates])
        # A sentence saying nothing the question does not (a table's header row, a title) cannot be the answer.
        informative = [i for i, terms in enumerate(sentence_terms) if terms - q_terms] or list(range(len(candidates)))
        # Answer type: a question after a quantity or a date is answered by a sentence holding a number.
        if _wants_number(question):
            informative = [i for i in informative if _DIGIT.search(candidates[i].sentence)] or informative
        candidates, sentence_terms = [candidates[i] for i in informative], [sentence_terms[i] for i in informative]
        q = self.embedder.encode_queries([question])[0]
        cosine = self.embedder.encode_passages([c.sentence for c in candidates]) @ q
        lexical = np.array([share(q_terms, terms) for terms in sentence_terms])
        best = candidates[int(np.argmax(cosine + lexical + np.array([c.support for c in candidates])))]
        sentence, cited, continued = best.sentence.strip(), [best.passage.chunk_id], []
        if self.continue_lead_ins and is_lead_in(sentence):
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
