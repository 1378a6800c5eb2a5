"""Which kind of question each question slot gets: shares of a mix turned into a fixed, seeded sequence."""

from __future__ import annotations

import random

LLM = "llm"  # the LLM's question types (SynthSettings.question_types), cycled as before mixes existed
RULE_BASED = ("answer-aware", "keyword", "inverse-cloze")
KINDS = (LLM, *RULE_BASED)
# Without an LLM: half answer-aware questions, the kind closest to what people ask (wh-questions about a fact of
# one sentence); a quarter keyword queries, how people type into a search box; a quarter inverse cloze, kept
# because it covers every passage (a sentence always exists) and is the kind the trained models were measured on.
DEFAULT_RULE_MIX = {"answer-aware": 0.5, "keyword": 0.25, "inverse-cloze": 0.25}


def validate(mix: dict[str, float]) -> dict[str, float]:
    unknown = sorted(set(mix) - set(KINDS))
    if unknown:
        raise ValueError(f"question_mix: unknown kinds {unknown}; use {', '.join(KINDS)}")
    if any(w < 0 for w in mix.values()) or not any(w > 0 for w in mix.values()):
        raise ValueError("question_mix: shares must be >= 0 and at least one > 0, e.g. {'answer-aware': 1.0}")
    return mix


def resolve(mix: dict[str, float] | None, has_llm: bool) -> dict[str, float]:
    """The mix of this run, shares summing to 1: None = the LLM alone with an LLM (the behaviour before mixes),
    DEFAULT_RULE_MIX without. Without an LLM, an `llm` share is left out and the others keep their proportions."""
    if mix is None:
        mix = {LLM: 1.0} if has_llm else DEFAULT_RULE_MIX
    kept = {k: float(w) for k, w in validate(mix).items() if w > 0 and (has_llm or k != LLM)}
    if not kept:
        raise ValueError(
            "question_mix asks for LLM questions only, and no LLM is configured: set llm_backend "
            "(or RAG_LLM_BACKEND), or give rule-based kinds a share (answer-aware, keyword, "
            "inverse-cloze)"
        )
    total = sum(kept.values())
    return {k: w / total for k, w in sorted(kept.items(), key=lambda kv: (-kv[1], KINDS.index(kv[0])))}


def slot_kinds(mix: dict[str, float], n_slots: int, seed: int) -> list[str]:
    """n_slots kinds: each kind's quota by largest remainder (so counts follow the shares to within one), in an
    order shuffled by the seed (so a cap on questions still takes a mixed prefix)."""
    quotas = {k: int(w * n_slots) for k, w in mix.items()}
    by_remainder = sorted(mix, key=lambda k: (-(mix[k] * n_slots - quotas[k]), KINDS.index(k)))
    for k in by_remainder[: n_slots - sum(quotas.values())]:
        quotas[k] += 1
    kinds = [k for k in mix for _ in range(quotas[k])]
    random.Random(f"question-mix-{seed}").shuffle(kinds)
    return kinds


def fallbacks(kind: str, mix: dict[str, float]) -> list[str]:
    """The kind, then the mix's other kinds by share: a passage that yields nothing of one kind gives its slot to the
    next, so short or odd passages still get a question."""
    return [kind] + [k for k in mix if k != kind]
