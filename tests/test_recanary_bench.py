"""bench/recanary.py refuses what would lose a finished run's data: a work dir it would empty that holds, or sits
inside, the run's data dir; and a kind the run never canaried, unless a candidate is named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _finished_run(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "run-data"
    (data / "models").mkdir(parents=True)
    (data / "models" / "registry.json").write_text("{}")
    result = tmp_path / "self-improvement-squad.json"
    canary = {"kind": "embedder", "candidate_version": "v1", "decision": "rollback"}
    result.write_text(json.dumps({"args": {}, "corpora": {"squad": {"canaries": [canary]}}}))
    return data, result


def _recanary(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "bench/recanary.py", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_work_dir_overlapping_the_data_dir_is_refused_and_nothing_is_touched(tmp_path):
    data, result = _finished_run(tmp_path)
    out = tmp_path / "out.json"
    for work in (data, data / "copy", tmp_path):  # the data dir itself, inside it, around it
        run = _recanary("--data-dir", str(data), "--run-result", str(result), "--kind", "embedder",
                        "--work-dir", str(work), "--json", str(out))  # fmt: skip
        assert run.returncode == 2, run.stderr
        assert "overlaps --data-dir" in run.stdout
        assert (data / "models" / "registry.json").read_text() == "{}"
        assert not (data / "copy").exists() and not out.exists()


def test_a_kind_the_run_never_canaried_needs_a_named_candidate(tmp_path):
    data, result = _finished_run(tmp_path)
    run = _recanary("--data-dir", str(data), "--run-result", str(result), "--kind", "reranker",
                    "--work-dir", str(tmp_path / "work"))  # fmt: skip
    assert run.returncode == 2 and "ran no reranker canary: name one with --candidate" in run.stdout
    assert not (tmp_path / "work").exists()
