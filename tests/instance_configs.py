"""The shipped Dagster instance configs under deploy/, set up as a deployment would: a DAGSTER_HOME holding the file,
the environment its `{env: ...}` entries read, and the deployment's processes (code server, daemon, workers)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

DEPLOY = REPO / "deploy"
CELERY_INSTANCE = DEPLOY / "celery" / "dagster.yaml"
K8S_INSTANCE = DEPLOY / "k8s" / "dagster.yaml"
CELERY_WORKER_CONFIG = DEPLOY / "celery" / "celery.yaml"
BIN = Path(sys.executable).parent  # the environment's commands: dagster, dagster-daemon, dagster-celery, rag
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


def start_process(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    """A deployment's process, output to `log`, in a session of its own so that it and what it starts (a Celery
    worker's pool, a run's process) stop together."""
    with log.open("w") as out:
        return subprocess.Popen(
            command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop_process(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
