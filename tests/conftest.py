import os
from pathlib import Path

import pytest

# anyio imports its file module lazily, inside the worker thread that first serves a file (the API's web page).
# pytest rewrites anyio's modules as a plugin's, and CPython 3.11.7 can fail an ast.parse running beside another
# thread's ("AST constructor recursion depth mismatch"): import it here, in the main thread, once.
import anyio._core._fileio  # noqa: E402,F401

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")
# Tests register models in their own temporary registries (embedded MLflow beside them): a developer's team server
# named in the environment must never receive them. Tests of the shared-store mode set these themselves.
for _name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "RAG_STATE_NAMESPACE"):
    os.environ.pop(_name, None)
# Rollout state and locks in files (tests copy data dirs whole), even beside a FEEDBACK_DB_URL naming PostgreSQL;
# the tests of the database backend set RAG_STATE_DB_URL themselves (tests/test_state_backends.py).
os.environ["RAG_STATE_DB_URL"] = "files"


def _no_fsync(fd: int) -> None:
    os.fstat(fd)  # a closed or bad descriptor still fails as it would


# fsync only guards against a power cut, which no test simulates (kill -9 leaves the page cache, so the crash tests
# hold without it); with a freshly copied data dir dirty in the page cache, each one waited ~70 ms here. Tests that
# check the order of fsyncs wrap this one; child processes (CLIs, servers) keep the real fsync.
os.fsync = _no_fsync

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"
# Answers encode questions with the model's int8 twin, exported at first use into the data dir: every test's fresh
# data dir would export again (seconds each). The exports are keyed by weights version, so all tests (and all xdist
# workers, and later runs) share one folder.
os.environ.setdefault("RAG_ONNX_CACHE", str(REPO / ".pytest_cache" / "onnx-int8"))


@pytest.fixture(scope="session")
def shared_pdfs() -> Path:
    path = SHARED / "pdfs"
    if not path.is_dir():
        pytest.skip(f"shared PDFs not available at {path}")
    return path


@pytest.fixture(scope="session")
def shared_mixed() -> Path:
    path = SHARED / "docs-mixed"
    if not path.is_dir():
        pytest.skip(f"shared mixed-format documents not available at {path}")
    return path


# make test hands out whole files to its two workers (--dist loadfile --no-loadscope-reorder). The files that take
# the longest (training, kill -9, loop and CLI runs) go first, so that neither worker ends with one of them alone
# while the other idles; the rest keep their order. Measured with --durations=0; a stale list only costs balance.
LONGEST_FILES = (
    "test_training.py",
    "test_lifecycle_kill.py",
    "test_loop_bench.py",
    "test_dagster.py",
    "test_reranker_ltr.py",
    "test_search_cli.py",
    "test_rollout_release.py",
    "test_ingest.py",
    "test_canary_attack.py",
    "test_training_learns.py",
)


def pytest_collection_modifyitems(config, items):
    first = {name: rank for rank, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # a stable sort: ties keep collection order
