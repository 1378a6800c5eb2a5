"""Pseudo-queries from a corpus alone (no labels): inverse cloze (Lee et al. 2019) — a sentence of a passage
is the query and the passage is its positive, with the sentence usually removed so the model must learn more
than word overlap. What SAGE/GPL do with an LLM, at zero generation cost."""

from __future__ import annotations

import random

from rag.synthetic import sentences

Triple = tuple[str, str, str]  # (query, passage, passage id)


def inverse_cloze(
    passages: dict[str, str],
    n: int,
    *,
    seed: int = 42,
    remove_probability: float = 0.9,
    min_words: int = 6,
    max_words: int = 50,
) -> list[Triple]:
    """At most one query per passage, from up to `n` passages sampled with a seed."""
    rng = random.Random(seed)
    ids = sorted(passages)
    rng.shuffle(ids)
    out: list[Triple] = []
    for pid in ids:
        if len(out) >= n:
            break
        text = passages[pid]
        spans = [(s, e) for s, e in sentences(text) if min_words <= len(text[s:e].split()) <= max_words]
        if len(spans) < 2:  # a one-sentence passage has nothing left once its sentence is the query
            continue
        s, e = rng.choice(spans)
        query = " ".join(text[s:e].split())
        passage = " ".join((text[:s] + " " + text[e:]).split()) if rng.random() < remove_probability else text
        out.append((query, passage, pid))
    return out
