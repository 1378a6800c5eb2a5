"""What bench/serving_memory.py builds and how it measures a serving replica's memory.

Build (one process): N synthetic chunks of a paragraph's size, grouped into documents with the chunk table's every
column (ids, offsets, pages, section paths, prev/next links, hashes), written as the chunk set's table; their BM25
terms (the product's tokenizer, rag.index.bm25_sparse.PassageTerms); one Qdrant Edge folder per collection layout
with the chunks upserted as the product writes them (rag.index.sync.point_batch: payload = the chunk record, the
BM25 sparse vector, a dense vector), the HNSW graph built, the serving alias set. Dense vectors are not encoded
(a million texts take hours on 2 cores): they are random 384-d unit vectors around 4,096 random centres (a clustered
cloud, as real embeddings are), upserted directly; a question is still encoded by the real model.

Measure (one fresh process per replica, one after the other): what `rag serve` builds, rag.serving.server's
serving_index (a replica copy of the collection, open_index, the answerer) over a data dir whose only chunk set is
this one, then `ask` of a few questions through the whole answer pipeline. /proc/self/status is read after the
imports, after the embedding model is loaded (what every replica holds whatever the corpus), after the index is
open and after the questions: VmRSS (resident), split into RssAnon (heap: only freed by the process) and RssFile
(pages of mapped files: the collection's on-disk parts; the kernel drops them under memory pressure and reads them
again), and VmHWM (the peak resident size). After the questions, /proc/self/smaps says which files the mapped pages
are: each part of the replica's copy of the collection (vectors, payload, postings, graph, write-ahead log, ...) and
the libraries and model files together, and fincore how much of the replica's collection files the kernel's page
cache holds (shared and reclaimable: not the replica's, but what its searches read instead of the disk).

The new way bounds the replica's mapped collection pages (rag.serving.residency: unmapped before a question once the
process maps more than the budget; the page cache keeps them) and, its copy being bigger than the budget, writes the
copy back and drops it from the page cache once made (searches then read what they need from disk, and the cache
fills with that). Rows beside it: the same without the budget (neither), and with the budget but the copy left in the
page cache.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.lib.results import log
from rag.serving.residency import folder_bytes

STRATEGY = "paragraph"
MODEL = "minilm"
DIM = 384
CENTRES = 4096
NOISE = 0.35  # distance of a point from its centre, relative to the centre's unit length
WRITE_BATCH = 1024
STOPWORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if will more no out so what up can about into than "
    "them its only other new some could these two may then do first any my now such like our over man me even most"
).split()
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou", "ee")]
MEASURES = (
    "a replica's resident memory (VmRSS) as /proc/self/status reports it, split into RssAnon (the process's heap, "
    "freed only by the process) and RssFile (mapped file pages: the collection's parts on disk, which the kernel "
    "drops under memory pressure); peak = VmHWM"
)
MAPPED_BUDGET = (
    "the new way unmaps the replica's collection pages before a question once the process maps more than "
    "rag.serving.residency's budget (MB, libraries and model files included; the kernel's page cache keeps them), "
    "and drops a replica copy bigger than the budget from the page cache once made"
)


# --- the synthetic chunk set -------------------------------------------------------------------------------------


def vocabulary(size: int, seed: int) -> np.ndarray:
    """`size` distinct pseudo-words of 2-4 syllables: content words the English stemmer leaves apart."""
    rng = np.random.default_rng(seed)
    words: dict[str, None] = {}
    while len(words) < size:
        n = int(rng.integers(2, 5))
        words["".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), n))] = None
    return np.array(list(words), dtype=object)


def texts(n: int, words_per_chunk: int, seed: int, batch: int = 20_000):
    """Batches of paragraph-like texts: a third stop words, the rest content words drawn Zipf-like from 50,000, in
    sentences of 8-24 words; about 6.2 characters a word with its space (1 KB at 160 words)."""
    rng = np.random.default_rng(seed + 1)
    content = vocabulary(50_000, seed)
    ranks = np.arange(1, len(content) + 1)
    weights = 1.0 / (ranks + 2.7) ** 1.07
    weights /= weights.sum()
    stop = np.array(STOPWORDS, dtype=object)
    for start in range(0, n, batch):
        m = min(batch, n - start)
        drawn = content[rng.choice(len(content), size=(m, words_per_chunk), p=weights)]
        stops = rng.random((m, words_per_chunk)) < 1 / 3
        drawn[stops] = stop[rng.integers(0, len(stop), int(stops.sum()))]
        out = []
        for row in drawn:
            words, cut, sentences = list(row), 0, []
            while cut < len(words):
                size = int(rng.integers(8, 25))
                sentence = words[cut : cut + size]
                sentences.append(" ".join([sentence[0].capitalize(), *sentence[1:]]) + ".")
                cut += size
            out.append(" ".join(sentences))
        yield out


def chunk_table(n: int, words_per_chunk: int, per_document: int, seed: int):
    """The chunk set's table (rag.chunk_sets.CHUNK_COLUMNS), `per_document` chunks a document, pages of 3 chunks and
    sections of 5, as the paragraph strategy leaves a long document."""
    import pandas as pd

    from rag.chunk_sets import CHUNK_COLUMNS
    from rag.chunking.spans import chunk_id

    rows: list[dict] = []
    for batch in texts(n, words_per_chunk, seed):
        for text in batch:
            i = len(rows)
            doc, k = f"reports/doc-{i // per_document:07d}.md", i % per_document
            start = 0 if k == 0 else rows[-1]["char_end"] + 2
            rows.append(
                {
                    "chunk_id": chunk_id(doc, STRATEGY, start, start + len(text)),
                    "doc_id": doc,
                    "strategy": STRATEGY,
                    "text": text,
                    "char_start": start,
                    "char_end": start + len(text),
                    "page_start": k // 3 + 1,
                    "page_end": k // 3 + 1,
                    "section_path": [f"Part {k // 5 + 1}"],
                    "prev_chunk_id": rows[-1]["chunk_id"] if k else None,
                    "next_chunk_id": None,
                    "n_tokens": len(text.split()),
                    "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                    "table_html": None,
                    "doc_content_hash": hashlib.sha256(doc.encode()).hexdigest(),
                    "strategy_fingerprint": "synthetic",
                }
            )
            if k:
                rows[-2]["next_chunk_id"] = rows[-1]["chunk_id"]
    return pd.DataFrame(rows, columns=CHUNK_COLUMNS)


def dense_vectors(n: int, seed: int, start: int) -> np.ndarray:
    """n points of the clustered cloud for the batch that starts at row `start` (the same for the same batching)."""
    centres = np.random.default_rng(seed + 2).standard_normal((CENTRES, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rng = np.random.default_rng([seed + 3, start])
    which = rng.integers(0, CENTRES, n)
    noise = rng.standard_normal((n, DIM)).astype(np.float32) * (NOISE / np.sqrt(DIM))
    out = centres[which] + noise
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def passage_terms(texts: list[str], batch: int = 20_000):
    """rag.index.bm25_sparse.PassageTerms of every text, tokenized a batch at a time (a million texts' token lists
    at once would take several GB) and joined into one."""
    from rag.index.bm25_sparse import PassageTerms

    parts = [PassageTerms.of(texts[i : i + batch]) for i in range(0, len(texts), batch)]
    offsets, base = [np.zeros(1, dtype=np.int64)], 0
    for part in parts:
        offsets.append(part.offsets[1:] + base)
        base += int(part.offsets[-1])
    return PassageTerms(
        np.concatenate([p.indices for p in parts]),
        np.concatenate([p.counts for p in parts]),
        np.concatenate(offsets),
        np.concatenate([p.lengths for p in parts]),
    )


def build_collection(folder: Path, table, terms, layout, version: str, seed: int) -> dict:
    """One Edge folder holding the chunk set's collection with `layout`, behind the alias serving opens."""
    from rag.embedding import model_key
    from rag.index.qdrant import CollectionName, QdrantSettings, close_client, create_collection, get_client
    from rag.index.qdrant import point_alias_to
    from rag.index.sync import point_batch

    settings = QdrantSettings(path=str(folder), engine="edge")
    client = get_client(settings)
    name = CollectionName(STRATEGY, model_key(MODEL))
    collection = name.versioned(version, "cosine")
    create_collection(client, collection, DIM, "cosine", layout=layout)
    avgdl = float(terms.lengths.mean())
    started = time.perf_counter()
    for start in range(0, len(table), WRITE_BATCH):
        part = table.iloc[start : start + WRITE_BATCH]
        rows = part.to_dict("records")
        client.upsert(collection, point_batch(rows, dense_vectors(len(rows), seed, start), terms, avgdl, start))
        if start // WRITE_BATCH % 100 == 0:
            log(f"  {folder.name}: {start + len(rows):,} of {len(table):,} points written")
    upserted = time.perf_counter()
    client.optimize(collection)  # the HNSW graph, as sync builds it before an alias goes live
    optimized = time.perf_counter()
    point_alias_to(client, name.alias, collection)
    info = client.get_collection(collection)
    close_client(settings)
    return {
        "collection": collection,
        "points": int(info.points_count),
        "indexed_vectors": int(info.indexed_vectors_count),
        "segments": int(info.segments_count),
        "upsert_seconds": round(upserted - started, 1),
        "optimize_seconds": round(optimized - upserted, 1),
        "disk_mb": round(folder_bytes(folder) / 2**20, 1),
    }


