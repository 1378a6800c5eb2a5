"""How much questions look like people's: per question type, the share copied from the document, the lexical
overlap with the evidence passage, length and question form. Run on synthetic and human questions of the same
documents, it shows how far each synthetic kind is from the distribution a model is judged on."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from rag.evaluation.qaset import QAItem
from rag.parsing.models import ParsedDocument
from rag.synthetic.text import content_tokens, has_question_form, is_verbatim, tokens


@dataclass(frozen=True)
class Sample:
    qtype: str
    question: str
    context: str  # the passage the question was asked about (the paragraphs holding its evidence)


def evidence_context(doc: ParsedDocument, item: QAItem) -> str:
    """The elements (paragraphs) of `doc` that overlap the item's first evidence span: the same unit for a sentence,
    a passage or a SQuAD answer span, so kinds with short and long evidence are measured against alike text."""
    ev = item.evidence[0]
    spans = [(e.char_start, e.char_end) for e in doc.elements if e.char_start < ev.end and ev.start < e.char_end]
    start, end = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (ev.start, ev.end)
    return doc.canonical_text[start:end]


def overlap(question: str, context: str) -> float:
    """Share of the question's content tokens that occur in the context (1.0 when it has none: nothing new)."""
    words = content_tokens(question)
    if not words:
        return 1.0
    have = set(tokens(context))
    return sum(w in have for w in words) / len(words)


def report(samples: Iterable[Sample]) -> dict[str, dict[str, float]]:
    """Per question type: n, copy_share (near-verbatim copies of the context: a common token run of at least 0.8 of
    the question), mean_overlap, mean_words, question_form_share (ends with "?" or opens like a question)."""
    groups: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.qtype].append(s)
    out = {}
    for qtype, group in sorted(groups.items()):
        n = len(group)
        out[qtype] = {
            "n": n,
            "copy_share": round(sum(is_verbatim(s.question, s.context) for s in group) / n, 3),
            "mean_overlap": round(sum(overlap(s.question, s.context) for s in group) / n, 3),
            "mean_words": round(sum(len(s.question.split()) for s in group) / n, 1),
            "question_form_share": round(sum(has_question_form(s.question) for s in group) / n, 3),
        }
    return out


def samples_of(items: Iterable[QAItem], documents: dict[str, ParsedDocument], qtype: str | None = None) -> list[Sample]:
    """Style samples of QA items, each against the paragraphs of its evidence; `qtype` overrides the item's own."""
    return [
        Sample(qtype or item.qtype, item.question, evidence_context(documents[item.doc_id], item)) for item in items
    ]
