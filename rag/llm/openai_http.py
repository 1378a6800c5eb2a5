"""OpenAI-compatible HTTP backend (OpenAI, vLLM, llama.cpp server, Ollama's /v1, ...) over plain httpx.

Plain HTTP instead of the `openai` package: two endpoints are all we need, and owning the retry loop
keeps timeouts, backoff and error messages the same whichever server is behind the URL.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from rag.llm.base import LLMError, Message, truncate_at_stop
from rag.llm.settings import LLMSettings

DEFAULT_BASE_URL = "https://api.openai.com/v1"  # what the official client uses when nothing is configured
_RETRY_STATUS = {429, 500, 502, 503, 504}
_MAX_RETRY_AFTER_S = 30.0  # never let a server's Retry-After stall a pipeline for long


class OpenAIHTTP:
    def __init__(self, settings: LLMSettings):
        if not settings.model:
            raise ValueError("LLMSettings.model is required for backend 'openai' (e.g. 'gpt-4o-mini', 'llama3.2')")
        self.name = f"openai:{settings.model}"
        self.model = settings.model
        self.base_url = (settings.base_url or DEFAULT_BASE_URL).rstrip("/")
        self.temperature = settings.temperature
        self.seed = settings.seed
        self.max_new_tokens = settings.max_new_tokens
        self.retries = max(0, settings.retries)
        self.backoff_s = settings.retry_backoff_s
        self.timeout_s = settings.timeout_s
        headers = {"Content-Type": "application/json"}
        # Read the key at construction only; it lives in the client's headers, never in settings or logs.
        key = os.environ.get(settings.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(timeout=settings.timeout_s, headers=headers)

    def complete(self, prompt: str, *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        body = self._body(max_new_tokens, stop) | {"prompt": prompt}
        data = self._post("/completions", body)
        try:
            text = data["choices"][0]["text"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"{self.base_url}/completions: unexpected response shape: {str(data)[:300]}") from exc
        return truncate_at_stop(text or "", stop)

    def chat(self, messages: list[Message], *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        body = self._body(max_new_tokens, stop) | {"messages": messages}
        data = self._post("/chat/completions", body)
        try:
            text = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"{self.base_url}/chat/completions: unexpected response shape: {str(data)[:300]}") from exc
        return truncate_at_stop(text or "", stop)

    def _body(self, max_new_tokens: int | None, stop: list[str] | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_new_tokens or self.max_new_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
        }
        if stop:
            body["stop"] = stop[:4]  # the OpenAI API rejects more than 4; the rest are applied client-side
        return body

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        last = ""
        for attempt in range(self.retries + 1):
            wait = self.backoff_s * (2**attempt)
            try:
                resp = self._client.post(url, json=body)
            except httpx.TimeoutException as exc:
                last = f"timed out after {self.timeout_s}s ({type(exc).__name__})"
            except httpx.TransportError as exc:
                last = f"connection failed ({type(exc).__name__}: {exc})"
            else:
                if resp.status_code < 400:
                    try:
                        return resp.json()
                    except ValueError as exc:
                        raise LLMError(
                            f"POST {url} returned non-JSON (status {resp.status_code}): {resp.text[:300]}"
                        ) from exc
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                if resp.status_code not in _RETRY_STATUS:
                    # 4xx other than 429 (bad model name, bad key, ...) will not fix itself: fail at once.
                    raise LLMError(f"POST {url} failed with {last}")
                wait = max(wait, _retry_after(resp))
            if attempt < self.retries:
                time.sleep(wait)
        raise LLMError(f"POST {url} failed after {self.retries + 1} attempt(s); last error: {last}")

    def close(self) -> None:
        self._client.close()


def _retry_after(resp: httpx.Response) -> float:
    try:
        return min(float(resp.headers.get("Retry-After", 0)), _MAX_RETRY_AFTER_S)
    except ValueError:  # an HTTP-date instead of seconds; not worth parsing
        return 0.0
