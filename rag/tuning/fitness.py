"""A persistent fitness cache keyed by genome (within an evaluation context), and the budgeted evaluation
counter every optimizer goes through: a genome is evaluated at most once, ever, for the same context."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rag.tuning.evaluate import Scored
from rag.tuning.space import Genome, SearchSpace


class BudgetExhausted(RuntimeError):
    """The search has seen as many distinct candidates as its budget allows."""


class FitnessCache:
    """SQLite table (context, genome key) → Scored; `path=None` keeps it in memory (tests, one-off runs)."""

    def __init__(self, path: Path | None, context: str):
        self.context = context
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path) if path else ":memory:", timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS fitness (context TEXT, genome TEXT, scored TEXT, created REAL, "
            "PRIMARY KEY (context, genome))"
        )

    def get(self, key: str) -> Scored | None:
        row = self._db.execute(
            "SELECT scored FROM fitness WHERE context = ? AND genome = ?", (self.context, key)
        ).fetchone()
        return Scored.from_json(json.loads(row[0])) if row else None

    def put(self, key: str, scored: Scored) -> None:
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO fitness VALUES (?, ?, ?, ?)",
                (self.context, key, json.dumps(scored.to_json()), time.time()),
            )

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM fitness WHERE context = ?", (self.context,)).fetchone()[0]

    def close(self) -> None:
        self._db.close()


@dataclass
class Evaluations:
    """Every fitness an optimizer asks for goes through here: cached, counted, and within the budget of distinct
    candidates (cache hits count toward the budget too, so a search explores the same way whatever the cache holds)."""

    space: SearchSpace
    evaluate: Callable[[Genome], Scored]
    cache: FitnessCache | None = None
    budget: int | None = None
    identity: Callable[[Genome], str] | None = None  # extra cache key: what the genome's option names leave open
    advance: Callable[[], None] | None = None  # called for each distinct candidate (rag.progress.counter)
    seen: dict[Genome, Scored] = field(default_factory=dict)
    order: list[tuple[Genome, int]] = field(default_factory=list)  # (genome, generation it was first seen in)
    computed: int = 0  # fitness actually computed (persistent-cache misses)
    cache_hits: int = 0
    generation: int = 0

    @property
    def remaining(self) -> int | None:
        return None if self.budget is None else self.budget - len(self.seen)

    def affordable(self, genome: Genome) -> bool:
        return genome in self.seen or self.remaining is None or self.remaining > 0

    def __call__(self, genome: Genome) -> Scored:
        genome = tuple(genome)
        if genome in self.seen:
            return self.seen[genome]
        if not self.affordable(genome):
            raise BudgetExhausted(f"budget of {self.budget} distinct candidates used")
        key = self.space.key(genome) + (f"#{self.identity(genome)}" if self.identity else "")
        scored = self.cache.get(key) if self.cache is not None else None
        if scored is None:
            scored = self.evaluate(genome)
            self.computed += 1
            if self.cache is not None:
                self.cache.put(key, scored)
        else:
            self.cache_hits += 1
        self.seen[genome] = scored
        self.order.append((genome, self.generation))
        if self.advance:
            self.advance()
        return scored
