"""Configuration-search figures. Prints; asserts nothing.

    nice -n 15 .venv/bin/python bench/config_search.py [--corpus squad|pdfs|both] [--articles 12] [--questions 150]
        [--embedders minilm,wordllama[,DIR_OR_NAME]] [--finetune-articles 30] [--strategies ...] [--budget 80]
        [--json OUT]

For each corpus (SQuAD dev articles rebuilt from paragraphs, with their real questions; the shared PDFs with
synthetic inverse-cloze questions):
1. Build every (chunker, embedder) index once (timed), so each method's wall time is search cost, not embedding.
2. Genetic search (RAGSmith defaults, budget N distinct candidates) with a fresh evaluator: best fitness, unique
   candidates, distinct indexes touched, retrieval runs, wall time.
3. Grid over the same space with a fresh evaluator: the same figures. Genetic vs grid: share of the grid's best
   reached and share of its evaluations used. More GA seeds replay against the grid's scores (no re-evaluation).
4. Preliminary ranking of the embedders (MRR@10, Recall@5 on the deduplicated reference passages): is the
   embedder ranked first also the embedder of the grid's winner (and the best per-embedder grid fitness)?
"""

from __future__ import annotations

import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from bench.lib import cli
from bench.lib.datasets import PDFS, SQUAD, absent
from bench.lib.results import write
from rag.evaluation.loaders import squad_articles
from rag.ingest import document_from_row, update_documents
from rag.parsing import ParseSettings
from rag.source import scan_folder
from rag.store import data_dir
from rag.synthetic import SynthSettings, generate_qa
from rag.tuning.data import corpus_workspace
from rag.tuning.evaluate import PipelineEvaluator, genome_scorer
from rag.tuning.fitness import Evaluations, FitnessCache
from rag.tuning.optimizers import GeneticSettings, genetic, grid
from rag.tuning.preliminary import rank_embedders
from rag.tuning.space import SearchSpace


def bench_space(strategies: list[str], embedders: list[str], post_retrieval: bool = True) -> SearchSpace:
    """Modest enough for a full grid: chunking × embedder × 5 retrieval modes (× MMR × filter × neighbours)."""
    space = SearchSpace(
        families=[
            {"name": "chunking", "options": [{"name": s, "params": {"strategy": s}} for s in strategies]},
            {
                "name": "embedder",
                "options": [{"name": Path(e).name if "/" in e else e, "params": {"model": e}} for e in embedders],
            },
            {
                "name": "retrieval",
                "options": [
                    {"name": "dense", "params": {"mode": "dense"}},
                    {"name": "bm25", "params": {"mode": "bm25"}},
                    {"name": "hybrid-rrf", "params": {"mode": "hybrid-rrf"}},
                    {"name": "hybrid-cc-0.3", "params": {"mode": "hybrid-cc", "alpha": 0.3}},
                    {"name": "hybrid-cc-0.7", "params": {"mode": "hybrid-cc", "alpha": 0.7}},
                ],
            },
            {"name": "mmr", "options": [{"name": "none"}, {"name": "mmr-0.7", "params": {"mmr_lambda": 0.7}}]},
            {
                "name": "filter",
                "options": [{"name": "top-5", "params": {"top_k": 5}}, {"name": "top-3", "params": {"top_k": 3}}],
            },
            {"name": "prev_next", "options": [{"name": "off"}, {"name": "on", "params": {"prev_next": True}}]},
        ],
        base={"k": 10, "candidates": 50},
        baseline={
            "chunking": "recursive-1000-200" if "recursive-1000-200" in strategies else strategies[0],
            "retrieval": "dense",
        },
    )
    if post_retrieval:
        return space
    return space.model_copy(update={"families": space.families[:3]})


def squad_corpus(root: Path, articles: int, questions: int):
    docs, items = squad_articles(SQUAD, max_articles=articles)
    items = random.Random(11).sample(items, min(questions, len(items)))
    return corpus_workspace(docs, root / f"squad-{articles}"), items, {d.doc_id: d.canonical_text for d in docs}


