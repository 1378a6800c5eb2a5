"""The ranking users get, as the queue scores it: the answer pipeline that serves (the active configuration, else
the defaults: production embedder and reranker, hybrid-cc) with its retrieve → rerank steps, not a stand-in. A label
is worth most where what serves is unsure, so the candidates must be what serves."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rag.qa import AnswerSettings
from rag.retrieval import Hit


def served_settings(root: Path | None = None) -> AnswerSettings:
    """What `rag serve` answers with: RAG_ANSWER_CONFIG, else the applied configuration, else the defaults."""
    from rag.tuning.active import active_file

    config = os.environ.get("RAG_ANSWER_CONFIG") or active_file(root)
    return AnswerSettings.from_yaml(Path(config)) if config else AnswerSettings()


class ServedRanking:
    """The served ranking of a question (its top `k`, with first-stage signals and, when a reranker serves, its
    probabilities). `strategy`, `model`, `mode` override what serves (None: keep it)."""

    def __init__(
        self,
        root: Path,
        qdrant=None,
        *,
        k: int = 10,
        strategy: str | None = None,
        model: str | None = None,
        mode: str | None = None,
    ):
        from rag.qa import Answerer

        served = served_settings(root)
        overrides = {"strategy": strategy, "model": model, "mode": mode}
        self.settings = served.model_copy(
            update={
                **{key: v for key, v in overrides.items() if v is not None},
                "k": max(k, served.k),
                "top_k": None,
                "min_score": None,
                "attribution": False,
                "generator": "extractive",
            }
        )
        self.answerer = Answerer(self.settings, root=Path(root), qdrant=qdrant)

    @property
    def reranked(self) -> bool:
        return self.answerer.reranker is not None

    @property
    def depth(self) -> int:
        """How deep the first stage's lists go (a pair missing from one ranks below this)."""
        return self.settings.candidates

    @property
    def chunks(self):
        return self.answerer.index.chunks

    def documents(self) -> int:
        """How many documents the served chunk set holds."""
        return self.answerer.index.lookup.document_count()

    def rank(self, question: str) -> list[Hit]:
        return self.answerer.rank(question)

    @property
    def encoder(self):
        """Question texts → vectors with the served embedder (None when nothing embeds, e.g. bm25 alone)."""
        embedder = (self.answerer.index.embedder if self.answerer.index is not None else None) or self.answerer.embedder
        return None if embedder is None else (lambda texts: np.asarray(embedder.encode_queries(texts)))

    def served(self) -> dict[str, str | None]:
        return self.answerer.served()


__all__ = ["ServedRanking", "served_settings"]
