"""Retrieval figures, each beside its baseline measured in the same run. Prints; asserts nothing.

    .venv/bin/python bench/retrieval.py [--quick] [--model minilm] [--json OUT]

1. SciFact test nDCG@10 for bm25, dense, hybrid-rrf, hybrid-cc (α chosen on the *train* split), beside
   the published anchors (MiniLM 0.645 MTEB, BM25 0.665 BEIR).
2. Indexing throughput: the whole embed-and-upsert path vs plain `model.encode` on the same texts.
3. Query latency p50/p95 per mode at SciFact size (5k) and at a synthetic ~100k points
   (SciFact + SQuAD paragraphs + repeats; repeated texts reuse their vectors).
4. Incremental re-index: 1 % and 10 % of documents changed vs a full build.
Indexes live under RAG_DATA_DIR (default ./data) and are reused by later runs.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench.lib import cli
from bench.lib.datasets import SCIFACT, SQUAD, absent
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import write
from rag.embedding import load_embedder
from rag.evaluation.beir import load_beir, open_beir_index
from rag.index.bm25 import BM25Index
from rag.index.qdrant import (
    DENSE,
    CollectionName,
    create_collection,
    engine_of,
    get_client,
    point_alias_to,
    point_id,
)
from rag.index.sync import sync_bm25, sync_collection
from rag.progress import cli_progress
from rag.retrieval import Index, RetrievalParams, SearchFilter, bm25_ranking, dense_ranking, retrieve
from rag.retrieval.fusion import convex_combination, reciprocal_rank_fusion
from rag.store import data_dir

ANCHORS = {"bm25": 0.665, "dense": 0.645}
NO_FILTER = SearchFilter()


def ndcg_at_10(qrels: dict, runs: dict[str, list[tuple[str, float]]]) -> float:
    from ranx import Qrels, Run, evaluate

    run = {q: {cid: float(len(r) - i) for i, (cid, _) in enumerate(r)} for q, r in runs.items()}
    return float(evaluate(Qrels(qrels), Run(run), "ndcg@10", make_comparable=True))


def rankings(index: Index, queries: dict[str, str], depth: int = 100):
    dense = {q: dense_ranking(index, t, depth, NO_FILTER) for q, t in queries.items()}
    sparse = {q: bm25_ranking(index, t, depth, NO_FILTER) for q, t in queries.items()}
    return dense, sparse


def scifact_slice(test, distractors: int, seed: int = 0):
    """The documents relevant to the test queries plus seeded distractors: embedding all 5,183 abstracts takes
    about 5 minutes on 2 cores, more than a quick run has. Scores on a slice run higher than the anchors."""
    import dataclasses
    import random

    relevant = {d for rel in test.qrels.values() for d in rel}
    others = sorted(set(test.corpus["chunk_id"]) - relevant)
    keep = relevant | set(random.Random(seed).sample(others, min(distractors, len(others))))
    return dataclasses.replace(
        test, name=f"{test.name}-slice{len(keep)}", corpus=test.corpus[test.corpus["chunk_id"].isin(keep)]
    )


def quality(model: str, root: Path, slice_distractors: int | None = None) -> dict:
    """nDCG@10 per mode on SciFact test; α of the convex combination swept on train (full corpus only: the train
    queries' documents are not in a slice, so a slice uses α = 0.5)."""
    test = load_beir(SCIFACT, "test")
    if slice_distractors is not None:
        test = scifact_slice(test, slice_distractors)
    index, info = open_beir_index(test, "hybrid-cc", model, root, progress=cli_progress())
    print(f"  SciFact index ready ({info['index_seconds']}s; collection {info['collection']['points']} points)")
    d_test, s_test = rankings(index, test.queries)
    if slice_distractors is None:
        train = load_beir(SCIFACT, "train")
        d_train, s_train = rankings(index, train.queries)
        alphas = [round(a, 1) for a in np.arange(0.1, 1.0, 0.1)]
        sweep = {
            a: ndcg_at_10(train.qrels, {q: convex_combination(d_train[q], s_train[q], a) for q in train.queries})
            for a in alphas
        }
        best = max(sweep, key=sweep.get)
    else:
        sweep, best = {}, 0.5
    out = {
        "bm25": ndcg_at_10(test.qrels, s_test),
        "dense": ndcg_at_10(test.qrels, d_test),
        "hybrid-rrf": ndcg_at_10(
            test.qrels, {q: reciprocal_rank_fusion([d_test[q], s_test[q]], k=60) for q in test.queries}
        ),
        "hybrid-cc": ndcg_at_10(test.qrels, {q: convex_combination(d_test[q], s_test[q], best) for q in test.queries}),
    }
    if sweep:
        print("  α swept on train: " + ", ".join(f"{a}:{v:.4f}" for a, v in sweep.items()) + f" → α={best}")
    print(f"  {'mode':12s} {'nDCG@10':>8s} {'anchor':>8s}")
    for mode, value in out.items():
        anchor = ANCHORS.get(mode)
        print(f"  {mode:12s} {value:8.4f} {anchor if anchor else '':>8}")
    return {
        "ndcg@10": out,
        "alpha_train_sweep": sweep,
        "alpha": best,
        "documents": len(test.corpus),
        "slice": slice_distractors is not None,
        "index": index,
    }


def throughput(model: str, n: int, client) -> dict:
    embedder = load_embedder(model)
    corpus = load_beir(SCIFACT, "test").corpus.head(n)
    texts = corpus["text"].tolist()
    raw_times, pipe_times = [], []
    for round_ in range(2):
        started = time.perf_counter()
        embedder._model.encode(
            texts, batch_size=embedder.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        raw_times.append(time.perf_counter() - started)
        strategy = f"bench-throughput-{round_}"
        started = time.perf_counter()
        sync_collection(client, corpus, embedder, strategy=strategy, model=model)
        pipe_times.append(time.perf_counter() - started)
        for c in client.get_collections().collections:
            if c.name.startswith(strategy):
                client.delete_collection(c.name)
    raw, pipe = statistics.median(raw_times), statistics.median(pipe_times)
    result = {"texts": n, "encode_per_s": n / raw, "pipeline_per_s": n / pipe, "ratio": raw / pipe}
    print(
        f"  {n} SciFact texts: model.encode {result['encode_per_s']:.1f}/s, embed+upsert "
        f"{result['pipeline_per_s']:.1f}/s, "
        f"ratio {result['ratio']:.2f} (goal ≥ 0.9)"
    )
    return result


def latency(index: Index, queries: list[str], label: str, n_queries: int) -> dict:
    out = {}
    for mode in ["bm25", "dense", "hybrid-rrf", "hybrid-cc"]:
        times = []
        for q in queries[:n_queries]:
            started = time.perf_counter()
            retrieve(index, q, mode, RetrievalParams(k=10))
            times.append(1000 * (time.perf_counter() - started))
        out[mode] = {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95))}
        print(f"  {label:>9s} {mode:12s} p50 {out[mode]['p50_ms']:8.1f} ms  p95 {out[mode]['p95_ms']:8.1f} ms")
    return out


