"""bench/canary_rule.py, small: every rule on every simulated cell, shares that add up, the harm test stopping a
losing candidate no later than the two-sided test alone, and futility stopping one no better than production sooner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_it_simulates_every_rule_and_records_the_run(tmp_path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, "bench/canary_rule.py", "--runs", "40", "--tie-rates", "0.5", "--max-queries", "400"]
    run = subprocess.run([*cmd, "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    record = json.loads(out.read_text())
    rows = record["simulated"]
    rules = {r["rule"] for r in rows}
    default = "harm test at 0.1 + futility at a win share of 0.6 (default)"
    futility = {default, "harm test at 0.1 + futility at a win share of 0.65"}
    assert rules == {"two-sided only", "harm test at 0.05", "harm test at 0.1", "harm test at 0.2", *futility}
    assert len(rows) == 7 * len(rules) and record["recorded"] == []
    for r in rows:
        assert abs(r["promote"] + r["rollback_on_evidence"] + r["horizon"] - 1) < 1e-3
        assert 1 <= r["median_queries"] <= 400
    cell = {r["rule"]: r for r in rows if r["win_share"] == 0.35}
    # The same simulated streams for every rule: the harm test can only stop a losing candidate sooner.
    assert cell["harm test at 0.1"]["mean_queries"] < cell["two-sided only"]["mean_queries"]
    assert cell["harm test at 0.1"]["rollback_on_evidence"] >= cell["two-sided only"]["rollback_on_evidence"]
    # Futility stops a candidate no better than production sooner, and promotes it no more often.
    level = {r["rule"]: r for r in rows if r["win_share"] == 0.5}
    for rule in futility:
        assert level[rule]["mean_queries"] < level["harm test at 0.1"]["mean_queries"]
        assert level[rule]["promote"] <= level["harm test at 0.1"]["promote"]
    assert record["commit"] and record["finished"] and record["machine"]
