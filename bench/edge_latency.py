"""Embedded engines side by side on SciFact at 20k / 100k / 1M points: Qdrant Edge (rag.index.edge) and, up to
--local-max-points, qdrant-client's local mode. End-to-end retrieval latency per mode and query encoder, HNSW recall,
build / reopen time, RSS and disk, and SciFact nDCG@10 per mode. Writes its own JSON (arguments, commit, date,
machine; rewritten after every engine x size, so a long run's finished parts survive); asserts nothing.

    .venv/bin/python bench/edge_latency.py      # all defaults: ~1.5 h on 2 idle cores (1M dominates), ~9 GB peak RSS
                                                # (BM25 over 1M texts); a first run adds ~10 min of corpus encoding
    .venv/bin/python bench/edge_latency.py --points 6000 --queries 20 --encoders minilm --corpus-limit 300  # smoke

Data (SciFact, BEIR layout under ../shared/datasets/scifact; the run prints a message and stops when it is absent):
  corpus         title + text of every abstract, one chunk per document (as rag eval-beir indexes it); 5,183 rows.
  vectors        the corpus encoded once per encoder (passage side) and cached as .npy under --cache (default
                 <data dir>/bench/edge-latency), keyed by encoder, its weights version and a hash of the corpus: a
                 second run encodes nothing. The JSON says whether each came from the cache; encoding time is no
                 part of any figure below.
  N points       row r is copy r // D of document r % D (D = corpus size). Copy 0 is the document itself; copy c >= 1
                 has the document's vector plus Gaussian noise N(0, sigma^2 / dim) per component (a noise vector
                 of norm ~ --sigma), renormalised, and its own chunk_id and doc_id ("<doc>~c<c>"). With --copies
                 mixture the copy starts from (1 - t) * its document's vector + t * a random document's, t ~
                 U(0, --mix-max), instead: isotropic copies make each real vector the hub of a star of N/D copies,
                 which caps HNSW recall once N/D passes 2m (points_matrix says why). Every copy keeps
                 its document's text: the chunk table (payload of the hits) and BM25 hold N rows, so BM25 ranks N
                 documents in which each text occurs ~N/D times. The big collections hold the vectors of the first
                 --encoders entry (--collection-encoder): the other encoder's queries search them (its own
                 passage vectors are used only in the quality section). Quality is measured without copies.
  queries        the SciFact test queries (300), the first --queries of them timed.

Per engine and N (in folders under --root, removed afterwards unless --keep):
  build          through the product's calls (rag.index.qdrant, rag.index.sync.point_batch): tokenizing every text
                 for the BM25 sparse vectors (rag.index.bm25_sparse.PassageTerms, when --bm25 has "engine"),
                 create_collection (payload indexes, the bm25 sparse vector), upsert of models.Batch in batches of
                 --batch (point ids UUID5(chunk_id), payload as rag.index.sync writes it: text included), optimize
                 (Edge builds HNSW here; a no-op for local mode), alias swap; tokenizing, upsert (which includes
                 the tokenizing) and optimize seconds apart.
  bm25s          (when --bm25 has "bm25s") rag.index.sync.sync_bm25 over the N-row chunk table (tokenize, index,
                 save), and BM25Index.load; once per N (both engines read the same bm25s index).
  BM25 sources   "engine" (the product's default: the collection's sparse vectors ranked by the engine,
                 rag.index.bm25_sparse.EngineBM25) and "bm25s" (the strategy's bm25s index): latency rows and quality
                 rows per encoder and source; dense and the encoding alone are timed once per encoder.
  reopen         close the client, open the folder again (rag.index.qdrant.get_client) and count the points.
  disk           du of the engine folder and of the BM25 folder (MB allocated).
  rss            process RSS (psutil) before the reopen and after the queries, and the growth between them (the
                 engine's share: the benchmark's own arrays are freed before the reopen); ru_maxrss is the process
                 peak so far (it includes the build and everything before it).
  latency        wall ms of rag.retrieval.retrieve(index, question, mode, RetrievalParams(k=10)) plus each hit's
                 to_json() (payload from the chunk table): question text -> top-10 hits with payload. Every timed
                 call starts with an empty query-vector cache, so each mode pays its own query encoding (the
                 hybrids encode once, as in the product). Modes (and "encode", encode_queries([q]) alone, to show
                 the encoder's share) and encoders take turns on every query, the mode order rotating per query, so
                 a shared machine's load falls on all alike. --warmup queries first, untimed. p50 / p95 / mean.
                 Every row also gives the ms spent in garbage collection during its calls and how many calls
                 held a full collection; with --gc-freeze every row is timed again after gc.freeze(), rows
                 '<label>/gc-frozen'.
                 With --exact, rows '<encoder>/exact' time dense and both hybrids with exact dense search
                 (Index.exact, RAG_EXACT_SEARCH in the product); the timed HNSW rows use --hnsw-ef.
  recall         dense top-k of the engine's default search (HNSW where Edge has built it) against the exact top-k
                 computed in numpy over the same N vectors and the same query vectors: recall@10 of a limit-10
                 search, recall@10 and recall@100 of a limit-100 search (what retrieve asks for: candidates=100),
                 and recall@10 of the engine's own SearchParams(exact=True) search, whose wall ms is timed too;
                 then recall@10 of a limit-100 search and its dense-only time at each hnsw_ef of --recall-ef.
Quality (per engine and encoder, N = D, no copies, each encoder's own passage vectors): SciFact test nDCG@10 and
recall@100 per mode, all test queries, retrieve with k = candidates = 100 as rag eval-beir does, hybrid-cc at
alpha 0.5 (RetrievalParams' default), scored by ranx (rag.evaluation.metrics.evaluate_run).
The graph is built with --hnsw-m / --hnsw-ef-construct (rag.index.qdrant.HnswBuild; the engine's 16 / 100 if not given).
Edge's knobs (--indexing-threshold-kb, --full-scan-threshold-kb, --max-indexing-threads) default to Edge's defaults
(the product's): segments under ~10 MB of vectors are searched exactly even when indexed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from bench.lib import cli
from bench.lib.datasets import RESULTS, scifact_absent
from bench.lib.edge import (
    COPY_KINDS,
    build,
    chunk_table,
    close,
    corpus_hash,
    corpus_vectors,
    default_cache,
    exact_top,
    folder_mb,
    names,
    open_client,
    points_matrix,
)
from bench.lib.provenance import run_record
from bench.lib.results import finish, log, stats, write

# Local mode always scans exactly and says so on every query given search_params; it also warns past 20k points.
warnings.filterwarnings("ignore", message="Local mode performs exact")
warnings.filterwarnings("ignore", message=".*Local mode is not recommended.*")
MODES = ["bm25", "dense", "hybrid-rrf", "hybrid-cc"]


def rss_mb() -> float:
    import psutil

    return round(psutil.Process().memory_info().rss / 2**20, 1)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KB on Linux


def reopen(engine: str, folder: Path, encoder: str, version: str, args: argparse.Namespace):
    started = time.perf_counter()
    client = open_client(engine, folder, args)
    count = client.count(names(encoder, version)[1], exact=True).count
    return client, {"reopen_seconds": round(time.perf_counter() - started, 3), "count_after_reopen": count}


def build_bm25(table: pd.DataFrame, folder: Path) -> tuple[object, dict]:
    from rag.index.bm25 import BM25Index
    from rag.index.sync import sync_bm25

    shutil.rmtree(folder, ignore_errors=True)
    started = time.perf_counter()
    sync_bm25(table, folder)
    build_seconds = time.perf_counter() - started
    started = time.perf_counter()
    bm25 = BM25Index.load(folder)
    return bm25, {
        "build_seconds": round(build_seconds, 2),
        "load_seconds": round(time.perf_counter() - started, 3),
        "disk_mb": folder_mb(folder),
        "documents": len(table),
        "process_peak_rss_mb_after": peak_rss_mb(),
    }


# --- measurements ------------------------------------------------------------------------------------------------

BM25_MODES = ["bm25", "hybrid-rrf", "hybrid-cc"]  # the modes a BM25 source changes
EXACT_MODES = ["dense", "hybrid-rrf", "hybrid-cc"]  # the modes exact dense search changes


def label(encoder: str, source: str) -> str:
    """A latency / quality row: the encoder alone is BM25 from the engine (the product's default), '/bm25s' the
    other."""
    return encoder if source == "engine" else f"{encoder}/bm25s"


def arms_of(source: str, first: bool) -> list[str]:
    """Dense and the encoding alone do not depend on the BM25 source: timed once per encoder."""
    return MODES + ["encode"] if first else BM25_MODES


class GcClock:
    """Milliseconds the interpreter spent in cyclic garbage collection, and how many full (generation 2) ones ran, while
    installed (gc.callbacks): a latency tail that is a collection, not the search, shows up here."""

    def __init__(self):
        self.ms, self.full, self._started = 0.0, 0, None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.ms += 1000 * (time.perf_counter() - self._started)
            self.full += info.get("generation") == 2
            self._started = None

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def timed_retrieval(indexes: dict, queries: list[str], warmup: int) -> dict:
    """{label: {mode: stats}}: question text -> top-10 hits with payload, every call encoding its query afresh.
    `indexes` maps a label to (index, modes to time). Each row also says how much of its time was garbage collection
    (gc_ms_mean, gc_ms_max, calls_with_a_full_gc)."""
    from rag.retrieval import RetrievalParams, retrieve

    params = RetrievalParams(k=10)
    times = {name: {m: [] for m in arms} for name, (_, arms) in indexes.items()}
    in_gc = {name: {m: [] for m in arms} for name, (_, arms) in indexes.items()}
    full_gcs = {name: {m: 0 for m in arms} for name, (_, arms) in indexes.items()}
    warm = queries[:warmup]  # fewer than --warmup when fewer queries are timed: every timed query still counts
    with GcClock() as clock:
        for i, q in enumerate(warm + queries):
            for enc, (index, arms) in indexes.items():
                shift = i % len(arms)
                for mode in arms[shift:] + arms[:shift]:
                    index._query_vectors.clear()  # untimed: the call below encodes its question itself
                    gc_ms, gc_full = clock.ms, clock.full
                    started = time.perf_counter()
                    if mode == "encode":
                        index.embedder.encode_queries([q])
                    else:
                        hits = [h.to_json() for h in retrieve(index, q, mode, params)]
                    elapsed = 1000 * (time.perf_counter() - started)
                    if i >= len(warm):
                        times[enc][mode].append(elapsed)
                        in_gc[enc][mode].append(clock.ms - gc_ms)
                        full_gcs[enc][mode] += clock.full > gc_full
                        if mode != "encode" and not hits:
                            log(f"  note: {enc} {mode} found nothing for {q!r}")
    return {
        enc: {
            m: {
                **stats(t),
                "gc_ms_mean": round(float(np.mean(in_gc[enc][m])), 3),
                "gc_ms_max": round(float(np.max(in_gc[enc][m])), 3),
                "calls_with_a_full_gc": full_gcs[enc][m],
            }
            for m, t in by.items()
        }
        for enc, by in times.items()
    }


def recall_figures(
    client, alias: str, query_vectors: np.ndarray, truth: np.ndarray, row_of: dict[str, int], efs: list[int]
) -> dict:
    """Default (HNSW) search vs numpy's exact top-k; the engine's own exact search as a check, timed; and recall@10
    of a limit-100 search at each hnsw_ef of `efs`, timed (dense only, vector given)."""
    from qdrant_client.http import models

    from rag.index.qdrant import DENSE

    def search(q, limit, params=None):
        points = client.query_points(
            alias, query=q.tolist(), using=DENSE, limit=limit, search_params=params, with_payload=["chunk_id"]
        ).points
        return [row_of[p.payload["chunk_id"]] for p in points]

    r10, r10_of100, r100, r10_exact, exact_ms, default_ms = [], [], [], [], [], []
    for q, top in zip(query_vectors, truth):
        t10, t100 = set(top[:10].tolist()), set(top[:100].tolist())
        started = time.perf_counter()
        found10 = search(q, 10)
        default_ms.append(1000 * (time.perf_counter() - started))
        found100 = search(q, 100)
        started = time.perf_counter()
        exact10 = search(q, 10, models.SearchParams(exact=True))
        exact_ms.append(1000 * (time.perf_counter() - started))
        r10.append(len(t10 & set(found10)) / 10)
        r10_of100.append(len(t10 & set(found100[:10])) / 10)
        r100.append(len(t100 & set(found100)) / 100)
        r10_exact.append(len(t10 & set(exact10)) / 10)
    mean = lambda xs: round(float(np.mean(xs)), 4)  # noqa: E731
    by_ef = {}
    for ef in efs:
        found, ms = [], []
        for q, top in zip(query_vectors, truth):
            started = time.perf_counter()
            got = search(q, 100, models.SearchParams(hnsw_ef=ef))
            ms.append(1000 * (time.perf_counter() - started))
            found.append(len(set(top[:10].tolist()) & set(got[:10])) / 10)
        by_ef[str(ef)] = {"recall@10_of_limit100": mean(found), "dense_only_limit100": stats(ms)}
    return {
        "recall@10": mean(r10),
        "recall@10_of_limit100": mean(r10_of100),
        "recall@100": mean(r100),
        "recall@10_engine_exact": mean(r10_exact),
        "dense_only_default_limit10": stats(default_ms),
        "dense_only_exact_limit10": stats(exact_ms),
        "by_hnsw_ef": by_ef,
        "n": len(r10),
    }


def quality(
    engine: str,
    folder: Path,
    corpus: pd.DataFrame,
    bm25s,
    embedder,
    encoder: str,
    vectors: np.ndarray,
    test,
    args: argparse.Namespace,
) -> list[dict]:
    """One row per BM25 source of --bm25: nDCG@10 and recall@100 per mode (dense is the same in every row)."""
    from rag.evaluation.metrics import evaluate_run
    from rag.index.bm25_sparse import EngineBM25
    from rag.retrieval import Index, RetrievalParams, retrieve

    built = build(engine, folder, corpus, vectors, encoder, embedder.version, args)
    client, _ = reopen(engine, folder, encoder, embedder.version, args)
    alias = names(encoder, embedder.version)[1]
    params = RetrievalParams(k=100, candidates=100)
    rows = []
    for source in args.bm25:
        index = Index(
            corpus.set_index("chunk_id"),
            EngineBM25(client, alias) if source == "engine" else bm25s,
            client,
            alias,
            embedder,
        )
        index.embed_queries(list(test.queries.values()))  # untimed here: one batch, shared by the four modes
        out = {
            "engine": engine,
            "encoder": encoder,
            "bm25_source": source,
            "documents": len(corpus),
            "queries": len(test.queries),
            "build_seconds": built["build_seconds"],
        }
        for mode in MODES:
            run = {
                qid: {h.chunk["chunk_id"]: float(100 - h.rank + 1) for h in retrieve(index, text, mode, params)}
                for qid, text in test.queries.items()
            }
            mean, _ = evaluate_run(test.qrels, run, ["ndcg@10", "recall@100"])
            out[mode] = {m: round(float(v), 4) for m, v in mean.items()}
        rows.append(out)
        log(f"quality {engine} {label(encoder, source)}: " + ", ".join(f"{m} {out[m]['ndcg@10']:.3f}" for m in MODES))
    close(engine, folder, client)
    shutil.rmtree(folder, ignore_errors=True)
    return rows


# --- run ---------------------------------------------------------------------------------------------------------


def print_table(out: dict) -> None:
    print("\nquality (SciFact test, no copies): nDCG@10")
    print(f"  {'engine':6s} {'encoder':18s} " + " ".join(f"{m:>10s}" for m in MODES))
    for q in out["quality"]:
        print(
            f"  {q['engine']:6s} {label(q['encoder'], q['bm25_source']):18s} "
            + " ".join(f"{q[m]['ndcg@10']:10.4f}" for m in MODES)
        )
    print("\nlatency, question -> top-10 hits with payload: p50 / p95 ms (encode: the query encoding alone)")
    print(f"  {'engine':6s} {'points':>8s} {'encoder':18s} " + " ".join(f"{m:>15s}" for m in MODES + ["encode"]))
    for r in out["runs"]:
        for enc, by in r["latency"].items():
            cells = " ".join(
                f"{by[m]['p50_ms']:7.1f}/{by[m]['p95_ms']:7.1f}" if m in by else f"{'-':>15s}"
                for m in MODES + ["encode"]
            )
            print(f"  {r['engine']:6s} {r['points']:8d} {enc:18s} {cells}")
            full = {
                m: by[m]["calls_with_a_full_gc"]
                for m in MODES + ["encode"]
                if by.get(m, {}).get("calls_with_a_full_gc")
            }
            if full:
                print(f"  {'':6s} {'':8s} {'':18s} calls holding a full garbage collection: {full}")
    print(
        "\nengine per N: build (upsert + optimize) s, reopen s, recall@10 vs exact, disk MB, RSS growth MB; BM25 "
        "build s"
    )
    for r in out["runs"]:
        rec = " ".join(f"{enc}:{v['recall@10']:.3f}" for enc, v in r["recall"].items())
        print(
            f"  {r['engine']:6s} {r['points']:8d} build {r['build']['build_seconds']:8.1f} reopen "
            f"{r['reopen_seconds']:7.2f} "
            f"recall {rec} disk {r['disk_mb']:8.1f} rss+ {r['rss_mb']['engine_growth']:7.1f} "
            f"bm25s {r['bm25']['build_seconds'] if r['bm25'] else '-'}"
        )
        for enc, v in r["recall"].items():
            sweep = ", ".join(
                f"ef {ef}: {x['recall@10_of_limit100']:.3f} ({x['dense_only_limit100']['p95_ms']:.1f} ms p95)"
                for ef, x in v.get("by_hnsw_ef", {}).items()
            )
            if sweep:
                print(f"    {enc} recall@10 of a limit-100 search by hnsw_ef: {sweep}")
    for s in out["skipped"]:
        print(f"  {s['engine']:6s} {s['points']:8d} skipped: {s['reason']}")


def main() -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--points", type=int, nargs="+", default=[20_000, 100_000, 1_000_000])
    ap.add_argument("--engines", nargs="+", default=["edge", "local"], choices=["edge", "local"])
    ap.add_argument("--encoders", nargs="+", default=["minilm", "minilm-int8"])
    ap.add_argument(
        "--collection-encoder", help="whose passage vectors fill the big collections (default: the first of --encoders)"
    )
    ap.add_argument(
        "--local-max-points",
        type=int,
        default=100_000,
        help="local mode only up to this N (it holds every point in memory)",
    )
    ap.add_argument("--queries", type=int, default=300, help="SciFact test queries timed (there are 300)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument(
        "--sigma", type=float, default=0.5, help="norm of the noise added to a copy's vector (before renormalising)"
    )
    ap.add_argument(
        "--copies",
        choices=COPY_KINDS,
        default="isotropic",
        help="how copies are made (points_matrix): isotropic noise around the document, or a mixture "
        "towards a random other document plus the noise",
    )
    ap.add_argument("--mix-max", type=float, default=0.5, help="largest share of the other document in a mixture copy")
    ap.add_argument("--batch", type=int, default=512, help="points per upsert (the sync path's default)")
    ap.add_argument("--no-quality", action="store_true", help="skip the nDCG@10 section")
    ap.add_argument(
        "--bm25",
        nargs="+",
        default=["engine", "bm25s"],
        choices=["engine", "bm25s"],
        help="BM25 sources: the collection's sparse vectors (the product's default) and the bm25s index",
    )
    ap.add_argument("--hnsw-ef", type=int, help="hnsw_ef of the timed searches (default: the engine's, as the product)")
    ap.add_argument(
        "--recall-ef",
        type=int,
        nargs="*",
        default=[128, 256, 512],
        help="hnsw_ef values whose recall@10 (limit 100) and dense search time are measured",
    )
    ap.add_argument(
        "--hnsw-m", type=int, help="the graph's m at build (default: the engine's, 16; RAG_HNSW_M in the product)"
    )
    ap.add_argument(
        "--hnsw-ef-construct",
        type=int,
        help="the graph's ef_construct at build (default: the engine's, 100; RAG_HNSW_EF_CONSTRUCT in the product)",
    )
    ap.add_argument(
        "--exact",
        action="store_true",
        help="also time dense and hybrid searches with exact dense search (rows '<encoder>/exact')",
    )
    ap.add_argument(
        "--gc-freeze",
        action="store_true",
        help="time every row again after gc.freeze() (rows '<label>/gc-frozen'). A second, warmer pass: "
        "read its gc figures beside the first pass's, not only its times",
    )
    ap.add_argument(
        "--corpus-limit", type=int, help="only the first M abstracts (smoke tests: nDCG then means nothing)"
    )
    ap.add_argument("--indexing-threshold-kb", type=int)
    ap.add_argument("--full-scan-threshold-kb", type=int)
    ap.add_argument("--max-indexing-threads", type=int)
    cli.add_seed(ap)
    cli.add_scifact(ap)
    cli.add_vectors_cache(ap)
    ap.add_argument("--root", type=Path, help="folder for the engines' data (default: a temporary one, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the engine and BM25 folders under --root")
    cli.add_output(ap, RESULTS / "edge-latency.json")
    args = ap.parse_args()

    if scifact_absent(args.scifact):
        return 0
    import torch

    from rag.embedding import load_embedder
    from rag.evaluation.beir import load_beir
    from rag.index.bm25_sparse import EngineBM25
    from rag.retrieval import Index

    cache = args.cache or default_cache()
    test = load_beir(args.scifact, "test")
    corpus = test.corpus if args.corpus_limit is None else test.corpus.head(args.corpus_limit).reset_index(drop=True)
    questions = list(test.queries.values())
    timed = questions[: args.queries]
    embedders = {enc: load_embedder(enc) for enc in args.encoders}
    base_encoder = args.collection_encoder or args.encoders[0]
    if base_encoder not in embedders:
        embedders[base_encoder] = load_embedder(base_encoder)
    vectors, cache_info = {}, {}
    for enc, embedder in embedders.items():
        vectors[enc], cache_info[enc] = corpus_vectors(enc, embedder, corpus, cache)
    query_vectors = {enc: e.encode_queries(timed) for enc, e in embedders.items() if enc in args.encoders}
    root = args.root or Path(tempfile.mkdtemp(prefix="edge-latency-"))
    root.mkdir(parents=True, exist_ok=True)
    out = {
        **run_record(
            args, torch_threads=torch.get_num_threads(), onnx_threads=os.environ.get("RAG_ONNX_THREADS") or "1"
        ),
        "data": {
            "scifact": str(args.scifact),
            "documents": len(corpus),
            "corpus_hash": corpus_hash(corpus),
            "corpus_limited": args.corpus_limit is not None,
            "timed_queries": len(timed),
            "collection_vectors": base_encoder,
            "sigma": args.sigma,
            "copy_kind": args.copies,
            "mix_max": args.mix_max if args.copies == "mixture" else None,
            "copies": "row r = copy r // D of document r % D; copy 0 = the real vector, copy c >= 1 = "
            + (
                "the real vector"
                if args.copies == "isotropic"
                else "(1 - t) * the real vector + t * a random document's, t ~ U(0, mix_max),"
            )
            + " + N(0, sigma^2/dim) noise, renormalised; chunk_id = doc_id = '<doc>~c<c>'",
            "bm25": "N documents: every copy has its document's real text (sparse vectors and bm25s alike)",
            "vectors_cache": cache_info,
            "encoder_versions": {enc: e.version for enc, e in embedders.items()},
        },
        "quality": [],
        "runs": [],
        "skipped": [],
    }
    try:
        if not args.no_quality:
            bm25 = build_bm25(corpus, root / "bm25-quality")[0] if "bm25s" in args.bm25 else None
            for engine in args.engines:
                for enc in args.encoders:
                    out["quality"] += quality(
                        engine, root / f"{engine}-quality", corpus, bm25, embedders[enc], enc, vectors[enc], test, args
                    )
                    write(out, args.json)
            del bm25
        for n in args.points:
            engines = [e for e in args.engines if e != "local" or n <= args.local_max_points]
            out["skipped"] += [
                {"engine": e, "points": n, "reason": f"over --local-max-points {args.local_max_points}"}
                for e in args.engines
                if e not in engines
            ]
            log(
                f"N = {n}: chunk table, vectors ({base_encoder}, {args.copies} copies, sigma {args.sigma}), exact "
                "top-100"
            )
            table = chunk_table(corpus, n)
            points = points_matrix(vectors[base_encoder], n, args.sigma, args.seed, args.copies, args.mix_max)
            truth = {enc: exact_top(points, qv, min(100, n)) for enc, qv in query_vectors.items()}
            row_of = {cid: r for r, cid in enumerate(table["chunk_id"])}
            builds = {}
            for engine in engines:
                log(f"{engine}: building {n} points")
                builds[engine] = build(
                    engine, root / f"{engine}-{n}", table, points, base_encoder, embedders[base_encoder].version, args
                )
                log(f"{engine}: {builds[engine]}")
            del points
            bm25 = bm25_info = None
            if "bm25s" in args.bm25:
                log(f"bm25s over {n} documents")
                bm25, bm25_info = build_bm25(table, root / f"bm25-{n}")
                log(f"bm25s: {bm25_info}")
            chunks = table.set_index("chunk_id")
            del table
            for engine in engines:
                folder = root / f"{engine}-{n}"
                gc.collect()
                rss_before = rss_mb()
                client, reopened = reopen(engine, folder, base_encoder, embedders[base_encoder].version, args)
                rss_reopened = rss_mb()
                alias = names(base_encoder, embedders[base_encoder].version)[1]
                indexes = {}
                for enc in args.encoders:
                    for j, source in enumerate(args.bm25):
                        sparse = EngineBM25(client, alias) if source == "engine" else bm25
                        index = Index(chunks, sparse, client, alias, embedders[enc], hnsw_ef=args.hnsw_ef)
                        indexes[label(enc, source)] = (index, arms_of(source, first=j == 0))
                    if args.exact:  # the same searches scoring every dense vector (RAG_EXACT_SEARCH=1)
                        sparse = EngineBM25(client, alias) if args.bm25[0] == "engine" else bm25
                        indexes[f"{label(enc, args.bm25[0])}/exact"] = (
                            Index(chunks, sparse, client, alias, embedders[enc], exact=True),
                            EXACT_MODES,
                        )
                log(f"{engine} {n}: reopened in {reopened['reopen_seconds']}s; timing {len(timed)} queries")
                latency = timed_retrieval(indexes, timed, args.warmup)
                if args.gc_freeze:  # the same calls with every object alive now out of the collector's sight
                    gc.freeze()
                    latency |= {
                        f"{name}/gc-frozen": row for name, row in timed_retrieval(indexes, timed, args.warmup).items()
                    }
                    gc.unfreeze()
                recall = {
                    enc: recall_figures(client, alias, qv, truth[enc], row_of, args.recall_ef)
                    for enc, qv in query_vectors.items()
                }
                rss_after = rss_mb()
                close(engine, folder, client)
                result = {
                    "engine": engine,
                    "points": n,
                    "build": builds[engine],
                    **reopened,
                    "bm25": bm25_info,
                    "disk_mb": folder_mb(folder),
                    "rss_mb": {
                        "before_reopen": rss_before,
                        "after_reopen": rss_reopened,
                        "after_queries": rss_after,
                        "engine_growth": round(rss_after - rss_before, 1),
                        "process_peak": peak_rss_mb(),
                    },
                    "latency": latency,
                    "recall": recall,
                }
                out["runs"].append(result)
                write(out, args.json)
                log(
                    f"{engine} {n}: "
                    + json.dumps({k: result[k] for k in ("reopen_seconds", "disk_mb", "rss_mb", "recall")})
                )
                if not args.keep:
                    shutil.rmtree(folder, ignore_errors=True)
            del bm25, chunks, row_of
            if not args.keep:
                shutil.rmtree(root / f"bm25-{n}", ignore_errors=True)
    finally:
        if args.root is None and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    finish(out, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
