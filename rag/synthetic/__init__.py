"""Synthetic QA sets over sampled passages, filtered, split 80/20 by document. Question kinds, mixed by
`SynthSettings.question_mix` (rag.synthetic.mix): few-shot LLM questions; answer-aware wh-questions made by rule
from a sentence's answer phrase (rag.synthetic.answer_aware); keyword queries of a passage's salient terms
(rag.synthetic.keywords); inverse-cloze pseudo-queries (a sentence as the query, its passage as evidence).
rag.synthetic.style measures how far each kind is from how people ask.

Passages come from the canonical text (not from a chunk set), so the QA set scores every strategy.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Protocol

import yaml
from pydantic import BaseModel, Field, field_validator

from rag.chunking.sentences import split_sentences
from rag.evaluation.qaset import Evidence, QAItem, assign_splits, question_id
from rag.parsing.models import ParsedDocument
from rag.synthetic import mix as question_mix
from rag.synthetic.keywords import KEYWORD_MIN_WORDS
from rag.synthetic.text import is_verbatim, tokens

QUESTION_TYPES = ("factual", "interpretation", "long-answer")


class Completer(Protocol):
    name: str

    def complete(self, prompt: str, *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str: ...


class SynthSettings(BaseModel):
    """How big a QA set is and how it is made. The single home of these defaults: the synthetic_qa asset's run
    config (assets/evaluation.py) reads its defaults and descriptions from here."""

    passages_per_document: int = Field(
        4,
        ge=1,
        description="passages sampled per document (fewer when a document "
        "has fewer disjoint passages of passage_chars)",
    )
    questions_per_passage: int = Field(
        1,
        ge=1,
        description="questions per passage: with an LLM, one per question type "
        "in turn; inverse-cloze: that many different sentences",
    )
    max_questions: int | None = Field(
        None,
        ge=1,
        description="stop once the set has this many questions (passages "
        "taken round-robin over documents, so the cap spreads over them); None = no cap",
    )
    passage_chars: tuple[int, int] = (300, 1200)  # min, max characters of a passage
    question_types: list[str] = Field(
        default_factory=lambda: list(QUESTION_TYPES),
        description=f"LLM question types, cycled per passage: {', '.join(QUESTION_TYPES)}",
    )
    question_mix: dict[str, float] | None = Field(
        None,
        description="share of each kind of question: llm (the LLM's question_types), answer-aware (wh-questions "
        "made by rule about a sentence's answer phrase), keyword (search-box terms of a passage), inverse-cloze (a "
        "sentence copied as the query); None = llm alone with an LLM, else answer-aware 0.5, keyword 0.25, "
        "inverse-cloze 0.25. A passage that yields nothing of its slot's kind gives the slot to the next kind",
    )
    multi_document_questions: int = Field(0, ge=0, description="extra questions that need two documents (LLM only)")
    min_words: int = 5
    max_words: int = 50
    dev_fraction: float = Field(
        0.2, ge=0.0, le=1.0, description="share of documents whose questions form the dev split"
    )
    # The checkpoint-selection and gate sets are cut from the dev questions that are not copies. Sized by passages
    # per document alone, a corpus of a few long papers gave its gate a few dozen questions: too few to tell a
    # 3-point change from noise. Only the dev documents get more (training is unchanged); copies are not made for
    # them, since copies never decide.
    dev_questions: int | None = Field(
        400,
        ge=1,
        description="dev-split questions that are not copies to aim for: the dev documents get more passages, "
        "in the mix without inverse-cloze, then up to three questions of each, until this many or the passages "
        "give no more (not with max_questions); None = the same passages per document as the training documents",
    )
    seed: int = Field(42, description="passage sampling and sentence choice")
    seed_examples_path: str | None = Field(
        None, description="YAML list of {passage, question, answer, type}; None = built-in generic examples"
    )

    @field_validator("question_mix")
    @classmethod
    def _known_kinds(cls, mix: dict[str, float] | None) -> dict[str, float] | None:
        return None if mix is None else question_mix.validate(mix)


@dataclass
class Passage:
    doc_id: str
    start: int
    end: int
    text: str


@dataclass
class SynthResult:
    items: list[QAItem]
    rejected: Counter = field(default_factory=Counter)
    attempted: int = 0
    generator: str = ""
    samples: list[dict] = field(default_factory=list)
    mix: dict[str, float] = field(default_factory=dict)  # the shares this run resolved to
    fallbacks: Counter = field(default_factory=Counter)  # "wanted->given": slots a passage filled with another kind
    dev_added: int = 0  # questions the dev documents got beyond passages_per_document (SynthSettings.dev_questions)

    @property
    def by_type(self) -> dict[str, int]:
        return dict(sorted(Counter(i.qtype for i in self.items).items()))

    @property
    def summary(self) -> dict:
        by_type = self.by_type
        by_split = Counter(i.split for i in self.items)
        return {
            "questions": len(self.items),
            "attempted": self.attempted,
            "generator": self.generator,
            "fallbacks": sum(self.fallbacks.values()),
            "dev_added": self.dev_added,
            **{f"type_{k}": v for k, v in sorted(by_type.items())},
            **{f"split_{k}": v for k, v in sorted(by_split.items())},
            **{f"rejected_{k}": v for k, v in sorted(self.rejected.items())},
        }


# --- passages --------------------------------------------------------------------------------------
def sample_passages(doc: ParsedDocument, n: int, chars: tuple[int, int], rng: random.Random) -> list[Passage]:
    """A deterministic sample of n of the document's passages (passage_windows), in text order."""
    windows = passage_windows(doc, chars)
    return sorted(rng.sample(windows, min(n, len(windows))), key=lambda p: p.start)


