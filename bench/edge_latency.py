"""Embedded engines side by side: qdrant-client's local mode vs Qdrant Edge (rag.index.edge), on N 384-d points.
Writes its own JSON (arguments, commit, date, machine); asserts nothing.

    .venv/bin/python bench/edge_latency.py --points 20000 100000       # minutes; local mode's build dominates

Per engine and N, in a fresh folder under --root, through rag.index.qdrant as the pipeline uses it:
  build          seconds to create the collection (with its payload indexes) and upsert N points in batches of
                 --batch (payload: chunk_id, doc_id, page_start, page_end), then `optimize` (the sync path's call:
                 Edge builds HNSW for segments past its indexing threshold; a no-op for local mode), timed apart.
  reopen         seconds to close the client, open the folder again and count the points (local mode loads every
                 point into memory here).
  query          wall ms per dense query (query_points, limit --k, payload chunk_id), --queries timed after --warmup
                 untimed ones; p50 / p95 / mean, for the engine's default search (HNSW where Edge has built it) and
                 with SearchParams(exact=True), the two taking turns on every query.
  recall         recall@k of both against the exact top-k computed in numpy (cosine on normalised vectors).
Data: --data clustered (default: points around 1,000 random centres, as embeddings of a corpus bunch by topic),
noise (isotropic Gaussian: the hardest case for HNSW), or --vectors FILE.npy (real embeddings, e.g. MiniLM
vectors of a corpus; N is capped at its row count). Queries are drawn the same way as the points, not from them.
Edge's own knobs (--indexing-threshold-kb, --full-scan-threshold-kb, --max-indexing-threads) default to Edge's
defaults: segments under ~10 MB of vectors (~6,500 points of 384 floats) are scanned exactly even when indexed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

# Local mode always scans exactly and says so on every query given search_params: the exact arm is the same search.
warnings.filterwarnings("ignore", message="Local mode performs exact")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.provenance import commit  # noqa: E402 - after the path setup

COLLECTION, ALIAS = "bench__random__v1__cosine", "bench__random"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_data(args: argparse.Namespace, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(points, queries), float32."""
    if args.vectors:
        rows = np.load(args.vectors).astype(np.float32)
        rng.shuffle(rows)
        if len(rows) <= args.queries:
            raise SystemExit(f"{args.vectors} has {len(rows)} rows: need more than --queries {args.queries}")
        return rows[args.queries:args.queries + n], rows[:args.queries]
    if args.data == "noise":
        return (rng.normal(size=(n, args.dim)).astype(np.float32), rng.normal(size=(args.queries, args.dim)).astype(np.float32))
    centres = rng.normal(size=(1000, args.dim))

    def draw(m: int) -> np.ndarray:
        return (centres[rng.integers(0, len(centres), m)] + 0.5 * rng.normal(size=(m, args.dim))).astype(np.float32)

    return draw(n), draw(args.queries)


def exact_top(points: np.ndarray, queries: np.ndarray, k: int) -> list[set[int]]:
    p = points / np.linalg.norm(points, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    out = []
    for i in range(0, len(q), 64):
        scores = q[i:i + 64] @ p.T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        out += [{int(j) + 1 for j in row} for row in top]  # point ids are row + 1
    return out


def open_client(engine: str, folder: Path, args: argparse.Namespace):
    """Local mode as get_client opens it; Edge directly, so that its knobs can be set (None: Edge's defaults)."""
    if engine == "local":
        from rag.index.qdrant import QdrantSettings, get_client

        return get_client(QdrantSettings(path=str(folder), engine="local"))
    from rag.index.edge import EdgeClient, EdgeOptions

    return EdgeClient(folder, EdgeOptions(indexing_threshold_kb=args.indexing_threshold_kb,
                                          full_scan_threshold_kb=args.full_scan_threshold_kb,
                                          max_indexing_threads=args.max_indexing_threads))


def close(engine: str, folder: Path, client) -> None:
    from rag.index.qdrant import QdrantSettings, close_client

    if engine == "local":
        close_client(QdrantSettings(path=str(folder), engine="local"))
    else:
        client.close()


def timed_queries(client, queries: np.ndarray, k: int, warmup: int) -> dict[str, tuple[dict, list[set[int]]]]:
    """{"default" | "exact": (latency stats, found ids per query)}; the two take turns on every query, so a shared
    machine's load falls on both alike."""
    from qdrant_client.http import models

    from rag.index.qdrant import DENSE

    modes = {"default": None, "exact": models.SearchParams(exact=True)}
    times: dict[str, list[float]] = {m: [] for m in modes}
    found: dict[str, list[set[int]]] = {m: [] for m in modes}
    for i, q in enumerate(np.concatenate([queries[:warmup], queries])):
        for mode, params in modes.items():
            started = time.perf_counter()
            points = client.query_points(ALIAS, query=q.tolist(), using=DENSE, limit=k, search_params=params,
                                         with_payload=["chunk_id"]).points
            if i >= warmup:
                times[mode].append(1000 * (time.perf_counter() - started))
                found[mode].append({int(p.payload["chunk_id"]) for p in points})
    return {m: ({"p50_ms": round(float(np.percentile(t, 50)), 3), "p95_ms": round(float(np.percentile(t, 95)), 3),
                 "mean_ms": round(float(np.mean(t)), 3), "n": len(t)}, found[m]) for m, t in times.items()}


def recall(found: list[set[int]], truth: list[set[int]], k: int) -> float:
    return round(float(np.mean([len(f & t) / k for f, t in zip(found, truth)])), 4)


def folder_mb(folder: Path) -> float:
    out = subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True)  # allocated, not WAL's sparse size
    return round(int(out.stdout.split()[0]) / 1024, 1) if out.returncode == 0 else float("nan")


