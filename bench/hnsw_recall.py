"""Recall of Qdrant Edge's HNSW graph on SciFact vectors plus copies, by how the copies are made, the graph's m /
ef_construct and the search breadth (hnsw_ef). Dense only: no payload, no BM25, no query encoding in the figures.
Writes its own JSON (arguments, commit, date, machine; rewritten after every build); asserts nothing.

    .venv/bin/python bench/hnsw_recall.py --points 200000 --hnsw-m 16 24          # ~4 min: the star cap and its cure
    .venv/bin/python bench/hnsw_recall.py --points 1000000 --copies mixture --sigma 0.1   # ~7 min

Why it exists: bench/edge_latency.py's 1M recall stopped near 0.86 however wide the search. Its isotropic copies make
every real vector the hub of a star of N/D copies (each copy is nearer its document than any sibling), HNSW's
neighbour heuristic links a copy to the hub and to no sibling, and the hub keeps at most 2m level-0 links. The
prediction this bench tests: with isotropic copies, the misses whose document was found through another copy stay
at any hnsw_ef while N/D > 2m, and vanish once 2m > N/D.

Data: the SciFact corpus' passage vectors of --encoder (cached by bench.lib.edge.corpus_vectors, as
bench/edge_latency.py does), made into N points by bench.lib.edge.points_matrix (--copies, --sigma, --mix-max,
--seed); the SciFact test queries' vectors.
Per N x m x ef_construct: build through the product's calls (rag.index.qdrant.create_collection with
HnswBuild, upsert in batches, optimize, where Edge builds the graph), timed; then for every --ef a limit-100 search
(what retrieve asks for) per query: recall@10 against numpy's exact top-10, the misses split into "another copy of
the document is among the engine's 100" and "the document was not found", and the search's wall ms.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib import cli
from bench.lib.datasets import RESULTS, scifact_absent
from bench.lib.edge import COPY_KINDS, corpus_vectors, default_cache, exact_top, folder_mb, points_matrix
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import log, stats, write


def build(folder: Path, points: np.ndarray, m: int, ef_construct: int, batch: int) -> tuple[object, dict]:
    from qdrant_client import models

    from rag.index.edge import EdgeClient
    from rag.index.qdrant import HnswBuild, create_collection

    client = EdgeClient(folder)
    create_collection(
        client, "recall", points.shape[1], "cosine", bm25=False, graph=HnswBuild(m=m, ef_construct=ef_construct)
    )
    started = time.perf_counter()
    for i in range(0, len(points), batch):
        j = min(len(points), i + batch)
        client.upsert("recall", models.Batch(ids=list(range(i, j)), vectors={"dense": points[i:j].tolist()}))
    upserted = time.perf_counter()
    client.optimize("recall")
    done = time.perf_counter()
    return client, {
        "upsert_s": round(upserted - started, 1),
        "optimize_s": round(done - upserted, 1),
        "disk_mb": folder_mb(folder),
    }


def recall_by_ef(client, query_vectors: np.ndarray, truth: np.ndarray, documents: int, efs: list[int]) -> dict:
    from qdrant_client import models

    from rag.index.qdrant import DENSE

    out = {}
    for ef in efs:
        recall, ms, sibling_found, document_missed = [], [], 0, 0
        for q, top in zip(query_vectors, truth):
            started = time.perf_counter()
            got = [
                p.id
                for p in client.query_points(
                    "recall", query=q.tolist(), using=DENSE, limit=100, search_params=models.SearchParams(hnsw_ef=ef)
                ).points
            ]
            ms.append(1000 * (time.perf_counter() - started))
            expected, found = set(top[:10].tolist()), set(got[:10])
            recall.append(len(expected & found) / 10)
            found_documents = {g % documents for g in got}
            for miss in expected - found:
                if miss % documents in found_documents:
                    sibling_found += 1
                else:
                    document_missed += 1
        out[str(ef)] = {
            "recall@10": round(float(np.mean(recall)), 4),
            "dense_limit100": stats(ms),
            "misses_document_found_through_another_copy": sibling_found,
            "misses_document_not_found": document_missed,
        }
        log(
            f"  hnsw_ef {ef}: recall@10 {out[str(ef)]['recall@10']:.3f}, misses with the document found "
            f"elsewhere {sibling_found}, document not found {document_missed}, p95 "
            f"{out[str(ef)]['dense_limit100']['p95_ms']} ms"
        )
    return out


def main() -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--points", type=int, nargs="+", default=[200_000])
    ap.add_argument("--copies", choices=COPY_KINDS, default="isotropic")
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--mix-max", type=float, default=0.5)
    ap.add_argument("--hnsw-m", type=int, nargs="+", default=[16])
    ap.add_argument("--hnsw-ef-construct", type=int, nargs="+", default=[100])
    ap.add_argument(
        "--ef",
        type=int,
        nargs="+",
        default=[128, 512, 2048, 8192],
        help="hnsw_ef values searched (a limit-100 search never goes below 100)",
    )
    ap.add_argument("--encoder", default="minilm")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--batch", type=int, default=2048)
    cli.add_seed(ap)
    ap.add_argument("--corpus-limit", type=int, help="only the first M abstracts (smoke tests)")
    cli.add_scifact(ap)
    cli.add_vectors_cache(ap)
    ap.add_argument("--root", type=Path, help="folder for the engine (default: a temporary one, removed)")
    cli.add_output(ap, RESULTS / "hnsw-recall.json")
    args = ap.parse_args()

    if scifact_absent(args.scifact):
        return 0
    from rag.embedding import load_embedder
    from rag.evaluation.beir import load_beir

    test = load_beir(args.scifact, "test")
    corpus = test.corpus if args.corpus_limit is None else test.corpus.head(args.corpus_limit).reset_index(drop=True)
    embedder = load_embedder(args.encoder)
    base, cache_info = corpus_vectors(args.encoder, embedder, corpus, args.cache or default_cache())
    query_vectors = embedder.encode_queries(list(test.queries.values())[: args.queries]).astype(np.float32)
    documents = len(corpus)
    out = {
        **run_record(args),
        "data": {"documents": documents, "queries": len(query_vectors), "vectors_cache": cache_info},
        "runs": [],
    }
    root = args.root or Path(tempfile.mkdtemp(prefix="hnsw-recall-"))
    try:
        for n in args.points:
            points = points_matrix(base, n, args.sigma, args.seed, args.copies, args.mix_max)
            top11 = exact_top(points, query_vectors, 11)
            truth = top11[:, :10]
            # exact 10th - 11th score: how near the ties are
            gap = float(np.mean([(points[t[9]] - points[t[10]]) @ q for t, q in zip(top11, query_vectors)]))
            for m in args.hnsw_m:
                for ef_construct in args.hnsw_ef_construct:
                    log(
                        f"N {n} ({args.copies}, {n / documents:.0f} points per document), m {m}, ef_construct "
                        f"{ef_construct}"
                    )
                    folder = root / f"edge-{n}-{m}-{ef_construct}"
                    shutil.rmtree(folder, ignore_errors=True)
                    client, built = build(folder, points, m, ef_construct, args.batch)
                    log(f"  built: {built}")
                    try:
                        by_ef = recall_by_ef(client, query_vectors, truth, documents, args.ef)
                    finally:
                        client.close()
                        shutil.rmtree(folder, ignore_errors=True)
                    out["runs"].append(
                        {
                            "points": n,
                            "points_per_document": round(n / documents, 1),
                            "m": m,
                            "level0_links": 2 * m,
                            "ef_construct": ef_construct,
                            "build": built,
                            "exact_gap_10th_11th": round(gap, 5),
                            "by_hnsw_ef": by_ef,
                        }
                    )
                    write(out, args.json)
            del points
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    write(stamp_end(out), args.json)
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
