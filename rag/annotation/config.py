"""What the annotation queue is built with (one pydantic model: every default lives here; the asset's run config and
the bench read their defaults from it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The uncertainty signals of rag.annotation.signals, each in [0, 1], higher = the pipeline is less sure of the pair.
SIGNALS = ("probability", "margin", "disagreement")


class AnnotationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = Field(50, ge=1, description="items in the queue")
    questions: int = Field(
        200, ge=1, description="questions whose candidates are scored (newest production queries first)"
    )
    k: int = Field(
        10,
        ge=2,
        description="candidates per question: the served ranking's top k (what users are shown "
        "and what a label can move)",
    )
    source: Literal["auto", "production", "synthetic"] = Field(
        "auto",
        description="where questions come from: auto = production queries, topped up with the synthetic QA "
        "set's questions while there are fewer than `questions` (all synthetic before any traffic)",
    )
    method: str = Field(
        "active",
        description="selection method (rag.annotation.select.SELECTORS): active = uncertainty "
        "+ diversity over question embeddings with quotas; uncertainty = most uncertain first; random",
    )
    diversity: Literal["mmr", "k-center"] = Field(
        "mmr",
        description="active: how diversity enters: mmr (maximal "
        "marginal relevance) or k-center greedy weighted by uncertainty",
    )
    mmr_lambda: float = Field(
        0.7,
        ge=0.0,
        le=1.0,
        description="active/mmr: weight of uncertainty against novelty "
        "(1 - the highest cosine to another question already picked)",
    )
    # A tenth of the default queue: on 16 SQuAD articles a quota of 3 per article pushed half the picks onto articles
    # that answer none of the questions (2 relevant labels of 48, against 12 of 50 without it;
    # bench/active_learning.py).
    per_document: int | None = Field(5, ge=1, description="active: most items from one document (None: no quota)")
    per_question: int | None = Field(2, ge=1, description="active: most items from one question (None: no quota)")
    weights: dict[str, float] = Field(
        default_factory=lambda: dict.fromkeys(SIGNALS, 1.0),
        description="weight of each uncertainty signal (probability: reranker probability "
        "near 0.5; margin: score close to the top one, a contender for first place; "
        "disagreement: BM25, dense and reranker ranks disagree); a signal that is absent (no "
        "reranker) drops out and the others are re-weighted",
    )
    skip_labelled: bool = Field(True, description="leave out pairs an expert already labelled")
    # A pool is one gate's pairs, up to 10 per held-out question: on TAT-QA a reranker gate's held 63-111 with 20-86
    # questions deciding (bench/results/loop-tatqa-reranker+configuration-experts*.json). The cap leaves room for
    # larger gates while active learning still gets its `size` places behind them.
    gate_pairs: int = Field(
        300,
        ge=0,
        description="most pairs of the gate's pool (rag.annotation.pool: held-out people's questions with a passage "
        "one model ranks high and the other does not, that nobody rated) put first, before the `size` picks of "
        "`method`: their grades settle a pending verdict",
    )
    seed: int = 0

    @field_validator("weights")
    @classmethod
    def _known_signals(cls, weights: dict[str, float]) -> dict[str, float]:
        unknown = set(weights) - set(SIGNALS)
        if unknown:
            raise ValueError(f"unknown uncertainty signals {sorted(unknown)}: use {', '.join(SIGNALS)}")
        if any(w < 0 for w in weights.values()) or not any(w > 0 for w in weights.values()):
            raise ValueError(f"weights must be >= 0 with at least one > 0, got {weights}")
        return weights

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: str) -> str:
        from rag.annotation.select import selector

        selector(method)  # raises, naming the known methods
        return method