def questions(table, n: int, seed: int) -> list[str]:
    """Questions of 6 content words from random chunks (so BM25 and the answer have something to find)."""
    rng = np.random.default_rng(seed + 4)
    stop = set(STOPWORDS)
    out = []
    for row in rng.integers(0, len(table), n):
        words = [w.strip(".").lower() for w in table["text"].iat[int(row)].split() if w.strip(".").lower() not in stop]
        picked = rng.choice(len(words), size=min(6, len(words)), replace=False)
        out.append("what about " + " ".join(words[i] for i in sorted(picked)) + "?")
    return out


def measure_size(work: Path, n: int, layouts: dict, args, built: dict | None = None) -> dict:
    """Everything of one size under `work`: the chunk set, a collection per layout, then a replica of each way (the
    whole chunk table over the first layout, records per hit over each), after an unrecorded replica per layout that
    asks every question: what the first replica of a data dir does once (the int8 twin of the question encoder
    exported into it; the passages' sentence vectors encoded and stored, which indexing does for a real chunk set)
    would otherwise be charged to whichever way is measured first. `built`: the "data" and "builds" of an earlier
    run that built `work` (kept): its chunk set and collections are measured again, not built."""
    from rag.store import CHUNKS_TABLE, TableStore

    root = work / "data"
    if built is not None:
        data, builds = built["data"], built["builds"]
        table = TableStore(root / "tables").read(CHUNKS_TABLE, STRATEGY, columns=["text"])
    else:
        data, builds, table = build_size(work, n, layouts, args)
    asked = questions(table, args.questions, args.seed)
    del table
    gc.collect()
    return {"data": data, "builds": builds, **measure_replicas(work, layouts, asked)}


