"""Key lifecycle tests again, with the rollout state, the journal and the lifecycle lock in PostgreSQL
(RAG_TEST_POSTGRES_URL; skipped with the reason without it). The test functions are the file backend's own, imported
here so that pytest runs them a second time in this module, under its autouse fixture."""

import pytest

from tests.state_backends import scratch_database, use_database
from tests.test_lifecycle import (  # noqa: F401 - collected again here
    canary_running,
    test_a_canary_is_promoted_only_when_the_sequential_test_says_so_now,
    test_a_promotion_interrupted_between_its_steps_is_completed_by_the_next_open,
)
from tests.test_models_cli import (  # noqa: F401 - collected again here
    data,
    registry,
    test_a_models_command_does_not_wait_on_a_promotion_running_elsewhere,
    test_every_models_command_first_completes_a_promotion_a_kill_left_half_done,
)


@pytest.fixture(scope="module")
def database():
    with scratch_database() as url:
        yield url


def rows(url: str) -> int:
    from sqlalchemy import text

    from rag.state.sql import engine_for

    with engine_for(url).connect() as conn:
        return conn.execute(
            text("SELECT (SELECT count(*) FROM rag_state) + (SELECT count(*) FROM rag_state_log)")
        ).scalar()


@pytest.fixture(autouse=True)
def on_postgres(database, monkeypatch):
    use_database(monkeypatch, database)
    before = rows(database)
    yield
    assert rows(database) > before  # the test's state went to PostgreSQL
