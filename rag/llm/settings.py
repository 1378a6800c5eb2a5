"""Which LLM backend to use and how to sample from it; plain data, safe to put in configs."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


def _default_cache_dir() -> str:
    # Imported lazily: rag.store pulls in pandas, which a settings object should not need.
    from rag.store import data_dir

    return str(data_dir() / "llm_cache")


class LLMSettings(BaseModel):
    # Forbid unknown keys so a typo in a config (e.g. `temprature`) fails loudly instead of being ignored.
    model_config = ConfigDict(extra="forbid")

    backend: str = "none"  # a key of LLM_BACKENDS: "openai", "local-gguf" or "none"
    model: str = ""  # openai: model name; local-gguf: "smollm2", "gemma3-270m" or a path to a .gguf file
    base_url: str | None = Field(default_factory=lambda: os.environ.get("OPENAI_BASE_URL"))
    api_key_env: str = "OPENAI_API_KEY"  # name of the env var holding the key; the key itself is never stored
    temperature: float = 0.0  # 0 = greedy, so re-runs are reproducible
    seed: int = 42
    max_new_tokens: int = 128
    timeout_s: float = 60.0
    retries: int = 2  # extra attempts after the first one, on connection errors, 5xx and 429
    retry_backoff_s: float = 1.0  # first wait between attempts; doubles each time
    cache_dir: str | None = Field(default_factory=_default_cache_dir)

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else Path(_default_cache_dir())