def build_size(work: Path, n: int, layouts: dict, args):
    """The chunk set of `n` chunks and a collection per layout under `work`; (data, builds, the chunk table)."""
    from rag.embedding import load_embedder
    from rag.embedding.onnx_int8 import int8_query_encoder
    from rag.store import CHUNKS_TABLE, TableStore

    root = work / "data"
    started = time.perf_counter()
    table = chunk_table(n, args.words, args.per_document, args.seed)
    table_path = TableStore(root / "tables").write(table, CHUNKS_TABLE, STRATEGY)
    log(f"{len(table):,} chunks written to {table_path} in {time.perf_counter() - started:.0f} s")
    data = {
        "chunks": len(table),
        "documents": int(table["doc_id"].nunique()),
        "mean_text_chars": round(float(table["text"].str.len().mean()), 1),
        "table_parquet_mb": round(table_path.stat().st_size / 2**20, 1),
        "table_in_pandas_mb": round(table.memory_usage(deep=True).sum() / 2**20, 1),
    }
    terms = passage_terms(table["text"].tolist())
    embedder = load_embedder(MODEL)
    version = embedder.version
    # Indexing pairs the model with its int8 twin (its sentence encoder), which records the pair a replica reads.
    int8_query_encoder(MODEL, embedder)
    builds = {}
    for label, layout in layouts.items():
        log(f"building the collection with layout {label}: {layout.model_dump(exclude_defaults=True)}")
        builds[label] = {
            "layout": layout.model_dump(exclude_defaults=True),
            **build_collection(work / f"qdrant-{label}", table, terms, layout, version, args.seed),
        }
        log(f"  {builds[label]}")
    return data, builds, table


