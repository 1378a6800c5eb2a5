"""The loop bench's corpora: documents written as files a user would index, and human questions split into the
questions simulated users ask (`users`) and the questions the served pipeline is scored on (`test`), never mixed.

- tatqa: annual-report tables and text; users ask the dev questions (278 documents), the test questions (277 other
  documents) score. Each context is a Markdown file: its table as a pipe table, then its paragraphs.
- scifact: users ask the 809 train claims, the 300 test claims score; every abstract is a text file.
- conditionalqa: 59 gov.uk pages; the 271 answerable questions split at random by question (the pages are shared).
- squad: SQuAD dev articles, split by article: users ask about some articles, the others score.
- beir: any BEIR folder (--data): qrels/users.tsv holds the questions people ask, qrels/test.tsv the scored ones;
  answers.jsonl ({query_id, answers: [...]}) is optional. A corpus of one's own, or a tiny one for a test.

A question's relevance is found in the text the product parsed, as a user's judgement would be: the passages holding
one of its answer strings (or evidence sentences) in its relevant document; where none is found in the text
(TAT-QA's arithmetic answers, SciFact's claims), any passage of that document.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from bench.lib.datasets import SCIFACT, SHARED, SQUAD

TATQA = SHARED / "tatqa"
CONDITIONALQA = SHARED / "conditionalqa-dev"
CORPORA = ("tatqa", "scifact", "conditionalqa", "squad", "beir")
SOURCES = {"tatqa": TATQA, "scifact": SCIFACT, "conditionalqa": CONDITIONALQA, "squad": SQUAD}


@dataclass
class Question:
    qid: str
    text: str
    doc_ids: list[str]  # relevant documents (file names under the docs folder)
    answers: list[str] = field(default_factory=list)  # strings that show a passage answers it (may be empty)


@dataclass
class Corpus:
    name: str
    docs_dir: Path
    users: list[Question]
    test: list[Question]

    def summary(self) -> dict:
        return {
            "corpus": self.name,
            "documents": sum(1 for _ in self.docs_dir.iterdir()),
            "users_questions": len(self.users),
            "test_questions": len(self.test),
        }


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _qrels(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as fh:
        next(fh)
        for line in fh:
            qid, doc, score = line.rstrip("\r\n").split("\t")
            if int(score) > 0:
                out.setdefault(qid, []).append(doc)
    return out


def _safe(doc_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", doc_id)[:150]


def _markdown_table(rows: list[list[str]]) -> str:
    cells = [[" ".join(str(c).split()).replace("|", "/") for c in row] for row in rows]
    width = max(len(r) for r in cells)
    cells = [r + [""] * (width - len(r)) for r in cells]
    head, body = cells[0], cells[1:]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * width] + ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _tatqa_text(doc: dict) -> str:
    table = doc.get("metadata", {}).get("table") or []
    paragraphs = doc["text"].split("\n\n", 1)[1] if "\n\n" in doc["text"] else ""
    return (_markdown_table(table) + "\n\n" if table else "") + paragraphs


def _limit(items: list, n: int | None, seed: int) -> list:
    if n is None or len(items) <= n:
        return items
    return random.Random(seed).sample(items, n)


def _beir(
    name: str, folder: Path, docs_dir: Path, *, users_split: str | None, test_split: str, args
) -> tuple[list[Question], list[Question]]:
    corpus = {str(d["_id"]): d for d in _jsonl(folder / "corpus.jsonl")}
    queries = {str(q["_id"]): q for q in _jsonl(folder / "queries.jsonl")}
    answers = {}
    if (folder / "answers.jsonl").exists():
        for row in _jsonl(folder / "answers.jsonl"):
            strings = [a for a in row.get("answers", []) if isinstance(a, str) and len(a.strip()) > 2]
            if name == "conditionalqa":  # yes/no answers are no span: its evidence sentences show the passage
                strings = [a for a in strings if a.lower() not in ("yes", "no")] + list(row.get("evidences", []))
            if row.get("answer_type") in ("arithmetic", "count"):
                strings = []  # a computed number need not be in the text
            answers[str(row["query_id"])] = strings
    test_qrels = _qrels(folder / "qrels" / f"{test_split}.tsv")
    if users_split is None:  # one labelled split, shared documents: split it by question
        order = sorted(test_qrels)
        random.Random(args.seed).shuffle(order)
        cut = round(len(order) * args.users_share)
        users_qrels = {q: test_qrels[q] for q in order[:cut]}
        test_qrels = {q: test_qrels[q] for q in order[cut:]}
    else:
        users_qrels = _qrels(folder / "qrels" / f"{users_split}.tsv")

    def questions(qrels: dict[str, list[str]], n: int | None) -> list[Question]:
        made = [
            Question(qid, queries[qid]["text"], [_safe(d) + ".md" for d in docs], answers.get(qid, []))
            for qid, docs in sorted(qrels.items())
            if qid in queries
        ]
        return _limit(made, n, args.seed)

    users, test = questions(users_qrels, args.users_questions), questions(test_qrels, args.test_questions)
    wanted = {d[:-3] for q in users + test for d in q.doc_ids}
    keep = set(corpus)
    if args.documents is not None:  # a slice: every judged document, then others at random
        others = sorted(set(corpus) - {k for k in corpus if _safe(k) in wanted})
        keep = {k for k in corpus if _safe(k) in wanted} | set(
            random.Random(args.seed).sample(others, max(0, min(len(others), args.documents - len(wanted))))
        )
    for key in sorted(keep):
        doc = corpus[key]
        text = _tatqa_text(doc) if name == "tatqa" else f"{doc.get('title', '')}\n\n{doc['text']}".strip()
        if name == "conditionalqa":
            text = "\n\n".join(line for line in text.split("\n") if line.strip())
        (docs_dir / f"{_safe(key)}.md").write_text(text, encoding="utf-8")
    return users, test


def _squad(docs_dir: Path, args) -> tuple[list[Question], list[Question]]:
    with gzip.open(SQUAD, "rt", encoding="utf-8") as fh:
        articles = json.load(fh)["data"][: args.articles]
    order = list(range(len(articles)))
    random.Random(args.seed).shuffle(order)
    users_articles = set(order[: round(len(order) * args.users_share)])
    users, test = [], []
    for i, article in enumerate(articles):
        name = _safe(article["title"]) + ".md"
        title = article["title"].replace("_", " ")
        (docs_dir / name).write_text(
            title + "\n\n" + "\n\n".join(p["context"] for p in article["paragraphs"]), encoding="utf-8"
        )
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                q = Question(str(qa["id"]), qa["question"], [name], sorted({a["text"] for a in qa["answers"]}))
                (users if i in users_articles else test).append(q)
    return _limit(users, args.users_questions, args.seed), _limit(test, args.test_questions, args.seed)


def load(name: str, work: Path, args) -> Corpus:
    """Write corpus `name`'s documents under work/docs and split its questions. `args`: seed, users_share,
    users_questions, test_questions, documents (a slice; None: all), articles (SQuAD), data (a BEIR folder for
    corpus "beir")."""
    docs_dir = work / "docs"
    docs_dir.mkdir(parents=True, exist_ok=True)
    if name == "squad":
        users, test = _squad(docs_dir, args)
    elif name == "tatqa":
        users, test = _beir(name, TATQA, docs_dir, users_split="dev", test_split="test", args=args)
    elif name == "scifact":
        users, test = _beir(name, SCIFACT, docs_dir, users_split="train", test_split="test", args=args)
    elif name == "conditionalqa":
        users, test = _beir(name, CONDITIONALQA, docs_dir, users_split=None, test_split="test", args=args)
    elif name == "beir":
        if not getattr(args, "data", None):
            raise ValueError("corpus beir needs --data: a BEIR folder with qrels/users.tsv and qrels/test.tsv")
        users, test = _beir(name, Path(args.data), docs_dir, users_split="users", test_split="test", args=args)
    else:
        raise ValueError(f"unknown corpus {name!r}: one of {', '.join(CORPORA)}")
    return Corpus(name, docs_dir, users, test)


def answer_evidence(questions: list[Question], documents) -> dict:
    """qid -> the spans (rag.evaluation.qaset.Evidence) answering it: where an answer string of the question occurs in
    its relevant documents (case and spacing aside), or those whole documents where no answer string is found in their
    parsed text. `documents`: the documents table (doc_id, canonical text)."""
    from rag.evaluation.qaset import Evidence

    texts = dict(zip(documents["doc_id"], documents["canonical_text"]))
    out = {}
    for q in questions:
        spans = []
        for doc in q.doc_ids:
            if doc not in texts:
                continue
            for answer in q.answers:
                pattern = re.compile(r"\s+".join(map(re.escape, answer.split())), re.IGNORECASE)
                for match in list(pattern.finditer(texts[doc]))[:20]:
                    spans.append(Evidence(doc_id=doc, start=match.start(), end=match.end()))
        if not spans:
            spans = [Evidence(doc_id=d, start=0, end=len(texts[d])) for d in q.doc_ids if d in texts]
        if spans:
            out[q.qid] = spans
    return out


ANY_OVERLAP = "any"  # a passage answers when it overlaps an answer span at all (rag.evaluation.qaset.Relevance)


def relevance(questions: list[Question], documents, chunks, evidence: dict | None = None) -> dict[str, dict[str, int]]:
    """qid -> {chunk_id: 1}: the chunks of one chunk set overlapping a span of answer_evidence (given, or found)."""
    from rag.evaluation.qaset import QAItem, Relevance, qrels_for_chunks

    evidence = answer_evidence(questions, documents) if evidence is None else evidence
    text = {q.qid: q.text for q in questions}
    items = [
        QAItem(qid=q, question=text[q], qtype="dataset", doc_id=spans[0].doc_id, evidence=spans)
        for q, spans in evidence.items()
        if q in text
    ]
    return qrels_for_chunks(items, chunks, Relevance(mode=ANY_OVERLAP))


def holds_answer(spans: list, doc_id: str, start: int, end: int) -> bool:
    """Whether the text [start, end) of a document, as a passage the answer reads, overlaps one of the spans."""
    from rag.evaluation.qaset import Relevance

    rule = Relevance(mode=ANY_OVERLAP)
    return any(rule.holds(ev, doc_id, start, end) for ev in spans)