def passage_windows(doc: ParsedDocument, chars: tuple[int, int]) -> list[Passage]:
    """Every run of consecutive elements between min and max characters, in text order, none overlapping."""
    lo, hi = chars
    windows, start, end = [], None, None
    for el in doc.elements:
        if el.type in ("header", "footer"):
            continue
        if start is None:
            start = el.char_start
        if el.char_end - start > hi and end is not None:
            if end - start >= lo:
                windows.append((start, end))
            start = el.char_start
        end = el.char_end
        if end - start >= lo:
            windows.append((start, min(end, start + hi)))
            start, end = None, None
    if start is not None and end is not None and end - start >= lo:
        windows.append((start, end))
    return [Passage(doc.doc_id, s, e, doc.canonical_text[s:e]) for s, e in windows]


# --- prompts ---------------------------------------------------------------------------------------
BUILTIN_EXAMPLES = [
    {
        "type": "factual",
        "passage": (
            "The Eiffel Tower was completed in March 1889 for the World's Fair in Paris. It is 330 metres tall and "
            "was the tallest man-made structure until 1930."
        ),
        "question": "In which year was the Eiffel Tower completed?",
        "answer": "1889",
    },
    {
        "type": "factual",
        "passage": (
            "Applicants must submit the form within 30 days of the notice. "
            "Late submissions are charged a fee of $25 per week of delay."
        ),
        "question": "How much is the fee for each week a submission is late?",
        "answer": "$25 per week",
    },
    {
        "type": "interpretation",
        "passage": (
            "Sales fell by 12% in the second quarter, "
            "while the cost of raw materials rose sharply after the new import tariffs took effect."
        ),
        "question": "What probably explains the weaker results of the second quarter?",
        "answer": "the cost of raw materials rose sharply after the new import tariffs took effect",
    },
    {
        "type": "long-answer",
        "passage": (
            "To reset the device, hold the power button for ten seconds, wait until the light blinks twice, "
            "then release the button and enter the default PIN 0000."
        ),
        "question": "What are the steps to reset the device?",
        "answer": (
            "hold the power button for ten seconds, wait until the light blinks twice, "
            "then release the button and enter the default PIN 0000"
        ),
    },
]


def load_examples(path: str | None) -> list[dict]:
    if path and Path(path).exists():
        examples = yaml.safe_load(Path(path).read_text()) or []
        if not isinstance(examples, list) or not all({"passage", "question", "answer"} <= set(e) for e in examples):
            raise ValueError(f"{path}: seed examples must be a list of {{passage, question, answer, type}}")
        return examples
    return BUILTIN_EXAMPLES


