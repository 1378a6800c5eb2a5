"""Backend name -> factory, and `load_llm`, which wraps every backend in the response cache."""

from __future__ import annotations

from typing import Callable

from rag.llm.base import LLM
from rag.llm.cache import CachedLLM, ResponseCache
from rag.llm.local_gguf import LocalGGUF
from rag.llm.openai_http import OpenAIHTTP
from rag.llm.settings import LLMSettings

# Adding a backend is one entry: a callable taking LLMSettings and returning an LLM (or None for "none").
LLM_BACKENDS: dict[str, Callable[[LLMSettings], LLM | None]] = {
    "none": lambda settings: None,
    "openai": OpenAIHTTP,
    "local-gguf": LocalGGUF,
}

CACHE_FILE = "responses.sqlite"


def load_llm(settings: LLMSettings) -> CachedLLM | None:
    """The backend named by `settings.backend`, wrapped in the on-disk response cache; None for "none"."""
    factory = LLM_BACKENDS.get(settings.backend)
    if factory is None:
        raise ValueError(f"unknown LLM backend {settings.backend!r}; known backends: {', '.join(sorted(LLM_BACKENDS))}")
    llm = factory(settings)
    if llm is None:
        return None
    cache = ResponseCache(settings.resolved_cache_dir() / CACHE_FILE)
    return CachedLLM(
        llm,
        cache,
        default_max_new_tokens=settings.max_new_tokens,
        params={"temperature": settings.temperature, "seed": settings.seed},
    )
