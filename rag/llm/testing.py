"""FakeLLM: scripted completions, so code that uses an LLM can be tested without a model or a server."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from rag.llm.base import Message, truncate_at_stop

Script = Callable[[Any], str] | Iterable[str] | str


class FakeLLM:
    """Answers from a script: a callable (gets the prompt str, or the messages list for chat), a sequence
    of replies used in order (raises when it runs out, so a test notices extra calls), or one fixed string.
    Stop strings are applied like the real backends do. Every call is recorded in `calls`."""

    def __init__(self, script: Script = "", name: str = "fake:scripted"):
        self.name = name
        self._fn: Callable[[Any], str] | None = script if callable(script) else None
        self._fixed: str | None = script if isinstance(script, str) else None
        self._queue: list[str] = [] if self._fn or self._fixed is not None else list(script)  # type: ignore[arg-type]
        self.calls: list[dict[str, Any]] = []

    @property
    def call_count(self) -> int:
        return len(self.calls)

    def complete(self, prompt: str, *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        return self._answer("complete", prompt, max_new_tokens, stop)

    def chat(self, messages: list[Message], *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        return self._answer("chat", messages, max_new_tokens, stop)

    def _answer(self, kind: str, content: Any, max_new_tokens: int | None, stop: list[str] | None) -> str:
        self.calls.append({"kind": kind, "input": content, "max_new_tokens": max_new_tokens, "stop": stop})
        if self._fn is not None:
            text = self._fn(content)
        elif self._fixed is not None:
            text = self._fixed
        elif self._queue:
            text = self._queue.pop(0)
        else:
            raise AssertionError(f"FakeLLM ran out of scripted replies after {len(self.calls) - 1} call(s)")
        return truncate_at_stop(text, stop)
