"""Embedding models: the registry names (config/embedders.yaml) and which ones are indexed."""

import os
from pathlib import Path

import yaml
from dagster import ConfigurableResource
from pydantic import Field

from rag.embedding import TextEmbedder, embedders_config_path, load_embedder


class EmbeddingModels(ConfigurableResource):
    config_path: str = Field(default_factory=lambda: str(embedders_config_path()))

    def active(self) -> list[str]:
        """Models that get a collection per strategy: `active:` in the YAML (env RAG_ACTIVE_MODELS overrides)."""
        if os.environ.get("RAG_ACTIVE_MODELS"):
            return [m.strip() for m in os.environ["RAG_ACTIVE_MODELS"].split(",") if m.strip()]
        path = Path(self.config_path)
        raw = yaml.safe_load(path.read_text()) if path.exists() else {}
        return list((raw or {}).get("active") or ["minilm"])

    def load(self, name: str) -> TextEmbedder:
        return load_embedder(name)