def build_prompt(passage: str, qtype: str, examples: list[dict]) -> str:
    """Completion-style few-shot prompt: small models continue a pattern far better than they follow a chat."""
    head = "Write one question that the passage answers, and copy the answer from the passage.\n\n"
    shots = "".join(
        f"Passage: {e['passage']}\nQuestion type: {e.get('type', 'factual')}\n"
        f"Question: {e['question']}\nAnswer: {e['answer']}\n\n"
        for e in examples[:5]
    )
    return f"{head}{shots}Passage: {' '.join(passage.split())}\nQuestion type: {qtype}\nQuestion:"


def ask(llm: Completer, prompt: str) -> tuple[str, str] | None:
    """Question, then answer, as two one-line completions: tiny models drift off a two-line format
    in one go, but each line on its own stays in the pattern of the examples."""
    question = llm.complete(prompt, max_new_tokens=64, stop=["\n"]).strip()
    if not question or question.lower().startswith("answer"):
        return None
    answer = llm.complete(f"{prompt} {question}\nAnswer:", max_new_tokens=64, stop=["\n"]).strip()
    return (question, answer) if answer else None


# --- filters ---------------------------------------------------------------------------------------
def locate_answer(answer: str, passage: Passage) -> Evidence | None:
    """The answer's span in the canonical text: exact (case-insensitive), else the best token-overlap window."""
    text = passage.text
    pos = text.lower().find(answer.lower().strip().rstrip("."))
    if pos >= 0 and answer.strip():
        length = len(answer.strip().rstrip("."))
        return Evidence(doc_id=passage.doc_id, start=passage.start + pos, end=passage.start + pos + length)
    want = set(tokens(answer))
    if not want:
        return None
    best, best_span = 0.0, None
    for m in re.finditer(r"[^.!?\n]+[.!?]?", text):  # sentences of the passage
        have = set(tokens(m.group()))
        score = len(want & have) / len(want)
        if score > best:
            best, best_span = score, (m.start(), m.end())
    if best >= 0.8 and best_span:
        return Evidence(doc_id=passage.doc_id, start=passage.start + best_span[0], end=passage.start + best_span[1])
    return None


def language_of(text: str) -> str | None:
    try:
        from langdetect import DetectorFactory, detect

        DetectorFactory.seed = 0  # langdetect is random unless seeded
        return detect(text)
    except Exception:
        return None


def sentences(text: str) -> list[tuple[int, int]]:
    return [(s, e) for s, e in split_sentences(text) if text[e - 1 : e] in ".!?"]  # whole sentences only


# --- generation ------------------------------------------------------------------------------------
class _Filters:
    def __init__(self, settings: SynthSettings):
        self.settings, self.seen, self.rejected = settings, set(), Counter()

    def accept(
        self,
        question: str,
        passage_text: str,
        check_language: bool = True,
        check_verbatim: bool | None = None,
        min_words: int | None = None,
    ) -> bool:
        """Length, duplicates, then (by default with the language) not a copy of the passage and its language."""
        words = len(question.split())
        key = " ".join(tokens(question))
        if not (self.settings.min_words if min_words is None else min_words) <= words <= self.settings.max_words:
            self.rejected["length"] += 1
        elif key in self.seen:
            self.rejected["duplicate"] += 1
        elif (check_language if check_verbatim is None else check_verbatim) and is_verbatim(question, passage_text):
            self.rejected["verbatim"] += 1
        elif check_language and language_of(question) not in (None, language_of(passage_text)):
            self.rejected["language"] += 1
        else:
            self.seen.add(key)
            return True
        return False


