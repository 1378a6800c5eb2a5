"""The serving replica on Qdrant Edge: how long `rag serve` takes to copy the primary collection into a new replica
and swap onto it, and whether the API keeps answering meanwhile. Writes its own JSON (arguments, commit, date,
machine, load average; rewritten after every size); asserts nothing.

    .venv/bin/python bench/replica_swap.py                    # 20k and 100k points (+ point by point at 20k)
    .venv/bin/python bench/replica_swap.py --points 3000 --point-by-point 3000 --repeats 1   # smoke

What runs is what `rag serve` runs: the server's own ServingIndex (rag.serving.server.serving_index over the
default AnswerSettings, strategy and model below: Answerer, hybrid-rrf, extractive generator, no reranker) on a data
dir holding a chunk table and the primary edge folder (RAG_DATA_DIR is set to it in this process, so the settings
resolve as the server's do). Its background thread calls `ServingIndex.refresh()` every refresh_seconds; here the
calls are made directly, back to back.

Data: the SciFact corpus (title + text, one chunk per document) encoded once with the minilm embedder
(encode_passages) and cached as .npy under --cache (bench.lib.edge.corpus_vectors: keyed by the weights' version
and a corpus hash; a second run encodes nothing); N points = the D documents, then noise copies of them
(bench.lib.edge.points_matrix / chunk_table: copy c of document d is its vector + noise of norm --sigma,
renormalised, with d's text and its own chunk_id). The primary is built by bench.lib.edge.build: the product's
create_collection, upserts of rag.index.sync.point_batch (dense + BM25 sparse vectors), optimize (HNSW), alias.

Per N, two copy paths (`file`: edge to edge, the product's path, EdgeClient.export_collection copies the shard's
files, HNSW graph included; `point`: rag.index.qdrant.copy_collection, scroll + upsert + optimize, which the product
uses for other engines, measured edge to edge by making rag.serving.index.copies_files answer False):
  cold       the server's start: ServingIndex built over a data dir with no replica yet (the first copy). The
             primary's files were just written by the build, so they are in the page cache.
  change     --change-fraction of the points (seeded random rows) re-upserted into the live primary collection with
             new vectors (their vector + noise, renormalised) and their BM25 sparse vectors, then optimize, as
             rag.index.sync does for changed chunks of an incremental re-index, in another process (as Dagster's
             re-index is: it shares the CPU with the server, not its interpreter). Its time is no part of the figures.
  refresh    refresh() twice: the first sees the primary changed and waits for it to settle (returns False; a server
             does this one tick earlier, refresh_seconds before), the second copies and swaps. Done --repeats times,
             each after its own change. Before each, the bench waits until the replica retired by the previous swap
             is removed (the server removes it 30 s after the swap), so that removal overlaps no timing.
  Per refresh, seconds of (instrumented by wrapping the functions ServingIndex calls, not by changing them):
    fingerprint   source_fingerprint (stat of the chunk table, BM25 files, the primary's collection files)
    copy          replicate_collection: open the primary, copy the collection, open the replica's client
    open          rag.retrieval.service.open_index on the replica (chunk table, alias and weights check, BM25 source)
    swap          everything of the refresh after the copy: open, the Answerer, the switch of the served answerer
    refresh       the whole refresh() call that copied (the settle call's time is given apart)
  disk_mb         du of the replica folder (allocated blocks: Edge's sparse preallocations count as what they use)
  availability    (--probe) a thread asks the served answerer (serving.current().rank(question): retrieve + filter, the
             /ask path before generation; every query encoded, Index.forget_query) one SciFact test question after
             another, --probe-pause-ms apart: --probe-warmup queries, --baseline-seconds, then a change and a refresh,
             and --after-seconds more. Reported: queries answered, errors (with their first messages), the longest time
             between two consecutive answers overlapping the refresh vs the longest in the baseline, latency
             p50 / p95 / max of queries started in each window, and the generation served before and after. The
             refresh figures of this pass are taken under that query load, on the same 2 cores.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.lib import cli
from bench.lib.datasets import RESULTS, scifact_absent
from bench.lib.edge import (
    STRATEGY,
    build,
    build_options,
    chunk_table,
    corpus_hash,
    corpus_vectors,
    default_cache,
    folder_mb,
    names,
    points_matrix,
)
from bench.lib.provenance import run_record
from bench.lib.results import finish, log, write

ENCODER = "minilm"


class Stopwatch:
    """Seconds spent in wrapped functions, summed per name until `take()`."""

    def __init__(self):
        self.spent: dict[str, float] = {}
        self._patches: list[tuple[object, str, object]] = []

    def wrap(self, module, attr: str, key: str) -> None:
        real = getattr(module, attr)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.spent[key] = self.spent.get(key, 0.0) + time.perf_counter() - started

        setattr(module, attr, timed)
        self._patches.append((module, attr, real))

    def take(self) -> dict[str, float]:
        spent, self.spent = self.spent, {}
        return spent

    def restore(self) -> None:
        for module, attr, real in reversed(self._patches):
            setattr(module, attr, real)
        self._patches.clear()


@contextmanager
def point_by_point(enabled: bool):
    """The serving replica copied point by point (copy_collection) though both folders are edge ones."""
    import rag.serving.index as serving_module

    real = serving_module.copies_files
    if enabled:
        serving_module.copies_files = lambda source, target: False
    try:
        yield
    finally:
        serving_module.copies_files = real


class Probe(threading.Thread):
    """Asks the served answerer one question after another; records (start, end, ok, generation) per query."""

    def __init__(self, serving, questions: list[str], pause_s: float):
        super().__init__(name="probe", daemon=True)
        self.serving, self.questions, self.pause_s = serving, questions, pause_s
        self.stop = threading.Event()
        self.events: list[tuple[float, float, bool, int]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            question = self.questions[i % len(self.questions)]
            i += 1
            generation = self.serving.generation
            started = time.perf_counter()
            try:
                answerer = self.serving.current()
                answerer.index.forget_query(question)  # a new question to the API: encoded, as every real one
                answerer.rank(question)
                ok = True
            except Exception as exc:  # noqa: BLE001 - counted, the first ones kept
                ok = False
                if len(self.errors) < 5:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            self.events.append((started, time.perf_counter(), ok, generation))
            self.stop.wait(self.pause_s)


def window_stats(events: list, start: float, end: float) -> dict:
    """Longest time between consecutive answers whose interval overlaps [start, end]; latency of queries started
    in it."""
    done = sorted(e for _, e, ok, _ in events if ok)
    gaps = [b - a for a, b in zip(done, done[1:]) if b >= start and a <= end]
    lat = [(e - s) * 1000 for s, e, ok, _ in events if ok and start <= s <= end]
    out = {
        "seconds": round(end - start, 3),
        "answered": len(lat),
        "errors": sum(1 for s, _, ok, _ in events if not ok and start <= s <= end),
        "max_gap_ms": round(max(gaps) * 1000, 1) if gaps else None,
    }
    if lat:
        out.update(
            {
                "latency_p50_ms": round(float(np.percentile(lat, 50)), 1),
                "latency_p95_ms": round(float(np.percentile(lat, 95)), 1),
                "latency_max_ms": round(max(lat), 1),
            }
        )
    return out


def pick_change(table, vectors: np.ndarray, fraction: float, sigma: float, rng) -> tuple[list[dict], np.ndarray]:
    """`fraction` of the rows (seeded) with new vectors: theirs + noise of norm `sigma`, renormalised (kept in
    `vectors` for the next change)."""
    rows = np.sort(rng.choice(len(table), size=max(1, round(len(table) * fraction)), replace=False))
    dim = vectors.shape[1]
    new = vectors[rows] + rng.standard_normal((len(rows), dim), dtype=np.float32) * np.float32(sigma / np.sqrt(dim))
    new /= np.linalg.norm(new, axis=1, keepdims=True)
    vectors[rows] = new
    return table.iloc[rows].to_dict("records"), new


def apply_change(folder: str, alias: str, records: list[dict], new: np.ndarray, avgdl: float, batch: int) -> dict:
    """Re-upsert the rows with their new vectors and BM25 sparse vectors into the live primary collection, then
    optimize, as an incremental sync writes changed chunks. Runs in another process, as a Dagster re-index does:
    the server's process shares its CPU, not its interpreter."""
    from rag.index.bm25_sparse import PassageTerms
    from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client, optimize
    from rag.index.sync import point_batch

    started = time.perf_counter()
    primary = QdrantSettings(path=folder)
    terms = PassageTerms.of([r["text"] for r in records])
    client = get_client(primary)
    try:
        collection = alias_target(client, alias)
        for i in range(0, len(records), batch):
            part = records[i : i + batch]
            client.upsert(
                collection, points=point_batch(part, new[i : i + len(part)], terms, avgdl, start=i), wait=True
            )
        optimize(client, collection)
    finally:
        close_client(primary)
    return {"points": len(records), "seconds": round(time.perf_counter() - started, 3)}


