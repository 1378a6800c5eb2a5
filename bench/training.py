"""Trained-model figures on SciFact (BEIR). Prints a table and writes JSON; asserts nothing.

    nice -n 15 .venv/bin/python bench/training.py [--pairs 2000] [--stages synthetic,reranker,ceiling] [--json OUT]

1. synthetic: fine-tune minilm on inverse-cloze pseudo-queries made from the SciFact *corpus only* (no qrels, no
   queries), re-index SciFact with it, and compare test nDCG@10 (dense and hybrid-rrf) with the base model
   (anchor: base minilm 0.645; GPL reports about +6 nDCG points on average over BEIR with generated queries).
2. reranker: a cross-encoder trained from minilm's weights on the same pseudo-queries re-ranks hybrid-rrf's top 50.
3. ceiling: the same fine-tune with SciFact's *train* qrels (809 queries) as if they were positive user feedback.
Training wall time is measured on this machine (2 shared cores). Indexes live under --data-dir and are reused.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHARED = REPO.parent / "shared" / "datasets"
ANCHOR_BASE_NDCG10 = 0.645


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def beir_scores(folder: Path, root: Path, model: str, modes=("dense", "hybrid-rrf")) -> dict:
    from rag.evaluation.beir import evaluate_beir

    out = {}
    for mode in modes:
        r = evaluate_beir(folder, mode=mode, model=model, root=root)
        out[mode] = {k: r[k] for k in ("ndcg@10", "recall@10", "recall@100", "mrr@10")} | {"index_seconds": r.get("index_seconds")}
        log(f"{model} {mode}: nDCG@10 {r['ndcg@10']:.4f} (index {r.get('index_seconds')} s)")
    return out


def selection_set(triples, corpus: dict[str, str], size: int, distractors: int, seed: int):
    """Held-out pseudo-queries over a corpus sample: checkpoint selection without encoding all of SciFact per eval."""
    import random

    from rag.training.data import IRSet

    held = triples[:size]
    rng = random.Random(seed)
    ids = {pid for _, _, pid in held} | set(rng.sample(sorted(corpus), min(distractors, len(corpus))))
    return IRSet({f"s{i}": q for i, (q, _, _) in enumerate(held)}, {c: corpus[c] for c in ids},
                 {f"s{i}": {pid: 1} for i, (_, _, pid) in enumerate(held)})


def train_and_register(registry, positives, selection, config, label: str, kind: str = "embedder"):
    import tempfile

    from rag.registry import library_versions
    from rag.training.data import TrainingData
    from rag.training.embedder import train_embedder
    from rag.training.reranker import train_reranker

    data = TrainingData(positives, [], selection, None)
    trainer = train_embedder if kind == "embedder" else train_reranker
    with tempfile.TemporaryDirectory(dir=registry.root) as scratch:
        run = trainer(data, config, Path(scratch) / "model", log=lambda m: log(f"{label}: {m}") if "step" not in m or "eval" in m else None)
        mv = registry.register(kind, run.model_dir, {
            "base_model": config.base_model, "training_data_hash": data.data_hash, "seed": config.seed,
            "hyperparameters": config.model_dump(exclude={"extra_positives", "extra_negatives"}),
            "library_versions": library_versions(), "metrics": {"dev_selection": run.selection_metrics, "training": run.summary},
            "bench": label}, move=True)
    log(f"{label}: {run.summary['steps']} steps on {run.examples} examples in {run.seconds:.0f} s -> {mv.name}")
    return mv, run


def rerank_eval(folder: Path, root: Path, reranker, depth: int) -> dict:
    from ranx import Qrels, Run, evaluate

    from rag.evaluation.beir import load_beir, open_beir_index
    from rag.retrieval import RetrievalParams, retrieve

    ds = load_beir(folder, "test")
    index, _ = open_beir_index(ds, "hybrid-rrf", "minilm", root)
    params = RetrievalParams(k=depth, candidates=100)
    plain, reranked = {}, {}
    started = time.perf_counter()
    for qid, text in ds.queries.items():
        hits = retrieve(index, text, "hybrid-rrf", params)
        ids = [h.chunk["chunk_id"] for h in hits]
        plain[qid] = {c: float(len(ids) - i) for i, c in enumerate(ids)}
        scores = reranker.score(text, [h.chunk["text"] for h in hits])
        order = sorted(range(len(ids)), key=lambda i: (-float(scores[i]), i))
        reranked[qid] = {ids[i]: float(len(ids) - r) for r, i in enumerate(order)}
    seconds = time.perf_counter() - started
    metrics = ["ndcg@10", "recall@10", "mrr@10"]
    return {"hybrid-rrf": {k: round(float(v), 4) for k, v in evaluate(Qrels(ds.qrels), Run(plain), metrics).items()},
            "hybrid-rrf+reranker": {k: round(float(v), 4) for k, v in evaluate(Qrels(ds.qrels), Run(reranked), metrics).items()},
            "rerank_depth": depth, "rerank_ms_per_query": round(1000 * seconds / len(ds.queries), 1)}


def main() -> int:
    from rag.training.config import RerankerTrainingConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=SHARED / "scifact")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/rag-training-bench"))
    parser.add_argument("--pairs", type=int, default=2000, help="synthetic training pairs (embedder)")
    parser.add_argument("--reranker-pairs", type=int, default=600)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--rerank-depth", type=int, default=50)
    parser.add_argument("--stages", default="synthetic,ceiling,reranker")
    parser.add_argument("--loss", default="cached-mnrl", choices=["mnrl", "cached-mnrl"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-hard-negatives", action="store_true", help="skip mining (saves encoding every pair once)")
    parser.add_argument("--selection", type=int, default=200, help="held-out pseudo-queries for checkpoint selection (0: none)")
    parser.add_argument("--reranker-learning-rate", type=float, default=RerankerTrainingConfig.model_fields["learning_rate"].default)
    parser.add_argument("--reranker-max-length", type=int, default=256, help="tokens per (query, passage) in training and evaluation")
    parser.add_argument("--reranker-version", help="evaluate this registered reranker (e.g. v1) instead of training one")
    parser.add_argument("--skip-base", action="store_true", help="do not re-measure the base model (another run did)")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "training-scifact.json")
    args = parser.parse_args()
    if not (args.scifact / "corpus.jsonl").exists():
        print(f"error: SciFact not found at {args.scifact}", file=sys.stderr)
        return 2
    os.environ["RAG_DATA_DIR"] = str(args.data_dir)  # the registry and indexes live there; ft-* names resolve there
    root = args.data_dir
    root.mkdir(parents=True, exist_ok=True)

    from rag.evaluation.beir import load_beir
    from rag.registry import ModelRegistry
    from rag.rerank import CrossEncoderReranker
    from rag.training.config import EmbedderTrainingConfig
    from rag.training.pseudo import inverse_cloze

    registry = ModelRegistry(root / "models")
    registry.root.mkdir(parents=True, exist_ok=True)
    results: dict = {"dataset": "scifact", "split": "test", "anchor_base_ndcg@10": ANCHOR_BASE_NDCG10, "cpu_cores": os.cpu_count(),
                     "measured": time.strftime("%Y-%m-%d", time.gmtime()),
                     "args": {k: str(v) for k, v in vars(args).items()}}

    def save() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))

    stages = args.stages.split(",")
    ds = load_beir(args.scifact, "test")
    corpus = dict(zip(ds.corpus["chunk_id"], ds.corpus["text"]))
    log(f"SciFact: {len(corpus)} documents, {len(ds.queries)} test queries")
    if not args.skip_base:
        results["base"] = beir_scores(args.scifact, root, "minilm")
        save()

    triples = inverse_cloze(corpus, args.pairs + args.selection, seed=42)
    selection = selection_set(triples, corpus, args.selection, 800, seed=42) if args.selection else None
    synthetic = [(q, p) for q, p, _ in triples[args.selection:]]
    log(f"inverse-cloze: {len(synthetic)} training pairs, {len(selection or ())} selection queries")

    if "synthetic" in stages:
        config = EmbedderTrainingConfig(max_pairs=args.pairs, epochs=args.epochs, max_seq_length=args.max_seq_length,
                                        negative_range_max=20, loss=args.loss, batch_size=args.batch_size,
                                        hard_negatives=not args.no_hard_negatives)
        started = time.perf_counter()
        mv, run = train_and_register(registry, synthetic, selection, config, "synthetic")
        results["synthetic"] = {"model": mv.name, "train_wall_seconds": round(time.perf_counter() - started, 1), **run.summary,
                                "pairs": len(synthetic), "source": "inverse-cloze over the SciFact corpus only"}
        save()
        results["synthetic"]["scores"] = beir_scores(args.scifact, root, mv.name)
        registry.update_metrics("embedder", mv.version, {"scifact_test": results["synthetic"]["scores"]})
        save()

    if "ceiling" in stages:
        train = load_beir(args.scifact, "train")
        positives = [(train.queries[q], corpus[d]) for q, rel in train.qrels.items() for d, s in rel.items() if s > 0 and d in corpus]
        config = EmbedderTrainingConfig(epochs=args.epochs, max_seq_length=args.max_seq_length, negative_range_max=20,
                                        loss=args.loss, batch_size=args.batch_size, hard_negatives=not args.no_hard_negatives)
        started = time.perf_counter()
        mv, run = train_and_register(registry, positives, selection, config, "ceiling")
        results["ceiling"] = {"model": mv.name, "train_wall_seconds": round(time.perf_counter() - started, 1), **run.summary,
                              "pairs": len(positives), "source": "SciFact train qrels as positive feedback"}
        save()
        results["ceiling"]["scores"] = beir_scores(args.scifact, root, mv.name, modes=("dense",))
        registry.update_metrics("embedder", mv.version, {"scifact_test": results["ceiling"]["scores"]})
        save()

    if "reranker" in stages:
        if args.reranker_version:  # a model an earlier run trained: its manifest has the training figures
            mv = registry.resolve("reranker", args.reranker_version)
            training = mv.model_extra.get("metrics", {}).get("training", {})
            results["reranker"] = {"model": mv.name, "train_wall_seconds": training.get("train_seconds"), **training,
                                   "reused": True}
        else:
            config = RerankerTrainingConfig(max_pairs=args.reranker_pairs, epochs=args.epochs, max_seq_length=args.reranker_max_length,
                                            negative_range_max=20, learning_rate=args.reranker_learning_rate)
            started = time.perf_counter()
            mv, run = train_and_register(registry, synthetic, selection, config, "reranker", kind="reranker")
            results["reranker"] = {"model": mv.name, "train_wall_seconds": round(time.perf_counter() - started, 1), **run.summary,
                                   "pairs": min(args.reranker_pairs, len(synthetic))}
        save()
        results["reranker"]["scores"] = rerank_eval(args.scifact, root, CrossEncoderReranker(mv.path, mv.name, max_length=args.reranker_max_length),
                                                     args.rerank_depth)
        log(f"reranker: {results['reranker']['scores']}")
        save()

    print_table(results)
    return 0


def print_table(results: dict) -> None:
    rows = [("minilm (base)", mode, s["ndcg@10"], None) for mode, s in results.get("base", {}).items()]
    for stage in ("synthetic", "ceiling"):
        for mode, s in (results.get(stage, {}).get("scores") or {}).items():
            rows.append((f"{results[stage]['model']} ({stage})", mode, s["ndcg@10"], results[stage]["train_wall_seconds"]))
    if "scores" in results.get("reranker", {}):
        r = results["reranker"]
        rows.append((f"hybrid-rrf + {r['model']}", f"rerank top {r['scores']['rerank_depth']}", r["scores"]["hybrid-rrf+reranker"]["ndcg@10"],
                     r["train_wall_seconds"]))
    print(f"\nSciFact test nDCG@10 (anchor: base minilm {ANCHOR_BASE_NDCG10})")
    print(f"{'model':<36} {'mode':<16} {'nDCG@10':>8} {'train s':>8}")
    for model, mode, ndcg, secs in rows:
        print(f"{model:<36} {mode:<16} {ndcg:>8.4f} {'' if secs is None else f'{secs:>8.0f}'}")


if __name__ == "__main__":
    raise SystemExit(main())