def measure_replicas(work: Path, layouts: dict, asked: list[str]) -> dict:
    """A replica of each way over what `work` holds (see measure_size), after a warm-up replica per layout."""
    from rag.serving.residency import MAPPED_PAGES_MB

    root = work / "data"
    labels = list(layouts)
    # (label, layout, RAG_CHUNKS, float model, mapped-page budget, the copy left in the page cache)
    before = f"whole chunk table and the float model, layout {labels[0]} (before)"
    plan = [(before, labels[0], "table", True, None, True)]
    plan += [(f"records per hit, layout {label}", label, "auto", False, MAPPED_PAGES_MB, False) for label in labels]
    last = labels[-1]
    plan.insert(-1, (f"records per hit, layout {last}, no mapped-page budget", last, "auto", False, None, True))
    kept = f"records per hit, layout {last}, copy left in the page cache"
    plan.insert(-1, (kept, last, "auto", False, MAPPED_PAGES_MB, True))
    for label in labels:  # each layout's own: an int8 search may return other passages
        log(f"warm-up replica, layout {label} (not recorded)")
        measure_replica(root, work / f"qdrant-{label}", "auto", asked)
    replicas = []
    for label, layout, chunks, float_model, budget, cached in plan:
        log(f"replica: {label}")
        qdrant = work / f"qdrant-{layout}"
        run = measure_replica(
            root, qdrant, chunks, asked, float_model=float_model, mapped_pages_mb=budget, cached=cached
        )
        replicas.append(
            {
                "label": label,
                "layout": layout,
                "chunks": chunks,
                "float_model": float_model,
                "mapped_pages_mb": budget,
                **run,
            }
        )
        log(f"  {run['memory_mb']['answered']}")
    return {"replicas": replicas, "disk_mb": round(folder_bytes(work) / 2**20, 1)}


# --- a replica ----------------------------------------------------------------------------------------------------


def text_hash(text) -> str:
    return hashlib.sha256(str(text).encode()).hexdigest()[:16]


def memory() -> dict[str, float]:
    """The process's resident memory now, MB: VmRSS, RssAnon, RssFile and the peak VmHWM."""
    wanted = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "peak"}
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in wanted:
                out[wanted[key]] = round(int(value.split()[0]) / 1024, 1)
    return out


# Which part of a collection a mapped file is, by the folder Qdrant keeps it in (the first that matches).
COLLECTION_PARTS = (
    ("write-ahead log", "/wal/"),
    ("dense vectors", "vector_storage-dense"),
    ("BM25 sparse vectors", "vector_storage-bm25"),
    ("BM25 postings", "vector_index-bm25"),
    ("HNSW graph", "vector_index-dense"),
    ("payload", "payload_storage"),
    ("payload indexes", "payload_index"),
    ("point ids", "id_tracker"),
)


def mapped_by_part(collection_root: str) -> dict[str, float]:
    """Resident pages of mapped files now, MB, by what they are: each part of the collection's files under
    `collection_root` (COLLECTION_PARTS, the rest "other collection files"), and every other file (libraries, model
    files) together. From /proc/self/smaps: which of the mapped bytes RssFile counts are which."""
    out: dict[str, int] = {}
    path = None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                path = head[5].strip() if len(head) == 6 and head[5].startswith("/") else None
            elif head and head[0] == "Rss:" and path is not None:
                if path.startswith(collection_root):
                    part = next((name for name, folder in COLLECTION_PARTS if folder in path), "other collection files")
                else:
                    part = "libraries and model files"
                out[part] = out.get(part, 0) + int(head[1])
    return {part: round(kb / 1024, 1) for part, kb in sorted(out.items(), key=lambda kv: -kv[1])}


