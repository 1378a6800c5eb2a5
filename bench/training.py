"""Trained-model figures on SciFact (BEIR), each with a paired significance test against the untrained start.
Writes its own JSON (arguments, commit, date, model versions, per-query scores, p-values); asserts nothing.

    .venv/bin/python bench/training.py --quick          # a SciFact slice, all four stages, <= 20 min on 2 cores
    .venv/bin/python bench/training.py                  # the full corpus (5,183 abstracts)

Stages (--stages):
  reranker           learned ranker (LightGBM LambdaRank) trained on inverse-cloze pseudo-queries made from the
                     corpus only (no qrels, no queries); hybrid-rrf top 50 reranked vs hybrid-rrf.
  reranker-feedback  the same trained on SciFact *train* queries rated from their qrels, as users' feedback
                     (positives, and the passage ratings as feedback priors).
  synthetic          MiniLM fine-tuned on the inverse-cloze pseudo-queries at its serving length; dense vs base.
  ceiling            MiniLM fine-tuned on SciFact train qrels as positive feedback; dense vs base.
Every comparison is on the SciFact test queries: per-query nDCG@10, one-sided sign-flip permutation test
(rag.training.gate.paired_p_value, 10,000 resamples). --quick uses the documents relevant to the train and test
queries plus 700 seeded distractors (scores run higher than on the full corpus: not comparable with the anchors).
Times are wall seconds on this machine and include everything a user of the training asset waits for (first
stage, mining, checkpoint selection), except building the base index, which is timed on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS, scifact_absent
from bench.lib.provenance import commit
from bench.lib.results import log
from bench.lib.scores import per_query_ndcg

ANCHOR_BASE_NDCG10 = 0.645  # all-MiniLM-L6-v2 on SciFact test, published
DEPTH = 50


def corpus_slice(test, train, distractors: int, seed: int = 0):
    relevant = {d for ds in (test, train) for rel in ds.qrels.values() for d in rel}
    others = sorted(set(test.corpus["chunk_id"]) - relevant)
    keep = relevant | set(random.Random(seed).sample(others, min(distractors, len(others))))
    return dataclasses.replace(
        test, name=f"{test.name}-slice{len(keep)}", corpus=test.corpus[test.corpus["chunk_id"].isin(keep)]
    )


def compare(name: str, base: dict[str, dict], model: dict[str, dict], base_label: str) -> dict:
    import numpy as np

    from rag.training.gate import paired_p_value

    qids = sorted(base)
    out = {"compared_with": base_label, "queries": len(qids)}
    for metric in ("ndcg@10", "mrr@10", "recall@10"):
        b = np.array([base[q][metric] for q in qids])
        m = np.array([model[q][metric] for q in qids])
        out[metric] = round(float(m.mean()), 4)
        out[f"base_{metric}"] = round(float(b.mean()), 4)
        out[f"delta_{metric}"] = round(float(m.mean() - b.mean()), 4)
        out[f"p_value_{metric}"] = round(paired_p_value(m, b, test="permutation", resamples=10_000, seed=0), 5)
    out["per_query_ndcg@10"] = {q: model[q]["ndcg@10"] for q in qids}
    log(
        f"{name}: nDCG@10 {out['base_ndcg@10']:.4f} -> {out['ndcg@10']:.4f} ({out['delta_ndcg@10']:+.4f}, "
        f"p={out['p_value_ndcg@10']:.4f}) on {len(qids)} test queries"
    )
    return out


def ir_set(queries: dict[str, str], qrels: dict, corpus: dict[str, str]):
    from rag.training.data import IRSet

    return IRSet(queries, corpus, {q: {d: 1 for d, s in qrels[q].items() if s > 0 and d in corpus} for q in queries})


def held_out(qids, fraction: float) -> tuple[list[str], list[str]]:
    """(train, selection) by a hash of the id: the same split on every run."""
    ordered = sorted(qids, key=lambda q: hashlib.sha256(str(q).encode()).hexdigest())
    cut = round(len(ordered) * fraction)
    return ordered[cut:], ordered[:cut]


def main() -> int:
    parser = cli.parser(__doc__)
    cli.add_scifact(parser)
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "rag-training-bench")
    cli.add_quick(parser, "a corpus slice and smaller training sets (<= 20 min on 2 cores)")
    parser.add_argument("--stages", default="reranker,reranker-feedback,synthetic,ceiling")
    parser.add_argument("--pseudo-queries", type=int, help="inverse-cloze training pairs (default 2000, quick 600)")
    parser.add_argument(
        "--embedder-pairs", type=int, help="cap on the embedder's synthetic pairs (default 2000, quick 300)"
    )
    parser.add_argument(
        "--selection", type=int, help="held-out pseudo-queries for checkpoint selection (default 200, quick 100)"
    )
    parser.add_argument(
        "--ceiling-pairs", type=int, help="cap on the embedder's train-qrel pairs (default all, quick 400)"
    )
    parser.add_argument(
        "--hard-negatives",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mine a hard negative per embedder pair "
        "(default on; off with --quick: mining encodes the corpus once more)",
    )
    parser.add_argument(
        "--selection-distractors",
        type=int,
        default=300,
        help="embedder checkpoint selection: passages besides the selection questions' own",
    )
    parser.add_argument(
        "--feedback-priors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reranker-feedback: the ratings also feed the per-passage feedback priors (--no-feedback-priors "
        "measures what the question-passage features alone learn)",
    )
    parser.add_argument("--loss", default="mnrl", choices=["mnrl", "cached-mnrl"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument(
        "--max-seq-length", type=int, help="embedder training length (default: the model's serving length)"
    )
    cli.add_output(parser, flags=("--json",), help="default bench/results/training-scifact[-quick].json")
    args = parser.parse_args()
    pseudo = args.pseudo_queries or (600 if args.quick else 2000)
    embedder_pairs = args.embedder_pairs or (300 if args.quick else 2000)
    selection_size = args.selection if args.selection is not None else (100 if args.quick else 200)
    ceiling_pairs = args.ceiling_pairs or (400 if args.quick else None)
    hard_negatives = args.hard_negatives if args.hard_negatives is not None else not args.quick
    out_path = args.json or RESULTS / f"training-scifact{'-quick' if args.quick else ''}.json"
    if scifact_absent(args.scifact):
        return 2  # make bench-training asked for figures: say that none came
    os.environ["RAG_DATA_DIR"] = str(args.data_dir)  # registry and indexes live there
    root = args.data_dir
    root.mkdir(parents=True, exist_ok=True)

    from rag.evaluation.beir import load_beir, open_beir_index
    from rag.progress import cli_progress
    from rag.registry import ModelRegistry
    from rag.rerank import rerank
    from rag.retrieval import RetrievalParams, retrieve
    from rag.training.pseudo import inverse_cloze

    registry = ModelRegistry(root / "models" / time.strftime("%Y%m%d-%H%M%S"))  # a fresh registry per run
    registry.root.mkdir(parents=True, exist_ok=True)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    results: dict = {
        "bench": "bench/training.py",
        "dataset": "scifact",
        "split": "test",
        "commit": commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_cores": os.cpu_count(),
        "argv": sys.argv[1:],
        "args": {k: str(v) for k, v in vars(args).items()},
        "effective": {
            "pseudo_queries": pseudo,
            "embedder_pairs": embedder_pairs,
            "selection": selection_size,
            "ceiling_pairs": ceiling_pairs,
            "hard_negatives": hard_negatives,
            "rerank_depth": DEPTH,
        },
        "anchor_base_ndcg@10": ANCHOR_BASE_NDCG10,
        "stages": {},
    }

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=2))

    test, train = load_beir(args.scifact, "test"), load_beir(args.scifact, "train")
    if args.quick:
        test = corpus_slice(test, train, 700)
        train = dataclasses.replace(train, corpus=test.corpus, name=test.name)
    corpus = dict(zip(test.corpus["chunk_id"], test.corpus["text"]))
    ids_of: dict[str, list[str]] = {}
    for cid, text in corpus.items():
        ids_of.setdefault(text, []).append(cid)
    results["corpus_documents"] = len(corpus)
    results["comparable_with_anchor"] = not args.quick
    log(
        f"SciFact{' slice' if args.quick else ''}: {len(corpus)} documents, {len(test.queries)} test queries, stages "
        f"{stages}"
    )

    started = time.perf_counter()
    index, info = open_beir_index(test, "hybrid-rrf", "minilm", root, progress=cli_progress())
    results["base_index_seconds"] = round(time.perf_counter() - started, 1)
    params = RetrievalParams(k=DEPTH, candidates=100)
    test_hits = {q: retrieve(index, text, "hybrid-rrf", params) for q, text in test.queries.items()}
    hybrid = per_query_ndcg(test.qrels, {q: [h.chunk["chunk_id"] for h in hits] for q, hits in test_hits.items()})
    dense_params = RetrievalParams(k=100, candidates=100)
    dense = per_query_ndcg(
        test.qrels,
        {q: [h.chunk["chunk_id"] for h in retrieve(index, t, "dense", dense_params)] for q, t in test.queries.items()},
    )
    results["base"] = {
        m: {k: round(sum(v[k] for v in s.values()) / len(s), 4) for k in ("ndcg@10", "mrr@10", "recall@10")}
        for m, s in (("hybrid-rrf", hybrid), ("dense", dense))
    }
    log(
        f"base minilm: hybrid-rrf nDCG@10 {results['base']['hybrid-rrf']['ndcg@10']:.4f}, dense "
        f"{results['base']['dense']['ndcg@10']:.4f}"
    )
    save()

    from rag.training.first_stage import cut_question, vectors_by_text

    base_vectors = vectors_by_text(index)  # the reranker's first stage re-embeds only the chunks it changes
    triples = inverse_cloze(corpus, pseudo + selection_size, seed=42)
    sel_triples, train_triples = triples[:selection_size], triples[selection_size:]
    # Selection passages without their pseudo-query sentence (inverse cloze), or selecting is matching a copy.
    cloze_corpus = {**corpus, **{pid: cut_question(corpus[pid], q) for q, _, pid in sel_triples}}
    pseudo_selection = ir_set(
        {f"s{i}": q for i, (q, _, _) in enumerate(sel_triples)},
        {f"s{i}": {pid: 1} for i, (_, _, pid) in enumerate(sel_triples)},
        cloze_corpus,
    )
    # Pairs name the indexed passage; both trainers cut a copied question out of its positive themselves.
    synthetic_pairs = [(q, corpus[pid]) for q, _, pid in train_triples]
    train_ids, train_sel_ids = held_out(list(train.queries), 0.2)
    qrel_pairs = [
        (train.queries[q], corpus[d]) for q in train_ids for d, s in train.qrels[q].items() if s > 0 and d in corpus
    ]
    qrel_selection = ir_set({q: train.queries[q] for q in train_sel_ids}, train.qrels, corpus)

    def reranker_stage(name: str, positives, selection, feedback) -> None:
        from rag.rerank import load_reranker
        from rag.training.config import RerankerTrainingConfig
        from rag.training.data import TrainingData
        from rag.training.ltr import train_learned_ranker

        config = RerankerTrainingConfig(rerank_depth=DEPTH)
        data = TrainingData(list(positives), [], selection, None)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=registry.root) as scratch:
            run = train_learned_ranker(
                data,
                config,
                Path(scratch) / "model",
                chunks=test.corpus,
                embedder=index.embedder,
                feedback=feedback,
                log=lambda m: log(f"{name}: {m}"),
                known_vectors=base_vectors,
            )
            mv = registry.register(
                "reranker",
                run.model_dir,
                {
                    "family": "ltr",
                    "base_model": "minilm",
                    "training_data_hash": data.data_hash,
                    "hyperparameters": config.model_dump(exclude={"extra_positives", "extra_negatives"}),
                    "seed": config.seed,
                    "metrics": {"training": run.summary},
                },
                move=True,
            )
        wall = time.perf_counter() - t0
        reranker = load_reranker(mv.name, registry=registry)
        t1 = time.perf_counter()
        reranked = {
            q: [h.chunk["chunk_id"] for h in rerank(reranker, test.queries[q], hits, k=DEPTH)]
            for q, hits in test_hits.items()
        }
        rerank_ms = 1000 * (time.perf_counter() - t1) / len(test_hits)
        stage = {
            "model": mv.name,
            "version": mv.version,
            "kind": "lambdamart",
            "train_wall_seconds": round(wall, 1),
            "feedback_priors_from": len(feedback[0]) + len(feedback[1]),
            "training": run.summary,
            "training_pairs": len(positives),
            "selection_questions": len(selection),
            "rerank_ms_per_query": round(rerank_ms, 1),
            "test": compare(name, hybrid, per_query_ndcg(test.qrels, reranked), "hybrid-rrf (base minilm), top 50"),
        }
        gain = reranker._booster.feature_importance("gain")
        stage["feature_gain_share"] = {
            n: round(float(g / gain.sum()), 4) for n, g in zip(reranker._booster.feature_name(), gain) if gain.sum() > 0
        }
        liked = {c for _, p in feedback[0] for c in ids_of.get(p, ())}
        stage["test_queries_with_a_liked_relevant_passage"] = sum(bool(set(rel) & liked) for rel in test.qrels.values())
        registry.update_metrics(
            "reranker",
            mv.version,
            {"scifact_test": {k: v for k, v in stage["test"].items() if not k.startswith("per_query")}},
        )
        results["stages"][name] = stage
        save()

    def embedder_stage(name: str, positives, selection) -> None:
        from rag.training.config import EmbedderTrainingConfig
        from rag.training.data import TrainingData
        from rag.training.embedder import train_embedder

        # Checkpoint selection encodes its corpus at every evaluation (4 per epoch): the selection questions' own
        # passages plus seeded distractors, not the whole corpus.
        relevant = {c for rel in selection.qrels.values() for c in rel}
        others = sorted(set(selection.corpus) - relevant)
        keep = relevant | set(random.Random(1).sample(others, min(args.selection_distractors, len(others))))
        selection = type(selection)(selection.queries, {c: selection.corpus[c] for c in keep}, selection.qrels)
        config = EmbedderTrainingConfig(
            max_pairs=embedder_pairs if name == "synthetic" else ceiling_pairs,
            epochs=args.epochs,
            max_seq_length=args.max_seq_length,
            negative_range_max=20,
            loss=args.loss,
            batch_size=args.batch_size,
            hard_negatives=hard_negatives,
        )
        data = TrainingData(list(positives), [], selection, None)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=registry.root) as scratch:
            run = train_embedder(
                data,
                config,
                Path(scratch) / "model",
                corpus=list(corpus.values()),
                progress=cli_progress(),
                log=lambda m: log(f"{name}: {m}") if "eval" in m or not m.startswith("step") else None,
            )
            mv = registry.register(
                "embedder",
                run.model_dir,
                {
                    "base_model": "minilm",
                    "training_data_hash": data.data_hash,
                    "hyperparameters": config.model_dump(exclude={"extra_positives", "extra_negatives"}),
                    "seed": config.seed,
                    "metrics": {"training": run.summary},
                },
                move=True,
            )
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        tuned_index, _ = open_beir_index(test, "dense", str(mv.path), root)
        index_seconds = time.perf_counter() - t1
        tuned = per_query_ndcg(
            test.qrels,
            {
                q: [h.chunk["chunk_id"] for h in retrieve(tuned_index, t, "dense", dense_params)]
                for q, t in test.queries.items()
            },
        )
        stage = {
            "model": mv.name,
            "version": mv.version,
            "train_wall_seconds": round(wall, 1),
            "training": run.summary,
            "training_pairs": min(len(positives), config.max_pairs or len(positives)),
            "selection_questions": len(selection),
            "selection_corpus": len(selection.corpus),
            "max_seq_length": config.max_seq_length or "serving length",
            "index_seconds": round(index_seconds, 1),
            "test": compare(name, dense, tuned, "dense (base minilm)"),
        }
        registry.update_metrics(
            "embedder",
            mv.version,
            {"scifact_test": {k: v for k, v in stage["test"].items() if not k.startswith("per_query")}},
        )
        results["stages"][name] = stage
        save()

    if "reranker" in stages:
        reranker_stage("reranker", synthetic_pairs, pseudo_selection, ((), ()))
    if "reranker-feedback" in stages:
        reranker_stage(
            "reranker-feedback", qrel_pairs, qrel_selection, (qrel_pairs, []) if args.feedback_priors else ((), ())
        )
    if "synthetic" in stages:
        embedder_stage("synthetic", synthetic_pairs, pseudo_selection)
    if "ceiling" in stages:
        embedder_stage("ceiling", qrel_pairs, qrel_selection)
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    save()
    print_table(results)
    print(f"\nwrote {out_path}")
    return 0


def print_table(results: dict) -> None:
    print(
        f"\nSciFact test ({results['corpus_documents']} documents; anchor: base minilm dense {ANCHOR_BASE_NDCG10} on "
        "the full corpus)"
    )
    print(
        f"{'stage':<18} {'model':<16} {'compared with':<34} {'base':>7} {'model':>7} {'delta':>7} {'p':>7} "
        f"{'train s':>8}"
    )
    for name, s in results["stages"].items():
        t = s["test"]
        print(
            f"{name:<18} {s['model']:<16} {t['compared_with']:<34} {t['base_ndcg@10']:>7.4f} {t['ndcg@10']:>7.4f} "
            f"{t['delta_ndcg@10']:>+7.4f} {t['p_value_ndcg@10']:>7.4f} {s['train_wall_seconds']:>8.0f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
