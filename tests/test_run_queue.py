"""The shipped instance config queues runs that open the embedded Qdrant folder one behind another: two
embedding_collections_job runs submitted at once, through a code server and the daemon on deploy/celery/dagster.yaml
(PostgreSQL storage), both succeed and never run at the same time. The example this config replaced allowed 4 at
once and 3 of 4 nightly runs failed with QdrantLockedError. The code server starts as deploy/compose.yaml starts it,
after `rag instance-config`: on a fresh database without that step, the first two such runs were dequeued in one pass
and overlapped (Dagster stores a pool's limit only once it dequeues a run of that pool). Slow (a code server, the
daemon and two runs in their own processes); needs RAG_TEST_POSTGRES_URL."""

import json
import os
import socket
import subprocess
import time

import pytest
import yaml

from orchestration.launch import CODE_LOCATION_MODULE as CODE_LOCATION
from orchestration.launch import run_job
from resources.chunking import ChunkingStrategies
from resources.documents import DocumentSource
from resources.storage import DataStore
from tests.conftest import REPO
from tests.instance_configs import BIN, CELERY_INSTANCE, dagster_pg_env, instance_home, start_process, stop_process
from tests.test_feedback_store import POSTGRES, scratch_postgres

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not POSTGRES, reason="set RAG_TEST_POSTGRES_URL to run Dagster's daemon on PostgreSQL"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s")


def test_two_embedding_runs_on_the_embedded_folder_queue_one_behind_the_other(tmp_path, monkeypatch):
    from dagster import DagsterInstance, DagsterRunStatus

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"d{i}.txt").write_text(f"Document {i} about topic {i}.\n\nA second paragraph on subject {i}.\n")
    (tmp_path / "chunking.yaml").write_text(
        yaml.safe_dump({"strategies": {"paragraph": {"kind": "paragraph"}, "page": {"kind": "page"}}})
    )
    (tmp_path / "embedders.yaml").write_text("active: [wordllama]\n")
    port = free_port()
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump({"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": port, "location_name": "rag"}}]})
    )
    home = instance_home(tmp_path, CELERY_INSTANCE)
    with scratch_postgres(POSTGRES) as url:
        settings = {
            **dagster_pg_env(url),
            "DAGSTER_HOME": str(home),
            "RAG_DATA_DIR": str(tmp_path / "data"),
            "RAG_DOCS_DIR": str(docs),
            "RAG_CHUNKING_CONFIG": str(tmp_path / "chunking.yaml"),
            "RAG_EMBEDDERS_CONFIG": str(tmp_path / "embedders.yaml"),
            "RAG_PDF_PASSWORDS_FILE": str(tmp_path / "none.yaml"),
        }
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
        env = {k: v for k, v in os.environ.items() if k not in ("QDRANT_URL", "RAG_EXECUTOR", "PYTEST_XDIST_WORKER")}
        env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        code_server = f"rag instance-config && exec dagster api grpc -h 127.0.0.1 -p {port} -m {CODE_LOCATION}"
        processes = [start_process(["sh", "-c", code_server], env, tmp_path / "code-server.log")]
        try:
            instance = DagsterInstance.from_config(str(home))
            # What the embedding runs read: parsed documents and two chunk sets, built here meanwhile.
            resources = {
                "document_source": DocumentSource(),
                "data_store": DataStore(),
                "chunking": ChunkingStrategies(),
            }
            assert run_job(instance, "ingest_documents_job", run_config=QUIET, resources=resources).success
            instance.add_dynamic_partitions("chunking_strategy", ["paragraph", "page"])
            instance.add_dynamic_partitions("embedding_model", ["wordllama"])
            for strategy in ("paragraph", "page"):
                chunked = run_job(
                    instance, "chunk_sets_job", partition_key=strategy, run_config=QUIET, resources=resources
                )
                assert chunked.success

            health = [str(BIN / "dagster"), "api", "grpc-health-check", "-p", str(port)]
            wait_for(lambda: subprocess.run(health, env=env, capture_output=True).returncode == 0, 180, "code server")
            processes.append(
                start_process([str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], env, tmp_path / "daemon.log")
            )
            for strategy in ("paragraph", "page"):
                tags = {
                    "dagster/partition": f"wordllama|{strategy}",
                    "dagster/partition/model": "wordllama",
                    "dagster/partition/strategy": strategy,
                }
                launched = subprocess.run(
                    [str(BIN / "dagster"), "job", "launch", "-w", str(workspace), "-j", "embedding_collections_job"]
                    + ["--tags", json.dumps(tags)],
                    env=env,
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-2000:]

            def finished():
                runs = [r for r in instance.get_runs() if r.job_name == "embedding_collections_job"]
                return len(runs) == 2 and all(r.is_finished for r in runs) and runs

            runs = wait_for(finished, 300, "both embedding runs finishing")
            assert {r.status for r in runs} == {DagsterRunStatus.SUCCESS}, (tmp_path / "daemon.log").read_text()[-3000:]
            first, second = sorted((instance.get_run_stats(r.run_id) for r in runs), key=lambda s: s.start_time)
            assert second.start_time >= first.end_time, "two runs held the embedded Qdrant folder at once"
            instance.dispose()
        finally:
            for process in reversed(processes):
                stop_process(process)
