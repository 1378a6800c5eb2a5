"""On-disk response cache: an identical request (model, input, generation params) is answered from SQLite.

Generation is the slow, costly step of building synthetic data sets; with greedy decoding the same request
always yields the same text, so re-runs of a pipeline should cost nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Callable

from rag.llm.base import LLM, Message

# Bump when the meaning of a cached entry changes (e.g. how stop strings are applied) to orphan old rows.
_KEY_VERSION = 1


def request_key(request: dict[str, Any]) -> str:
    canonical = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ResponseCache:
    """One SQLite file, one table. A connection per operation keeps transactions short and makes the
    cache safe to share between threads and processes (WAL lets readers run alongside a writer)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as conn, conn:
            # WAL is a property of the database file, so setting it once here is enough for every process.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS responses ("
                " key TEXT PRIMARY KEY, model TEXT NOT NULL, request TEXT NOT NULL,"
                " response TEXT NOT NULL, created REAL NOT NULL)"
            )

    def _connect(self) -> sqlite3.Connection:
        # timeout = how long to wait for another process's write lock before raising "database is locked".
        return sqlite3.connect(self.path, timeout=30.0)

    def get(self, key: str) -> str | None:
        with closing(self._connect()) as conn:
            row = conn.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, model: str, request: dict[str, Any], response: str) -> None:
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "INSERT OR REPLACE INTO responses (key, model, request, response, created) VALUES (?, ?, ?, ?, ?)",
                (key, model, json.dumps(request, ensure_ascii=False, sort_keys=True), response, time.time()),
            )

    def __len__(self) -> int:
        with closing(self._connect()) as conn:
            return conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0]


class CachedLLM:
    """Wraps any LLM; looks every request up in a ResponseCache before calling the backend.

    `params` holds the settings that change the output but are not call arguments (temperature, seed), so
    they take part in the key. `max_new_tokens=None` is resolved to the default first, so passing the
    default explicitly hits the same entry.
    """

    def __init__(
        self, inner: LLM, cache: ResponseCache, *, default_max_new_tokens: int, params: dict[str, Any] | None = None
    ):
        self.inner = inner
        self.cache = cache
        self.name = inner.name
        self.default_max_new_tokens = default_max_new_tokens
        self.params = dict(params or {})
        self.cache_hits = 0
        self.cache_misses = 0

    def complete(self, prompt: str, *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        n = max_new_tokens or self.default_max_new_tokens
        return self._cached(
            "complete", prompt, n, stop, lambda: self.inner.complete(prompt, max_new_tokens=n, stop=stop)
        )

    def chat(self, messages: list[Message], *, max_new_tokens: int | None = None, stop: list[str] | None = None) -> str:
        n = max_new_tokens or self.default_max_new_tokens
        return self._cached("chat", messages, n, stop, lambda: self.inner.chat(messages, max_new_tokens=n, stop=stop))

    def _cached(
        self,
        kind: str,
        content: str | list[Message],
        max_new_tokens: int,
        stop: list[str] | None,
        generate: Callable[[], str],
    ) -> str:
        request = {
            "v": _KEY_VERSION,
            "model": self.name,
            "kind": kind,
            "input": content,
            "max_new_tokens": max_new_tokens,
            "stop": list(stop or []),
            **self.params,
        }
        key = request_key(request)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache_hits += 1
            return hit
        self.cache_misses += 1
        text = generate()  # failures raise and are never cached
        self.cache.put(key, self.name, request, text)
        return text
