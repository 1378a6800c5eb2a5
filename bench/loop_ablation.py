"""What does each learner add, on each corpus? One row per full run of `bench/loop.py` (its result files under
bench/results/loop-*.json, quick runs left out): the corpus, which learners the feedback retrains trained, how the
simulated people clicked, what served at the end and where it came from, the headline figure and *answer read*
after the last round against the untrained default (paired, as the loop bench scored them). Corrections: runs that
differ only in the share of failed questions people correct (`--p-correction`) side by side. Ceilings, one row per
corpus: the recall of the ten passages the untrained default serves, the best configuration of the learner's grid on
the test labels (`--ceiling`, an oracle) and, from `bench/reranker_ceiling.py`'s result, the first stage's recall
down to the depth a reranker re-orders and what the reranker learner serves when trained on complete labels (of
people's questions, and of the test questions themselves). Reads result files only; writes its own JSON
(arguments, commit, date, the source files with their commits); asserts nothing.

    .venv/bin/python bench/loop_ablation.py             # after one or more bench/loop.py runs
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import RESULTS
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import write

# Runs before bench/loop.py recorded its headline figure led with these.
HEADLINE = {"tatqa": "recall@5", "scifact": "ndcg@10", "conditionalqa": "recall@5", "squad": "recall@5"}
READ = "answer_read"
# The commit that gave the reranker learner its document features (rag.rerank.features.DOCUMENT). Runs since record
# the features they read (`reranker_features`); earlier runs of that commit or its descendants are told by git.
DOCUMENT_FEATURES_COMMIT = "9dbf44f"


def reranker_learner(record: dict) -> str:
    """Which reranker learner a loop run trained: "document features" or "before document features" ("unknown" where
    neither the result nor git can tell)."""
    features = (record.get("corpus") or {}).get("reranker_features")
    if features is not None:
        return "document features" if "document_rank" in features else "before document features"
    commit = record.get("commit")
    if not commit:
        return "unknown"
    try:
        found = subprocess.run(
            ["git", "merge-base", "--is-ancestor", DOCUMENT_FEATURES_COMMIT, commit],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return {0: "document features", 1: "before document features"}.get(found.returncode, "unknown")


def _paired(entry: dict, metric: str) -> dict | None:
    paired = (entry.get("paired_vs_untrained_default") or {}).get(metric)
    if not paired:
        return None
    return {k: paired.get(k) for k in ("delta", "ci_low", "ci_high", "p_value", "better", "worse", "n")}


def _promotions(rounds: list[dict]) -> list[dict]:
    """Every promotion and rollback the product's jobs reported, in order: which kind served what, and why."""
    out = []
    for entry in rounds:
        for op in entry.get("operations", []):
            for asset, released in (op.get("released") or {}).items():
                said = released.get("summary") or released.get("reason")
                if said:
                    out.append({"round": entry["round"], "job": op.get("job"), "asset": asset, "what": said})
    return out


def row_of(name: str, record: dict) -> dict | None:
    """One loop run summarised, or None for a file that is not a finished full run."""
    corpus, args = record.get("corpus") or {}, record.get("args") or {}
    rounds, first = corpus.get("rounds") or [], corpus.get("round_0")
    if args.get("quick") or not rounds or not first:
        return None
    metric, last = corpus.get("headline") or HEADLINE.get(corpus.get("corpus"), "recall@5"), rounds[-1]
    learner = reranker_learner(record)  # may ask git: once per run
    ceiling = (corpus.get("ceiling") or {}).get("configurations") or []
    best = max(ceiling, key=lambda r: r[READ]) if ceiling else None
    return {
        "source": name,
        "source_commit": record.get("commit"),
        "source_date": record.get("date"),
        "corpus": corpus.get("corpus"),
        "learners": args.get("learners"),
        "reranker_learner": learner,
        "behaviour": args.get("behaviour"),
        "canary_behaviour": args.get("canary_behaviour"),
        "people_questions": last.get("asked_total"),
        "expert_labels": sum((r.get("experts") or {}).get("labelled", 0) for r in rounds),
        "test_questions": corpus.get("test_questions"),
        "metric": metric,
        "round_0": {metric: first["scores"].get(metric), READ: first["scores"].get(READ)},
        "last_round": {metric: last["scores"].get(metric), READ: last["scores"].get(READ)},
        "paired": {metric: _paired(last, metric), READ: _paired(last, READ)},
        "p_correction": args.get("p_correction"),
        "corrections_sent": sum((r.get("people") or {}).get("corrections", 0) for r in rounds),
        # what else set the run: two runs that differ only in p_correction measure what corrections add
        "setting": json.dumps(
            {k: v for k, v in sorted(args.items()) if k not in ("p_correction", "out", "markdown")}
            | {"reranker_learner": learner},
            default=str,
        ),
        "production": last.get("production"),
        "canary_running": last.get("canary_running"),
        "releases": _promotions(rounds),
        "ceiling": {
            "best_configuration": best and best["configuration"],
            "best_configuration_answer_read": best and best[READ],
            # The loop judges the server's 10 passages, so its recall@20 is their recall@10.
            "served_recall@10": first["scores"].get("recall@20"),
        },
    }


