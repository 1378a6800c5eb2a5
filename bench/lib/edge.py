"""SciFact vectors made into N points, and built into an embedded Qdrant collection as the product builds it.

Shared by bench/edge_latency.py (the engines side by side), bench/hnsw_recall.py (the graph's recall),
bench/replica_swap.py and bench/replica_open_pause.py (the serving replica). bench/edge_latency.py's docstring
says how the points are made and what a build does.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench.lib.results import log

STRATEGY = "bench-edge-latency"


def default_cache() -> Path:
    """Where corpus_vectors keeps the encoded corpus unless a script's --cache says otherwise."""
    from rag.store import data_dir

    return data_dir() / "bench" / "edge-latency"


def build_options(batch: int) -> argparse.Namespace:
    """The options `build` reads, for a build as the product makes one: BM25 sparse vectors in the engine, the
    engine's own graph and Edge's own knobs, `batch` points per upsert."""
    return argparse.Namespace(
        bm25=["engine"], batch=batch, indexing_threshold_kb=None, full_scan_threshold_kb=None, max_indexing_threads=None
    )


def folder_mb(folder: Path) -> float:
    out = subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True)  # allocated, not WAL's sparse size
    return round(int(out.stdout.split()[0]) / 1024, 1) if out.returncode == 0 else float("nan")


# --- data -----------------------------------------------------------------------------------------------------------


def corpus_hash(corpus: pd.DataFrame) -> str:
    digest = hashlib.sha256()
    for cid, text in zip(corpus["chunk_id"], corpus["text"]):
        digest.update(f"{cid}\t{text}\n".encode())
    return digest.hexdigest()[:16]


def corpus_vectors(name: str, embedder, corpus: pd.DataFrame, cache: Path) -> tuple[np.ndarray, dict]:
    """The corpus' passage vectors of one encoder, from the cache or encoded once and cached."""
    from rag.embedding import model_key

    path = cache / f"scifact-{model_key(name)}-{embedder.version}-{corpus_hash(corpus)}.npy"
    info = {"path": str(path), "encoder_version": embedder.version}
    if path.exists():
        vectors = np.load(path)
        if vectors.shape[0] == len(corpus):
            return vectors, {**info, "cached": True}
    log(f"encoding {len(corpus)} SciFact passages with {name} (once; cached at {path})")
    started = time.perf_counter()
    texts = corpus["text"].tolist()
    vectors = np.vstack([embedder.encode_passages(texts[i : i + 256]) for i in range(0, len(texts), 256)]).astype(
        np.float32
    )
    seconds = time.perf_counter() - started
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vectors)
    os.replace(tmp, path)
    return vectors, {**info, "cached": False, "encode_seconds": round(seconds, 1)}


def copy_ids(corpus: pd.DataFrame, n: int) -> list[str]:
    ids = corpus["chunk_id"].tolist()
    d = len(ids)
    return [ids[r] if r < d else f"{ids[r % d]}~c{r // d}" for r in range(n)]


COPY_KINDS = ("isotropic", "mixture")


def points_matrix(
    base: np.ndarray, n: int, sigma: float, seed: int, kind: str = "isotropic", mix_max: float = 0.5
) -> np.ndarray:
    """N unit vectors: the D real ones, then copies of them (row r copies row r % D), renormalised.

    isotropic: the document's vector + N(0, sigma^2 / dim) noise. Every copy is nearer its document than any other
        copy (cosine 1/sqrt(1+sigma^2) against 1/(1+sigma^2)), so each real vector is the hub of a star of N/D copies.
        HNSW's neighbour heuristic then links a copy to the hub and to no sibling, and the hub keeps at most 2m
        level-0 links: past 2m copies per document some copies are reachable only by chance, and recall stops
        rising with hnsw_ef (bench/hnsw_recall.py shows it).
    mixture: (1 - t) * the document's vector + t * a random document's (rarely its own), t ~ U(0, mix_max), + the
        same noise:
        synthetic passages between real ones, copies of one document spread towards different documents."""
    d, dim = base.shape
    if kind not in COPY_KINDS:
        raise ValueError(f"unknown copy kind {kind!r}: one of {', '.join(COPY_KINDS)}")
    out = base[np.arange(n) % d].astype(np.float32)
    rng = np.random.default_rng(seed)
    for i in range(d, n, 65536):  # in blocks: no N x dim float64 temporary
        j = min(n, i + 65536)
        if kind == "mixture":
            t = rng.uniform(0, mix_max, (j - i, 1)).astype(np.float32)
            out[i:j] = (1 - t) * out[i:j] + t * base[rng.integers(0, d, j - i)]
        out[i:j] += rng.standard_normal((j - i, dim), dtype=np.float32) * np.float32(sigma / np.sqrt(dim))
        out[i:j] /= np.linalg.norm(out[i:j], axis=1, keepdims=True)
    return out


