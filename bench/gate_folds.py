"""Does the cross-fitted gate see what one held-out share cannot? Each reranker a finished `bench/loop.py` run trained
is gated again, on a copy of the run's work folder, against the untrained default (no reranker) and against a
reranker of the run (`--against v1`): once on its own share of users' held-out questions, as the gate decided before
RerankerTrainingConfig.gate_folds, and once cross-fitted over every share. Beside each, what the ranker serves on the
test split (the run's `rerankers_on_test`).

    .venv/bin/python bench/gate_folds.py --against v1 --results bench/results/loop-tatqa-<...>-gate-folds-seed12.json

Writes bench/results/gate-folds.json (arguments, commit, date, machine). Skips a result whose work folder is gone.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS
from bench.lib.provenance import run_record, stamp_end
from bench.lib.regate import regate
from bench.lib.results import log, write


def main() -> int:
    p = cli.parser(__doc__)
    p.add_argument("--results", type=Path, nargs="+", required=True, help="loop result files with kept work folders")
    p.add_argument(
        "--against", nargs="*", default=[], help="versions of the run to gate against too (always: no reranker)"
    )
    cli.add_output(p, flags=("--out",), help="result JSON (default: bench/results/gate-folds.json)")
    args = p.parse_args()
    record = run_record(args)
    runs = []
    for path in args.results:
        corpus = json.loads(path.read_text()).get("corpus") or {}
        work = Path(corpus.get("work_dir") or "/nonexistent")
        if not (work / "data" / "models").exists():
            log(f"{path.name}: its work folder is gone, skipped")
            continue
        on_test = {
            r["name"]: r["paired_vs_untrained_default"][
                "recall@5" if corpus.get("headline") == "recall@5" else "ndcg@10"
            ]
            for r in corpus.get("rerankers_on_test", [])
            if r.get("paired_vs_untrained_default")
        }
        verdicts = [row for against in [None, *args.against] for row in regate(work, against)]
        for row in verdicts:
            test = on_test.get(row["candidate"]) or {}
            row["on_test_delta_vs_untrained"] = test.get("delta")
            row["on_test_p_value"] = test.get("p_value")
            log(f"{path.name}: {json.dumps(row)}")
        runs.append(
            {
                "source": path.stem,
                "corpus": corpus.get("corpus"),
                "headline": corpus.get("headline"),
                "verdicts": verdicts,
            }
        )
    record["runs"] = runs
    out = args.out or RESULTS / "gate-folds.json"
    write(stamp_end(record), out, indent=2, default=str)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
