"""LLM backends behind one small interface, for generating synthetic questions and answers.

    llm = load_llm(LLMSettings(backend="local-gguf", model="smollm2"))
    text = llm.complete("Q: ...\nA:", stop=["\n"])

Backends: "openai" (any OpenAI-compatible server over HTTP), "local-gguf" (a GGUF file run by
transformers on CPU; built-ins "smollm2" and "gemma3-270m" ship in PyPI packages) and "none".
Every backend returned by `load_llm` answers repeated identical requests from an on-disk SQLite cache.
"""

from rag.llm.base import LLM, LLMError, Message, truncate_at_stop
from rag.llm.cache import CachedLLM, ResponseCache
from rag.llm.gguf_models import BUILTIN_GGUF
from rag.llm.registry import LLM_BACKENDS, load_llm
from rag.llm.settings import LLMSettings

__all__ = [
    "LLM",
    "LLMError",
    "LLMSettings",
    "LLM_BACKENDS",
    "load_llm",
    "CachedLLM",
    "ResponseCache",
    "BUILTIN_GGUF",
    "Message",
    "truncate_at_stop",
]
