"""BEIR retrieval evaluation: the corpus indexed as-is (title + text, one chunk per document),
the split's queries retrieved with any mode, metrics computed by ranx."""

from __future__ import annotations

import csv
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rag.embedding import load_embedder
from rag.index.qdrant import QdrantSettings, get_client
from rag.index.sync import sync_bm25, sync_collection
from rag.progress import Progress, counter
from rag.retrieval import DENSE_MODES, RETRIEVERS, Index, RetrievalError, RetrievalParams, retrieve
from rag.retrieval.service import BM25Source, open_bm25
from rag.store import bm25_root


@dataclass
class BeirDataset:
    name: str
    corpus: pd.DataFrame  # chunk-table shaped: one row per document
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def load_beir(folder: Path, split: str = "test") -> BeirDataset:
    folder = Path(folder)
    qrels_path = folder / "qrels" / f"{split}.tsv"
    for needed in (folder / "corpus.jsonl", folder / "queries.jsonl", qrels_path):
        if not needed.exists():
            raise FileNotFoundError(
                f"{needed} not found: a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv"
            )
    rows = []
    with open(folder / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            text = f"{doc.get('title', '')} {doc.get('text', '')}".strip()
            rows.append(
                {
                    "chunk_id": str(doc["_id"]),
                    "doc_id": str(doc["_id"]),
                    "strategy": "beir",
                    "text": text,
                    "char_start": 0,
                    "char_end": len(text),
                    "page_start": 1,
                    "page_end": 1,
                    "section_path": [],
                    "prev_chunk_id": None,
                    "next_chunk_id": None,
                    "n_tokens": len(text.split()),
                    "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                    "table_html": None,
                }
            )
    qrels: dict[str, dict[str, int]] = {}
    with open(qrels_path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"].strip(), {})[row["corpus-id"].strip()] = int(row["score"])
    queries = {}
    with open(folder / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            q = json.loads(line)
            if str(q["_id"]) in qrels:  # only `text` is read: BEIR metadata may hold the answers
                queries[str(q["_id"])] = q["text"]
    return BeirDataset(folder.name, pd.DataFrame(rows), queries, qrels)


def open_beir_index(
    ds: BeirDataset,
    mode: str,
    model: str | None,
    root: Path,
    qdrant: QdrantSettings | None = None,
    progress: Progress | None = None,
    bm25: BM25Source | None = None,
) -> tuple[Index, dict]:
    """Index once, reuse afterwards: both parts sync incrementally, so a second run embeds nothing."""
    strategy = f"beir-{ds.name}"
    started = time.perf_counter()
    bm25_dir = bm25_root(root, strategy)
    sync_bm25(ds.corpus, bm25_dir)
    client = alias = embedder = None
    info: dict = {}
    if mode in DENSE_MODES:
        if not model:
            raise RetrievalError(f"mode {mode!r} needs --model")
        embedder = load_embedder(model)
        client = get_client(qdrant)
        run = sync_collection(client, ds.corpus, embedder, strategy=strategy, model=model, progress=progress)
        alias = run.alias
        info["collection"] = run.summary
    info["index_seconds"] = round(time.perf_counter() - started, 2)
    searches = (
        qdrant or QdrantSettings.from_env()
    )  # the breadth / exact search serving uses (RAG_HNSW_EF, RAG_EXACT_SEARCH)
    return Index(
        ds.corpus.set_index("chunk_id"),
        open_bm25(bm25_dir, client, alias, bm25),
        client,
        alias,
        embedder,
        hnsw_ef=searches.hnsw_ef,
        exact=searches.exact_search,
    ), info


def evaluate_beir(
    folder: Path,
    *,
    mode: str,
    model: str | None,
    split: str = "test",
    k: int = 10,
    root: Path,
    params: RetrievalParams | None = None,
    qdrant: QdrantSettings | None = None,
    progress: Progress | None = None,
) -> dict:
    from ranx import evaluate

    from rag.evaluation.ranx_input import ranx_lists

    if mode not in RETRIEVERS:
        raise RetrievalError(f"unknown retrieval mode {mode!r} (known: {', '.join(RETRIEVERS)})")
    ds = load_beir(folder, split)
    index, info = open_beir_index(ds, mode, model, root, qdrant, progress)
    params = (params or RetrievalParams()).model_copy(update={"k": max(100, k), "candidates": max(100, k)})
    started = time.perf_counter()
    run: dict[str, dict[str, float]] = {}
    advance = counter(progress, f"retrieving ({mode})", len(ds.queries), "queries")
    for qid, text in ds.queries.items():
        hits = retrieve(index, text, mode, params)
        # ranx needs distinct scores in rank order; fused ties are already broken deterministically.
        run[qid] = {h.chunk["chunk_id"]: float(len(hits) - h.rank + 1) for h in hits}
        advance()
    seconds = time.perf_counter() - started
    metric_names = [f"ndcg@{k}", f"recall@{k}", "recall@100", f"mrr@{k}", f"map@{k}"]
    scores = evaluate(*ranx_lists(ds.qrels, run, sorted(ds.qrels)), metric_names)
    return {
        **{m: round(float(v), 4) for m, v in scores.items()},
        "n_queries": len(ds.queries),
        "seconds": round(seconds, 2),
        "query_ms_mean": round(1000 * seconds / max(1, len(ds.queries)), 2),
        "dataset": ds.name,
        "split": split,
        "mode": mode,
        "model": model if mode in DENSE_MODES else None,
        "alpha": params.alpha if mode == "hybrid-cc" else None,
        **info,
    }
