"""BM25 as sparse vectors inside the Qdrant collection (the `bm25` named sparse vector, IDF modifier), so the
engine ranks BM25 next to the dense vectors: one index, filtered by the same payload indexes, copied with the
collection to a serving replica.

Scores equal bm25s' "lucene" BM25 (rag.index.bm25) on the same tokens:
    score(q, d) = sum over query terms t of
                  count_q(t) * idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
The passage vector holds the tf part (it needs |d| and avgdl, known at index time); the query vector holds term
counts; the engine's IDF modifier supplies idf(t) = ln(1 + (N - n_t + 0.5) / (n_t + 0.5)) from the live points,
as bm25s computes it at build time. Terms are the BM25 tokenizer's (rag.index.bm25.tokenize: lower case, English
stop words, Snowball stems), hashed to 32-bit indices (blake2b): two terms share an index with probability ~n^2/2^33
for n distinct terms (about one pair at 100k), which merges their counts.

avgdl is the mean token count over the chunk set at the time a passage is written. An incremental sync writes
changed passages with the chunk set's current mean and leaves the others as they were (their lengths are in the
payload, `bm25_terms`, so the mean costs no re-tokenizing); a full build writes every passage with one mean.
A few percent of churn moves the mean by well under a percent, which changes scores less than that.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rag.index.aliases import alias_target
from rag.index.bm25 import B, K1, tokenize

SPARSE = "bm25"  # the sparse vector's name in every collection
LENGTH_FIELD = "bm25_terms"  # payload: the passage's token count (|d|)


@lru_cache(maxsize=1 << 20)  # a corpus repeats its terms endlessly; bounded for a long-lived API process
def term_index(term: str) -> int:
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "little")


def _counts(tokens: Iterable[str]) -> tuple[list[int], list[int]]:
    counts: Counter[int] = Counter(term_index(t) for t in tokens)
    return list(counts), list(counts.values())


@dataclass(frozen=True)
class PassageTerms:
    """Term indices and counts of many passages in one flat (CSR) layout: a million passages stay a few hundred
    MB, not Python lists of lists."""

    indices: np.ndarray  # uint32, every passage's distinct terms one after another
    counts: np.ndarray  # float32, the term counts beside them
    offsets: np.ndarray  # int64, len(passages) + 1: passage i is offsets[i]:offsets[i + 1]
    lengths: np.ndarray  # int64, tokens per passage (|d|, repeats included)

    @classmethod
    def of(cls, texts: Sequence[str]) -> PassageTerms:
        indices, counts = array("I"), array("f")  # packed as they grow: no Python int per term
        offsets, lengths = array("q", [0]), array("q")
        for tokens in tokenize(texts) if len(texts) else []:
            ids, tf = _counts(tokens)
            indices.extend(ids)
            counts.extend(tf)
            offsets.append(len(indices))
            lengths.append(len(tokens))
        return cls(
            np.frombuffer(indices, dtype=np.uint32),
            np.frombuffer(counts, dtype=np.float32),
            np.frombuffer(offsets, dtype=np.int64),
            np.frombuffer(lengths, dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.lengths)

    def vectors(self, avgdl: float, rows: Iterable[int] | None = None) -> list:
        """The passages' sparse vectors (qdrant_client models.SparseVector), the tf part of BM25 as values."""
        from qdrant_client import models

        out = []
        for i in range(len(self)) if rows is None else rows:
            lo, hi = self.offsets[i], self.offsets[i + 1]
            tf = self.counts[lo:hi]
            norm = K1 * (1.0 - B + B * float(self.lengths[i]) / avgdl) if avgdl > 0 else K1
            out.append(models.SparseVector(indices=self.indices[lo:hi].tolist(), values=(tf / (tf + norm)).tolist()))
        return out


def query_vector(query: str):
    """The query's sparse vector (term counts), or None when no term survives the tokenizer (stop words only)."""
    from qdrant_client import models

    ids, counts = _counts(tokenize([query])[0])
    return models.SparseVector(indices=ids, values=[float(c) for c in counts]) if ids else None


def sparse_params(on_disk: bool | None = None):
    """The sparse vector's params; `on_disk`: its inverted index on disk (CollectionLayout.sparse_on_disk)."""
    from qdrant_client import models

    index = models.SparseIndexParams(on_disk=on_disk) if on_disk is not None else None
    return {SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF, index=index)}


def has_bm25(client, collection: str) -> bool:
    """Whether a collection (or alias) carries the BM25 sparse vector: collections built before it existed do not,
    and their searches take BM25 from the strategy's bm25s index instead."""
    params = client.get_collection(alias_target(client, collection) or collection).config.params
    return SPARSE in (params.sparse_vectors or {})


class EngineBM25:
    """BM25 ranked by the engine over a collection's sparse vectors: what rag.retrieval uses in place of the
    bm25s index when the opened collection carries them."""

    def __init__(self, client, collection: str):
        self.client, self.collection = client, collection

    def points(self, query: str, k: int, query_filter=None, with_payload=False) -> list:
        """The engine's scored points, best first, with `with_payload` (none by default: rag.retrieval ranks point
        ids and reads records for its top k only); points sharing no term with the query are not returned."""
        vector = query_vector(query)
        if vector is None or k <= 0:
            return []
        points = self.client.query_points(
            self.collection, query=vector, using=SPARSE, limit=k, query_filter=query_filter, with_payload=with_payload
        ).points
        return [p for p in points if p.score > 0]

    def search(self, query: str, k: int, query_filter=None) -> list[tuple[str, float]]:
        """(chunk_id, score) best first, from each hit's chunk_id payload."""
        return [(p.payload["chunk_id"], float(p.score)) for p in self.points(query, k, query_filter, ["chunk_id"])]
