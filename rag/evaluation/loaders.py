"""Real datasets as documents + span-anchored questions, in the same shapes the pipeline produces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from rag.evaluation.beir import load_beir
from rag.evaluation.qaset import Evidence, QAItem, split_for
from rag.parsing.models import ElementDraft, ParsedDocument, assemble


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def locate(text: str, needle: str, hint: int) -> int | None:
    """Offset of `needle` in `text` nearest to `hint` (answers can repeat within a document)."""
    best, pos = None, text.find(needle)
    while pos != -1:
        if best is None or abs(pos - hint) < abs(best - hint):
            best = pos
        pos = text.find(needle, pos + 1)
    return best


def squad_articles(path: Path, *, max_articles: int | None = None) -> tuple[list[ParsedDocument], list[QAItem]]:
    """SQuAD articles rebuilt as documents (title + paragraphs); answer spans re-anchored in the canonical text."""
    with gzip.open(path, "rt", encoding="utf-8") if str(path).endswith(".gz") else open(path, encoding="utf-8") as fh:
        data = json.load(fh)["data"]
    docs, items = [], []
    for article in data[:max_articles]:
        doc_id = f"squad/{article['title']}"
        drafts = [ElementDraft(type="title", text=article["title"].replace("_", " "), heading_level=1)]
        drafts += [ElementDraft(type="narrative", text=p["context"]) for p in article["paragraphs"]]
        doc = assemble(
            drafts,
            doc_id=doc_id,
            source_path=str(path),
            content_hash=_sha(json.dumps(article)),
            parser="squad",
            n_pages=1,
        )
        docs.append(doc)
        paragraphs = [e for e in doc.elements if e.type == "narrative"]
        for para_el, para in zip(paragraphs, article["paragraphs"]):
            for qa in para["qas"]:
                spans = []
                for ans in qa["answers"]:
                    at = locate(doc.canonical_text, ans["text"], para_el.char_start + ans["answer_start"])
                    if at is not None and para_el.char_start <= at < para_el.char_end:
                        spans.append(Evidence(doc_id=doc_id, start=at, end=at + len(ans["text"])))
                if spans:
                    items.append(
                        QAItem(
                            qid=str(qa["id"]),
                            question=qa["question"],
                            qtype="dataset",
                            doc_id=doc_id,
                            evidence=spans,
                            answer=qa["answers"][0]["text"],
                            split=split_for(doc_id),
                            source="squad",
                        )
                    )
    return docs, items


def beir_documents(folder: Path, split: str = "test") -> tuple[list[ParsedDocument], list[QAItem]]:
    """A BEIR corpus as documents (title heading + text); each judged document is evidence as a whole."""
    ds = load_beir(folder, split)
    docs = {}
    for row in ds.corpus.to_dict("records"):
        raw = json.loads(json.dumps(row["text"]))
        docs[row["doc_id"]] = assemble(
            [ElementDraft(type="narrative", text=raw)],
            doc_id=row["doc_id"],
            source_path=str(folder),
            content_hash=row["content_hash"],
            parser="beir",
            n_pages=1,
        )
    items = []
    for qid, rel in ds.qrels.items():
        evidence = [
            Evidence(doc_id=d, start=0, end=len(docs[d].canonical_text))
            for d, score in rel.items()
            if score > 0 and d in docs
        ]
        if evidence and qid in ds.queries:
            items.append(
                QAItem(
                    qid=qid,
                    question=ds.queries[qid],
                    qtype="dataset",
                    doc_id=evidence[0].doc_id,
                    evidence=evidence,
                    split="test" if split == "test" else "train",
                    source="beir",
                )
            )
    return list(docs.values()), items
