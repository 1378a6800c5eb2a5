"""The shipped Dagster instance configs under deploy/, set up as a deployment would: a DAGSTER_HOME holding the file,
and the environment its `{env: ...}` entries read."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import REPO

DEPLOY = REPO / "deploy"
CELERY_INSTANCE = DEPLOY / "celery" / "dagster.yaml"
K8S_INSTANCE = DEPLOY / "k8s" / "dagster.yaml"
CELERY_WORKER_CONFIG = DEPLOY / "celery" / "celery.yaml"
# Every instance config a deployment copies, the local one of `make dev` included.
SHIPPED_INSTANCES = (DEPLOY / "dagster-local.yaml", CELERY_INSTANCE, K8S_INSTANCE)


def dagster_pg_env(url: str) -> dict[str, str]:
    """The DAGSTER_PG_* variables the shipped configs read, for the database `url` names."""
    import sqlalchemy as sa

    parsed = sa.engine.make_url(url)
    return {
        "DAGSTER_PG_HOST": parsed.host or "127.0.0.1",
        "DAGSTER_PG_PORT": str(parsed.port or 5432),
        "DAGSTER_PG_USERNAME": parsed.username or "postgres",
        "DAGSTER_PG_PASSWORD": parsed.password or "",
        "DAGSTER_PG_DB": parsed.database or "postgres",
    }


def instance_home(parent: Path, config: Path) -> Path:
    """A DAGSTER_HOME holding `config` as its dagster.yaml."""
    home = parent / f"home-{config.parent.name}"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, home / "dagster.yaml")
    return home
