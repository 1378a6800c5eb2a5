"""The first stage a reranker sits on, rebuilt in memory over a chunk set: BM25 + a dense collection of the
production embedder, so reranker training and its gate see candidates the way serving does (with each hit's
first-stage signals), without opening the live Qdrant folder (an embedded folder has one opener).

Synthetic questions without an LLM are sentences copied out of a chunk (inverse cloze). Retrieved against the
chunk that still contains them, the first stage finds them by exact match and a reranker learns nothing that
transfers to real questions ("the answer repeats the question word for word"). `without_questions` takes each
question's sentence out of the chunks it was copied from, as the inverse-cloze task intends, before the
reranker's training candidates are retrieved.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from rag.retrieval import Hit, Index


# The reranker re-orders what serving retrieves, so it trains and is gated on the same first stage: the mode that
# serves (rag.qa.models.DEFAULT_MODE, or the active configuration's). Gated over hybrid-rrf while serving ran
# hybrid-cc, a learned ranker passed (+4.7 nDCG@10 over rrf) and lowered what users got (recall@5 0.9505 -> 0.9395
# on 2,000 SQuAD dev questions): cc alone was already as good as rrf plus the ranker.
def serving_mode(root: Path | None = None) -> str:
    """The retrieval mode answers use by default: the production configuration's (rag.training.configuration), else
    the applied configuration's, else DEFAULT_MODE."""
    from rag.qa.models import DEFAULT_MODE
    from rag.registry import ModelRegistry
    from rag.retrieval import RETRIEVERS
    from rag.store import data_dir
    from rag.training.configuration import base_settings, served_settings

    root = Path(root or data_dir())
    mode = served_settings(base_settings(root), ModelRegistry(root / "models")).mode or DEFAULT_MODE
    return mode if mode in RETRIEVERS else DEFAULT_MODE


FIRST_STAGE_MODE = "hybrid-cc"  # rag.qa.models.DEFAULT_MODE, for callers that name no data dir


def _squash(text: str) -> str:
    return " ".join(str(text).split())


def cut_question(passage: str, question: str) -> str:
    """The passage without a question copied out of it word for word (whitespace-insensitive); unchanged when the
    question is not in it, shorter than three words (a phrase, not a copied sentence), or is all of it."""
    question, text = _squash(question), _squash(passage)
    if len(question.split()) < 3 or question not in text:
        return passage
    return _squash(text.replace(question, " ")) or passage


def without_questions(chunks: pd.DataFrame, questions: Iterable[tuple[str, str]]) -> tuple[pd.DataFrame, int]:
    """`questions`: (question, chunk id) pairs. Each question found word for word in its chunk is cut out of it
    (whitespace-insensitive); returns the chunk table with those texts changed and how many distinct questions
    were found copied."""
    texts = chunks.set_index("chunk_id")["text"].to_dict()
    changed: dict[str, str] = {}
    copied: set[str] = set()
    for question, cid in questions:
        if cid not in texts:
            continue
        cut = cut_question(changed.get(cid, texts[cid]), question)
        if cut != changed.get(cid, texts[cid]):
            changed[cid] = cut
            copied.add(question)
    out = chunks.copy()
    if changed:
        out["text"] = [changed.get(c, t) for c, t in zip(out["chunk_id"], out["text"])]
        if "content_hash" in out:
            out["content_hash"] = [
                hashlib.sha256(t.encode()).hexdigest() if c in changed else h
                for c, t, h in zip(out["chunk_id"], out["text"], out["content_hash"])
            ]
    return out, len(copied)


class KnownVectors:
    """An embedder that answers passages it has seen from a table of vectors and encodes only the rest: the
    first stage over a chunk set with a few texts changed re-embeds those few, not the whole set."""

    def __init__(self, embedder, vectors: dict[str, np.ndarray]):
        self._embedder, self._vectors = embedder, vectors
        self.name, self.dim, self.version = embedder.name, embedder.dim, embedder.version
        self.encoded = 0

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self._embedder.encode_queries(texts)

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            self.encoded += len(missing)
            self._vectors.update(zip(missing, self._embedder.encode_passages(missing)))
        return np.vstack([self._vectors[t] for t in texts]) if texts else np.zeros((0, self.dim), dtype=np.float32)

    encode = encode_passages


def vectors_by_text(index: Index) -> dict[str, np.ndarray]:
    """Every (passage text -> dense vector) of an index's collection."""
    from rag.index.qdrant import DENSE

    out, offset = {}, None
    while True:
        points, offset = index.client.scroll(
            index.alias, limit=1024, offset=offset, with_vectors=[DENSE], with_payload=["text"]
        )
        for p in points:
            out[p.payload["text"]] = np.asarray(p.vector[DENSE], dtype=np.float32)
        if offset is None:
            return out


@contextlib.contextmanager
def first_stage_index(
    chunks: pd.DataFrame, embedder, known_vectors: dict[str, np.ndarray] | None = None
) -> Iterator[Index]:
    from qdrant_client import QdrantClient

    from rag.index.bm25 import BM25Index
    from rag.index.qdrant import QdrantSettings
    from rag.index.sync import sync_collection

    # The engine serving uses (Qdrant Edge by default): local mode scans in Python and copies every payload per
    # search, minutes for a few hundred questions over a few hundred chunks.
    if QdrantSettings(path=":memory:").engine == "local":
        client = QdrantClient(location=":memory:")
    else:
        from rag.index.edge import EdgeClient

        client = EdgeClient(None)
    try:
        passages = KnownVectors(embedder, dict(known_vectors)) if known_vectors else embedder
        run = sync_collection(client, chunks, passages, strategy="first-stage", model="first-stage")
        yield Index(
            chunks.set_index("chunk_id"),
            BM25Index.build(chunks["chunk_id"].tolist(), chunks["text"].tolist()),
            client,
            run.alias,
            embedder,
        )
    finally:
        client.close()


def first_stage_hits(
    index: Index, queries: dict[str, str], depth: int, mode: str = FIRST_STAGE_MODE
) -> dict[str, list[Hit]]:
    """Top-`depth` hits of every question (by id), with their first-stage signals."""
    from rag.retrieval import QUERY_VECTORS_KEPT, RetrievalParams, retrieve, validate_query

    params = RetrievalParams(k=depth, candidates=max(depth, 100))
    asked = {q: text for q, text in queries.items() if text.strip()}
    out = {}
    ids = list(asked)
    for start in range(0, len(ids), QUERY_VECTORS_KEPT):
        batch = ids[start : start + QUERY_VECTORS_KEPT]
        if index.embedder is not None and mode != "bm25":
            # One batched encoding instead of one forward pass per question (10x+ faster on a CPU); retrieve()
            # then finds each vector in the index's query cache.
            texts = list(dict.fromkeys(validate_query(asked[q]) for q in batch))
            index._query_vectors.update(zip(texts, index.embedder.encode_queries(texts)))
        out.update({q: retrieve(index, asked[q], mode, params) for q in batch})
    return out


__all__ = [
    "FIRST_STAGE_MODE",
    "serving_mode",
    "KnownVectors",
    "first_stage_index",
    "first_stage_hits",
    "vectors_by_text",
    "without_questions",
    "cut_question",
]
