"""Where the product's small shared state lives, and the locks that guard it.

The rollout state of each model kind, the promotion journal (the pending intent and the rollout log), the model
registry's change signal and the locks of the lifecycle and the registry are kept by one of two backends:

- files (the default, embedded): under the registry root, as they always were: `rollout/<kind>.json`,
  `rollout/intent.json`, `rollout/log.jsonl`, `.changed`; locks are flock()s on `rollout/.lock` and `.lock`. Every
  process must see the same folder (one machine, or one shared volume).
- postgresql: two tables (`rag_state`, `rag_state_log`) in a PostgreSQL database, each write one transaction; locks
  are session advisory locks (pg_advisory_lock), each held on a connection of its own, so a process that dies
  releases its locks with its connection. Replicas and pods then share state without sharing a disk.

Which one: `RAG_STATE_DB_URL` (a PostgreSQL SQLAlchemy URL, or `files`); unset, the state follows the feedback
store when `FEEDBACK_DB_URL` names PostgreSQL (one database for the product), else files. A database namespace
(`RAG_STATE_NAMESPACE`; default: the MLflow registry URI when the registry is a shared MLflow, else the registry
root's path) keeps apart the data dirs that share one database, as tests do.

Both backends expose the same primitives (StateBackend); the guarantees above them (an intent written before any
step, each step idempotent, recovery on the next open, re-entrant locks per thread) live in rag.lifecycle.journal
and rag.registry, once, for both."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

FILES = "files"
URL_ENV = "RAG_STATE_DB_URL"
NAMESPACE_ENV = "RAG_STATE_NAMESPACE"
FEEDBACK_URL_ENV = "FEEDBACK_DB_URL"


class StateBusy(RuntimeError):
    """A lock asked for without waiting is held by another process (or another thread of this one)."""


class StateBackend(Protocol):
    """Named documents (a key such as `rollout/embedder` -> a JSON text), an append-only log and named locks."""

    def describe(self) -> str:
        """Where the state is, for messages and /health: `files under /data/models`, `postgresql://host/db (...)`."""

    def read(self, key: str) -> str | None:
        """The document (None: never written, or deleted)."""

    def write(self, key: str, text: str) -> None:
        """Replace the document atomically: a reader sees the old text or the new one."""

    def delete(self, key: str) -> None:
        """Remove the document durably (absent is fine)."""

    def marks(self, keys: list[str]) -> tuple:
        """A value per key that changes whenever its document is written or deleted (None: absent). Cheap."""

    def append(self, entry: dict) -> None:
        """Append one entry to the log, durably."""

    def entries(self, limit: int | None = None) -> list[dict]:
        """The log, oldest first (its last `limit` entries)."""

    def logged(self, op: str) -> bool:
        """Whether an entry with this `op` (an intent's id) was appended."""

    def lock_id(self, name: str) -> str:
        """What identifies the lock `name` across processes (re-entrancy bookkeeping keys on it)."""

    def hold(self, name: str, wait: bool = True) -> AbstractContextManager[None]:
        """Hold the lock `name` across processes (not re-entrant); StateBusy at once when `wait` is False and
        another holder has it."""


class StateSettings(BaseModel):
    """Which backend keeps the state, from the environment."""

    url: str | None = Field(None, description="PostgreSQL SQLAlchemy URL; None: files under the registry root")
    namespace: str | None = Field(None, description="RAG_STATE_NAMESPACE: the data dir's rows in a shared database")

    @classmethod
    def from_env(cls) -> StateSettings:
        explicit = os.environ.get(URL_ENV, "").strip()
        namespace = os.environ.get(NAMESPACE_ENV, "").strip() or None
        if explicit == FILES:
            return cls(namespace=namespace)
        if explicit:
            if not is_postgres(explicit):
                raise ValueError(
                    f"{URL_ENV}={explicit!r}: the shared state needs PostgreSQL (advisory locks), e.g. "
                    f"postgresql+psycopg://user:password@host:5432/db; set {URL_ENV}=files to keep it in files"
                )
            return cls(url=explicit, namespace=namespace)
        feedback = os.environ.get(FEEDBACK_URL_ENV, "").strip()
        return cls(url=feedback if is_postgres(feedback) else None, namespace=namespace)


def is_postgres(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


class _Scoped(Protocol):
    """What a backend needs of a model registry (rag.registry.ModelRegistry)."""

    root: Path

    @property
    def embedded(self) -> bool: ...

    @property
    def registry_uri(self) -> str: ...


_open: dict[tuple, StateBackend] = {}


def for_registry(registry: _Scoped, settings: StateSettings | None = None) -> StateBackend:
    """The backend holding `registry`'s rollout state, journal, change signal and locks (one per process and
    place)."""
    settings = settings or StateSettings.from_env()
    root = Path(registry.root)
    if settings.url is None:
        key: tuple = (FILES, str(root.resolve()))
    else:
        namespace = settings.namespace or (str(root.resolve()) if registry.embedded else registry.registry_uri)
        key = (settings.url, namespace, str(root.resolve()))
    backend = _open.get(key)
    if backend is None:
        backend = _open.setdefault(key, _make(settings, root, key))
    return backend


def _make(settings: StateSettings, root: Path, key: tuple) -> StateBackend:
    from rag.state.files import FileState

    if settings.url is None:
        return FileState(root)
    from rag.state.sql import SqlState

    return SqlState(settings.url, namespace=key[1], root=root)