def squad_paragraphs() -> list[str]:
    with gzip.open(SQUAD, "rt", encoding="utf-8") as fh:
        data = json.load(fh)["data"]
    return [p["context"] for article in data for p in article["paragraphs"]]


def big_index(scifact: Index, model: str, size: int, client, root: Path, with_squad: bool = True) -> Index:
    """~`size` points: SciFact vectors (scrolled from its collection), SQuAD paragraphs (embedding them costs
    minutes: a quick run repeats SciFact's only), then repeats."""
    embedder = load_embedder(model)
    alias = CollectionName(f"bench-{size}" + ("" if with_squad else "-quick"), model).alias
    texts, vectors, offset = [], [], None
    while True:
        points, offset = client.scroll(
            scifact.alias, limit=2048, offset=offset, with_payload=["text"], with_vectors=[DENSE]
        )
        texts += [p.payload["text"] for p in points]
        vectors += [p.vector[DENSE] for p in points]
        if offset is None:
            break
    squad = squad_paragraphs() if with_squad else []
    texts += squad
    base = len(texts)
    ids = [f"u{i}" for i in range(base)] + [f"r{i}" for i in range(size - base)]
    all_texts = [texts[i % base] for i in range(size)]
    collection = f"{alias}__{embedder.version}__cosine"
    if not client.collection_exists(collection):  # built once; later runs reuse it
        vectors += embedder.encode_passages(squad).tolist()
        create_collection(client, collection, embedder.dim, "cosine")
        from qdrant_client import models

        for i in range(0, size, 2000):
            client.upsert(
                collection,
                points=models.Batch(
                    ids=[point_id(c) for c in ids[i : i + 2000]],
                    vectors={DENSE: [vectors[j % base] for j in range(i, min(size, i + 2000))]},
                    payloads=[{"chunk_id": c} for c in ids[i : i + 2000]],
                ),
                wait=True,
            )
        point_alias_to(client, alias, collection)
    chunks = pd.DataFrame(
        {
            "chunk_id": ids,
            "doc_id": ids,
            "text": all_texts,
            "page_start": 1,
            "page_end": 1,
            "char_start": 0,
            "char_end": [len(t) for t in all_texts],
            "content_hash": [str(i % base) for i in range(size)],
        }
    )
    bm25_dir = root / "indexes" / "bm25" / (f"bench-{size}" + ("" if with_squad else "-quick"))
    sync_bm25(chunks, bm25_dir)
    return Index(chunks.set_index("chunk_id"), BM25Index.load(bm25_dir), client, alias, embedder)


