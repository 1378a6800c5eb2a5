"""Synthetic QA sets: few-shot LLM questions over sampled passages, filtered, split 80/20 by document.
Without an LLM, inverse-cloze pseudo-queries (a sentence as the query, its passage as evidence).

Passages come from the canonical text (not from a chunk set), so the QA set scores every strategy.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Protocol

import yaml
from pydantic import BaseModel, Field

from rag.chunking.sentences import split_sentences
from rag.evaluation.qaset import Evidence, QAItem, assign_splits, question_id
from rag.parsing.models import ParsedDocument

QUESTION_TYPES = ("factual", "interpretation", "long-answer")


class Completer(Protocol):
    name: str

    def complete(self, prompt: str, *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str: ...


class SynthSettings(BaseModel):
    """How big a QA set is and how it is made. The single home of these defaults: the synthetic_qa asset's run
    config (assets/evaluation.py) reads its defaults and descriptions from here."""

    passages_per_document: int = Field(4, ge=1, description="passages sampled per document (fewer when a document "
                                       "has fewer disjoint passages of passage_chars)")
    questions_per_passage: int = Field(1, ge=1, description="questions per passage: with an LLM, one per question type "
                                       "in turn; inverse-cloze: that many different sentences")
    max_questions: int | None = Field(None, ge=1, description="stop once the set has this many questions (passages "
                                      "taken round-robin over documents, so the cap spreads over them); None = no cap")
    passage_chars: tuple[int, int] = (300, 1200)  # min, max characters of a passage
    question_types: list[str] = Field(default_factory=lambda: list(QUESTION_TYPES),
                                      description=f"LLM question types, cycled per passage: {', '.join(QUESTION_TYPES)}")
    multi_document_questions: int = Field(0, ge=0, description="extra questions that need two documents (LLM only)")
    min_words: int = 5
    max_words: int = 50
    dev_fraction: float = Field(0.2, ge=0.0, le=1.0, description="share of documents whose questions form the dev split")
    seed: int = Field(42, description="passage sampling and sentence choice")
    seed_examples_path: str | None = Field(None, description="YAML list of {passage, question, answer, type}; "
                                           "None = built-in generic examples")


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

    @property
    def summary(self) -> dict:
        by_type = Counter(i.qtype for i in self.items)
        by_split = Counter(i.split for i in self.items)
        return {"questions": len(self.items), "attempted": self.attempted, "generator": self.generator,
                **{f"type_{k}": v for k, v in sorted(by_type.items())}, **{f"split_{k}": v for k, v in sorted(by_split.items())},
                **{f"rejected_{k}": v for k, v in sorted(self.rejected.items())}}


# --- passages --------------------------------------------------------------------------------------
def sample_passages(doc: ParsedDocument, n: int, chars: tuple[int, int], rng: random.Random) -> list[Passage]:
    """Runs of consecutive elements between min and max characters; a deterministic sample of n."""
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
    picked = sorted(rng.sample(windows, min(n, len(windows))))
    return [Passage(doc.doc_id, s, e, doc.canonical_text[s:e]) for s, e in picked]


# --- prompts ---------------------------------------------------------------------------------------
BUILTIN_EXAMPLES = [
    {"type": "factual", "passage": "The Eiffel Tower was completed in March 1889 for the World's Fair in Paris. It is 330 metres tall and was the tallest man-made structure until 1930.",
     "question": "In which year was the Eiffel Tower completed?", "answer": "1889"},
    {"type": "factual", "passage": "Applicants must submit the form within 30 days of the notice. Late submissions are charged a fee of $25 per week of delay.",
     "question": "How much is the fee for each week a submission is late?", "answer": "$25 per week"},
    {"type": "interpretation", "passage": "Sales fell by 12% in the second quarter, while the cost of raw materials rose sharply after the new import tariffs took effect.",
     "question": "What probably explains the weaker results of the second quarter?", "answer": "the cost of raw materials rose sharply after the new import tariffs took effect"},
    {"type": "long-answer", "passage": "To reset the device, hold the power button for ten seconds, wait until the light blinks twice, then release the button and enter the default PIN 0000.",
     "question": "What are the steps to reset the device?", "answer": "hold the power button for ten seconds, wait until the light blinks twice, then release the button and enter the default PIN 0000"},
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
    shots = "".join(f"Passage: {e['passage']}\nQuestion type: {e.get('type', 'factual')}\nQuestion: {e['question']}\nAnswer: {e['answer']}\n\n"
                    for e in examples[:5])
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
def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _longest_common_run(a: list[str], b: list[str]) -> int:
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            if x == y:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def is_verbatim(question: str, passage: str) -> bool:
    """The question copies a run of the passage covering most of it."""
    q = _tokens(question)
    return len(q) >= 4 and _longest_common_run(q, _tokens(passage)) >= 0.8 * len(q)


def locate_answer(answer: str, passage: Passage) -> Evidence | None:
    """The answer's span in the canonical text: exact (case-insensitive), else the best token-overlap window."""
    text = passage.text
    pos = text.lower().find(answer.lower().strip().rstrip("."))
    if pos >= 0 and answer.strip():
        length = len(answer.strip().rstrip("."))
        return Evidence(doc_id=passage.doc_id, start=passage.start + pos, end=passage.start + pos + length)
    want = set(_tokens(answer))
    if not want:
        return None
    best, best_span = 0.0, None
    for m in re.finditer(r"[^.!?\n]+[.!?]?", text):  # sentences of the passage
        have = set(_tokens(m.group()))
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
    return [(s, e) for s, e in split_sentences(text) if text[e - 1:e] in ".!?"]  # whole sentences only


