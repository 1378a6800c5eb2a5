"""`rag search-config`: run a configuration search from the command line (no Dagster needed)."""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timezone
from pathlib import Path


def add_search_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search-config",
        help="search the best pipeline configuration for a QA set (grid, genetic, preliminary ranking of embedders)",
    )
    p.add_argument("--method", choices=["genetic", "grid", "preliminary-ranking"], default="genetic")
    p.add_argument(
        "--qa",
        type=Path,
        required=True,
        metavar="QA_DIR",
        help="folder with the synthetic_qa data.parquet (documents: the data dir's parsed documents) or a "
        "SQuAD JSON (*.json[.gz]; its paragraphs become the corpus)",
    )
    p.add_argument("--budget", type=int, default=100, help="distinct candidates to evaluate at most")
    p.add_argument("--space", type=Path, help="search space YAML (default config/search_space.yaml)")
    p.add_argument("--top-n", type=int, default=2, help="preliminary ranking: embedders kept for the grid")
    p.add_argument("--split", default="all", help="questions of this split only (train | dev | test | all)")
    p.add_argument("--max-questions", type=int, help="a seeded sample of at most this many questions")
    p.add_argument(
        "--llm",
        default=os.environ.get("RAG_LLM_BACKEND", "none"),
        help="LLM backend for query expansion (none | local-gguf | openai; default RAG_LLM_BACKEND)",
    )
    p.add_argument("--llm-model", default=os.environ.get("RAG_LLM_MODEL", "smollm2"))
    p.add_argument(
        "--judge",
        action="store_true",
        help="also generate answers and judge them with the LLM (fitness = ½ RetrievalScore + ½ GenerationScore); slow",
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", type=Path, help="output folder (default <data dir>/search/<method>-<time>)")
    p.add_argument("--apply", action="store_true", help="make the winner the active configuration (logged)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_search_config)


def cmd_search_config(args: argparse.Namespace) -> int:
    from rag.progress import cli_progress
    from rag.tuning.active import apply_configuration
    from rag.tuning.data import load_qa_dir
    from rag.tuning.evaluate import PipelineEvaluator
    from rag.tuning.optimizers import GeneticSettings
    from rag.tuning.runner import load_items, run_search
    from rag.tuning.space import load_space
    from rag.store import data_dir

    if args.budget < 1:
        raise ValueError("--budget must be at least 1")
    space = load_space(args.space)
    root = data_dir()
    workspace, items = load_qa_dir(args.qa, root)
    items = load_items(items, args.split, args.max_questions, args.seed)
    llm, generator = _llm_and_generator(args)
    evaluator = PipelineEvaluator(workspace, items, llm=llm, generator=generator)
    out = args.out or root / "search" / f"{args.method}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    with cli_progress() as progress:
        outcome = run_search(
            args.method,
            evaluator,
            space,
            budget=args.budget,
            cache_path=root / "search" / "fitness_cache.sqlite",
            genetic_settings=GeneticSettings(seed=args.seed),
            top_n=args.top_n,
            out_dir=out,
            progress=progress,
        )
    summary = outcome.summary()
    if args.apply:
        summary["applied"] = apply_configuration(
            outcome.files["best_config"], root, reason=f"rag search-config --method {args.method}"
        )
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(outcome.report)
        print(f"files: {out}" + ("\napplied as the active configuration" if args.apply else ""))
    return 0


def _llm_and_generator(args: argparse.Namespace):
    from rag.llm import LLMSettings, load_llm

    llm = load_llm(LLMSettings(backend=args.llm, model=args.llm_model))
    if not args.judge:
        return llm, None
    if llm is None:
        raise ValueError("--judge needs an LLM: pass --llm local-gguf or --llm openai")
    from rag.embedding import load_embedder
    from rag.tuning.generation import GenerationScorer

    return llm, GenerationScorer(llm, llm, load_embedder("minilm"))
