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

# make test runs two xdist workers on two cores. torch, OpenMP (LightGBM, ONNX Runtime) and numba each start one
# thread per core in every worker and in every child process, and their spin-waiting threads then fight over the
# cores. A worker's share of the cores it may run on (a cpuset narrows them), here and in its children (measured:
# 903 s -> 667 s for the whole suite).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
if _WORKERS > 1:
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_name, str(max(1, _CORES // _WORKERS)))


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


# Dagster instances entered (`with instance:` sets Dagster's current-instance context variable) and not exited yet.
_OPEN_DAGSTER_INSTANCES: list[object] = []


def _track_dagster_instances() -> bool:
    """Wraps the context manager that every entered Dagster instance goes through, once Dagster is imported."""
    import sys
    from contextlib import contextmanager

    if "dagster" not in sys.modules:
        return False
    try:
        from dagster._core.storage.defs_state import base
    except ImportError:  # another Dagster layout: no guard
        return True
    if getattr(base.set_defs_state_storage, "tracked", False):
        return True
    original = base.set_defs_state_storage

    @contextmanager
    def tracked(storage):
        marker = object()
        _OPEN_DAGSTER_INSTANCES.append(marker)
        try:
            with original(storage):
                yield
        finally:
            _OPEN_DAGSTER_INSTANCES.remove(marker)

    tracked.tracked = True
    base.set_defs_state_storage = tracked
    return True


@pytest.fixture(autouse=True)
def _dagster_instances_closed_by_their_test():
    """Fails the test that leaves a Dagster instance entered (a `build_schedule_context(...)` left to the garbage
    collector, say): its late exit resets the current-instance context variable in some later test of the worker, to
    a disposed instance, and each materialize() after that fails there ("undefined DagsterInstance weakref")."""
    guarded = _track_dagster_instances()
    before = set(_OPEN_DAGSTER_INSTANCES)
    yield
    if not guarded:
        _track_dagster_instances()  # this test imported Dagster: the next ones are guarded
        return
    if [m for m in _OPEN_DAGSTER_INSTANCES if m not in before]:
        pytest.fail("this test left a Dagster instance entered: open it (or the context holding it) with `with`")


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