def generate_qa(
    documents: list[ParsedDocument], llm: Completer | None, settings: SynthSettings | None = None
) -> SynthResult:
    settings = settings or SynthSettings()
    rng = random.Random(settings.seed)
    examples = load_examples(settings.seed_examples_path)
    filters = _Filters(settings)
    mix = question_mix.resolve(settings.question_mix, has_llm=llm is not None)
    generator = "+".join(f"llm:{llm.name}" if kind == question_mix.LLM and llm else kind for kind in mix)
    result = SynthResult(items=[], generator=generator, mix=mix)
    passages_by_doc = {
        d.doc_id: sample_passages(d, settings.passages_per_document, settings.passage_chars, rng) for d in documents
    }
    cap, n = settings.max_questions, settings.questions_per_passage
    order = _passage_order(passages_by_doc, interleave=cap is not None)
    kinds = question_mix.slot_kinds(mix, len(order) * n, settings.seed)
    makers = _RuleBased(settings, filters, result, rng, [p for _, p in order], set(mix))
    slot = _Slots(settings, mix, llm, examples, filters, result, makers)
    for number, (i, passage) in enumerate(order):
        if cap is not None and len(result.items) >= cap:
            break
        result.attempted += n
        for j in range(n):
            item = slot.fill(kinds[number * n + j], passage, i * n + j)
            if item is not None:
                result.items.append(item)
    if cap is not None:
        result.items = result.items[:cap]
    extra = (
        settings.multi_document_questions
        if cap is None
        else min(settings.multi_document_questions, cap - len(result.items))
    )
    if llm and extra > 0:
        result.items += _multi_document(llm, passages_by_doc, extra, examples, filters, result, rng)
    # Split over the documents that produced questions: a dev document without any would give the gate nothing.
    splits = assign_splits([i.doc_id for i in result.items], settings.dev_fraction)
    for item in result.items:
        item.split = splits[item.doc_id]
    if settings.dev_questions is not None and cap is None:
        _more_dev_questions(documents, passages_by_doc, splits, settings, slot, rng)
    result.rejected.update(filters.rejected)
    per_type: Counter = Counter()
    for item in result.items:  # a few of every kind, so a mixed set shows each
        if per_type[item.qtype] < 3:
            per_type[item.qtype] += 1
            result.samples.append(
                {"type": item.qtype, "question": item.question, "answer": item.answer, "doc_id": item.doc_id}
            )
    return result


class _Slots:
    """One question slot filled with its wanted kind, or the mix's next kind where the passage yields none of it."""

    def __init__(self, settings, mix, llm, examples, filters, result, makers):
        self.settings, self.mix, self.llm, self.examples = settings, mix, llm, examples
        self.filters, self.result, self.makers = filters, result, makers

    def fill(self, wanted: str, passage: Passage, number: int, mix: dict[str, float] | None = None) -> QAItem | None:
        for kind in question_mix.fallbacks(wanted, mix or self.mix):
            if kind == question_mix.LLM:
                qtype = self.settings.question_types[number % len(self.settings.question_types)]
                item = _llm_question(self.llm, passage, qtype, self.examples, self.filters, self.result)
            else:
                item = self.makers.next(kind, passage)
            if item is not None:
                if kind != wanted:
                    self.result.fallbacks[f"{wanted}->{kind}"] += 1
                return item
        return None


# Passes over the dev documents' other passages: a passage's questions share its words, so each further pass tells
# the gate less than the first; three at most.
DEV_ROUNDS = 3


def _more_dev_questions(
    documents: list[ParsedDocument],
    taken: dict[str, list[Passage]],
    splits: dict[str, str],
    settings: SynthSettings,
    slot: _Slots,
    rng: random.Random,
) -> None:
    """Questions on the dev documents' other passages, round-robin over the documents, then on the passages already
    asked, then further questions of all of them, until the dev split holds `settings.dev_questions` that are not
    copies or the passages give no more (DEV_ROUNDS passes)."""
    result = slot.result
    missing = settings.dev_questions - sum(i.split == "dev" and i.qtype != "inverse-cloze" for i in result.items)
    mix = {k: w for k, w in slot.mix.items() if k != "inverse-cloze"}
    if missing <= 0 or not mix:
        return
    mix = {k: w / sum(mix.values()) for k, w in mix.items()}
    more: dict[str, list[Passage]] = {}
    new: list[Passage] = []
    for doc in documents:
        if splits.get(doc.doc_id) != "dev":
            continue
        used = taken.get(doc.doc_id, [])
        rest = [
            p
            for p in passage_windows(doc, settings.passage_chars)
            if not any(p.start < u.end and u.start < p.end for u in used)
        ]
        # The passages already asked come after the new ones: a short document (an abstract) has no other passage,
        # and further questions of its own are all it can give the gate.
        new += rest
        more[doc.doc_id] = rng.sample(rest, len(rest)) + list(used)
    order = _passage_order(more, interleave=True)
    if slot.makers.keywords is not None:
        slot.makers.keywords.add(p.text for p in new)  # the passages already asked are counted
    n = settings.questions_per_passage
    for rounds in range(DEV_ROUNDS):  # then another question of each passage (a different one: the streams go on)
        added = result.dev_added
        kinds = question_mix.slot_kinds(mix, len(order) * n, settings.seed + 1 + rounds)
        for number, (i, passage) in enumerate(order):
            if result.dev_added >= missing:
                return
            result.attempted += n
            for j in range(n):
                item = slot.fill(kinds[number * n + j], passage, (rounds + i) * n + j, mix)
                if item is not None:
                    item.split = "dev"
                    result.items.append(item)
                    result.dev_added += 1
        if result.dev_added == added:
            return


