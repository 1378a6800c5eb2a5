"""Where an answer people wrote in (a correction) stands in the documents: the key that tells where the answer was
when none of the passages production showed held it. Used by the configuration learner (document spans) and by the
embedder and reranker training (the chunks that hold it)."""

from __future__ import annotations

import re

from rag.evaluation.qaset import Evidence

MAX_ANSWER_DOCUMENTS = 3  # a corrected answer found in more documents than this says too little about where


def answer_spans(answer: str, documents: dict[str, str]) -> list[Evidence]:
    """Where a corrected answer occurs in the documents (case and spacing aside): every occurrence, when it is found
    in at most MAX_ANSWER_DOCUMENTS documents and is more than a word or a number of three characters; else none (a
    "yes" or a "2019" is everywhere and names no passage)."""
    words = answer.split()
    if len(" ".join(words)) < 4:
        return []
    pattern = re.compile(r"\s+".join(map(re.escape, words)), re.IGNORECASE)
    found = []
    for doc, text in documents.items():
        matches = list(pattern.finditer(text))[:5]
        if matches:
            found.append((doc, matches))
            if len(found) > MAX_ANSWER_DOCUMENTS:
                return []
    return [Evidence(doc_id=doc, start=m.start(), end=m.end()) for doc, matches in found for m in matches]


def answer_chunks(answer: str, texts: dict[str, str]) -> list[str]:
    """The chunks (`texts`: chunk_id -> text) that hold a corrected answer, by answer_spans' rule with a chunk for a
    document: none when it is too short or stands in more than MAX_ANSWER_DOCUMENTS chunks."""
    return sorted({e.doc_id for e in answer_spans(answer, texts)})
