"""Where the serving API's pause during a replica swap comes from: how long each step of opening a new replica
holds Python's GIL. Writes its own JSON (arguments, commit, date, machine); asserts nothing.

    .venv/bin/python bench/replica_open_pause.py                     # 100k points
    .venv/bin/python bench/replica_open_pause.py --points 3000 --repeats 1   # smoke

A primary edge collection of N points is built as bench/replica_swap.py builds it (bench.lib.edge.build: dense
and BM25 sparse vectors, HNSW), with its chunk table in a data dir. A probe thread sleeps 1 ms in a loop and
records the time between its wake-ups; the longest one overlapping a step is how long that step kept every other
Python thread (an API request among them) from running. Steps, each --repeats times on a fresh file copy of the
primary (rag.serving.index.replicate_collection, as the server takes one):
  copy            replicate_collection (the shard's files copied, the replica's client opened)
  chunk_table     the chunk table read and indexed by chunk_id, as open_index reads it
  shard_load      the replica's first get_collection: qdrant-edge-py loads the shard (EdgeShard.load)
  open_index      rag.retrieval.service.open_index on the replica, the whole call the server makes (after
                  closing the replica's client, so the shard is loaded again inside it)
Per step: seconds and the longest gap (ms); the baseline gap is the probe alone for a second before the steps.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS, scifact_absent
from bench.lib.edge import (
    STRATEGY,
    build,
    build_options,
    chunk_table,
    corpus_vectors,
    default_cache,
    names,
    points_matrix,
)
from bench.lib.provenance import run_record
from bench.lib.results import finish, log

ENCODER = "minilm"


class GapProbe(threading.Thread):
    """Wakes every millisecond; (previous wake-up, this one) pairs tell how long no Python thread but one ran."""

    def __init__(self):
        super().__init__(name="gap-probe", daemon=True)
        self.wakes: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        last = time.perf_counter()
        while not self.stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.wakes.append((last, now))
            last = now

    def longest(self, start: float, end: float) -> float:
        """The longest gap (ms) overlapping [start, end]."""
        return round(1000 * max((b - a for a, b in self.wakes if b >= start and a <= end), default=0.0), 1)


def timed(probe: GapProbe, fn) -> tuple[object, dict]:
    started = time.perf_counter()
    out = fn()
    ended = time.perf_counter()
    time.sleep(0.05)  # the probe's wake-up after the step closes the gap that overlaps its end
    return out, {"seconds": round(ended - started, 3), "max_gap_ms": probe.longest(started, ended)}


def main() -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=512)
    cli.add_seed(ap)
    cli.add_scifact(ap)
    cli.add_vectors_cache(ap)
    cli.add_output(ap, RESULTS / "replica-open-pause.json")
    args = ap.parse_args()
    if scifact_absent(args.scifact):
        return 0
    root = Path(tempfile.mkdtemp(prefix="replica-open-pause-"))
    os.environ["RAG_DATA_DIR"] = str(root / "data")  # settings resolve here, as the server's do

    from rag.embedding import load_embedder
    from rag.evaluation.beir import load_beir
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.retrieval.service import open_index
    from rag.serving.index import replicate_collection
    from rag.store import CHUNKS_TABLE, TableStore

    data = root / "data"
    corpus = load_beir(args.scifact, "test").corpus
    embedder = load_embedder(ENCODER)
    base, cache_info = corpus_vectors(ENCODER, embedder, corpus, args.cache or default_cache())
    table = chunk_table(corpus, args.points)
    TableStore(data / "tables").write(table, CHUNKS_TABLE, STRATEGY)
    log(f"building {args.points} points")
    built = build(
        "edge",
        data / "qdrant",
        table,
        points_matrix(base, args.points, args.sigma, args.seed),
        ENCODER,
        embedder.version,
        build_options(args.batch),
    )
    del table
    alias = names(ENCODER, embedder.version)[1]
    primary = QdrantSettings(path=str(data / "qdrant"))
    out = {
        **run_record(args),
        "data": {
            "encoder": ENCODER,
            "encoder_version": embedder.version,
            "vectors_cache": cache_info,
            "strategy": STRATEGY,
        },
        "build": built,
        "repeats": [],
    }
    probe = GapProbe()
    probe.start()
    try:
        time.sleep(1.0)
        out["baseline_max_gap_ms"] = probe.longest(probe.wakes[0][0], time.perf_counter())
        for i in range(args.repeats):
            replica = QdrantSettings(path=str(root / f"replica-{i}"))
            steps = {}
            _, steps["copy"] = timed(probe, lambda: replicate_collection(primary, replica, alias))
            _, steps["chunk_table"] = timed(
                probe, lambda: TableStore(data / "tables").read(CHUNKS_TABLE, STRATEGY).set_index("chunk_id")
            )
            client = get_client(replica)
            _, steps["shard_load"] = timed(probe, lambda: client.get_collection(alias))
            close_client(replica)
            _, steps["open_index"] = timed(probe, lambda: open_index(STRATEGY, ENCODER, root=data, qdrant=replica))
            close_client(replica)
            shutil.rmtree(replica.location, ignore_errors=True)
            out["repeats"].append(steps)
            log(f"repeat {i + 1}: {steps}")
    finally:
        probe.stop.set()
        shutil.rmtree(root, ignore_errors=True)
    finish(out, args.json, print_table)
    return 0


def print_table(out: dict) -> None:
    print(
        f"\nopening a serving replica of {out['args']['points']} points: seconds / longest GIL gap ms "
        f"(probe alone: {out['baseline_max_gap_ms']} ms)"
    )
    for i, steps in enumerate(out["repeats"], 1):
        print(f"  {i}: " + "  ".join(f"{k} {v['seconds']:.3f}/{v['max_gap_ms']:.0f}" for k, v in steps.items()))


if __name__ == "__main__":
    sys.exit(main())
