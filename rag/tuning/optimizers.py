"""Optimizers over a SearchSpace: grid (every feasible genome) and genetic (RAGSmith's defaults).

Both go through `Evaluations`, so each distinct genome is scored once and the budget counts distinct candidates.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from rag.tuning.evaluate import Scored
from rag.tuning.fitness import Evaluations
from rag.tuning.operators import CROSSOVERS, MUTATIONS, SELECTIONS, adaptive_rate, diversity, elite_selection
from rag.tuning.space import Genome, SearchSpace


@dataclass
class SearchResult:
    method: str
    space: SearchSpace  # the space `best` indexes into (preliminary ranking searches a restricted one)
    best: Genome
    best_scored: Scored
    history: list[dict]  # one row per generation (grid: per batch of candidates): best, mean, best so far
    stopped: str  # generations | budget | target | patience | exhausted
    seconds: float
    evaluations: Evaluations
    extra: dict = field(default_factory=dict)

    @property
    def unique_candidates(self) -> int:
        return len(self.evaluations.seen)


def _best(evals: Evaluations) -> tuple[Genome, Scored]:
    # Ties go to the genome seen first, so the result does not depend on dict order quirks.
    genome = max(evals.seen, key=lambda g: evals.seen[g].fitness)
    return genome, evals.seen[genome]


def grid(
    space: SearchSpace, evals: Evaluations, capabilities: set[str] | frozenset[str] = frozenset(), batch: int = 16
) -> SearchResult:
    """Every feasible genome in order, until the budget runs out; history per `batch` candidates."""
    started = time.perf_counter()
    stopped, history, fits = "exhausted", [], []
    for i, genome in enumerate(space.feasible_genomes(capabilities)):
        if not evals.affordable(genome):
            stopped = "budget"
            break
        evals.generation = i // batch
        fits.append(evals(genome).fitness)
        if len(fits) == batch:
            history.append(_row(len(history), fits, evals))
            fits = []
    if fits:
        history.append(_row(len(history), fits, evals))
    if not evals.seen:
        raise ValueError("no feasible candidate in the search space (check its rules against what is configured)")
    best, scored = _best(evals)
    return SearchResult("grid", space, best, scored, history, stopped, time.perf_counter() - started, evals)


def _row(generation: int, fits: list[float], evals: Evaluations, **extra) -> dict:
    return {
        "generation": generation,
        "best": max(fits),
        "mean": statistics.fmean(fits),
        "best_so_far": max(s.fitness for s in evals.seen.values()),
        "unique_candidates": len(evals.seen),
        **extra,
    }


class GeneticSettings(BaseModel):
    """RAGSmith's defaults."""

    population: int = Field(16, ge=2)
    generations: int = Field(20, ge=1)
    selection: str = "elite"
    parents: int = Field(5, ge=2, description="how many parents selection picks")
    elites_kept: int = Field(2, ge=0, description="elitist replacement: the best survive unchanged")
    crossover: str = "uniform"
    crossover_rate: float = Field(0.6, ge=0.0, le=1.0)
    mutation: str = "adaptive"
    mutation_rate: float = Field(0.08, ge=0.0, le=1.0)
    mutation_bounds: tuple[float, float] = (0.01, 0.2)
    target_fitness: float | None = None
    patience: int = Field(5, ge=1, description="generations without a better best before stopping")
    seed: int = 42

    def model_post_init(self, _context) -> None:
        for name, table in (("selection", SELECTIONS), ("crossover", CROSSOVERS), ("mutation", MUTATIONS)):
            if getattr(self, name) not in table:
                raise ValueError(f"unknown {name} operator {getattr(self, name)!r} (known: {', '.join(table)})")


def _initial_population(space: SearchSpace, size: int, rng: random.Random, caps) -> list[Genome]:
    # The naive baseline is one member, so the search starts no worse than it.
    population = [space.repair(space.baseline_genome(), caps)]
    for _ in range(size * 50):
        if len(population) >= size:
            break
        genome = space.random_genome(rng, caps)
        if genome not in population:
            population.append(genome)
    return population


def genetic(
    space: SearchSpace,
    evals: Evaluations,
    capabilities: set[str] | frozenset[str] = frozenset(),
    settings: GeneticSettings | None = None,
) -> SearchResult:
    cfg = settings or GeneticSettings()
    started = time.perf_counter()
    rng = random.Random(cfg.seed)
    population = _initial_population(space, cfg.population, rng, capabilities)
    history: list[dict] = []
    stopped, best_so_far, stale, rate = "generations", float("-inf"), 0, cfg.mutation_rate
    for generation in range(cfg.generations):
        evals.generation = generation
        scored: list[tuple[Genome, float]] = []
        for genome in population:
            if not evals.affordable(genome):
                stopped = "budget"
                break
            scored.append((genome, evals(genome).fitness))
        if not scored:
            break
        population, fits = [g for g, _ in scored], [f for _, f in scored]
        history.append(_row(generation, fits, evals, mutation_rate=rate, diversity=diversity(population)))
        if stopped == "budget":
            break
        current = history[-1]["best_so_far"]
        stale = 0 if current > best_so_far + 1e-12 else stale + 1
        best_so_far = max(best_so_far, current)
        if cfg.target_fitness is not None and best_so_far >= cfg.target_fitness:
            stopped = "target"
            break
        if stale >= cfg.patience:
            stopped = "patience"
            break
        if generation == cfg.generations - 1:
            break
        parents = SELECTIONS[cfg.selection](population, fits, cfg.parents, rng)
        rate = (
            adaptive_rate(
                cfg.mutation_rate, diversity(population), low=cfg.mutation_bounds[0], high=cfg.mutation_bounds[1]
            )
            if cfg.mutation == "adaptive"
            else cfg.mutation_rate
        )
        population = _offspring(space, population, fits, parents, cfg, rate, rng, capabilities)
    if not evals.seen:
        raise ValueError("no feasible candidate in the search space (check its rules against what is configured)")
    best, scored_best = _best(evals)
    return SearchResult("genetic", space, best, scored_best, history, stopped, time.perf_counter() - started, evals)


def _offspring(
    space: SearchSpace,
    population: list[Genome],
    fits: list[float],
    parents: list[Genome],
    cfg: GeneticSettings,
    rate: float,
    rng: random.Random,
    caps,
) -> list[Genome]:
    nxt: list[Genome] = []
    for elite in elite_selection(population, fits, cfg.elites_kept, rng):
        if elite not in nxt:
            nxt.append(elite)
    for _ in range(cfg.population * 20):
        if len(nxt) >= cfg.population:
            return nxt
        a, b = rng.sample(parents, 2) if len(parents) >= 2 else (parents[0], parents[0])
        child = CROSSOVERS[cfg.crossover](a, b, rng) if rng.random() < cfg.crossover_rate else a
        child = space.repair(MUTATIONS[cfg.mutation](child, space.sizes, rate, rng), caps)
        if child not in nxt:  # a duplicate would waste a slot of the generation
            nxt.append(child)
    # A converged population breeds mostly copies: fill the rest with random immigrants.
    for _ in range(cfg.population * 50):
        if len(nxt) >= cfg.population:
            break
        genome = space.random_genome(rng, caps)
        if genome not in nxt:
            nxt.append(genome)
    return nxt
