"""Qdrant: embedded under the data dir by default (Qdrant Edge; an old local-mode folder stays on local mode), a
server or cluster with QDRANT_URL."""

import os

from dagster import ConfigurableResource
from pydantic import Field

from rag.index.qdrant import QdrantSettings, get_client

# Embedded Qdrant locks its folder to one process for as long as the process lives, so two runs that open it at
# once fail with QdrantLockedError. Every step that opens it takes this pool, which the instance config of
# `make dev` and `make demo` (deploy/dagster-local.yaml: granularity run, limit 1) grants to one run at a time.
QDRANT_POOL = "qdrant"


def qdrant_pool() -> str | None:
    """The pool of steps that open Qdrant: the embedded folder's single-writer pool, or none with a Qdrant server
    (QDRANT_URL), which takes parallel writers (runs are then bounded by the instance's max_concurrent_runs)."""
    return None if os.environ.get("QDRANT_URL") else QDRANT_POOL


class QdrantResource(ConfigurableResource):
    """Every asset and job reaches Qdrant through this, so a process holds at most one local client."""

    url: str | None = Field(default_factory=lambda: os.environ.get("QDRANT_URL") or None)
    api_key: str | None = Field(default_factory=lambda: os.environ.get("QDRANT_API_KEY") or None)
    path: str | None = Field(
        default_factory=lambda: os.environ.get("RAG_QDRANT_PATH") or None,
        description="embedded folder (default `<data dir>/qdrant`)",
    )
    engine: str = Field(
        default_factory=lambda: os.environ.get("RAG_QDRANT_ENGINE") or "auto",
        description="embedded engine: auto (Qdrant Edge; a folder local mode wrote stays on local "
        "mode until `rag migrate-engine`), edge or local (env RAG_QDRANT_ENGINE)",
    )
    distance: str = Field(
        "cosine",
        description="dense distance for new collections: cosine | dot | l2 (searches "
        "report an l2 distance d as the similarity 1/(1+d), so min_score and hybrid-cc read it "
        "as higher = closer)",
    )

    def settings(self) -> QdrantSettings:
        return QdrantSettings(url=self.url, api_key=self.api_key, path=self.path, engine=self.engine)

    def client(self):
        return get_client(self.settings())

    def serving_target(self, tables, strategies: list[str] | None = None):
        """What promotion, rollback and a canary's start swap serving aliases in: `tables`' chunk sets (or
        `strategies`), Qdrant opened only when a step needs it (a reranker's never does)."""
        from rag.lifecycle.target import ServingTarget

        return ServingTarget(tables, self.client, strategies, self.distance)