def _passage_order(passages_by_doc: dict[str, list[Passage]], interleave: bool) -> list[tuple[int, Passage]]:
    """(index within its document, passage): document by document, or round-robin over documents."""
    per_doc = [list(enumerate(ps)) for ps in passages_by_doc.values()]
    if not interleave:
        return [x for ps in per_doc for x in ps]
    return [x for group in zip_longest(*per_doc) for x in group if x is not None]


def _llm_question(
    llm: Completer, passage: Passage, qtype: str, examples, filters: _Filters, result: SynthResult
) -> QAItem | None:
    parsed = ask(llm, build_prompt(passage.text, qtype, examples))
    if parsed is None:
        result.rejected["unparseable"] += 1
        return None
    question, answer = parsed
    if not filters.accept(question, passage.text):
        return None
    evidence = locate_answer(answer, passage)
    if evidence is None:
        result.rejected["unanswerable"] += 1
        return None
    return QAItem(
        qid=question_id(passage.doc_id, str(passage.start), question),
        question=question,
        qtype=qtype,
        doc_id=passage.doc_id,
        evidence=[evidence],
        answer=answer,
        source=f"llm:{llm.name}",
    )


class _RuleBased:
    """The rule-based kinds' questions, drawn one at a time per passage: each (kind, passage) keeps a lazy stream, so
    a passage's second question of a kind is a different one, and no passage is parsed unless a slot asks for it."""

    def __init__(
        self,
        settings: SynthSettings,
        filters: _Filters,
        result: SynthResult,
        rng: random.Random,
        passages: list[Passage],
        kinds: set[str],
    ):
        self.settings, self.filters, self.result, self.rng = settings, filters, result, rng
        self.streams: dict[tuple[str, str, int], Iterator[QAItem]] = {}
        self.keywords = None
        if "keyword" in kinds:
            from rag.synthetic.keywords import KeywordQueries

            self.keywords = KeywordQueries(p.text for p in passages)  # document frequency over the run's passages

    def next(self, kind: str, passage: Passage) -> QAItem | None:
        key = (kind, passage.doc_id, passage.start)
        if key not in self.streams:
            make = {"inverse-cloze": self._cloze, "answer-aware": self._answer_aware, "keyword": self._keyword}[kind]
            self.streams[key] = make(passage)
        return next(self.streams[key], None)

    def _item(
        self, passage: Passage, question: str, kind: str, evidence: Evidence, answer: str | None = None
    ) -> QAItem:
        return QAItem(
            qid=question_id(passage.doc_id, str(passage.start), question),
            question=question,
            qtype=kind,
            doc_id=passage.doc_id,
            evidence=[evidence],
            answer=answer,
            source=kind,
        )

    def _whole(self, passage: Passage) -> Evidence:
        return Evidence(doc_id=passage.doc_id, start=passage.start, end=passage.end)

    def _prose(self, passage: Passage) -> list[tuple[int, int]]:
        """The passage's whole sentences of min_words to max_words words."""
        lo, hi = self.settings.min_words, self.settings.max_words
        return [(s, e) for s, e in sentences(passage.text) if lo <= len(passage.text[s:e].split()) <= hi]

    def _cloze(self, passage: Passage) -> Iterator[QAItem]:
        """Different sentences of the passage as queries, its whole span as their evidence."""
        candidates = self._prose(passage)
        if not candidates:
            self.filters.rejected["no_sentence"] += 1
        for s, e in self.rng.sample(candidates, len(candidates)):
            question = " ".join(passage.text[s:e].split())
            # The sentence is copied by construction; only length and duplicates apply to pseudo-queries.
            if self.filters.accept(question, passage.text, check_language=False):
                yield self._item(passage, question, "inverse-cloze", self._whole(passage))

    def _answer_aware(self, passage: Passage) -> Iterator[QAItem]:
        """Wh-questions about answer phrases of the passage's sentences; the sentence is the evidence."""
        from rag.synthetic import answer_aware
        from rag.synthetic.nlp import english

        if language_of(passage.text) not in (None, "en"):
            self.result.rejected["not_english"] += 1  # the rules and the parser are English's
            return

        def shuffled(sents: list) -> list:
            return self.rng.sample(sents, len(sents))

        def accept(q: answer_aware.Question) -> bool:
            return self.filters.accept(q.question, passage.text, check_language=False, check_verbatim=True)

        for q in answer_aware.questions(passage.text, shuffled, accept, self.result.rejected, english()):
            start, end = q.sentence
            evidence = Evidence(doc_id=passage.doc_id, start=passage.start + start, end=passage.start + end)
            yield self._item(passage, q.question, "answer-aware", evidence, answer=q.answer)

    def _keyword(self, passage: Passage) -> Iterator[QAItem]:
        """Search-box queries of the passage's salient terms; the passage is the evidence."""
        assert self.keywords is not None
        if not self._prose(passage):
            # No whole sentence: a table or a list, whose terms are cell labels ("cell 1 column 2 row heading"),
            # not what people type; and it keeps the documents that yield questions the same for every kind.
            self.result.rejected["no_sentence_for_keywords"] += 1
            return
        found, term_sets = False, set()
        # People type two or three words into a search box: keyword queries have their own floor (KEYWORD_MIN_WORDS).
        floor = min(KEYWORD_MIN_WORDS, self.settings.min_words)
        for query in self.keywords.queries(passage.text, self.rng, floor, self.settings.max_words):
            if frozenset(query.split()) in term_sets:  # the same terms in another order is the same query
                self.filters.rejected["duplicate"] += 1
                continue
            term_sets.add(frozenset(query.split()))
            # A run of neighbouring terms can spell out a stretch of the passage: that is a copy, not a query.
            if self.filters.accept(query, passage.text, check_language=False, check_verbatim=True, min_words=floor):
                found = True
                yield self._item(passage, query, "keyword", self._whole(passage))
        if not found:
            self.result.rejected["no_keyword_query"] += 1