def incremental(model: str, n: int, client) -> dict:
    embedder = load_embedder(model)
    corpus = load_beir(SCIFACT, "test").corpus.head(n).copy()
    strategy = "bench-incremental"
    for c in client.get_collections().collections:
        if c.name.startswith(strategy):
            client.delete_collection(c.name)
    started = time.perf_counter()
    full = sync_collection(client, corpus, embedder, strategy=strategy, model=model)
    full_s = time.perf_counter() - started
    out = {"documents": n, "full_build_s": full_s}
    for share in (0.01, 0.10):
        changed = corpus.copy()
        rows = changed.sample(frac=share, random_state=int(share * 100)).index
        changed.loc[rows, "text"] = changed.loc[rows, "text"] + f" (revised {share})"
        changed.loc[rows, "content_hash"] = changed.loc[rows, "content_hash"] + f"-{share}"
        started = time.perf_counter()
        run = sync_collection(client, changed, embedder, strategy=strategy, model=model)
        seconds = time.perf_counter() - started
        out[f"{int(share * 100)}%"] = {"seconds": seconds, "ratio": seconds / full_s, "updated": run.updated}
        print(
            f"  {int(share * 100):>3d}% of {n} changed: {seconds:.2f}s vs full build {full_s:.1f}s → ratio "
            f"{seconds / full_s:.3f}" + (" (goal ≤ 0.05)" if share == 0.01 else "")
        )
        corpus = changed
    out["full_build_points"] = full.points
    return out


def main() -> int:
    parser = cli.parser(__doc__)
    cli.add_quick(parser, "small sizes: minutes, not the full figures")
    parser.add_argument("--model", default="minilm")
    cli.add_output(parser, flags=("--json",), help="also write the figures here")
    parser.add_argument(
        "--only",
        default="quality,throughput,latency,incremental",
        help="comma-separated sections to run (latency needs the SciFact index that quality builds)",
    )
    args = parser.parse_args()
    started = {**run_record(args), "data_dir": str(data_dir())}
    results = run(args.model, args.quick, set(args.only.split(",")))
    if args.json:
        write(stamp_end({**started, **results}), args.json, indent=2, default=float)
    return 0


def run(model: str = "minilm", quick: bool = False, only: set[str] | None = None) -> dict:
    """Every figure of this benchmark (or the sections in `only`), printed as it goes and returned."""
    only = only or {"quality", "throughput", "latency", "incremental"}
    if absent(SCIFACT, "SciFact in BEIR layout"):
        return {}
    root = data_dir() / "beir"
    client = get_client()
    results: dict = {"model": model, "quick": quick, "engine": engine_of(client)}
    scifact_index = None
    if "quality" in only or "latency" in only:
        print("1. SciFact test nDCG@10")
        q = (
            quality(model, root, 700 if quick else None)
            if "quality" in only
            else {"index": open_beir_index(load_beir(SCIFACT), "hybrid-cc", model, root)[0]}
        )
        scifact_index = q.pop("index")
        results["quality"] = q
    if "throughput" in only:
        print("2. indexing throughput")
        results["throughput"] = throughput(model, 200 if quick else 1000, client)
    if "latency" in only:
        print("3. query latency")
        queries = list(load_beir(SCIFACT, "test").queries.values())
        label = f"{max(1, round(len(scifact_index.chunks) / 1000))}k"  # 5k for all of SciFact, 1k for the quick slice
        results["latency"] = {label: latency(scifact_index, queries, label, 30 if quick else 100)}
        for size in [20_000] if quick else [20_000, 100_000]:
            big = big_index(scifact_index, model, size, client, data_dir() / "bench", with_squad=not quick)
            results["latency"][f"{size // 1000}k"] = latency(big, queries, f"{size // 1000}k", 20 if quick else 50)
    if "incremental" in only:
        print("4. incremental re-index")
        results["incremental"] = incremental(model, 300 if quick else 2000, client)
    return results


if __name__ == "__main__":
    sys.exit(main())
