"""Where production is served from, typed: what promotion, rollback and a canary's start need to build an
embedder's collections and swap the serving aliases (it replaces the `promote_args` dict that was built in three
places)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rag.store import CHUNKS_TABLE, TableStore


def chunk_sets(tables: TableStore) -> list[str]:
    """Every chunk set present: the strategies whose serving aliases `<strategy>__production` follow production."""
    folder = tables.root / CHUNKS_TABLE
    return sorted(p.parent.name for p in folder.glob("*/data.parquet")) if folder.exists() else []


@dataclass
class ServingTarget:
    """The chunk sets and the Qdrant holding their collections. Qdrant is opened on first use only: a reranker's
    promotion and a canary's rollback never need it, and an embedded Qdrant folder may be held by another process.

    `strategies`: None means every chunk set present in `tables` when first asked."""

    tables: TableStore
    open_client: Callable[[], object]
    strategies: list[str] | None = None
    distance: str = "cosine"
    _client: object | None = field(default=None, repr=False)

    @classmethod
    def of_client(
        cls, tables: TableStore, client, strategies: list[str] | None = None, distance: str = "cosine"
    ) -> ServingTarget:
        """A target over an already opened client (tests, benches, the process that holds Qdrant)."""
        return cls(tables, lambda: client, strategies, distance)

    def client(self):
        if self._client is None:
            self._client = self.open_client()
        return self._client

    def chunk_sets(self) -> list[str]:
        if self.strategies is None:
            self.strategies = chunk_sets(self.tables)
        return list(self.strategies)


def data_dir_target(distance: str = "cosine") -> ServingTarget:
    """The data dir's chunk sets and Qdrant, opened only when a step needs it: stopping a canary works while
    Dagster holds the embedded folder. What the `rag models` commands act on."""
    from rag.index.qdrant import get_client
    from rag.store import data_dir

    return ServingTarget(TableStore(data_dir() / "tables"), get_client, distance=distance)
