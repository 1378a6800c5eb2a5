import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"


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
