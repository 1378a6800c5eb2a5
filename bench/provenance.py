"""What a result file records about the code that produced it."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """HEAD, marked -dirty when tracked files differ from it (the figures may then come from uncommitted code)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    """Where a result was measured, with the load average at the time of the call (a shared machine's load skews timings)."""
    import os
    import platform

    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "nice": os.nice(0), "loadavg": [round(x, 2) for x in os.getloadavg()]}
