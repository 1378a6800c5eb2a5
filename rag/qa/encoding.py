"""Sentence vectors remembered per text: the extractive generator and attribution encode the same passage
sentences, and a bake-off sees the same passages under every retrieval mode."""
from __future__ import annotations

import numpy as np

from rag.embedding import TextEmbedder


class CachedEmbedder:
    """Wraps a TextEmbedder; `encode_passages` answers known texts from memory (bounded: cleared when full)."""

    def __init__(self, embedder: TextEmbedder, max_entries: int = 50_000):
        self.embedder, self.max_entries = embedder, max_entries
        self.name, self.dim, self.version = embedder.name, embedder.dim, embedder.version
        self._vectors: dict[str, np.ndarray] = {}

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            if len(self._vectors) + len(missing) > self.max_entries:
                self._vectors.clear()
            self._vectors.update(zip(missing, self.embedder.encode_passages(missing)))
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.vstack([self._vectors[t] for t in texts])

    encode = encode_passages

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self.embedder.encode_queries(texts)