def corrections(rows: list[dict]) -> list[dict]:
    """Runs that differ only in p_correction, grouped: what people's corrections add to the same run."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["setting"], []).append(row)
    out = []
    for runs in groups.values():
        if len({r["p_correction"] for r in runs}) < 2:
            continue
        for r in sorted(runs, key=lambda r: r["p_correction"] or 0):
            keep = (
                "source",
                "corpus",
                "learners",
                "reranker_learner",
                "people_questions",
                "p_correction",
                "corrections_sent",
            )
            out.append({**{k: r[k] for k in keep}, "production": r["production"], "paired": r["paired"]})
    return out


def reranker_ceiling(results: Path, corpus: str) -> dict | None:
    """bench/reranker_ceiling.py's figures for a corpus, when it ran."""
    path = results / f"reranker-ceiling-{corpus}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    found = record.get("corpus") or {}
    arms = {a["arm"]: a for a in found.get("arms", [])}
    users = [
        a
        for name, a in arms.items()
        if name.startswith("users-") and not name.endswith("+generated") and not a.get("learner_options")
    ]
    widest = max(users, key=lambda a: a["questions"]) if users else None
    first = found.get("first_stage") or {}

    metric = found.get("headline", "recall@5")

    def delta(arm: dict | None) -> dict | None:
        paired = arm and (arm.get("paired_vs_untrained_default") or {}).get(metric)
        return paired and {"questions": arm["questions"], **{k: paired.get(k) for k in ("delta", "p_value")}}

    return {
        "source": path.stem,
        "source_commit": record.get("commit"),
        "rerank_depth": first.get("depth"),
        "first_stage_recall_at_depth": first.get(f"recall@{first.get('depth')}"),
        "metric": metric,
        "complete_users_labels": delta(widest),
        "in_sample_oracle": delta(arms.get("test-in-sample")),
    }


def ceilings(rows: list[dict], results: Path) -> list[dict]:
    """One row per corpus: the untrained default, the best configuration any run's --ceiling found, and
    bench/reranker_ceiling.py's figures."""
    out = []
    for corpus in sorted({r["corpus"] for r in rows}):
        runs = [r for r in rows if r["corpus"] == corpus]
        first = runs[0]
        found = [r["ceiling"] for r in runs if r["ceiling"].get("best_configuration")]
        best = max(found, key=lambda c: c["best_configuration_answer_read"]) if found else {}
        out.append(
            {
                "corpus": corpus,
                "metric": first["metric"],
                "round_0": first["round_0"],
                "served_recall@10": first["ceiling"].get("served_recall@10"),
                "best_configuration": best.get("best_configuration"),
                "best_configuration_answer_read": best.get("best_configuration_answer_read"),
                "reranker": reranker_ceiling(results, corpus),
            }
        )
    return out


def collect(results: Path) -> list[dict]:
    rows = []
    for path in sorted(results.glob("loop-*.json")):
        if path.stem == "loop-ablation":
            continue
        row = row_of(path.stem, json.loads(path.read_text()))
        if row:
            rows.append(row)
    return rows


def markdown(record: dict) -> str:
    head = "| corpus | learners | people | served at the end | Δ headline (p) | Δ answer read (p) |"
    lines = [head, "|" + "---|" * 6]
    for r in record["runs"]:
        metric, paired = r["metric"], r["paired"]

        def cell(m: str) -> str:
            p = paired.get(m)
            return f"{p['delta']:+.4f} ({p['p_value']:.2g})" if p else "—"

        served = ", ".join(f"{k} {v}" for k, v in (r["production"] or {}).items() if v) or "untrained default"
        lines.append(
            f"| {r['corpus']} | {'+'.join(r['learners'] or [])} | {r['behaviour']} | {served} | "
            f"{metric} {cell(metric)} | {cell(READ)} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = cli.parser(__doc__)
    p.add_argument("--results", type=Path, default=RESULTS, help="where the loop result files are")
    cli.add_output(p, flags=("--out",), help="result JSON (default bench/results/loop-ablation.json)")
    args = p.parse_args()
    record = run_record(args)
    record["runs"] = collect(args.results)
    record["corrections"] = corrections(record["runs"])
    record["ceilings"] = ceilings(record["runs"], args.results)
    out = args.out or RESULTS / "loop-ablation.json"
    write(stamp_end(record), out, indent=2, default=str)
    print(markdown(record))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