def run_engine(engine: str, points: np.ndarray, queries: np.ndarray, truth: list[set[int]], folder: Path,
               args: argparse.Namespace) -> dict:
    from qdrant_client.http import models

    from rag.index.qdrant import DENSE, create_collection, optimize, point_alias_to

    client = open_client(engine, folder, args)
    started = time.perf_counter()
    create_collection(client, COLLECTION, points.shape[1], "cosine")
    for i in range(0, len(points), args.batch):
        rows = range(i, min(i + args.batch, len(points)))
        client.upsert(COLLECTION, points=models.Batch(
            ids=[r + 1 for r in rows], vectors={DENSE: points[i:i + len(rows)].tolist()},
            payloads=[{"chunk_id": str(r + 1), "doc_id": f"doc-{r // 10}", "page_start": r % 50, "page_end": r % 50}
                      for r in rows]), wait=True)
    upsert_seconds = time.perf_counter() - started
    started = time.perf_counter()
    optimize(client, COLLECTION)
    optimize_seconds = time.perf_counter() - started
    point_alias_to(client, ALIAS, COLLECTION)
    close(engine, folder, client)

    started = time.perf_counter()
    client = open_client(engine, folder, args)
    count = client.count(ALIAS, exact=True).count
    reopen_seconds = time.perf_counter() - started
    (default, found), (exact, found_exact) = timed_queries(client, queries, args.k, args.warmup).values()
    info = client.get_collection(COLLECTION)
    indexed = getattr(info, "indexed_vectors_count", None)
    close(engine, folder, client)
    result = {"engine": engine, "points": len(points), "count_after_reopen": count,
              "upsert_seconds": round(upsert_seconds, 2), "optimize_seconds": round(optimize_seconds, 2),
              "build_seconds": round(upsert_seconds + optimize_seconds, 2), "reopen_seconds": round(reopen_seconds, 3),
              "indexed_vectors": indexed, "query_default": default, "query_exact": exact,
              f"recall@{args.k}_default": recall(found, truth, args.k), f"recall@{args.k}_exact": recall(found_exact, truth, args.k),
              "folder_mb": folder_mb(folder)}
    log(json.dumps(result))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, nargs="+", default=[20_000, 100_000])
    ap.add_argument("--engines", nargs="+", default=["local", "edge"], choices=["local", "edge"])
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--data", choices=["clustered", "noise"], default="clustered")
    ap.add_argument("--vectors", type=Path, help=".npy of real embeddings to use instead of random points")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--batch", type=int, default=512, help="points per upsert (the sync path's default)")
    ap.add_argument("--indexing-threshold-kb", type=int)
    ap.add_argument("--full-scan-threshold-kb", type=int)
    ap.add_argument("--max-indexing-threads", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", type=Path, help="folder for the engines' data (default: a temporary one, removed)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "edge-latency.json")
    args = ap.parse_args()

    root = args.root or Path(tempfile.mkdtemp(prefix="edge-latency-"))
    results = []
    try:
        for n in args.points:
            points, queries = make_data(args, n, np.random.default_rng(args.seed))
            truth = exact_top(points, queries, args.k)
            for engine in args.engines:
                folder = root / f"{engine}-{len(points)}"
                shutil.rmtree(folder, ignore_errors=True)
                log(f"{engine}: {len(points)} points of {points.shape[1]} floats")
                results.append(run_engine(engine, points, queries, truth, folder, args))
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    out = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "commit": commit(),
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
           "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
