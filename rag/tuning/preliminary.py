"""Preliminary ranking of embedders (the retriever-optimizer paper): each candidate model retrieves the
deduplicated reference passages of the QA set for every question; rank by mean(MRR@10, Recall@5), keep the
top n, then grid the space with only those embedders."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from rag.embedding import load_embedder
from rag.evaluation.metrics import evaluate_run, run_from_hits
from rag.evaluation.qaset import QAItem
from rag.tuning.fitness import Evaluations
from rag.tuning.optimizers import SearchResult, grid
from rag.tuning.space import SearchSpace

PARAGRAPH_BREAK = "\n\n"  # canonical texts join elements with a blank line


def reference_passage(text: str, start: int, end: int) -> str:
    """The paragraphs (elements) an evidence span lies in: SQuAD answers are a few words, the paper's
    reference passage is the paragraph they come from."""
    lo = text.rfind(PARAGRAPH_BREAK, 0, start)
    hi = text.find(PARAGRAPH_BREAK, end)
    return text[0 if lo == -1 else lo + len(PARAGRAPH_BREAK) : len(text) if hi == -1 else hi].strip()


def reference_pairs(items: list[QAItem], texts: dict[str, str]) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """(passage id → text over the deduplicated reference passages, qrels question → passage ids)."""
    passages: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for item in items:
        for ev in item.evidence:
            if ev.doc_id not in texts:
                continue
            passage = reference_passage(texts[ev.doc_id], ev.start, ev.end)
            if not passage:
                continue
            pid = "p" + hashlib.sha256(passage.encode()).hexdigest()[:16]
            passages[pid] = passage
            qrels.setdefault(item.qid, {})[pid] = 1
    return passages, qrels


def rank_embedders(
    items: list[QAItem], texts: dict[str, str], embedders: list[str], *, depth: int = 10
) -> pd.DataFrame:
    """One row per embedder, best first: mrr@10, recall@5, their mean (score), seconds."""
    passages, qrels = reference_pairs(items, texts)
    if not qrels:
        raise ValueError("no question's evidence lies in the given documents: nothing to rank embedders with")
    pids, ptexts = list(passages), list(passages.values())
    questions = {i.qid: i.question for i in items if i.qid in qrels}
    rows = []
    for name in embedders:
        started = time.perf_counter()
        embedder = load_embedder(name)
        p = embedder.encode_passages(ptexts)
        q = embedder.encode_queries(list(questions.values()))
        scores = q @ p.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        run = {qid: [pids[j] for j in row] for qid, row in zip(questions, top)}
        mean, _ = evaluate_run(qrels, run_from_hits(run), ["mrr@10", "recall@5"])
        rows.append(
            {
                "embedder": name,
                "mrr@10": mean["mrr@10"],
                "recall@5": mean["recall@5"],
                "score": (mean["mrr@10"] + mean["recall@5"]) / 2,
                "passages": len(pids),
                "questions": len(questions),
                "seconds": round(time.perf_counter() - started, 2),
            }
        )
    table = pd.DataFrame(rows).sort_values("score", ascending=False, kind="stable", ignore_index=True)
    table.insert(0, "rank", range(1, len(table) + 1))
    return table


def preliminary_then_grid(
    space: SearchSpace,
    evals_for: Callable[[SearchSpace], Evaluations],
    items: list[QAItem],
    texts: dict[str, str],
    *,
    top_n: int = 2,
    capabilities: set[str] | frozenset[str] = frozenset(),
    embedder_family: str = "embedder",
) -> SearchResult:
    """Rank the space's embedders, keep the top n, grid the rest of the space with them.
    `evals_for(space)` returns the Evaluations for the restricted space (same cache and budget)."""
    family = space.family(embedder_family)
    names = {o.name: o.params.get("model", o.name) for o in family.options}
    ranking = rank_embedders(items, texts, list(names.values()))
    kept_models = ranking["embedder"].head(top_n).tolist()
    kept = [o for o, model in names.items() if model in kept_models]
    restricted = space.restrict(embedder_family, sorted(kept, key=lambda o: kept_models.index(names[o])))
    evals: Evaluations = evals_for(restricted)
    result = grid(restricted, evals, capabilities)
    result.method = "preliminary-ranking"
    result.extra = {"embedder_ranking": ranking, "kept_embedders": kept}
    return result
