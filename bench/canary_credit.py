"""Which signals tell a better ranking in a canary? The interleaved canary queries of finished `bench/loop.py` runs,
read from their feedback stores, counted under each credit rule: positive signals only (clicks and +1s, what the
canary decided on until 2026-11-30), signed (a -1 debiting its team, the rule before that), the -1s alone, plain team
draft (shared picks credited), and three that weigh a rating above a bare click: bare clicks left out where the
person rated a passage +1 (what it decides on now), the +1s alone, and the +1s with bare clicks breaking their ties.
Beside them, what each run's rerankers serve on the test split (its `rerankers_on_test`), so a rule can be checked
against a candidate known to be better.

    .venv/bin/python bench/canary_credit.py                      # every loop result whose work folder is still here
    .venv/bin/python bench/canary_credit.py --results bench/results/loop-tatqa-reranker+configuration.json

Writes bench/results/canary-credit.json (arguments, commit, date, machine). Skips a result whose work folder is gone
(the loop runs in a temporary folder; rerun bench/loop.py to get one).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS
from bench.lib.loop import canary_credit_split
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import log, write


def canaries_named(corpus: dict) -> list[str]:
    """The canaries a run's canary_sensor reported, in order (their names: a reranker canary's queries carry only the
    embedders' names)."""
    names = []
    for entry in corpus.get("rounds", []):
        for op in entry.get("operations", []):
            said = op.get("skip") or ""
            if op.get("sensor") == "canary_sensor" and said.startswith("canary "):
                name = said.split()[1].rstrip(":")
                if name not in names:
                    names.append(name)
    return names


def main() -> int:
    p = cli.parser(__doc__)
    p.add_argument("--results", type=Path, nargs="*", help="loop result files (default: bench/results/loop-*.json)")
    cli.add_output(p, flags=("--out",), help="result JSON (default: bench/results/canary-credit.json)")
    args = p.parse_args()
    record = run_record(args)
    runs = []
    for path in args.results or sorted(RESULTS.glob("loop-*.json")):
        result = json.loads(path.read_text())
        corpus = result.get("corpus") or {}
        store = Path(corpus.get("work_dir") or "/nonexistent") / "data" / "feedback.sqlite"
        if not store.exists():
            log(f"{path.name}: its work folder is gone, skipped")
            continue
        split = canary_credit_split(store)
        if not split:
            continue
        runs.append(
            {
                "source": path.stem,
                "source_commit": result.get("commit"),
                "corpus": corpus.get("corpus"),
                "canaries": canaries_named(corpus),
                "interleaved": split,
                "rerankers_on_test": [
                    {"name": r["name"], "paired_vs_untrained_default": r.get("paired_vs_untrained_default")}
                    for r in corpus.get("rerankers_on_test", [])
                ],
            }
        )
        log(f"{path.name}: {json.dumps(split)[:300]}")
    record["runs"] = runs
    out = args.out or RESULTS / "canary-credit.json"
    write(stamp_end(record), out, indent=2, default=str)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