def wait_retired(serving, limit_s: float = 60.0) -> float:
    """Until the serving folder holds only the served replica (the previous one is removed 30 s after a swap)."""
    started = time.perf_counter()
    current = Path(serving.info()["qdrant"].removeprefix("replica "))
    while time.perf_counter() - started < limit_s:
        if [p for p in serving.replicas.glob("replica-*") if p != current] == []:
            break
        time.sleep(0.5)
    return round(time.perf_counter() - started, 1)


def refresh_figures(serving, watch: Stopwatch, total: float, settle_s: float | None = None) -> dict:
    spent = watch.take()
    copy = spent.get("copy", 0.0)
    replica = Path(serving.info()["qdrant"].removeprefix("replica "))
    index = serving.current().index
    info = index.client.get_collection(index.alias)
    out = {
        "refresh_s": round(total, 3),
        "copy_s": round(copy, 3),
        "swap_s": round(total - copy - spent.get("fingerprint", 0.0), 3),
        "open_s": round(spent.get("open", 0.0), 3),
        "fingerprint_s": round(spent.get("fingerprint", 0.0), 3),
        "disk_mb": folder_mb(replica),
        "points": info.points_count,
        "indexed_vectors": info.indexed_vectors_count,
        "segments": info.segments_count,
        "generation": serving.generation,
    }
    if settle_s is not None:
        out["settle_call_s"] = round(settle_s, 3)
    return out


