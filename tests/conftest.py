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
