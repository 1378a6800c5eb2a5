"""Generators: an LLM of rag.llm (any backend), or an extractive one that needs no model beyond the embedder.

A generator takes the question and the labelled passages (None: closed book, no retrieval) and returns a
`Generation`: the raw reply, what `parse_answer` made of it, and the messages sent (for inspection).
"""
from __future__ import annotations

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


def content_terms(text: str) -> set[str]:
    """Stemmed content words, by the tokenizer BM25 uses (stopwords out, Snowball stems), question words out."""
    from rag.index.bm25 import tokenize

    return set(tokenize([text])[0]) - _question_stems()


class ExtractiveGenerator:
    """Picks the passage sentence best supporting the question and cites its passage, with no LLM.

    A sentence scores cosine(question, sentence) + its share of the question's content terms + its passage's share
    of them (the *support*). Below `min_support` the honest answer is NOT_IN_CONTEXT: a passage that shares
    too few of the question's words almost never holds the answer, while embedding similarity alone finds a
    "nearest" sentence for any question at all."""

    name = "extractive"

    def __init__(self, embedder: TextEmbedder, min_support: float = 0.5, max_passages: int = 5):
        self.embedder, self.min_support, self.max_passages = embedder, min_support, max_passages

    def generate(self, question: str, passages: list[Passage] | None) -> Generation:
        if not passages:
            return Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), support=0.0)
        q_terms = content_terms(question)
        candidates: list[tuple[Passage, str, float]] = []  # passage, sentence, passage support
        for p in sorted(passages, key=lambda p: p.hit.rank)[: self.max_passages]:
            support = len(q_terms & content_terms(p.chunk.get("text") or "")) / len(q_terms) if q_terms else 0.0
            candidates.extend((p, s, support) for s in passage_sentences(p.chunk.get("text") or "") if len(s.strip()) >= 3)
        if not candidates:
            return Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), support=0.0)
        q = self.embedder.encode_queries([question])[0]
        cosine = self.embedder.encode_passages([s for _, s, _ in candidates]) @ q
        lexical = np.array([len(q_terms & content_terms(s)) / len(q_terms) if q_terms else 0.0 for _, s, _ in candidates])
        scores = cosine + lexical + np.array([sup for _, _, sup in candidates])
        best = int(np.argmax(scores))
        passage, sentence, support = candidates[best]
        if not q_terms:  # nothing to match lexically ("Who is she?"): only similarity can speak
            support = float(cosine[best])
        if support < self.min_support:
            return Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), support=support)
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
