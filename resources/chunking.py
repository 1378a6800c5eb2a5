"""Chunking strategies from the user's YAML file."""

import os
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from rag.chunking import Chunker, StrategyConfig, get_chunker, load_strategies

REPO_ROOT = Path(__file__).resolve().parents[1]


class ChunkingStrategies(ConfigurableResource):
    """The strategies file (env RAG_CHUNKING_CONFIG; default config/chunking.yaml)."""

    config_path: str = Field(
        default_factory=lambda: os.environ.get("RAG_CHUNKING_CONFIG", str(REPO_ROOT / "config" / "chunking.yaml"))
    )

    def strategies(self) -> dict[str, StrategyConfig]:
        return load_strategies(Path(self.config_path))

    def chunker(self, name: str) -> Chunker:
        return get_chunker(name, self.strategies())
