"""One configuration search end to end: evaluator, caches, optimizer, baseline, and the files it writes
(best_config.yaml, leaderboard.parquet, convergence.png, report.md, summary.json)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd

from rag.evaluation.qaset import QAItem
from rag.progress import Progress, counter
from rag.tuning.evaluate import Objective, PipelineEvaluator, Scored, Workspace, genome_identity, genome_scorer
from rag.tuning.fitness import Evaluations, FitnessCache
from rag.tuning.optimizers import GeneticSettings, SearchResult, genetic, grid
from rag.tuning.preliminary import preliminary_then_grid
from rag.tuning.report import best_config_yaml, convergence_plot, leaderboard, markdown_report
from rag.tuning.space import SearchSpace
from rag.store import DOCUMENTS_TABLE

Method = Literal["genetic", "grid", "preliminary-ranking"]
METHODS = ("genetic", "grid", "preliminary-ranking")


@dataclass
class SearchOutcome:
    result: SearchResult
    leaderboard: pd.DataFrame
    baseline: tuple[str, Scored] | None
    counts: dict
    fitness_note: str
    best_yaml: str
    unapplied: list[str]
    report: str
    files: dict[str, Path] = field(default_factory=dict)

    def summary(self) -> dict:
        r = self.result
        out = {
            "method": r.method,
            "best": r.space.decode(r.best),
            "best_fitness": r.best_scored.fitness,
            "best_retrieval_score": r.best_scored.retrieval_score,
            "best_generation_score": r.best_scored.generation_score,
            "fitness": self.fitness_note,
            "unique_candidates": r.unique_candidates,
            "computed": r.evaluations.computed,
            "cache_hits": r.evaluations.cache_hits,
            "stopped": r.stopped,
            "seconds": round(r.seconds, 2),
            "generations": len(r.history),
            **self.counts,
            "files": {k: str(v) for k, v in self.files.items()},
        }
        if self.baseline:
            out["baseline"] = {"key": self.baseline[0], "fitness": self.baseline[1].fitness}
            out["delta_fitness"] = r.best_scored.fitness - self.baseline[1].fitness
        if "embedder_ranking" in r.extra:
            out["embedder_ranking"] = r.extra["embedder_ranking"].to_dict("records")
        return out


def fitness_note(evaluator: PipelineEvaluator) -> str:
    scope = (
        f"RetrievalScore = mean of Recall@5, MAP@5, nDCG@5, MRR@5 over the prompt's passages within max_context_chars, "
        f"{evaluator.relevance.mode} relevance"
    )
    if evaluator.generator is None:
        return f"RetrievalScore only ({scope}): no generator and judge configured"
    o = evaluator.objective
    return (
        f"{o.retrieval_weight:g}·RetrievalScore + {o.generation_weight:g}·GenerationScore (normalised; {scope}), "
        "GenerationScore = mean(LLM judge, semantic similarity)"
    )


def run_search(
    method: Method,
    evaluator: PipelineEvaluator,
    space: SearchSpace,
    *,
    budget: int | None = 100,
    cache_path: Path | None = None,
    genetic_settings: GeneticSettings | None = None,
    top_n: int = 2,
    out_dir: Path | None = None,
    progress: Progress | None = None,
) -> SearchOutcome:
    """`progress` counts the distinct candidates scored, out of the budget."""
    if method not in METHODS:
        raise ValueError(f"unknown search method {method!r} (known: {', '.join(METHODS)})")
    started = time.perf_counter()
    caps = evaluator.capabilities
    cache = FitnessCache(cache_path, evaluator.context)
    advance = counter(progress, f"{method} search", budget, "candidates")

    def make(sp):
        return Evaluations(
            sp, genome_scorer(evaluator, sp), cache, budget, genome_identity(evaluator, sp), advance=advance
        )

    if method == "grid":
        result = grid(space, make(space), caps)
    elif method == "genetic":
        result = genetic(space, make(space), caps, genetic_settings)
    else:
        result = preliminary_then_grid(space, make, evaluator.items, _texts(evaluator), top_n=top_n, capabilities=caps)
    result.seconds = time.perf_counter() - started
    baseline = None
    base_genome = space.baseline_genome()
    if space.feasible(base_genome, caps):
        # Scored outside the budget (through the same cache), so every method is compared with the same baseline.
        baseline = (
            space.key(base_genome),
            Evaluations(space, genome_scorer(evaluator, space), cache, identity=genome_identity(evaluator, space))(
                base_genome
            ),
        )
    note = fitness_note(evaluator)
    board = leaderboard(result)
    yaml_text, unapplied = best_config_yaml(result, fitness_note=note)
    counts = evaluator.counts
    extra = []
    if "embedder_ranking" in result.extra:
        from rag.markdown import markdown_table

        ranking = result.extra["embedder_ranking"]
        extra = [
            "",
            "## Preliminary ranking of embedders",
            "",
            markdown_table(ranking, ["rank", "embedder", "mrr@10", "recall@5", "score", "passages", "questions"]),
            "",
            f"Kept: {', '.join(result.extra['kept_embedders'])}.",
        ]
    report = markdown_report(
        result, board, baseline, counts, fitness_note=note, unapplied=unapplied, extra_sections=extra
    )
    outcome = SearchOutcome(result, board, baseline, counts, note, yaml_text, unapplied, report)
    if out_dir is not None:
        write_outputs(outcome, Path(out_dir))
    cache.close()
    return outcome


def _texts(evaluator: PipelineEvaluator) -> dict[str, str]:
    docs = evaluator.indexes.workspace.tables.read(DOCUMENTS_TABLE, columns=["doc_id", "canonical_text"])
    return dict(zip(docs["doc_id"], docs["canonical_text"]))


def write_outputs(outcome: SearchOutcome, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "best_config": out_dir / "best_config.yaml",
        "leaderboard": out_dir / "leaderboard.parquet",
        "convergence": out_dir / "convergence.png",
        "report": out_dir / "report.md",
        "summary": out_dir / "summary.json",
    }
    files["best_config"].write_text(outcome.best_yaml)
    outcome.leaderboard.to_parquet(files["leaderboard"], index=False)
    files["convergence"].write_bytes(
        convergence_plot(outcome.result.history, f"{outcome.result.method}: fitness per generation")
    )
    files["report"].write_text(outcome.report)
    outcome.files = files
    files["summary"].write_text(json.dumps(outcome.summary(), indent=2, default=str))
    return files


def load_items(
    items: list[QAItem], split: str = "all", max_questions: int | None = None, seed: int = 42
) -> list[QAItem]:
    """The questions a search optimises on: one split (or all), at most `max_questions` (a seeded sample)."""
    import random

    chosen = [i for i in items if split == "all" or i.split == split]
    if max_questions is not None and len(chosen) > max_questions:
        chosen = random.Random(seed).sample(chosen, max_questions)
    if not chosen:
        raise ValueError(f"no questions in split {split!r}")
    return chosen


__all__ = ["run_search", "SearchOutcome", "METHODS", "Objective", "Workspace", "load_items"]
