"""Generators: an LLM of rag.llm (any backend), or an extractive one that needs no model beyond the embedder.

A generator takes the question and the labelled passages (None: closed book, no retrieval) and returns a
`Generation`: the raw reply, what `parse_answer` made of it, and the messages sent (for inspection).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

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


class Generator(Protocol):
    name: str

    def generate(self, question: str, passages: list[Passage] | None) -> Generation: ...


# Words that shape a question without saying what it is about (BM25's stopword list keeps most of them).
QUESTION_WORDS = "what which who whom whose when where why how many much does did do is are was were can could name".split()


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


def share(question_terms: set[str], terms: set[str]) -> float:
    # A question with no content word cannot be checked against any text: it gets no support.
    return len(question_terms & terms) / len(question_terms) if question_terms else 0.0


_WANTS_NUMBER = re.compile(
    r"\bhow (?:many|much|long|old|far|often|large|big|tall)\b|\bwhen\b|\bwhat (?:year|date|percentage|number|amount|time)\b"
    r"|\b(?:total|number of|amount|cost|price|rate|percent|percentage|salar(?:y|ies)|sum|count|spen[dt])s?\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")


def _wants_number(question: str) -> bool:
    return bool(_WANTS_NUMBER.search(question))


class ExtractiveGenerator:
    """Picks the passage sentence best supporting the question and cites its passage, with no LLM.

    A passage's *support* is its share of the question's content terms; only passages with at least `min_support`
    may answer, and when none has it the honest answer is NOT_IN_CONTEXT: a passage sharing too few of the
    question's words rarely holds the answer, while embedding similarity alone finds a "nearest" sentence for
    any question at all. Among the supported passages' sentences the best scores cosine(question, sentence) +
    its own share of the question's terms + its passage's support. Passed over: sentences adding no term to the
    question's (headers, titles) and, when the question asks a quantity or a date, sentences without a number."""

    name = "extractive"

    def __init__(self, embedder: TextEmbedder, min_support: float = 0.5, max_passages: int = 5):
        self.embedder, self.min_support, self.max_passages = embedder, min_support, max_passages

    def generate(self, question: str, passages: list[Passage] | None) -> Generation:
        if not passages:
            return Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), support=0.0)
        ranked = sorted(passages, key=lambda p: p.hit.rank)[: self.max_passages]
        q_terms, *passage_terms = content_terms([question] + [p.chunk.get("text") or "" for p in ranked])
        supports = [(p, share(q_terms, terms)) for p, terms in zip(ranked, passage_terms)]
        # Only supported passages may answer; when none is, nothing needs encoding.
        candidates = [(p, s, sup) for p, sup in supports if sup >= self.min_support
                      for s in passage_sentences(p.chunk.get("text") or "") if len(s.strip()) >= 3]
        best_support = max(sup for _, sup in supports)
        if not candidates:
            return Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), support=best_support)
        sentence_terms = content_terms([s for _, s, _ in candidates])
        # A sentence saying nothing the question does not (a table's header row, a title) cannot be the answer.
        informative = [i for i, terms in enumerate(sentence_terms) if terms - q_terms] or list(range(len(candidates)))
        # Answer type: a question after a quantity or a date is answered by a sentence holding a number.
        if _wants_number(question):
            informative = [i for i in informative if _DIGIT.search(candidates[i][1])] or informative
        candidates, sentence_terms = [candidates[i] for i in informative], [sentence_terms[i] for i in informative]
        q = self.embedder.encode_queries([question])[0]
        cosine = self.embedder.encode_passages([s for _, s, _ in candidates]) @ q
        lexical = np.array([share(q_terms, terms) for terms in sentence_terms])
        best = int(np.argmax(cosine + lexical + np.array([sup for _, _, sup in candidates])))
        passage, sentence, support = candidates[best]
        raw = f"{sentence.strip()} [{passage.label}]"
        return Generation(raw, ParsedAnswer(sentence.strip(), [passage.chunk_id], False), support=support)


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
        raise ValueError('generator "llm" needs an LLM: set `llm: {backend: local-gguf, model: smollm2}` in the answer '
                         'config (or RAG_LLM_BACKEND), or use generator "extractive"')
    max_new_tokens = settings.llm.max_new_tokens if settings.llm else 128
    return LLMGenerator(llm, max_new_tokens=max_new_tokens, reflect=settings.reflect)


def _extractive_generator(settings: AnswerSettings, embedder: TextEmbedder | None, llm: LLM | None) -> Generator:
    if embedder is None:
        raise ValueError('generator "extractive" needs an embedding model: set `model` in the answer settings')
    return ExtractiveGenerator(embedder, min_support=settings.min_support)


# One entry per generator; the key is AnswerSettings.generator.
GENERATORS: dict[str, GeneratorFactory] = {"extractive": _extractive_generator, "llm": _llm_generator}