def replica(spec: dict) -> dict:
    """In a fresh process: what `rag serve` builds over the data dir, then the questions asked; memory at each step."""
    steps = {"start": memory()}
    from rag.embedding import load_embedder, load_for_queries
    from rag.qa import AnswerSettings
    from rag.serving.server import serving_index

    steps["imports"] = memory()
    # What open_index loads of the model, loaded once per process (it finds it loaded): the model paired with its
    # int8 twin, which encodes the questions, from the pairing indexing recorded (no torch); the way before, a
    # server loaded the float model itself too (torch and sentence-transformers).
    load_for_queries(MODEL).encode_queries(["warm up"])
    if spec.get("float_model"):
        load_embedder(MODEL).encode_queries(["warm up"])
    steps["model"] = memory()
    started = time.perf_counter()
    serving = serving_index(
        AnswerSettings(strategy=STRATEGY, model=MODEL, mode="hybrid-cc"),
        root=Path(spec["root"]),
        lock_wait_seconds=5,
        mapped_pages_mb=spec.get("mapped_pages_mb"),
        drop_copy_from_cache=not spec.get("cached", True),
    )
    open_seconds = time.perf_counter() - started
    replica_folder = Path(spec["root"]) / "serving"
    answerer = serving.current()
    steps["open"] = memory()
    latencies, ranked = [], []
    for question in spec["questions"]:
        started = time.perf_counter()
        result = serving.current().ask(question)  # as /ask does: current() first (where the budget is kept)
        latencies.append((time.perf_counter() - started) * 1000)
        ranked.append([[c["chunk_id"], text_hash(c["text"])] for c in result.chunks])
    gc.collect()
    steps["answered"] = memory()
    mapped = mapped_by_part(str(replica_folder))  # where serving keeps the replica's copy
    lookup = type(answerer.index.lookup).__name__
    cached = page_cache_mb(replica_folder)
    trims, dropped = serving.mapped_pages.trims, serving.mapped_pages.copies_dropped
    serving.close()
    return {
        "memory_mb": steps,
        "mapped_mb": mapped,
        "page_cache_mb": cached,
        "mapped_page_trims": trims,
        "page_cache_dropped": dropped > 0,
        "open_seconds": round(open_seconds, 2),
        "ask_ms": latencies,
        "chunk_lookup": lookup,
        "holds_chunk_table": lookup == "TableChunks",
        "passages": ranked,
    }


def page_cache_mb(folder: Path) -> float | None:
    """MB of the files under `folder` the kernel's page cache holds now (util-linux fincore); None without it."""
    files = [str(p) for p in folder.rglob("*") if p.is_file()]
    if not files:
        return 0.0
    try:
        done = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return round(sum(int(line) for line in done.stdout.split()) / 2**20, 1)


def measure_replica(
    root: Path,
    qdrant: Path,
    chunks: str,
    asked: list[str],
    *,
    float_model: bool = False,
    mapped_pages_mb: float | None = None,
    cached: bool = True,
) -> dict:
    """replica() in a child process with the serving environment: this data dir, this Edge folder, RAG_CHUNKS;
    `float_model`: the float embedding model loaded too, as every replica did before (the way before);
    `mapped_pages_mb`: rag.serving.residency's budget (None: none, as before); `cached`: the replica's copy left in
    the page cache (False: dropped once made, when bigger than the budget, as serving does by default)."""
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(root),
        "RAG_QDRANT_PATH": str(qdrant),
        "RAG_QDRANT_ENGINE": "edge",
        "RAG_CHUNKS": chunks,
    }
    spec = json.dumps(
        {
            "root": str(root),
            "questions": asked,
            "float_model": float_model,
            "mapped_pages_mb": mapped_pages_mb,
            "cached": cached,
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "bench.lib.serving_memory", spec],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    if done.returncode != 0:
        raise RuntimeError(f"the replica failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(replica(json.loads(sys.argv[1]))))