def chunk_table(corpus: pd.DataFrame, n: int) -> pd.DataFrame:
    """N rows in the chunk-table shape: copy c of document d has d's text and its own chunk_id / doc_id."""
    table = corpus.iloc[np.arange(n) % len(corpus)].reset_index(drop=True)
    ids = copy_ids(corpus, n)
    table["chunk_id"] = ids
    table["doc_id"] = ids
    return table


def exact_top(points: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Row indices of the exact top-k (cosine: all rows are unit vectors), best first, per query."""
    out = np.empty((len(queries), k), dtype=np.int64)
    for i in range(0, len(queries), 16):
        scores = queries[i : i + 16] @ points.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        out[i : i + 16] = np.take_along_axis(top, order, axis=1)
    return out


# --- engines --------------------------------------------------------------------------------------------------------


def open_client(engine: str, folder: Path, args: argparse.Namespace):
    """As the product opens a folder (get_client); Edge directly only when one of its knobs is set."""
    knobs = (args.indexing_threshold_kb, args.full_scan_threshold_kb, args.max_indexing_threads)
    if engine == "edge" and any(v is not None for v in knobs):
        from rag.index.edge import EdgeClient, EdgeOptions

        return EdgeClient(
            folder,
            EdgeOptions(
                indexing_threshold_kb=args.indexing_threshold_kb,
                full_scan_threshold_kb=args.full_scan_threshold_kb,
                max_indexing_threads=args.max_indexing_threads,
            ),
        )
    from rag.index.qdrant import QdrantSettings, get_client

    return get_client(QdrantSettings(path=str(folder), engine=engine))


def close(engine: str, folder: Path, client) -> None:
    from rag.index.qdrant import QdrantSettings, close_client

    close_client(QdrantSettings(path=str(folder), engine=engine))
    client.close()  # a no-op when close_client closed it; an EdgeClient opened directly is closed here
    gc.collect()


def names(encoder: str, version: str) -> tuple[str, str]:
    from rag.index.qdrant import CollectionName

    name = CollectionName(STRATEGY, encoder)
    return name.versioned(version, "cosine"), name.alias


def build(
    engine: str,
    folder: Path,
    table: pd.DataFrame,
    vectors: np.ndarray,
    encoder: str,
    version: str,
    args: argparse.Namespace,
) -> dict:
    """create_collection + batched upserts + optimize + alias, as rag.index.sync does for a fresh collection: with
    "engine" in --bm25, each point's BM25 sparse vector too (tokenizing every text is part of the build time)."""
    from rag.index.bm25_sparse import PassageTerms
    from rag.index.qdrant import HnswBuild, create_collection, optimize, point_alias_to
    from rag.index.sync import point_batch

    collection, alias = names(encoder, version)
    shutil.rmtree(folder, ignore_errors=True)
    client = open_client(engine, folder, args)
    sparse = "engine" in args.bm25
    started = time.perf_counter()
    terms = PassageTerms.of(table["text"].tolist()) if sparse else None
    terms_seconds = time.perf_counter() - started
    avgdl = float(terms.lengths.mean()) if sparse and len(terms) else 0.0
    create_collection(
        client,
        collection,
        vectors.shape[1],
        "cosine",
        bm25=sparse,
        graph=HnswBuild(
            m=getattr(args, "hnsw_m", None),  # bench/replica_swap builds with the defaults
            ef_construct=getattr(args, "hnsw_ef_construct", None),
        ),
    )
    for i in range(0, len(table), args.batch):
        rows = table.iloc[i : i + args.batch].to_dict("records")
        client.upsert(
            collection, points=point_batch(rows, vectors[i : i + len(rows)], terms, avgdl, start=i), wait=True
        )
    del terms
    upsert_seconds = time.perf_counter() - started
    started = time.perf_counter()
    optimize(client, collection)
    optimize_seconds = time.perf_counter() - started
    point_alias_to(client, alias, collection)
    info = client.get_collection(collection)
    close(engine, folder, client)
    return {
        "bm25_terms_seconds": round(terms_seconds, 2),
        "upsert_seconds": round(upsert_seconds, 2),
        "optimize_seconds": round(optimize_seconds, 2),
        "build_seconds": round(upsert_seconds + optimize_seconds, 2),
        "indexed_vectors": getattr(info, "indexed_vectors_count", None),
        "segments": getattr(info, "segments_count", None),
    }
