"""A product job on dagster-celery's executor, as deploy/celery ships it: Redis as broker and result backend,
Dagster's storage on PostgreSQL (deploy/celery/dagster.yaml), the run's orchestrator in its own process
(`dagster job execute`), and each step in a Celery worker started by `dagster-celery worker start` (separate
processes). Needs RAG_TEST_POSTGRES_URL and RAG_TEST_REDIS_URL (`make test` starts both through
deploy/ci/services.sh); skipped, saying which is missing, without them. Slow (two workers, the run's own process and
their imports: 53 s on the 2-core development machine, beside other work): `make test-all` runs it;
tests/test_deployment.py checks in `make test` that runs and workers meet on the broker the environment names."""

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from orchestration.launch import run_job
from rag.store import TableStore
from resources.documents import DocumentSource
from resources.storage import DataStore
from tests.conftest import REPO
from tests.instance_configs import (
    BIN,
    CELERY_INSTANCE,
    CELERY_WORKER_CONFIG,
    dagster_pg_env,
    instance_home,
    start_process,
    stop_process,
)
from tests.test_feedback_store import POSTGRES, scratch_postgres

REDIS = os.environ.get("RAG_TEST_REDIS_URL")
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}

pytestmark = pytest.mark.slow


@pytest.fixture
def broker() -> str:
    """A Redis database of its own on RAG_TEST_REDIS_URL's server, so tasks left by an earlier run never meet ours."""
    if not REDIS:
        pytest.skip("set RAG_TEST_REDIS_URL=redis://host:port (e.g. Debian's redis-server) to run the Celery test")
    import redis

    try:
        redis.Redis.from_url(REDIS, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis answers at RAG_TEST_REDIS_URL={REDIS}: {exc}")
    return f"{REDIS.rstrip('/')}/{random.randint(1, 15)}"


@pytest.fixture
def database():
    if not POSTGRES:
        pytest.skip("set RAG_TEST_POSTGRES_URL=postgresql+psycopg://user:password@host/db to run the Celery test")
    with scratch_postgres(POSTGRES) as url:
        yield url


def start_worker(name: str, env: dict, log: Path) -> subprocess.Popen:
    """A Celery worker as a deployment starts it, one task at a time."""
    command = [str(BIN / "dagster-celery"), "worker", "start", "-A", "dagster_celery.app"]
    command += ["-y", str(CELERY_WORKER_CONFIG), "-n", name, "--", "--concurrency=1"]
    return start_process(command, env, log)


def ancestors(pid: int) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).parents()}
    except psutil.NoSuchProcess:
        return set()


def test_a_chunking_job_runs_each_step_in_a_celery_worker_with_postgres_storage(
    tmp_path, monkeypatch, broker, database
):
    from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, EventRecordsFilter

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "cats.txt").write_text("Cats sleep most of the day.\n\nThey hunt at dusk and at dawn.\n")
    (docs / "birds.md").write_text("# Birds\n\nSwifts sleep on the wing.\n\nGeese fly south in winter.\n")
    chunking = tmp_path / "chunking.yaml"
    chunking.write_text(yaml.safe_dump({"strategies": {"paragraph": {"kind": "paragraph"}}}))
    home = instance_home(tmp_path, CELERY_INSTANCE)
    settings = {
        **dagster_pg_env(database),
        "DAGSTER_HOME": str(home),
        "DAGSTER_CELERY_BROKER_URL": broker,
        "DAGSTER_CELERY_BACKEND_URL": broker,
        "RAG_EXECUTOR": "celery",
        "RAG_DATA_DIR": str(tmp_path / "data"),
        "RAG_DOCS_DIR": str(docs),
        "RAG_CHUNKING_CONFIG": str(chunking),
        "RAG_PDF_PASSWORDS_FILE": str(tmp_path / "none.yaml"),
    }
    env = {k: v for k, v in os.environ.items() if k not in ("QDRANT_URL", "PYTEST_XDIST_WORKER")}
    env.update(settings, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    workers = [start_worker(name, env, tmp_path / f"{name}.log") for name in ("rag-test-1", "rag-test-2")]
    try:
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
        instance = DagsterInstance.from_config(str(home))
        # The documents are parsed here while the workers start (the chunking job reads the parsed table).
        ingest = run_job(
            instance,
            "ingest_documents_job",
            run_config=QUIET,
            resources={"document_source": DocumentSource(), "data_store": DataStore()},
        )
        assert ingest.success
        instance.add_dynamic_partitions("chunking_strategy", ["paragraph"])

        # The run as a deployment's run worker starts it: its own process, the code location's executor.
        started = time.monotonic()
        execute = subprocess.run(
            [str(BIN / "dagster"), "job", "execute", "-m", "orchestration.definitions", "-j", "chunk_sets_job"]
            + ["--tags", json.dumps({"dagster/partition": "paragraph"})],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert execute.returncode == 0, execute.stdout[-3000:] + execute.stderr[-3000:]
        print(f"chunk_sets_job on Celery: {time.monotonic() - started:.1f} s")

        (run,) = [r for r in instance.get_runs() if r.job_name == "chunk_sets_job"]
        assert run.status == DagsterRunStatus.SUCCESS and run.tags["dagster/partition"] == "paragraph"
        events = [e.dagster_event for e in instance.all_logs(run.run_id) if e.dagster_event]
        (orchestrator,) = {e.pid for e in events if e.event_type == DagsterEventType.RUN_START}
        step_pids = {e.step_key: e.pid for e in events if e.event_type == DagsterEventType.STEP_START}
        assert set(step_pids) == {"chunk_sets", "bm25_indexes", "chunk_sets_chunk_sets_quality"}
        assert {e.step_key for e in events if e.event_type == DagsterEventType.STEP_SUCCESS} == set(step_pids)
        # Every step ran in a process forked by one of the two workers: not the run's, not this test's.
        worker_pids = {w.pid for w in workers}
        for step, pid in step_pids.items():
            assert pid not in (orchestrator, os.getpid()), step
            assert ancestors(pid) & worker_pids, f"step {step} ran in process {pid}, outside the Celery workers"
        assert "Submitting celery task" in execute.stderr + execute.stdout

        # What the steps wrote: the chunk table on the shared data dir, the materializations in Postgres.
        chunks = TableStore(tmp_path / "data" / "tables").read("chunk_sets", "paragraph")
        assert set(chunks.doc_id) == {"cats.txt", "birds.md"} and len(chunks) >= 2
        chunk_sets_materializations = instance.get_event_records(
            EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION, asset_key=AssetKey("chunk_sets"))
        )
        assert [r.event_log_entry.run_id for r in chunk_sets_materializations] == [run.run_id]
        assert [r.partition_key for r in chunk_sets_materializations] == ["paragraph"]
        assert instance.get_dynamic_partitions("chunking_strategy") == ["paragraph"]
        instance.dispose()
    finally:
        for worker in workers:
            stop_process(worker)