def finetuned_minilm(root: Path, first: int, count: int, max_pairs: int) -> str:
    """MiniLM fine-tuned (rag.training.train_embedder) on SQuAD articles first..first+count, disjoint from the
    evaluated ones, so preliminary ranking can include a fine-tuned model without leakage. Returns its directory."""
    from rag.chunk_sets import update_chunk_set
    from rag.chunking import get_chunker
    from rag.ingest import document_to_row
    from rag.training.config import EmbedderTrainingConfig
    from rag.training.data import training_data
    from rag.training.embedder import train_embedder

    out = root / f"ft-minilm-squad-{first}-{count}"
    if (out / "config.json").exists():
        return str(out)
    docs, items = squad_articles(SQUAD, max_articles=first + count)
    docs, keep = docs[first:], {d.doc_id for d in docs[first:]}
    items = [i for i in items if i.doc_id in keep]
    dev_docs = {d.doc_id for d in docs[: max(1, count // 5)]}
    items = [i.model_copy(update={"split": "dev" if i.doc_id in dev_docs else "train"}) for i in items]
    chunks = update_chunk_set(
        None, pd.DataFrame([document_to_row(d, "bench") for d in docs]), get_chunker("paragraph")
    ).chunks
    data = training_data(items, chunks)
    run = train_embedder(data, EmbedderTrainingConfig(max_pairs=max_pairs, hard_negatives=False), out)
    print(
        f"  fine-tuned minilm on {len(data.positives)} pairs of SQuAD articles {first}..{first + count - 1} in "
        f"{run.seconds:.0f} s ({run.steps} steps): {out}"
    )
    return str(out)


def pdf_corpus(root: Path, questions: int, passages: int = 12):
    run = update_documents(scan_folder(PDFS), None, None, ParseSettings())
    docs = [document_from_row(r) for r in run.documents.to_dict("records")]
    qa = generate_qa(docs, None, SynthSettings(passages_per_document=passages))
    items = random.Random(11).sample(qa.items, min(questions, len(qa.items)))
    print(
        f"  {len(docs)} PDFs parsed ({len(run.quarantine)} quarantined), {len(qa.items)} inverse-cloze questions, "
        f"{len(items)} used"
    )
    return corpus_workspace(docs, root / "pdfs"), items, {d.doc_id: d.canonical_text for d in docs}


def one_corpus(
    name: str, workspace, items, texts, space: SearchSpace, budget: int, seeds: list[int], genetic_too: bool = True
) -> dict:
    out: dict = {
        "corpus": name,
        "questions": len(items),
        "space_size": space.size,
        "feasible": sum(1 for _ in space.feasible_genomes()),
    }
    print(f"\n== {name}: {len(items)} questions, space {out['feasible']} feasible candidates")
    started = time.perf_counter()
    warm = PipelineEvaluator(workspace, items)
    for strategy in [o.params["strategy"] for o in space.family("chunking").options]:
        for model in [o.params["model"] for o in space.family("embedder").options]:
            warm.indexes.index(strategy, model)
    warm.score(space.settings(space.baseline_genome()))  # first use of ranx compiles its metrics: not search cost
    out["index_build_seconds"] = round(time.perf_counter() - started, 1)
    out["index_work"] = warm.indexes.work
    points = {k: v.get("points", v.get("chunks")) for k, v in warm.indexes.work.items()}
    print(f"  indexes ready in {out['index_build_seconds']} s: {points}")

    def run(method: str, seed: int = 42):
        evaluator = PipelineEvaluator(workspace, items)
        evals = Evaluations(
            space, genome_scorer(evaluator, space), FitnessCache(None, "bench"), budget if method == "genetic" else None
        )
        t = time.perf_counter()
        res = genetic(space, evals, settings=GeneticSettings(seed=seed)) if method == "genetic" else grid(space, evals)
        seconds = time.perf_counter() - t
        row = {
            "method": method,
            "seed": seed,
            "best_fitness": res.best_scored.fitness,
            "best": space.decode(res.best),
            "unique_candidates": res.unique_candidates,
            "generations": len(res.history),
            "stopped": res.stopped,
            "seconds": round(seconds, 1),
            **evaluator.counts,
        }
        print(
            f"  {method:8s} best {row['best_fitness']:.4f} with {row['unique_candidates']} candidates, "
            f"{row['distinct_indexes']} indexes, {row['retrieval_runs']} retrieval runs, {row['seconds']} s; "
            f"stopped: {row['stopped']}; best = {space.key(res.best)}"
        )
        return row, res

    ga = run("genetic")[0] if genetic_too else None
    gr, grid_res = run("grid")
    grid_scores = {g: s.fitness for g, s in grid_res.evaluations.seen.items()}
    baseline = grid_scores[space.baseline_genome()]
    out.update({"genetic": ga, "grid": gr, "baseline_fitness": baseline})
    if genetic_too:
        genetic_figures(out, space, grid_res, gr, ga, budget, seeds)
    preliminary_figures(out, space, items, texts, grid_res, gr)
    return out


def genetic_figures(out: dict, space: SearchSpace, grid_res, gr: dict, ga: dict, budget: int, seeds: list[int]) -> None:
    baseline = out["baseline_fitness"]
    share = ga["best_fitness"] / gr["best_fitness"]
    evals_share = ga["unique_candidates"] / gr["unique_candidates"]
    out["genetic_vs_grid"] = {
        "fitness_share": share,
        "evaluations_share": evals_share,
        "meets_98pct_with_25pct": share >= 0.98 and evals_share <= 0.25,
    }
    print(
        f"  genetic reaches {100 * share:.1f} % of the grid's best with {100 * evals_share:.1f} % of its evaluations "
        f"(baseline fitness {baseline:.4f}, grid best {gr['best_fitness']:.4f})"
    )
    replays = []
    for seed in seeds:
        evals = Evaluations(space, lambda g: grid_res.evaluations.seen[g], None, budget)
        res = genetic(space, evals, settings=GeneticSettings(seed=seed))
        replays.append(
            {
                "seed": seed,
                "best_fitness": res.best_scored.fitness,
                "share": res.best_scored.fitness / gr["best_fitness"],
                "unique_candidates": res.unique_candidates,
            }
        )
    out["genetic_seeds"] = replays
    print(
        "  genetic over seeds (replayed on the grid's scores): "
        + ", ".join(f"seed {r['seed']}: {100 * r['share']:.1f} % ({r['unique_candidates']})" for r in replays)
    )


def preliminary_figures(out: dict, space: SearchSpace, items, texts, grid_res, gr: dict) -> None:
    """Preliminary ranking vs the grid: does the first-ranked embedder win?"""
    grid_scores = {g: s.fitness for g, s in grid_res.evaluations.seen.items()}
    models = [o.params["model"] for o in space.family("embedder").options]
    ranking = rank_embedders(items, texts, models)
    per_embedder = {}
    for g, f in grid_scores.items():
        model = space.settings(g)["model"]
        per_embedder[model] = max(per_embedder.get(model, 0.0), f)
    grid_winner = space.settings(grid_res.best)["model"]
    out["preliminary"] = {
        "ranking": ranking.to_dict("records"),
        "grid_best_per_embedder": per_embedder,
        "grid_winner_embedder": grid_winner,
        "first_ranked_wins_grid": ranking["embedder"].iloc[0] == grid_winner,
    }
    print(
        "  preliminary ranking: "
        + ", ".join(
            f"{r['rank']}. {r['embedder']} (MRR@10 {r['mrr@10']:.3f}, R@5 {r['recall@5']:.3f})"
            for r in ranking.to_dict("records")
        )
    )
    print(
        "  grid best per embedder: "
        + ", ".join(f"{m} {f:.4f}" for m, f in per_embedder.items())
        + f"; first-ranked embedder wins the grid: {out['preliminary']['first_ranked_wins_grid']}"
    )
    # Preliminary ranking then grid over the kept top-1 embedder (the paper's procedure).
    kept = ranking["embedder"].iloc[0]
    restricted = space.restrict(
        "embedder", [o.name for o in space.family("embedder").options if o.params["model"] == kept]
    )
    pr = [f for g, f in grid_scores.items() if space.settings(g)["model"] == kept]
    out["preliminary_then_grid"] = {
        "kept": kept,
        "candidates": sum(1 for _ in restricted.feasible_genomes()),
        "best_fitness": max(pr),
        "share_of_grid_best": max(pr) / gr["best_fitness"],
    }
    print(
        f"  preliminary ranking + grid over {kept}: {out['preliminary_then_grid']['candidates']} candidates, best "
        f"{max(pr):.4f} ({100 * max(pr) / gr['best_fitness']:.1f} % of the full grid's best)"
    )


def main() -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--corpus", default="both", choices=["squad", "pdfs", "both"])
    parser.add_argument("--articles", type=int, default=12)
    parser.add_argument("--questions", type=int, default=150)
    parser.add_argument("--embedders", default="minilm,wordllama")
    parser.add_argument("--strategies", default="recursive-1000-200,paragraph,fixed-512,sentence-window-4-2")
    parser.add_argument(
        "--budget", type=int, default=80, help="genetic: distinct candidates (the grid of the default space is 320)"
    )
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument(
        "--finetune-articles",
        type=int,
        default=0,
        help="also rank a MiniLM fine-tuned on this many "
        "SQuAD articles after the evaluated ones (rag.training; no overlap with the evaluation)",
    )
    parser.add_argument("--finetune-pairs", type=int, default=800)
    parser.add_argument(
        "--preliminary-only",
        action="store_true",
        help="the paper's grid only (chunking × embedder × "
        "retrieval mode) and no genetic run: does the first-ranked embedder win it?",
    )
    cli.add_output(parser, flags=("--json",))
    args = parser.parse_args()
    if args.corpus in ("squad", "both") and absent(SQUAD, "SQuAD v1.1 dev"):
        return 0
    if args.corpus in ("pdfs", "both") and absent(PDFS, "the shared PDFs"):
        return 0
    root = data_dir() / "bench" / "config_search"
    embedders = args.embedders.split(",")
    if args.finetune_articles:
        embedders.append(finetuned_minilm(root, args.articles, args.finetune_articles, args.finetune_pairs))
    space = bench_space(args.strategies.split(","), embedders, post_retrieval=not args.preliminary_only)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    results = {"started": datetime.now(timezone.utc).isoformat(), "args": {k: str(v) for k, v in vars(args).items()}}
    if args.corpus in ("squad", "both"):
        ws, items, texts = squad_corpus(root, args.articles, args.questions)
        results["squad"] = one_corpus(
            f"SQuAD dev, {args.articles} articles rebuilt",
            ws,
            items,
            texts,
            space,
            args.budget,
            seeds,
            not args.preliminary_only,
        )
    if args.corpus in ("pdfs", "both"):
        ws, items, texts = pdf_corpus(root, args.questions)
        results["pdfs"] = one_corpus(
            "shared PDFs, inverse-cloze questions",
            ws,
            items,
            texts,
            space,
            args.budget,
            seeds,
            not args.preliminary_only,
        )
    if args.json:
        write(results, args.json, indent=2, default=str)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    pd.set_option("display.width", 160)
    sys.exit(main())