def refresh_after_change(serving, watch: Stopwatch, change) -> tuple[dict, tuple[float, float]]:
    """Change the primary, then the two refresh calls: figures, and when the copying call started and ended."""
    changed = change()
    watch.take()
    started = time.perf_counter()
    settled = serving.refresh()
    settle_s = time.perf_counter() - started
    swap_start = time.perf_counter()
    swapped = serving.refresh()
    swap_end = time.perf_counter()
    return (
        {
            "change": changed,
            "settle_call_returned": settled,
            "refresh_returned": swapped,
            **refresh_figures(serving, watch, swap_end - swap_start, settle_s),
        },
        (swap_start, swap_end),
    )


def measure(
    path: str, root: Path, table, vectors, lengths, questions, watch: Stopwatch, writer, args, repeats: int
) -> dict:
    from rag.qa import AnswerSettings
    from rag.serving.server import serving_index

    rng = np.random.default_rng(args.seed + 1)
    vectors = vectors.copy()
    alias = names(ENCODER, args.encoder_version)[1]
    out: dict = {"path": path}

    def change():
        records, new = pick_change(table, vectors, args.change_fraction, args.sigma, rng)
        return writer.submit(
            apply_change, str(root / "qdrant"), alias, records, new, float(lengths.mean()), args.batch
        ).result()

    with point_by_point(path == "point"):
        shutil.rmtree(root / "serving", ignore_errors=True)
        watch.take()
        started = time.perf_counter()
        serving = serving_index(AnswerSettings(strategy=STRATEGY, model=ENCODER), root=root)
        out["cold"] = refresh_figures(serving, watch, time.perf_counter() - started)
        log(f"{path} cold: {out['cold']}")
        try:
            out["refresh"] = []
            for _ in range(repeats):
                waited = wait_retired(serving)
                out["refresh"].append(
                    {**refresh_after_change(serving, watch, change)[0], "waited_for_retired_s": waited}
                )
                log(f"{path} refresh: {out['refresh'][-1]}")
            if args.probe:
                wait_retired(serving)
                probe = Probe(serving, questions, args.probe_pause_ms / 1000)
                probe.start()
                while len(probe.events) < args.probe_warmup and probe.is_alive():
                    time.sleep(0.05)
                base_start = time.perf_counter()
                time.sleep(args.baseline_seconds)
                base_end = time.perf_counter()
                before = serving.generation
                figures, (swap_start, refresh_end) = refresh_after_change(serving, watch, change)
                time.sleep(args.after_seconds)
                probe.stop.set()
                probe.join()
                events = probe.events
                served_after = sorted({g for s, _, ok, g in events if ok and s > refresh_end})
                out["availability"] = {
                    "probe_pause_ms": args.probe_pause_ms,
                    "queries": len(events),
                    "warmup_queries": args.probe_warmup,
                    "errors": sum(1 for *_, ok, _ in events if not ok),
                    "error_messages": probe.errors,
                    "baseline": window_stats(events, base_start, base_end),
                    "during_refresh": window_stats(events, swap_start, refresh_end),
                    "during_change_and_refresh": window_stats(events, base_end, refresh_end),
                    "generation_before": before,
                    "generations_served_after": served_after,
                    "refresh_under_load": figures,
                }
                log(f"{path} availability: {out['availability']}")
        finally:
            serving.close()
    return out


