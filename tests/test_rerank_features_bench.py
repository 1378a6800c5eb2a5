"""bench/rerank_features.py on a tiny SciFact-shaped folder: it times every question twice and records both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_it_times_cold_and_warm_features_and_records_the_run(tmp_path):
    corpus = tmp_path / "scifact"
    corpus.mkdir()
    words = "protein cell gene tumour vitamin receptor dose cohort trial mouse".split()
    with (corpus / "corpus.jsonl").open("w") as f:
        for i in range(40):
            text = " ".join(words[(i + j) % len(words)] for j in range(30))
            f.write(json.dumps({"_id": str(i), "title": f"Study {i}", "text": text}) + "\n")
    with (corpus / "queries.jsonl").open("w") as f:
        for i, claim in enumerate(["Vitamin dose lowers tumour growth.", "Receptor genes change in mouse cells."]):
            f.write(json.dumps({"_id": str(i), "text": claim}) + "\n")
    out = tmp_path / "result.json"
    cmd = [sys.executable, "bench/rerank_features.py", "--scifact", str(corpus), "--questions", "2"]
    run = subprocess.run(
        [*cmd, "--candidates", "10", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    record = json.loads(out.read_text())
    assert (record["passages"], record["questions"], record["candidates_per_question"]) == (40, 2, 10)
    for state in ("cold", "warm"):
        assert 0 < record[state]["median_ms"] <= record[state]["p95_ms"]
    assert record["warm_up"]["passages"] == 40 and record["warm_up"]["seconds"] >= 0
    assert record["commit"] and record["finished"] and record["machine"]["packages"]


def test_without_scifact_it_says_so_and_writes_nothing(tmp_path):
    out = tmp_path / "result.json"
    run = subprocess.run(
        [sys.executable, "bench/rerank_features.py", "--scifact", str(tmp_path / "none"), "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "skipped" in run.stdout and not out.exists()
