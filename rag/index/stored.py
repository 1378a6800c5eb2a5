"""Vectors the index already holds, found by text, so that no text is encoded twice by the same weights.

A collection's name holds the weights version of the embedder that filled it
(`<strategy>__<model>__<version>__<distance>`, rag.index.qdrant.CollectionName) and each point its text (payload
"text"). The vector stored for a text in a collection of model `model` and version `version` is what that embedder
returns for the text (same weights, same passage prefix, same window: the index itself already takes a collection of
the same model and version as current), so another chunk set's collection, or a chunk of this one whose text is also a
sentence, gives it without encoding it again."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import numpy as np

from rag.index.qdrant import DENSE, CollectionName, _pages, aliased_collections

Lookup = Callable[[list[str]], dict[str, np.ndarray]]  # texts -> the vectors known for some of them
RETRIEVE_BATCH = 1024


def weights_collections(
    client, version: str, *, model: str | None = None, strategy: str | None = None, skip: Iterable[str] = ()
) -> list[str]:
    """Collections filled by weights `version` (of model key `model`, of chunk set `strategy`, when given), but those
    in `skip`: aliased ones (complete) first, then any interrupted build (what it stored is as good)."""
    aliased, skip = aliased_collections(client), set(skip)
    names = []
    for collection in client.get_collections().collections:
        parts = collection.name.rsplit("__", 3)
        if len(parts) != 4 or parts[2] != version or collection.name in skip:
            continue
        if (model is None or parts[1] == model) and (strategy is None or parts[0] == strategy):
            names.append(collection.name)
    return sorted(names, key=lambda name: (name not in aliased, name))


def collection_model(collection: str) -> str:
    """The model key in a collection's name."""
    return collection.rsplit("__", 3)[1]


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def other_chunk_sets(client, strategy: str, model: str, version: str, distance: str) -> StoredVectors:
    """The vectors that collections of `model` (its weights `version`) for chunk sets other than `strategy` hold: a
    text two chunk sets share is encoded once (indexing, promotion and a canary's start all build through this)."""
    from rag.embedding import model_key

    target = CollectionName(strategy, model_key(model)).versioned(version, distance)
    return StoredVectors(client, weights_collections(client, version, model=model_key(model), skip=[target]))


class StoredVectors:
    """The dense vectors `collections` (all filled by one embedder) hold for texts, looked up by text: the points'
    texts are read once, at the first lookup (and kept as 16-byte digests), vectors only for the texts asked for.
    Callable as a Lookup."""

    def __init__(self, client, collections: Iterable[str]):
        self.client, self.collections = client, list(collections)
        self._where: dict[bytes, tuple[str, object]] | None = None
        self.found = 0  # texts answered so far

    def _points(self) -> dict[bytes, tuple[str, object]]:
        if self._where is None:
            where: dict[bytes, tuple[str, object]] = {}
            for collection in self.collections:
                for points in _pages(self.client, collection, 2048, with_payload=["text"], with_vectors=False):
                    for point in points:
                        text = (point.payload or {}).get("text")
                        if text:
                            where.setdefault(_key(text), (collection, point.id))
            self._where = where
        return self._where

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        if not self.collections or not texts:
            return {}
        where = self._points()
        wanted: dict[str, list[tuple[object, str]]] = {}
        for text in dict.fromkeys(texts):
            if (found := where.get(_key(text))) is not None:
                collection, point = found
                wanted.setdefault(collection, []).append((point, text))
        out: dict[str, np.ndarray] = {}
        for collection, items in wanted.items():
            for i in range(0, len(items), RETRIEVE_BATCH):
                batch = items[i : i + RETRIEVE_BATCH]
                text_of = {str(point): text for point, text in batch}
                ids = [point for point, _ in batch]
                for record in self.client.retrieve(collection, ids, with_payload=False, with_vectors=[DENSE]):
                    vector = record.vector.get(DENSE) if isinstance(record.vector, dict) else record.vector
                    if vector is not None:
                        out[text_of[str(record.id)]] = np.asarray(vector, dtype=np.float32)
        self.found += len(out)
        return out


class ReusingEmbedder:
    """A TextEmbedder whose passages are first looked up (`lookups`, in order: each answers some texts with this
    embedder's own vectors) and only the rest encoded. Queries are encoded as ever; every other attribute (name,
    version, dim, batch_size, window, ...) is the wrapped embedder's."""

    def __init__(self, embedder, *lookups: Lookup):
        self.embedder, self.lookups = embedder, lookups
        self.reused = 0  # passages answered by a lookup

    def __getattr__(self, name: str):
        return getattr(self.embedder, name)

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        texts = list(texts)
        found: dict[str, np.ndarray] = {}
        for lookup in self.lookups:
            missing = [t for t in dict.fromkeys(texts) if t not in found]
            if not missing:
                break
            found.update(lookup(missing))
        self.reused += len(found)
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            found.update(zip(missing, self.embedder.encode_passages(missing)))
        if not texts:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        return np.vstack([found[t] for t in texts])

    encode = encode_passages

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self.embedder.encode_queries(texts)
