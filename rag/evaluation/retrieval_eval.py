"""Score one index (a chunk set × model) with a span-anchored QA set, for each retrieval mode."""
from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from rag.evaluation.metrics import KS, METRICS, evaluate_run, retrieval_score, run_from_hits, weighted_average
from rag.evaluation.qaset import QAItem, Relevance, qrels_for_chunks
from rag.retrieval import Index, RetrievalParams, retrieve

REPORT_KEYS = ["strategy", "model", "mode"]


@dataclass
class ConfigReport:
    summary: pd.DataFrame  # one row per mode: metrics, RetrievalScore, counts, latency
    per_query: pd.DataFrame  # one row per (mode, question)


def evaluate_index(index: Index, items: list[QAItem], chunks: pd.DataFrame, *, strategy: str, model: str, modes: list[str],
                   split: str = "all", relevance: Relevance | None = None, params: RetrievalParams | None = None) -> ConfigReport:
    selected = [i for i in items if split == "all" or i.split == split]
    qrels = qrels_for_chunks(selected, chunks, relevance)
    questions = [i for i in selected if i.qid in qrels]
    params = (params or RetrievalParams()).model_copy(update={"k": max(KS)})
    rows, tables = [], []
    for mode in modes:
        started = time.perf_counter()
        hits = {q.qid: [h.chunk["chunk_id"] for h in retrieve(index, q.question, mode, params)] for q in questions}
        seconds = time.perf_counter() - started
        mean, per_query = evaluate_run(qrels, run_from_hits(hits))
        # The thesis's WA also needs faithfulness and reference-free precision, which come from generated
        # answers; until those exist it stays empty rather than being computed from half its terms.
        wa = weighted_average({"context_recall": mean["recall@5"], "context_precision_ref": mean["precision@5"],
                               "faithfulness": None, "context_precision_noref": None})
        rows.append({"strategy": strategy, "model": model, "mode": mode, "split": split, "n_questions": len(questions),
                     "n_without_relevant_chunk": len(selected) - len(questions), "retrieval_score": retrieval_score(mean),
                     "weighted_average": wa, "query_ms": 1000 * seconds / max(1, len(questions)), **mean})
        per_query.insert(0, "mode", mode)
        per_query["question"] = per_query["qid"].map({q.qid: q.question for q in questions})
        per_query["top_chunk"] = per_query["qid"].map({q: (ids[0] if ids else None) for q, ids in hits.items()})
        tables.append(per_query)
    return ConfigReport(pd.DataFrame(rows), pd.concat(tables, ignore_index=True))


def summarize(reports: pd.DataFrame, baseline: tuple[str, str] = ("recursive-1000-200", "dense")) -> pd.DataFrame:
    """Every configuration side by side, best first, with deltas against the naive baseline of the same model."""
    if reports.empty:
        return reports
    out = reports.sort_values("retrieval_score", ascending=False, ignore_index=True)
    out["best"] = False
    out.loc[0, "best"] = True
    base = out[(out["strategy"] == baseline[0]) & (out["mode"] == baseline[1])].set_index("model")
    for metric in ("retrieval_score", "recall@5", "ndcg@10"):
        out[f"delta_{metric}"] = [row[metric] - base.loc[row["model"], metric] if row["model"] in base.index else None
                                  for row in out.to_dict("records")]
    return out


__all__ = ["ConfigReport", "evaluate_index", "summarize", "METRICS", "REPORT_KEYS"]
