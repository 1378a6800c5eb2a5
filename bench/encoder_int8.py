"""MiniLM on torch (sentence-transformers) vs minilm-int8 (int8 ONNX on onnxruntime) on SciFact (BEIR).
Writes its own JSON (arguments, commit, date, model versions); asserts nothing.

    .venv/bin/python bench/encoder_int8.py     # about 10-20 min on 2 cores (two full-corpus encodings)

Figures:
  query latency    wall ms per single query (encode_queries([q]): tokenize, encode, pool, normalise), over the first
                   --queries SciFact test queries, after --warmup untimed ones; p50 / p95 / mean. The two models
                   take turns on every query, so on a shared machine both see the same background load.
  batch throughput passages per second, the first --passages abstracts (title + text, as rag eval-beir indexes them)
                   in 8 encode_passages calls (batches of the embedder's batch_size), the models taking turns.
  quality          SciFact test nDCG@10 / recall@100, dense: all 5,183 abstracts encoded, each test query encoded on
                   its own, exact cosine top-100 in numpy, scored by ranx (rag.evaluation.metrics.evaluate_run).
  agreement        cosine between the two models' vectors of the same abstract (min / mean).
torch runs with its default thread count (recorded), the int8 model with RAG_ONNX_THREADS (default 1).
The int8 model is exported into --cache (a temporary folder by default) before any timing; the int8 model's
load_seconds include that export.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib import cli
from bench.lib.datasets import RESULTS, SCIFACT, scifact_absent
from bench.lib.provenance import commit
from bench.lib.results import log, write


def latency(embedders: dict, queries: list[str], warmup: int) -> dict:
    """Per-query wall ms, the models taking turns on each query: on a shared box both see the same load."""
    times: dict[str, list[float]] = {label: [] for label in embedders}
    for i, q in enumerate(queries[:warmup] + queries):
        for label, embedder in embedders.items():
            started = time.perf_counter()
            embedder.encode_queries([q])
            if i >= warmup:
                times[label].append(1000 * (time.perf_counter() - started))
    return {
        label: {
            "p50_ms": round(float(np.percentile(t, 50)), 2),
            "p95_ms": round(float(np.percentile(t, 95)), 2),
            "mean_ms": round(float(np.mean(t)), 2),
            "n": len(t),
        }
        for label, t in times.items()
    }


def throughput(embedders: dict, texts: list[str], slices: int = 8) -> tuple[dict, dict]:
    """Passages per second over `texts`, encoded in `slices` parts with the models taking turns on each part;
    and the vectors, per model."""
    seconds = dict.fromkeys(embedders, 0.0)
    parts: dict[str, list[np.ndarray]] = {label: [] for label in embedders}
    step = -(-len(texts) // slices)
    for i in range(0, len(texts), step):
        for label, embedder in embedders.items():
            started = time.perf_counter()
            parts[label].append(embedder.encode_passages(texts[i : i + step]))
            seconds[label] += time.perf_counter() - started
    figures = {
        label: {
            "passages": len(texts),
            "seconds": round(s, 2),
            "passages_per_second": round(len(texts) / s, 1),
            "batch_size": embedders[label].batch_size,
            "slices": slices,
        }
        for label, s in seconds.items()
    }
    return figures, {label: np.vstack(rows) for label, rows in parts.items()}


def quality(ds, doc_vecs: np.ndarray, query_vecs: np.ndarray) -> dict:
    from rag.evaluation.metrics import evaluate_run, run_from_hits

    ids = ds.corpus["chunk_id"].tolist()
    scores = query_vecs @ doc_vecs.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :100]
    run = run_from_hits({qid: [ids[j] for j in row] for qid, row in zip(ds.queries, top, strict=True)})
    mean, _ = evaluate_run(ds.qrels, run, ["ndcg@10", "recall@100"])
    return {m: round(v, 4) for m, v in mean.items()}


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument("--queries", type=int, default=200, help="single queries timed per model")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--passages", type=int, default=2000, help="passages in the throughput run")
    parser.add_argument("--float-model", default="minilm")
    parser.add_argument("--int8-model", default="minilm-int8")
    parser.add_argument("--cache", type=Path, help="data dir for the int8 export (default: a temporary folder)")
    cli.add_output(parser, RESULTS / "encoder-int8.json", flags=("--out",))
    args = parser.parse_args()
    if scifact_absent(args.dataset):
        return

    import torch

    from rag.embedding import load_embedder
    from rag.evaluation.beir import load_beir

    tmp = None
    if args.cache is None:
        tmp = tempfile.TemporaryDirectory(prefix="encoder-int8-")
        args.cache = Path(tmp.name)
    os.environ["RAG_DATA_DIR"] = str(args.cache)
    ds = load_beir(args.dataset, "test")
    texts = ds.corpus["text"].tolist()
    queries = list(ds.queries.values())
    result: dict = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "commit": commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "torch_threads": torch.get_num_threads(),
            "onnx_threads": int(os.environ.get("RAG_ONNX_THREADS") or 1),
            "note": "2-core box shared with another long benchmark, run under nice -n 19: timings are noisy",
        },
        "dataset": {"name": ds.name, "corpus": len(texts), "test_queries": len(queries)},
        "models": {},
    }
    embedders = {}
    for label, name in (("torch", args.float_model), ("int8", args.int8_model)):
        started = time.perf_counter()
        embedders[label] = load_embedder(name)
        result["models"][label] = {
            "name": name,
            "version": embedders[label].version,
            "load_seconds": round(time.perf_counter() - started, 2),
        }
        log(f"{name}: loaded in {result['models'][label]['load_seconds']} s (version {embedders[label].version})")
    for label, lat in latency(embedders, queries[: args.queries], args.warmup).items():
        result["models"][label]["query_latency"] = lat
        log(f"{label}: query p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms")
    figures, head = throughput(embedders, texts[: args.passages])
    for label, batch in figures.items():
        result["models"][label]["batch"] = batch
        log(f"{label}: {batch['passages_per_second']} passages/s")
    vectors = {}
    for label, embedder in embedders.items():  # the rest of the corpus, untimed, for the quality figures
        vectors[label] = np.vstack([head[label], embedder.encode_passages(texts[args.passages :])])
        scores = quality(ds, vectors[label], np.vstack([embedder.encode_queries([q]) for q in queries]))
        result["models"][label]["scifact_test"] = scores
        log(f"{label}: {scores}")
    cos = (vectors["torch"] * vectors["int8"]).sum(axis=1)
    result["agreement"] = {
        "passage_cosine_min": round(float(cos.min()), 4),
        "passage_cosine_mean": round(float(cos.mean()), 4),
    }
    t, q = result["models"]["torch"], result["models"]["int8"]
    result["speedup"] = {
        "query_p50": round(t["query_latency"]["p50_ms"] / q["query_latency"]["p50_ms"], 2),
        "batch": round(q["batch"]["passages_per_second"] / t["batch"]["passages_per_second"], 2),
    }
    write(result, args.out, indent=2)
    log(f"wrote {args.out}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
