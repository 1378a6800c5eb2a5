"""Span-anchored ground truth: questions whose evidence is character spans of canonical document text.

Relevance of a chunk of *any* strategy follows from its span and the evidence spans, so one QA set scores every
chunk set.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import BaseModel, Field, model_validator

# answer-aware and keyword: rule-based synthetic kinds (rag.synthetic.answer_aware, rag.synthetic.keywords).
QuestionType = Literal[
    "factual", "interpretation", "long-answer", "multi-document", "inverse-cloze", "answer-aware", "keyword", "dataset"
]
Split = Literal["train", "dev", "test"]


class Evidence(BaseModel):
    doc_id: str
    start: int = Field(ge=0)
    end: int

    @model_validator(mode="after")
    def _ordered(self) -> Evidence:
        if self.end <= self.start:
            raise ValueError(f"empty evidence span [{self.start}, {self.end}) in {self.doc_id}")
        return self


class QAItem(BaseModel):
    qid: str
    question: str
    qtype: QuestionType
    doc_id: str  # the primary document (the first evidence's)
    evidence: list[Evidence]
    answer: str | None = None
    split: Split = "dev"
    source: str = ""  # what produced it: "llm:<model>", "inverse-cloze", "squad", "beir"


class Relevance(BaseModel):
    """When a chunk (or the part of it a prompt holds) is relevant to a question, from the spans alone.

    - `span` (default): it holds at least `min_coverage` of an evidence span, or at least `min_coverage` of it is
      evidence. A chunk that only grazes the evidence's edge is no hit, and a long evidence passage cut into small
      chunks still has relevant chunks, so neither big nor small chunks are favoured by the rule itself.
    - `coverage`: it holds at least `min_coverage` of an evidence span (small chunks inside a long passage miss).
    - `any`: any overlap with an evidence span.

    No rule on spans alone keeps a whole-article chunk from holding every short answer; evaluations therefore score
    the context as a prompt would get it, cut to a character budget (rag.evaluation.retrieval_eval).
    """

    mode: Literal["span", "coverage", "any"] = "span"
    min_coverage: float = Field(0.5, gt=0.0, le=1.0)

    def holds(self, evidence: Evidence, doc_id: str, start: int, end: int) -> bool:
        """Whether the text [start, end) of `doc_id` is relevant to this evidence span."""
        if doc_id != evidence.doc_id:
            return False
        overlap = min(end, evidence.end) - max(start, evidence.start)
        if overlap <= 0:
            return False
        if self.mode == "any" or overlap / (evidence.end - evidence.start) >= self.min_coverage:
            return True
        return self.mode == "span" and overlap / (end - start) >= self.min_coverage


def question_id(*parts: str) -> str:
    return "q" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _doc_rank(doc_id: str) -> str:
    return hashlib.sha256(doc_id.encode()).hexdigest()


def split_for(doc_id: str, dev_fraction: float = 0.2) -> Split:
    """Deterministic split of one document, for corpora too large to rank (datasets)."""
    return "dev" if int(_doc_rank(doc_id)[:8], 16) / 0xFFFFFFFF < dev_fraction else "train"


def assign_splits(doc_ids: list[str], dev_fraction: float = 0.2) -> dict[str, Split]:
    """Split by document: the `dev_fraction` of documents first in hash order are dev (at least one when there
    are two or more), so no document feeds both splits and small corpora still get a dev set."""
    ordered = sorted(set(doc_ids), key=_doc_rank)
    n_dev = max(1, round(len(ordered) * dev_fraction)) if len(ordered) >= 2 else 0
    return {d: ("dev" if i < n_dev else "train") for i, d in enumerate(ordered)}


# --- tables ----------------------------------------------------------------------------------------
QA_COLUMNS = ["qid", "question", "qtype", "doc_id", "evidence_json", "answer", "split", "source"]


def to_frame(items: list[QAItem]) -> pd.DataFrame:
    rows = [
        {**item.model_dump(exclude={"evidence"}), "evidence_json": json.dumps([e.model_dump() for e in item.evidence])}
        for item in items
    ]
    return pd.DataFrame(rows, columns=QA_COLUMNS)


def from_frame(df: pd.DataFrame) -> list[QAItem]:
    return [
        QAItem(**{k: r[k] for k in QA_COLUMNS if k != "evidence_json"}, evidence=json.loads(r["evidence_json"]))
        for r in df.to_dict("records")
    ]


# --- relevance -------------------------------------------------------------------------------------
def qrels_for_chunks(
    items: list[QAItem], chunks: pd.DataFrame, relevance: Relevance | None = None
) -> dict[str, dict[str, int]]:
    """qid -> {chunk_id: 1} for every chunk relevant to an evidence span of the question; questions without any
    relevant chunk are left out (evaluations put them back as misses: rag.evaluation.retrieval_eval)."""
    relevance = relevance or Relevance()
    by_doc: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for cid, doc, start, end in zip(chunks["chunk_id"], chunks["doc_id"], chunks["char_start"], chunks["char_end"]):
        by_doc[doc].append((cid, int(start), int(end)))
    qrels: dict[str, dict[str, int]] = {}
    for item in items:
        rel: dict[str, int] = {}
        for ev in item.evidence:
            for cid, start, end in by_doc.get(ev.doc_id, ()):
                if relevance.holds(ev, ev.doc_id, start, end):
                    rel[cid] = 1
        if rel:
            qrels[item.qid] = rel
    return qrels


# A relevant chunk whose part in the context no longer meets the rule is ranked under its id plus this suffix,
# which no qrels hold: it took its place in the context but counts as no hit.
NOT_RELEVANT_IN_CONTEXT = "#not-relevant-in-context"


def visible_span(chunk: dict) -> tuple[int, int]:
    """The span of a context passage: a chunk cut to a prompt's budget keeps its start and loses its end."""
    start = int(chunk["char_start"])
    return start, min(int(chunk["char_end"]), start + len(chunk["text"]))


