"""A serving replica's memory at N synthetic chunks, the way before and the new way in one run: the whole chunk table
in memory over a collection of the engine's default layout (RAG_CHUNKS=table), against chunk records read per hit
from the collection's payloads (RAG_CHUNKS=auto, the default) over the same collection and over collections built
with the sized layouts of config/qdrant/ (10m: an int8 copy of the vectors in RAM, the rest on disk; 1m: every part
on disk, the new way the ratios compare with the way before, which also bounds the collection's pages it keeps mapped
and drops its copy from the page cache: rag.serving.residency; beside it the same without either, and with the bound
but the copy left in the page cache). Each replica is a fresh process that builds what `rag serve` builds (a
replica copy of the collection, open_index, the answerer) and answers questions through the whole answer pipeline;
the passages each returns are compared between the two ways. Writes its own JSON (arguments, commit, date,
machine); asserts nothing. How it builds and measures: bench/lib/serving_memory.py.

    .venv/bin/python bench/serving_memory.py                 # 1,000,000 chunks (an hour or more on 2 cores)
    .venv/bin/python bench/serving_memory.py --quick         # 50,000 chunks, minutes
    .venv/bin/python bench/serving_memory.py --chunks 200000 --layouts default 100m 1m
    .venv/bin/python bench/serving_memory.py --reuse bench/results/serving-memory.json  # its --keep dir again

Dense vectors are random 384-d unit vectors around random centres, upserted directly: encoding a million texts
would take hours, and a vector's bytes do not depend on its values. BM25 sparse vectors, payloads and the chunk
table are the product's own. The data dir is a fresh temporary folder (removed at the end unless --keep), on the
same disk as the system's temporary files: give --keep DIR elsewhere when that disk is small (1M chunks with three
layouts take about 20 GB). Default output: bench/results/serving-memory.json (--quick: serving-memory-quick.json).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.lib import cli
from bench.lib.datasets import RESULTS
from bench.lib.provenance import run_record
from bench.lib.results import finish, log, stats
from bench.lib.serving_memory import MAPPED_BUDGET, MEASURES, measure_size

FLOOR_CHUNKS = 2_000  # the small size beside the run's: what the chunks add is the difference

LAYOUTS = Path(__file__).resolve().parent.parent / "config" / "qdrant"


def layout_of(label: str):
    from rag.index.layout import CollectionLayout

    return CollectionLayout() if label == "default" else CollectionLayout.from_file(LAYOUTS / f"{label}.yaml")


def summary(run: dict, floor: dict, chunks: int, floor_chunks: int) -> dict:
    """A replica's figures after its questions (steady), its peak, what it holds beyond the embedding model it loads
    whatever the corpus, and per chunk: the heap and mapped pages it adds from the floor's size to this one."""
    after, model, small = run["memory_mb"]["answered"], run["memory_mb"]["model"], floor["memory_mb"]["answered"]
    grown = chunks - floor_chunks
    return {
        "steady_rss_mb": after["rss"],
        "peak_rss_mb": after["peak"],
        "anon_mb": after["anon"],
        "file_mb": after["file"],
        "model_rss_mb": model["rss"],
        "index_rss_mb": round(after["rss"] - model["rss"], 1),
        "floor_rss_mb": small["rss"],
        "page_cache_mb": run.get("page_cache_mb"),
        "mapped_page_trims": run.get("mapped_page_trims"),
        "anon_bytes_per_chunk": round((after["anon"] - small["anon"]) * 2**20 / grown),
        "file_bytes_per_chunk": round((after["file"] - small["file"]) * 2**20 / grown),
        "ask": stats(run["ask_ms"]),
    }


