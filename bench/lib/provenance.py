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
    """HEAD, marked -dirty when tracked files differ from it (the figures may then come from uncommitted code).
    Result files and Markdown are not code: a bench that runs after another one wrote its result stays clean."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results", ":!*.md")
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# The libraries whose arithmetic or ordering a measured figure rests on: a fresh install may pull other versions.
MEASURED_WITH = (
    "torch",
    "sentence-transformers",
    "transformers",
    "numpy",
    "qdrant-client",
    "qdrant-edge-py",
    "bm25s",
    "lightgbm",
    "ranx",
)
# Vector instruction sets pick different float kernels (oneDNN, MKL): the same code and seed can rank a tie another
# way on another host. Two runs of the same code and seed on two hosts gave slightly different rankings; with the
# processor and the versions recorded, the next such pair can be told apart.
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu() -> dict:
    """The processor's model and the vector instruction sets it offers (Linux; empty elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in info.split("\n\n", 1)[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name", "unknown"), "vector": [f for f in VECTOR_FLAGS if f in flags]}


def packages() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in MEASURED_WITH:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def machine() -> dict:
    """Where a result was measured, with the load average at the time of the call (a shared machine's load skews
    timings), the processor and the versions of the libraries the figures rest on."""
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu": cpu(),
        "packages": packages(),
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
