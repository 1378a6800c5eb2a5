"""Local backend: a GGUF file run on CPU by transformers (weights dequantised with the `gguf` package).

The model is loaded lazily on the first request that misses the response cache (a fully cached re-run
never pays the load), and at most once per process per file.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from rag.llm.base import LLMError, Message, truncate_at_stop
from rag.llm.gguf_models import BUILTIN_GGUF, resolve_gguf
from rag.llm.settings import LLMSettings

log = logging.getLogger(__name__)

_LOADED: dict[Path, tuple[Any, Any]] = {}  # resolved .gguf path -> (tokenizer, model)
_LOAD_LOCK = threading.Lock()  # two threads asking for the same model must not both load it


def load_gguf(path: Path) -> tuple[Any, Any]:
    """(tokenizer, model) for a .gguf file, loaded once per process."""
    with _LOAD_LOCK:
        if path in _LOADED:
            return _LOADED[path]
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise LLMError(f"the local-gguf backend needs transformers and torch: {exc}") from exc
        start = time.perf_counter()
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
        except ImportError as exc:  # transformers needs both `gguf` and `accelerate` for GGUF files
            raise LLMError(f"cannot load {path}: {exc} (pip install gguf accelerate)") from exc
        except Exception as exc:  # unsupported architecture or quantisation type, truncated file, ...
            raise LLMError(f"transformers could not load GGUF file {path}: {type(exc).__name__}: {exc}") from exc
        model.eval()
        log.info("loaded %s in %.1f s", path.name, time.perf_counter() - start)
        _LOADED[path] = (tokenizer, model)
        return tokenizer, model


class LocalGGUF:
    def __init__(self, settings: LLMSettings):
        model = settings.model
        if model not in BUILTIN_GGUF and not model.lower().endswith(".gguf"):
            raise ValueError(
                f"local-gguf model {model!r} is neither a built-in "
                f"({', '.join(sorted(BUILTIN_GGUF))}) nor a path to a .gguf file"
            )
        if model not in BUILTIN_GGUF and not Path(model).expanduser().is_file():
            raise LLMError(f"GGUF file not found: {model}")
        self.name = f"local-gguf:{model if model in BUILTIN_GGUF else Path(model).name}"
        self.model = model
        self.temperature = settings.temperature
        self.seed = settings.seed
        self.max_new_tokens = settings.max_new_tokens
        self.models_dir = settings.resolved_cache_dir() / "models"  # where split models get assembled

    def _load(self) -> tuple[Any, Any]:
        return load_gguf(resolve_gguf(self.model, self.models_dir))

    def complete(self, prompt: str, *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        tokenizer, _ = self._load()
        # add_special_tokens: models that expect a BOS token (Gemma) get it; SmolLM2 adds none.
        inputs = tokenizer(prompt, return_tensors="pt")
        return self._generate(inputs, max_new_tokens, stop)

    def chat(self, messages: list[Message], *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        tokenizer, _ = self._load()
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)  # template has its own BOS
        else:
            # No template in the GGUF (e.g. Gemma 3 270M): a plain transcript, stopped before the next turn.
            text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
            inputs = tokenizer(text, return_tensors="pt")
            stop = [*(stop or []), "\nUser:"]
        return self._generate(inputs, max_new_tokens, stop).strip()

    def _generate(self, inputs: Any, max_new_tokens: int | None, stop: list[str] | None) -> str:
        import torch

        tokenizer, model = self._load()
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens or self.max_new_tokens,
            "do_sample": self.temperature > 0,
            "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        }
        if self.temperature > 0:
            kwargs["temperature"] = self.temperature
            torch.manual_seed(self.seed)  # same seed + same request -> same sample
        if stop:
            # Stop generating as soon as a stop string appears (saves time); the text is still cut below,
            # because generate keeps the stop string itself in the output.
            kwargs.update(stop_strings=stop, tokenizer=tokenizer)
        prompt_len = inputs["input_ids"].shape[1]
        with torch.inference_mode():
            out = model.generate(**inputs, **kwargs)
        text = tokenizer.decode(out[0, prompt_len:], skip_special_tokens=True)
        return truncate_at_stop(text, stop)
