"""What a search hands back: a leaderboard, the winner as an answer-settings YAML a user can apply, a
convergence plot and a Markdown report with deltas against the naive baseline."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pandas as pd
import yaml

from rag.markdown import markdown_table
from rag.tuning.evaluate import DEFAULT_SETTINGS, REPORT_METRICS, Scored
from rag.tuning.optimizers import SearchResult
from rag.tuning.space import Genome, SearchSpace

# Settings the search can vary that the answer pipeline may not (yet) take; they go into the YAML only if it does.
SEARCH_ONLY_DEFAULTS = {"mmr_lambda": None, "query_expansion": "none"}


def leaderboard(result: SearchResult) -> pd.DataFrame:
    space, evals = result.space, result.evaluations
    first_seen = dict(evals.order)
    rows = []
    for genome, scored in evals.seen.items():
        rows.append(
            {
                "fitness": scored.fitness,
                "retrieval_score": scored.retrieval_score,
                "generation_score": scored.generation_score,
                **{m: scored.metrics.get(m) for m in REPORT_METRICS},
                **space.decode(genome),
                "generation": first_seen.get(genome, 0),
                "seconds": round(scored.seconds, 3),
                "key": space.key(genome),
            }
        )
    table = pd.DataFrame(rows).sort_values(
        ["fitness", "generation"], ascending=[False, True], kind="stable", ignore_index=True
    )
    table.insert(0, "rank", range(1, len(table) + 1))
    return table


def serving_fields() -> set[str] | None:
    """The fields rag.qa.AnswerSettings accepts, or None when the answer pipeline is not installed."""
    try:
        from rag.qa import AnswerSettings
    except ImportError:
        return None
    return set(AnswerSettings.model_fields)


def best_settings(space: SearchSpace, genome: Genome) -> dict[str, Any]:
    return DEFAULT_SETTINGS | space.settings(genome)


def best_config_yaml(result: SearchResult, *, fitness_note: str) -> tuple[str, list[str]]:
    """(YAML text loadable by AnswerSettings.from_yaml, settings the answer pipeline cannot apply)."""
    settings = best_settings(result.space, result.best)
    fields = serving_fields()
    unapplied = [
        k
        for k, default in SEARCH_ONLY_DEFAULTS.items()
        if fields is not None and k not in fields and settings.get(k) != default
    ]
    if fields is not None:
        settings = {k: v for k, v in settings.items() if k in fields}
    header = [
        f"# Best configuration found by `rag search-config --method {result.method}` on "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# fitness {result.best_scored.fitness:.4f} ({fitness_note}); {result.unique_candidates} candidates evaluated",
        f"# genome: {result.space.key(result.best)}",
        "# Apply it with `rag search-config --apply FILE` (or materialize active_configuration).",
    ]
    header += [
        f"# NOT applied by the answer pipeline (no such AnswerSettings field): {k} = "
        f"{best_settings(result.space, result.best)[k]}"
        for k in unapplied
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(settings, sort_keys=False), unapplied


def convergence_plot(history: list[dict], title: str) -> bytes:
    from rag.evaluation.plots import _png, _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    gens = [h["generation"] for h in history]
    ax.plot(gens, [h["best"] for h in history], marker="o", label="best of generation")
    ax.plot(gens, [h["mean"] for h in history], marker=".", label="mean of generation")
    ax.plot(gens, [h["best_so_far"] for h in history], linestyle="--", label="best so far")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("generation (grid: batch of candidates)"), ax.set_ylabel("fitness"), ax.set_title(title)
    ax.grid(alpha=0.3), ax.legend(fontsize=7)
    return _png(fig)


def markdown_report(
    result: SearchResult,
    board: pd.DataFrame,
    baseline: tuple[str, Scored] | None,
    counts: dict,
    *,
    fitness_note: str,
    unapplied: list[str],
    extra_sections: list[str] = (),
) -> str:
    best = result.best_scored
    lines = [
        f"# Configuration search ({result.method})",
        "",
        f"- Fitness: {fitness_note}.",
        f"- Best: `{result.space.key(result.best)}` with fitness **{best.fitness:.4f}** "
        f"(RetrievalScore {best.retrieval_score:.4f}"
        + (f", GenerationScore {best.generation_score:.4f})" if best.generation_score is not None else ")"),
        f"- Candidates: {result.unique_candidates} distinct evaluated ({result.evaluations.computed} computed, "
        f"{result.evaluations.cache_hits} from the fitness cache); stopped: {result.stopped}; {result.seconds:.1f} s.",
        f"- Indexes: {counts.get('distinct_indexes', 0)} distinct indexes built or reused "
        f"({counts.get('bm25_indexes', 0)} BM25 over {counts.get('chunk_sets', 0)} chunk sets, "
        f"{counts.get('dense_collections', 0)} dense (chunker, embedder) collections); "
        f"{counts.get('retrieval_runs', 0)} retrieval runs for {result.unique_candidates} candidates.",
    ]
    if baseline is not None:
        key, scored = baseline
        lines += [
            "",
            "## Against the naive baseline",
            "",
            f"Baseline `{key}`: fitness {scored.fitness:.4f}.",
            "",
            "| metric | baseline | best | delta |",
            "|---|---|---|---|",
        ]
        for name in ["fitness", "retrieval_score"] + REPORT_METRICS:
            b = (
                scored.fitness
                if name == "fitness"
                else scored.retrieval_score
                if name == "retrieval_score"
                else scored.metrics.get(name)
            )
            w = (
                best.fitness
                if name == "fitness"
                else best.retrieval_score
                if name == "retrieval_score"
                else best.metrics.get(name)
            )
            if b is not None and w is not None:
                lines.append(f"| {name} | {b:.4f} | {w:.4f} | {w - b:+.4f} |")
    if unapplied:
        lines += [
            "",
            f"Note: the winner sets {', '.join(unapplied)}, which the answer pipeline does not take yet; "
            "the YAML leaves them out.",
        ]
    lines += list(extra_sections)
    families = [f.name for f in result.space.families]
    lines += [
        "",
        "## Leaderboard (top 20)",
        "",
        markdown_table(board.head(20), ["rank", "fitness", "retrieval_score"] + families),
    ]
    return "\n".join(lines) + "\n"