def main() -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--points", type=int, nargs="+", default=[20_000, 100_000])
    ap.add_argument(
        "--point-by-point",
        type=int,
        nargs="*",
        default=[20_000],
        help="sizes (of --points) also measured with the point-by-point copy",
    )
    ap.add_argument("--repeats", type=int, default=3, help="change + refresh rounds per size and path")
    ap.add_argument("--change-fraction", type=float, default=0.01)
    ap.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True, help="the availability pass")
    ap.add_argument("--probe-pause-ms", type=float, default=2.0)
    ap.add_argument("--probe-warmup", type=int, default=20, help="queries answered before the baseline window opens")
    ap.add_argument("--baseline-seconds", type=float, default=5.0)
    ap.add_argument("--after-seconds", type=float, default=2.0)
    ap.add_argument(
        "--sigma", type=float, default=0.5, help="norm of the noise of a copy's vector (before renormalising)"
    )
    ap.add_argument("--batch", type=int, default=512, help="points per upsert (the sync path's default)")
    ap.add_argument(
        "--bm25",
        nargs="+",
        default=["engine"],
        choices=["engine", "bm25s"],
        help="edge_latency.build's: with engine, points carry BM25 sparse vectors as the product writes them",
    )
    cli.add_seed(ap)
    cli.add_scifact(ap)
    cli.add_vectors_cache(ap)
    ap.add_argument("--root", type=Path, help="folder for the data dirs (default: a temporary one, removed)")
    cli.add_output(ap, RESULTS / "replica-swap.json")
    args = ap.parse_args()

    if scifact_absent(args.scifact):
        return 0
    loadavg_before = [round(x, 2) for x in os.getloadavg()]
    import torch

    import rag.retrieval.service as service_module
    import rag.serving.index as serving_module
    from rag.embedding import load_embedder
    from rag.evaluation.beir import load_beir
    from rag.index.bm25_sparse import PassageTerms
    from rag.store import CHUNKS_TABLE, TableStore

    cache = args.cache or default_cache()
    test = load_beir(args.scifact, "test")
    corpus = test.corpus
    embedder = load_embedder(ENCODER)
    args.encoder_version = embedder.version
    base, cache_info = corpus_vectors(ENCODER, embedder, corpus, cache)
    doc_lengths = PassageTerms.of(corpus["text"].tolist()).lengths
    questions = list(test.queries.values())
    root = args.root or Path(tempfile.mkdtemp(prefix="replica-swap-"))
    root.mkdir(parents=True, exist_ok=True)
    build_args = build_options(args.batch)
    out = {
        **run_record(args, torch_threads=torch.get_num_threads(), loadavg_before_run=loadavg_before),
        "data": {
            "scifact": str(args.scifact),
            "documents": len(corpus),
            "corpus_hash": corpus_hash(corpus),
            "encoder": ENCODER,
            "encoder_version": embedder.version,
            "sigma": args.sigma,
            "vectors_cache": cache_info,
            "strategy": STRATEGY,
        },
        "runs": [],
    }
    watch = Stopwatch()
    watch.wrap(serving_module, "replicate_collection", "copy")
    watch.wrap(serving_module, "source_fingerprint", "fingerprint")
    watch.wrap(service_module, "open_index", "open")  # serving_index imports it when called: wrapped before
    # The primary's changes are written by another process, as Dagster's re-index is (spawned: no fork of torch).
    writer = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        for n in args.points:
            data = root / f"data-{n}"
            shutil.rmtree(data, ignore_errors=True)
            os.environ["RAG_DATA_DIR"] = str(data)  # the server's settings (primary folder, registry) resolve here
            table = chunk_table(corpus, n)
            vectors = points_matrix(base, n, args.sigma, args.seed)
            lengths = doc_lengths[np.arange(n) % len(corpus)]
            TableStore(data / "tables").write(table, CHUNKS_TABLE, STRATEGY)
            log(f"N = {n}: building the primary")
            run = {
                "points": n,
                "loadavg_at_size_start": [round(x, 2) for x in os.getloadavg()],
                "build": build("edge", data / "qdrant", table, vectors, ENCODER, embedder.version, build_args),
            }
            run["primary_disk_mb"] = folder_mb(data / "qdrant")
            log(f"N = {n}: primary {run['build']}, {run['primary_disk_mb']} MB")
            run["paths"] = []
            for path in ["file", "point"] if n in args.point_by_point else ["file"]:
                run["paths"].append(
                    measure(
                        path,
                        data,
                        table,
                        vectors,
                        lengths,
                        questions,
                        watch,
                        writer,
                        args,
                        args.repeats if path == "file" else 1,
                    )
                )
                out["runs"] = [*[r for r in out["runs"] if r["points"] != n], run]
                write(out, args.json)
            shutil.rmtree(data, ignore_errors=True)
    finally:
        writer.shutdown()
        watch.restore()
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    finish(out, args.json, print_table)
    return 0


def print_table(out: dict) -> None:
    print("\nserving replica on Qdrant Edge: seconds (median over refreshes) and replica MB")
    print(
        f"  {'points':>7s} {'path':5s} {'cold copy':>9s} {'cold swap':>9s} {'copy':>6s} {'swap':>6s} {'refresh':>8s} "
        f"{'disk MB':>8s} {'max gap ms (base)':>18s} {'errors':>6s}"
    )
    for run in out["runs"]:
        for p in run["paths"]:
            med = {k: float(np.median([r[k] for r in p["refresh"]])) for k in ("copy_s", "swap_s", "refresh_s")}
            a = p.get("availability")
            gap = f"{a['during_refresh']['max_gap_ms']} ({a['baseline']['max_gap_ms']})" if a else "-"
            print(
                f"  {run['points']:7d} {p['path']:5s} {p['cold']['copy_s']:9.2f} {p['cold']['swap_s']:9.2f} "
                f"{med['copy_s']:6.2f} {med['swap_s']:6.2f} {med['refresh_s']:8.2f} {p['refresh'][-1]['disk_mb']:8.1f} "
                f"{gap:>18s} {a['errors'] if a else '-':>6}"
            )


if __name__ == "__main__":
    sys.exit(main())
