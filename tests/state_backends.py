"""Running tests on the PostgreSQL state backend (rag.state.sql): a scratch database, and a namespace per data dir."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

POSTGRES = os.environ.get("RAG_TEST_POSTGRES_URL")  # e.g. postgresql+psycopg://postgres:pg@127.0.0.1:5432/postgres
SKIP_REASON = (
    "set RAG_TEST_POSTGRES_URL=postgresql+psycopg://user:password@host/db to run the PostgreSQL cases"
)


@contextmanager
def scratch_database() -> Iterator[str]:
    """The URL of a database of its own on RAG_TEST_POSTGRES_URL's server, dropped afterwards; skips without one."""
    if not POSTGRES:
        pytest.skip(SKIP_REASON)
    from tests.test_feedback_store import scratch_postgres

    from rag.state import sql

    with scratch_postgres(POSTGRES) as url:
        try:
            yield url
        finally:
            engine = sql._engines.pop(url, None)
            if engine is not None:
                engine.dispose()


def use_database(monkeypatch, url: str, namespace: str | None = None) -> None:
    """This process's rollout state, journal and locks in `url` from now on (its namespace: `namespace`, else each
    data dir's registry root)."""
    monkeypatch.setenv("RAG_STATE_DB_URL", url)
    if namespace:
        monkeypatch.setenv("RAG_STATE_NAMESPACE", namespace)
    else:
        monkeypatch.delenv("RAG_STATE_NAMESPACE", raising=False)
