"""MiniLM on torch (sentence-transformers) vs minilm-int8 (int8 ONNX on onnxruntime) on SciFact (BEIR).
Writes its own JSON (arguments, commit, date, model versions); asserts nothing.

    .venv/bin/python bench/encoder_int8.py     # about 10-20 min on 2 cores (two full-corpus encodings)

Figures:
  query latency    wall ms per single query (encode_queries([q]): tokenize, encode, pool, normalise), over the first
                   --queries SciFact test queries, after --warmup untimed ones; p50 / p95 / mean. The two models
                   take turns on every query, so on a shared machine both see the same background load.
  batch throughput passages per second, the first --passages abstracts (title + text, as rag eval-beir indexes them)
                   in 8 encode_passages calls (batches of the embedder's batch_size), the models taking turns.
  quality          dense nDCG@10 / recall@100 on SciFact test (all 5,183 abstracts) and, with --squad, on SQuAD dev
                   (its 2,067 paragraphs, its 10,570 human questions): every passage encoded by both models, each
                   query encoded on its own (as /ask does), exact cosine top-100 in numpy, scored by ranx
                   (rag.evaluation.metrics.evaluate_run). Three arms: float queries over float passages, int8 over
                   int8, and int8 queries over float passages (what `query_encoder: int8` serves: the index keeps
                   the float model's vectors, only the question is encoded by the int8 model); each int8 arm beside
                   the float one in a paired test of per-query nDCG@10 (rag.evaluation.metrics.paired_comparison).
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
from bench.lib.datasets import RESULTS, SCIFACT, SQUAD, absent, scifact_absent, squad_as_beir
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


def quality(ds, doc_vecs: np.ndarray, query_vecs: np.ndarray) -> tuple[dict, object]:
    """Mean nDCG@10 / recall@100 of exact dense search, and the per-query nDCG@10 (a Series by query id)."""
    from rag.evaluation.metrics import evaluate_run, run_from_hits

    ids = ds.corpus["chunk_id"].tolist()
    top = np.vstack(
        [np.argsort(-(part @ doc_vecs.T), axis=1, kind="stable")[:, :100] for part in np.array_split(query_vecs, 16)]
    )
    run = run_from_hits({qid: [ids[j] for j in row] for qid, row in zip(ds.queries, top, strict=True)})
    mean, table = evaluate_run(ds.qrels, run, ["ndcg@10", "recall@100"])
    return {m: round(v, 4) for m, v in mean.items()}, table.set_index("qid")["ndcg@10"]


def quality_arms(ds, embedders: dict, passages: dict[str, np.ndarray]) -> dict:
    """The three arms on one dataset: float/float, int8/int8 and int8 queries over float passages, with paired
    tests of each int8 arm against float/float. Queries are encoded one at a time, as /ask encodes them (int8's
    activation scales are per batch, so a batch would give other vectors than serving does)."""
    from rag.evaluation.metrics import paired_comparison

    queries = list(ds.queries.values())
    query_vecs = {label: np.vstack([e.encode_queries([q]) for q in queries]) for label, e in embedders.items()}
    arms = {
        "float": (passages["torch"], query_vecs["torch"]),
        "int8": (passages["int8"], query_vecs["int8"]),
        "int8_queries_over_float_passages": (passages["torch"], query_vecs["int8"]),
    }
    scored = {name: quality(ds, docs, qv) for name, (docs, qv) in arms.items()}
    out = {name: mean for name, (mean, _) in scored.items()}
    base = scored["float"][1]
    out["paired_ndcg@10_vs_float"] = {
        name: {k: round(v, 4) if isinstance(v, float) else v for k, v in paired_comparison(per_q, base).items()}
        for name, (_, per_q) in scored.items()
        if name != "float"
    }
    cos = (query_vecs["torch"] * query_vecs["int8"]).sum(axis=1)
    out["query_cosine"] = {"min": round(float(cos.min()), 4), "mean": round(float(cos.mean()), 4)}
    out["queries"], out["passages"] = len(queries), len(ds.corpus)
    return out


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument("--queries", type=int, default=200, help="single queries timed per model")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--passages", type=int, default=2000, help="passages in the throughput run")
    parser.add_argument("--float-model", default="minilm")
    parser.add_argument("--int8-model", default="minilm-int8")
    parser.add_argument("--cache", type=Path, help="data dir for the int8 export (default: a temporary folder)")
    parser.add_argument("--squad", action="store_true", help="quality on SQuAD dev too (its human questions)")
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
            "loadavg": [round(x, 2) for x in os.getloadavg()],
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
    # the rest of the corpus, untimed, for the quality figures
    vectors = {
        label: np.vstack([head[label], e.encode_passages(texts[args.passages :])]) for label, e in embedders.items()
    }
    result["quality"] = {"scifact_test": quality_arms(ds, embedders, vectors)}
    log(f"scifact: {result['quality']['scifact_test']}")
    if args.squad and not absent(SQUAD, "SQuAD dev"):
        squad = load_beir(squad_as_beir(args.cache / "squad-beir"), "test")
        squad_vectors = {label: e.encode_passages(squad.corpus["text"].tolist()) for label, e in embedders.items()}
        result["quality"]["squad_dev"] = quality_arms(squad, embedders, squad_vectors)
        log(f"squad: {result['quality']['squad_dev']}")
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
