"""Logging, latency statistics and result writing shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.lib.provenance import stamp_end


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stats(ms: list[float]) -> dict:
    """p50 / p95 / mean of a list of milliseconds, and how many there were."""
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p95_ms": round(float(np.percentile(ms, 95)), 3),
        "mean_ms": round(float(np.mean(ms)), 3),
        "n": len(ms),
    }


def write(out: dict, path: Path, indent: int = 1, default=None) -> None:
    """Write `out` as JSON through a temporary file: a run killed mid-write leaves the previous result whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=indent, default=default) + "\n")
    os.replace(tmp, path)


def finish(out: dict, path: Path, show: Callable[[dict], None]) -> None:
    """Stamp the end of a run (time, load), write it, and print its table with `show`."""
    write(stamp_end(out), path)
    show(out)
    log(f"wrote {path}")
