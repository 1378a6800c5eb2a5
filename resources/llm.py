"""The LLM used to generate synthetic questions (and later answers): a backend of rag.llm's registry."""

import os

from dagster import ConfigurableResource
from pydantic import Field

from rag.llm import LLMSettings, load_llm


class LLMResource(ConfigurableResource):
    """backend: none (inverse-cloze questions, no model) | local-gguf (SmolLM2 / Gemma-3 shipped in PyPI
    packages, offline) | openai (any OpenAI-compatible endpoint: base_url + key from the env var)."""

    backend: str = Field(default_factory=lambda: os.environ.get("RAG_LLM_BACKEND", "none"))
    model: str = Field(default_factory=lambda: os.environ.get("RAG_LLM_MODEL", "smollm2"))
    base_url: str | None = Field(default_factory=lambda: os.environ.get("OPENAI_BASE_URL") or None)
    api_key_env: str = "OPENAI_API_KEY"
    max_new_tokens: int = 128
    timeout_s: float = 60.0

    def settings(self) -> LLMSettings:
        return LLMSettings(
            backend=self.backend,
            model=self.model,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            max_new_tokens=self.max_new_tokens,
            timeout_s=self.timeout_s,
        )

    def load(self):
        return load_llm(self.settings())
