"""What a result file records about the code and the machine that produced it."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def commit() -> str:
    """HEAD, marked -dirty when tracked files differ from it (the figures may then come from uncommitted code)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    """Where a result was measured, with the load average at the time of the call (a shared machine's load skews
    timings)."""
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "nice": os.nice(0),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def run_record(args, **machine_extra) -> dict:
    """The head of a result file: the run's arguments, commit, start time and machine (plus `machine_extra`)."""
    return {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "commit": commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine(), **machine_extra},
    }


def stamp_end(record: dict) -> dict:
    """The end of a run: its time and the load average then (what ran beside it shows up here)."""
    record["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    record.setdefault("machine", {})["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return record


def rendered_or_skipped(args, markdown, needed: Path, what: str) -> bool:
    """True when there is nothing to measure: `--markdown FILE` printed the table of an existing result file, or the
    data the bench needs (`needed`) is absent, which is said and skipped."""
    if getattr(args, "markdown", None):
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return True
    if not needed.exists():
        print(f"skipped: {needed} is absent ({what} are needed)")
        return True
    return False
