"""The interface every backend implements, and the one error type callers need to catch."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}


class LLMError(RuntimeError):
    """A backend could not produce a completion (server down, bad status, model not loadable, ...)."""


@runtime_checkable
class LLM(Protocol):
    name: str  # "<backend>:<model>", part of every cache key

    def complete(self, prompt: str, *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        """Raw continuation of `prompt` (no chat formatting), cut before the first stop string."""
        ...

    def chat(self, messages: list[Message], *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        """The assistant's reply to `messages`, cut before the first stop string."""
        ...


def truncate_at_stop(text: str, stop: list[str] | None) -> str:
    """Cut `text` before the earliest stop string.

    Applied by every backend even when the server honours `stop` itself, so all backends
    (and FakeLLM) agree on where output ends.
    """
    if not stop:
        return text
    cut = len(text)
    for s in stop:
        if s:
            at = text.find(s)
            if at != -1:
                cut = min(cut, at)
    return text[:cut]