def _multi_document(llm, passages_by_doc, count: int, examples, filters, result, rng) -> list[QAItem]:
    docs = [d for d, ps in passages_by_doc.items() if ps]
    out = []
    for _ in range(count if len(docs) >= 2 else 0):
        a, b = (rng.choice(passages_by_doc[d]) for d in rng.sample(docs, 2))
        result.attempted += 1
        prompt = build_prompt(f"{a.text} {b.text}", "multi-document (needs both parts)", examples)
        parsed = ask(llm, prompt)
        if parsed is None:
            result.rejected["unparseable"] += 1
            continue
        question, answer = parsed
        if not filters.accept(question, a.text + " " + b.text):
            continue
        answer_tokens = set(tokens(answer))
        hits = [p for p in (a, b) if answer_tokens & set(tokens(p.text))]
        if len(hits) < 2:
            result.rejected["unanswerable"] += 1
            continue
        item = QAItem(
            qid=question_id(a.doc_id, b.doc_id, question),
            question=question,
            qtype="multi-document",
            doc_id=a.doc_id,
            evidence=[Evidence(doc_id=p.doc_id, start=p.start, end=p.end) for p in (a, b)],
            answer=answer,
            source=f"llm:{llm.name}",
        )
        out.append(item)
    return out


__all__ = [
    "QUESTION_TYPES",
    "Completer",
    "Passage",
    "SynthResult",
    "SynthSettings",
    "ask",
    "build_prompt",
    "generate_qa",
    "is_verbatim",
    "language_of",
    "load_examples",
    "locate_answer",
    "sample_passages",
    "sentences",
]