def show(record: dict) -> None:
    print(f"\n{record['data']['chunks']:,} chunks; {MEASURES}")
    head = ["steady MB", "anon", "file", "peak MB", "index MB", "ask p50", "ask p95"]
    print(f"{'replica':60s} " + " ".join(f"{h:>9s}" for h in head))
    for row in record["replicas"]:
        s = row["summary"]
        print(
            f"{row['label']:60s} {s['steady_rss_mb']:9.0f} {s['anon_mb']:9.0f} {s['file_mb']:9.0f} "
            f"{s['peak_rss_mb']:9.0f} {s['index_rss_mb']:9.0f} {s['ask']['p50_ms']:9.1f} {s['ask']['p95_ms']:9.1f}"
        )
    print(record["ratios"])


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    p.add_argument("--chunks", type=int, default=1_000_000, help="synthetic chunks (default %(default)s)")
    cli.add_quick(p, "50,000 chunks (overrides --chunks)")
    p.add_argument("--words", type=int, default=160, help="words a chunk (default %(default)s: about 1 KB)")
    p.add_argument("--per-document", type=int, default=20, help="chunks a document (default %(default)s)")
    p.add_argument("--questions", type=int, default=20, help="questions each replica answers (default %(default)s)")
    p.add_argument(
        "--layouts",
        nargs="+",
        default=["default", "10m", "1m"],
        help="collection layouts, one collection each: 'default' (the engine's own, the way before) or a file of "
        "config/qdrant/ (1m, 10m, 100m); the first also serves the way before, the last is the new way the ratios "
        "compare with it (default: %(default)s)",
    )
    p.add_argument("--keep", type=Path, help="build the data dir here and keep it (default: a temporary one)")
    p.add_argument(
        "--reuse",
        type=Path,
        help="a result of a run with --keep whose folder still holds what it built: its chunk sets and collections "
        "are measured again by replicas of this code, not built (its sizes, layouts and build figures are taken "
        "from it; --questions and --seed are this run's)",
    )
    cli.add_seed(p)
    cli.add_output(p, flags=("--json",), help="result JSON (default bench/results/serving-memory[-quick].json)")
    args = p.parse_args(argv)
    if args.quick:
        args.chunks = 50_000
    reused = json.loads(args.reuse.read_text()) if args.reuse else None
    if reused is not None:
        if not reused["args"].get("keep") or not Path(reused["args"]["keep"]).is_dir():
            p.error(f"{args.reuse} was not run with --keep, or its folder is gone: nothing to measure again")
        args.chunks, args.layouts = reused["data"]["chunks"], reused["args"]["layouts"]
        args.keep = Path(reused["args"]["keep"])
    elif args.quick:
        args.chunks = 50_000
    layouts = {label: layout_of(label) for label in args.layouts}  # a missing file fails before anything is built
    out = args.json or RESULTS / ("serving-memory-quick.json" if args.quick else "serving-memory.json")
    record = run_record(args, floor_chunks=FLOOR_CHUNKS)
    if reused is not None:
        record["reused_builds"] = {k: reused[k] for k in ("commit", "date", "machine")} | {"result": str(args.reuse)}
    elif args.keep and args.keep.exists() and any(args.keep.iterdir()):
        p.error(f"{args.keep} is not empty: the bench builds from nothing")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    scratch = contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="serving-")
    with scratch as folder:
        work = Path(folder)
        # The same at a floor of a few thousand chunks: what a replica holds whatever the corpus (the model, the
        # answer stage, the engine's own) is what both sizes share, so the difference is what the chunks add.
        floor_built = run_built = None
        if reused is not None:
            floor_builds = {label: {"disk_mb": mb} for label, mb in reused["floor"]["disk_mb"].items()}
            floor_built = {"data": {"chunks": FLOOR_CHUNKS}, "builds": floor_builds}
            run_built = {"data": reused["data"], "builds": reused["builds"]}
        log(f"the floor: {FLOOR_CHUNKS:,} chunks")
        floor = measure_size(work / "floor", FLOOR_CHUNKS, layouts, args, floor_built)
        log(f"the run: {args.chunks:,} chunks")
        record |= measure_size(work / "run", args.chunks, layouts, args, run_built)
        record["data"] |= {
            "vectors": "random 384-d unit vectors around 4,096 random centres, upserted directly (not encoded); "
            "questions are encoded by the real model",
            "bm25": "the product's sparse vectors of the synthetic texts (rag.index.bm25_sparse)",
            "measures": MEASURES,
            "mapped_pages_budget": MAPPED_BUDGET,
        }
        for row, small in zip(record["replicas"], floor["replicas"]):
            row["summary"] = summary(row, small, args.chunks, FLOOR_CHUNKS)
        for label, build in record["builds"].items():
            grown = build["disk_mb"] - floor["builds"][label]["disk_mb"]
            build["disk_bytes_per_chunk"] = round(grown * 2**20 / (args.chunks - FLOOR_CHUNKS))
        record["floor"] = {
            "chunks": FLOOR_CHUNKS,
            "replicas": [{"label": r["label"], "memory_mb": r["memory_mb"]} for r in floor["replicas"]],
            "disk_mb": {label: b["disk_mb"] for label, b in floor["builds"].items()},
        }
        before, same = record["replicas"][0], record["replicas"][1]
        newest = record["replicas"][-1]
        # What the answers show, chunk ids and texts: the same collection served both ways must give the same.
        record["same_passages"] = before["passages"] == same["passages"]
        before_sets = [set(map(tuple, shown)) for shown in before["passages"]]
        for row in record["replicas"]:
            sets = [set(map(tuple, shown)) for shown in row.pop("passages")]
            shared = [len(a & b) / max(len(b), 1) for a, b in zip(sets, before_sets)]
            row["passages_shared_with_before"] = round(float(np.mean(shared)), 4)
        record["ratios"] = {
            f"{figure}_new_over_before": round(newest["summary"][figure] / max(before["summary"][figure], 1.0), 3)
            for figure in ("steady_rss_mb", "peak_rss_mb", "index_rss_mb", "anon_mb")
        }
        finish(record, out, show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
