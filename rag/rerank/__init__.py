"""Rerankers: re-score retrieved passages for a query.

    reranker = load_reranker("production")          # the registry's production reranker, or None
    hits = rerank(reranker, query, hybrid_hits, k=10)

Kinds (RERANKERS; a registered version names its kind in the manifest's hyperparameters["reranker_kind"]):
- "lambdamart" (default for training): LightGBM LambdaRank over first-stage signals, lexical features and
  feedback priors (rag.rerank.ltr). It trains in seconds on a CPU and reads the hits' first-stage signals.
- "cross-encoder": any saved sentence-transformers CrossEncoder directory (a pretrained one for users online,
  or one rag.training trained from the bi-encoder's weights, which learns little on a CPU budget).

Score scale, for `min_score` and attribution thresholds: every reranker here returns a relevance probability in
[0, 1] (the learned ranker is Platt-calibrated; a CrossEncoder's logit always goes through a sigmoid, whatever
activation its saved config names). A reranker of your own that returns logits says so with `scale = "logit"`;
`probabilities()` then squashes every batch the same way instead of guessing from the values.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from rag.registry import ALIASES, ModelRegistry, is_registry_name
from rag.retrieval import Hit


class Reranker(Protocol):
    name: str
    scale: str  # "probability" (in [0, 1]) or "logit"

    def score(self, query: str, passages: list[str]) -> np.ndarray:
        """One relevance score per passage; higher is more relevant."""
        ...


def reranker_scores(reranker, query: str, hits) -> np.ndarray:
    """Probabilities for first-stage hits: a reranker with `needs_hits` reads their signals, others their texts."""
    if getattr(reranker, "needs_hits", False):
        return probabilities(reranker, reranker.score_hits(query, hits))
    return probabilities(reranker, reranker.score(query, [str(h.chunk.get("text", "")) for h in hits]))


def probabilities(reranker, scores) -> np.ndarray:
    """A reranker's scores on the [0, 1] scale: a sigmoid for a reranker that declares `scale = "logit"`, the scores
    themselves otherwise. Deciding per reranker, not per batch: a batch of logits that happened to fall inside
    [0, 1] was left unsquashed while the next batch was squashed, so one threshold meant two things."""
    scores = np.asarray(scores, dtype=np.float64)
    if getattr(reranker, "scale", "probability") == "logit":
        return 1.0 / (1.0 + np.exp(-scores))
    if scores.size and (scores.min() < -1e-6 or scores.max() > 1 + 1e-6):
        raise ValueError(
            f"reranker {getattr(reranker, 'name', reranker)!r} returned scores outside [0, 1] "
            f"({scores.min():.3g}..{scores.max():.3g}) without declaring scale = 'logit': a reranker returns "
            "probabilities, or declares logits so they are squashed consistently"
        )
    return scores


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder saved in a directory (pretrained, or trained by rag.training)."""

    scale = "probability"

    def __init__(self, path: str | Path, name: str | None = None, max_length: int = 256, batch_size: int = 32) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(
                f"no cross-encoder at {self.path}: train one (the trained_reranker asset) "
                "or pass a saved model directory"
            )
        self.name = name or self.path.name
        self.batch_size = batch_size
        self._model = _cross_encoder(str(self.path.resolve()), max_length)

    def score(self, query: str, passages: list[str]) -> np.ndarray:
        if not passages:
            return np.zeros(0, dtype=np.float32)
        import torch

        # The sigmoid is named here, not taken from the saved config: a model saved with an Identity activation
        # (common for MS MARCO cross-encoders) would otherwise return logits under the same name.
        scores = self._model.predict(
            [(query, p) for p in passages],
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
            activation_fn=torch.nn.Sigmoid(),
        )
        scores = np.asarray(scores, dtype=np.float32)
        if scores.ndim == 2:  # a two-label model: the probability of its last ("relevant") label
            scores = scores[:, -1]
        return scores.reshape(len(passages))


@lru_cache(maxsize=8)
def _cross_encoder(path: str, max_length: int):
    """Loaded once per process and directory (registry versions are immutable, so the path is the identity)."""
    from sentence_transformers import CrossEncoder
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return CrossEncoder(path, device="cpu", local_files_only=True, max_length=max_length)


def _learned_ranker(path, name=None):
    from rag.rerank.ltr import LearnedRanker

    return LearnedRanker(path, name=name)


RERANKERS: dict[str, Callable[..., Reranker]] = {"lambdamart": _learned_ranker, "cross-encoder": CrossEncoderReranker}


def reranker_from_dir(path: str | Path, name: str | None = None) -> Reranker:
    """A saved reranker of any kind: a learned ranker's folder has ltr.json, anything else is read as a CrossEncoder."""
    from rag.rerank.ltr import is_ltr_dir

    return RERANKERS["lambdamart" if is_ltr_dir(path) else "cross-encoder"](path, name=name)


def load_reranker(spec: str | None, *, registry: ModelRegistry | None = None) -> Reranker | None:
    """None / "none" -> None; "production" / "candidate" / "v2" / "ce-minilm-v2" -> that registered reranker (None
    when the alias points nowhere yet); a directory -> the CrossEncoder saved there."""
    if spec is None or spec.strip().lower() in ("", "none"):
        return None
    spec = spec.strip()
    registry = registry or ModelRegistry()
    if spec in ALIASES or is_registry_name(spec, "reranker") or re.fullmatch(r"v\d+", spec):
        mv = registry.resolve("reranker", spec)
        if mv is not None:
            return reranker_from_dir(mv.path, name=mv.name)
        if spec in ALIASES:
            return None
    if Path(spec).is_dir():
        return reranker_from_dir(spec)
    known = ", ".join(registry.names("reranker")) or "none registered yet"
    raise ValueError(
        f"unknown reranker {spec!r}: use none, production, candidate, a registered version ({known}) "
        "or a directory holding a saved reranker (a learned ranker or a CrossEncoder)"
    )


def rerank(reranker: Reranker, query: str, hits: list[Hit], k: int) -> list[Hit]:
    """The hits re-scored by the reranker, best first, ranks 1..k; ties keep the retrieval order."""
    if not hits:
        return []
    scores = reranker_scores(reranker, query, hits)
    if scores.shape != (len(hits),):
        raise ValueError(f"reranker {reranker.name!r} returned {scores.shape} scores for {len(hits)} passages")
    order = sorted(range(len(hits)), key=lambda i: (-scores[i], hits[i].rank))
    return [replace(hits[i], rank=rank, score=float(scores[i])) for rank, i in enumerate(order[:k], start=1)]


__all__ = [
    "Reranker",
    "CrossEncoderReranker",
    "RERANKERS",
    "load_reranker",
    "probabilities",
    "rerank",
    "reranker_from_dir",
    "reranker_scores",
]