# --- generation ------------------------------------------------------------------------------------
class _Filters:
    def __init__(self, settings: SynthSettings):
        self.settings, self.seen, self.rejected = settings, set(), Counter()

    def accept(self, question: str, passage_text: str, check_language: bool = True) -> bool:
        words = len(question.split())
        key = " ".join(_tokens(question))
        if not self.settings.min_words <= words <= self.settings.max_words:
            self.rejected["length"] += 1
        elif key in self.seen:
            self.rejected["duplicate"] += 1
        elif check_language and is_verbatim(question, passage_text):
            self.rejected["verbatim"] += 1
        elif check_language and language_of(question) not in (None, language_of(passage_text)):
            self.rejected["language"] += 1
        else:
            self.seen.add(key)
            return True
        return False


def generate_qa(documents: list[ParsedDocument], llm: Completer | None, settings: SynthSettings | None = None) -> SynthResult:
    settings = settings or SynthSettings()
    rng = random.Random(settings.seed)
    examples = load_examples(settings.seed_examples_path)
    filters = _Filters(settings)
    result = SynthResult(items=[], generator=f"llm:{llm.name}" if llm else "inverse-cloze")
    passages_by_doc = {d.doc_id: sample_passages(d, settings.passages_per_document, settings.passage_chars, rng) for d in documents}
    cap = settings.max_questions
    for i, passage in _passage_order(passages_by_doc, interleave=cap is not None):
        if cap is not None and len(result.items) >= cap:
            break
        n = settings.questions_per_passage
        result.attempted += n
        if llm:
            types = [settings.question_types[(i * n + j) % len(settings.question_types)] for j in range(n)]
            items = [_llm_question(llm, passage, qtype, examples, filters, result) for qtype in types]
        else:
            items = _cloze_questions(passage, n, filters, rng)
        result.items += [item for item in items if item is not None]
    if cap is not None:
        result.items = result.items[:cap]
    extra = settings.multi_document_questions if cap is None else min(settings.multi_document_questions, cap - len(result.items))
    if llm and extra > 0:
        result.items += _multi_document(llm, passages_by_doc, extra, examples, filters, result, rng)
    # Split over the documents that produced questions, so the dev share is a share of real questions.
    splits = assign_splits([i.doc_id for i in result.items], settings.dev_fraction)
    for item in result.items:
        item.split = splits[item.doc_id]
    result.rejected.update(filters.rejected)
    result.samples = [{"type": i.qtype, "question": i.question, "answer": i.answer, "doc_id": i.doc_id} for i in result.items[:8]]
    return result


def _passage_order(passages_by_doc: dict[str, list[Passage]], interleave: bool) -> list[tuple[int, Passage]]:
    """(index within its document, passage): document by document, or round-robin over documents."""
    per_doc = [list(enumerate(ps)) for ps in passages_by_doc.values()]
    if not interleave:
        return [x for ps in per_doc for x in ps]
    return [x for group in zip_longest(*per_doc) for x in group if x is not None]


def _llm_question(llm: Completer, passage: Passage, qtype: str, examples, filters: _Filters, result: SynthResult) -> QAItem | None:
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
    return QAItem(qid=question_id(passage.doc_id, str(passage.start), question), question=question, qtype=qtype,
                  doc_id=passage.doc_id, evidence=[evidence], answer=answer, source=result.generator)


def _cloze_questions(passage: Passage, n: int, filters: _Filters, rng: random.Random) -> list[QAItem]:
    """Up to n different sentences of the passage as queries, its whole span as their evidence."""
    candidates = [(s, e) for s, e in sentences(passage.text) if filters.settings.min_words <= len(passage.text[s:e].split()) <= filters.settings.max_words]
    if not candidates:
        filters.rejected["no_sentence"] += 1
        return []
    items = []
    for s, e in rng.sample(candidates, min(n, len(candidates))):
        question = " ".join(passage.text[s:e].split())
        # The sentence is copied by construction; only length and duplicates apply to pseudo-queries.
        if filters.accept(question, passage.text, check_language=False):
            items.append(QAItem(qid=question_id(passage.doc_id, str(passage.start), question), question=question, qtype="inverse-cloze",
                                doc_id=passage.doc_id, evidence=[Evidence(doc_id=passage.doc_id, start=passage.start, end=passage.end)],
                                source="inverse-cloze"))
    return items


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
        answer_tokens = set(_tokens(answer))
        hits = [p for p in (a, b) if answer_tokens & set(_tokens(p.text))]
        if len(hits) < 2:
            result.rejected["unanswerable"] += 1
            continue
        item = QAItem(qid=question_id(a.doc_id, b.doc_id, question), question=question, qtype="multi-document", doc_id=a.doc_id,
                      evidence=[Evidence(doc_id=p.doc_id, start=p.start, end=p.end) for p in (a, b)], answer=answer, source=result.generator)
        out.append(item)
    return out