def context_run(
    items: list[QAItem],
    contexts: dict[str, list[dict]],
    qrels: dict[str, dict[str, int]],
    relevance: Relevance | None = None,
) -> dict[str, list[str]]:
    """qid -> ranked ids for ranx from each question's context passages (chunk records, possibly cut to a budget):
    a chunk in the question's qrels stays a hit only when the part of it in the context is still relevant."""
    relevance = relevance or Relevance()
    evidence = {i.qid: i.evidence for i in items}
    out: dict[str, list[str]] = {}
    for qid, passages in contexts.items():
        rel = qrels.get(qid, {})
        ids = []
        for chunk in passages:
            cid = chunk["chunk_id"]
            if cid in rel and not any(
                relevance.holds(ev, chunk["doc_id"], *visible_span(chunk)) for ev in evidence[qid]
            ):
                cid += NOT_RELEVANT_IN_CONTEXT
            ids.append(cid)
        out[qid] = ids
    return out


def context_chars(contexts: dict[str, list[dict]], k: int | None = None) -> float:
    """Mean characters of the first `k` (None: all) context passages per question: the price of a hit, reported
    beside it."""
    if not contexts:
        return 0.0
    return sum(sum(len(c["text"]) for c in passages[:k]) for passages in contexts.values()) / len(contexts)


# --- export ----------------------------------------------------------------------------------------
def export_beir(
    items: list[QAItem], chunks: pd.DataFrame, folder: Path, split: str = "test", relevance: Relevance | None = None
) -> Path:
    """A BEIR folder for one chunk set: the chunks as corpus, the questions as queries, span-derived qrels."""
    folder = Path(folder)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for r in chunks.to_dict("records"):
            fh.write(json.dumps({"_id": r["chunk_id"], "title": r["doc_id"], "text": r["text"], "metadata": {}}) + "\n")
    qrels = qrels_for_chunks(items, chunks, relevance)
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as fh:
        for item in items:
            fh.write(json.dumps({"_id": item.qid, "text": item.question, "metadata": {}}) + "\n")
    with open(folder / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for qid, rel in qrels.items():
            for cid, score in rel.items():
                fh.write(f"{qid}\t{cid}\t{score}\n")
    return folder


def export_squad(items: list[QAItem], documents: dict[str, str], path: Path) -> Path:
    """SQuAD v1.1 JSON: one article per document, its canonical text as the context."""
    by_doc: dict[str, list[QAItem]] = defaultdict(list)
    for item in items:
        by_doc[item.doc_id].append(item)
    data = []
    for doc_id, qs in by_doc.items():
        context = documents[doc_id]
        qas = [
            {
                "id": q.qid,
                "question": q.question,
                "answers": [
                    {"answer_start": e.start, "text": context[e.start : e.end]}
                    for e in q.evidence
                    if e.doc_id == doc_id
                ],
            }
            for q in qs
        ]
        data.append({"title": doc_id, "paragraphs": [{"context": context, "qas": qas}]})
    Path(path).write_text(json.dumps({"version": "1.1", "data": data}, ensure_ascii=False))
    return Path(path)


def import_squad(path: Path, split: Split = "dev") -> tuple[dict[str, str], list[QAItem]]:
    """Documents (context per article/paragraph as written) and span-anchored questions from SQuAD JSON."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)["data"]
    documents: dict[str, str] = {}
    items: list[QAItem] = []
    for a_i, article in enumerate(data):
        for p_i, para in enumerate(article["paragraphs"]):
            doc_id = (
                f"{article.get('title', a_i)}#{p_i}"
                if len(article["paragraphs"]) > 1
                else str(article.get("title", a_i))
            )
            documents[doc_id] = para["context"]
            for qa in para["qas"]:
                spans = [
                    Evidence(doc_id=doc_id, start=a["answer_start"], end=a["answer_start"] + len(a["text"]))
                    for a in qa["answers"]
                    if a["text"]
                ]
                if spans:
                    items.append(
                        QAItem(
                            qid=str(qa["id"]),
                            question=qa["question"],
                            qtype="dataset",
                            doc_id=doc_id,
                            evidence=spans,
                            answer=qa["answers"][0]["text"],
                            split=split,
                            source="squad",
                        )
                    )
    return documents, items
