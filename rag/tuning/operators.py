"""Genetic operators, one registry per kind so a new operator is one entry.

Every operator takes an explicit `random.Random`, so a seeded search is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from rag.tuning.space import Genome

Selection = Callable[[Sequence[Genome], Sequence[float], int, random.Random], list[Genome]]
Crossover = Callable[[Genome, Genome, random.Random], Genome]
Mutation = Callable[[Genome, Sequence[int], float, random.Random], Genome]

SELECTIONS: dict[str, Selection] = {}
CROSSOVERS: dict[str, Crossover] = {}
MUTATIONS: dict[str, Mutation] = {}


def _register(table: dict, name: str):
    def decorator(fn):
        table[name] = fn
        return fn

    return decorator


# --- selection: pick n parents from a scored population --------------------------------------------
@_register(SELECTIONS, "elite")
def elite_selection(population: Sequence[Genome], fitness: Sequence[float], n: int, rng: random.Random) -> list[Genome]:
    """The n fittest (ties keep population order)."""
    order = sorted(range(len(population)), key=lambda i: -fitness[i])
    return [population[i] for i in order[:n]]


@_register(SELECTIONS, "tournament")
def tournament_selection(
    population: Sequence[Genome], fitness: Sequence[float], n: int, rng: random.Random, size: int = 3
) -> list[Genome]:
    """n tournaments of `size` random members each; each winner is its tournament's fittest."""
    out = []
    for _ in range(n):
        entrants = rng.sample(range(len(population)), min(size, len(population)))
        out.append(population[max(entrants, key=lambda i: fitness[i])])
    return out


# --- crossover: one child from two parents ----------------------------------------------------------
@_register(CROSSOVERS, "uniform")
def uniform_crossover(a: Genome, b: Genome, rng: random.Random) -> Genome:
    """Each gene from either parent with probability ½."""
    return tuple(x if rng.random() < 0.5 else y for x, y in zip(a, b))


@_register(CROSSOVERS, "single-point")
def single_point_crossover(a: Genome, b: Genome, rng: random.Random) -> Genome:
    """a's genes before a random cut, b's from it on."""
    if len(a) < 2:
        return tuple(a)
    cut = rng.randrange(1, len(a))
    return tuple(a[:cut]) + tuple(b[cut:])


# --- mutation: each gene replaced by another option with probability `rate` ------------------------
@_register(MUTATIONS, "random")
def random_mutation(genome: Genome, sizes: Sequence[int], rate: float, rng: random.Random) -> Genome:
    out = list(genome)
    for i, size in enumerate(sizes):
        if size > 1 and rng.random() < rate:
            out[i] = rng.choice([o for o in range(size) if o != genome[i]])
    return tuple(out)


# Adaptive mutation is random mutation at a rate set per generation from the population's diversity.
MUTATIONS["adaptive"] = random_mutation


def diversity(population: Sequence[Genome]) -> float:
    """Mean pairwise Hamming distance over genes, in [0, 1]: 0 when every member is the same genome."""
    n = len(population)
    if n < 2:
        return 0.0
    genes = len(population[0])
    total = sum(sum(x != y for x, y in zip(population[i], population[j])) for i in range(n) for j in range(i + 1, n))
    return total / (genes * n * (n - 1) / 2)


def adaptive_rate(
    base: float, population_diversity: float, *, reference: float = 0.5, low: float = 0.01, high: float = 0.2
) -> float:
    """Raise the mutation rate as the population converges (diversity below `reference`), lower it while the
    population is diverse, clamped to [low, high]."""
    return min(high, max(low, base * reference / max(population_diversity, 1e-6)))
