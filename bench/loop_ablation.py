"""Did the loop reach what was asked of it, and what does each learner add, on each corpus? Per figure asked (TARGETS):
how many full runs served it at the round it is judged, how many trained a model that would have (served or not), the
best run and model, and the ceiling on complete labels. One row per full run of `bench/loop.py` (its result files
under bench/results/loop-*.json, quick runs left out): the corpus, which learners the feedback retrains trained, how
the simulated people clicked, what served at the end and where it came from, the headline figure and *answer read*
after the last round against the untrained default (paired, as the loop bench scored them). Corrections: runs that
differ only in the share of failed questions people correct (`--p-correction`) side by side. Ceilings, one row per
corpus: the recall of the ten passages the untrained default serves, the best configuration of the learner's grid on
the test labels (`--ceiling`, an oracle) and, from `bench/reranker_ceiling.py`'s result, the first stage's recall
down to the depth a reranker re-orders and what the reranker learner serves when trained on complete labels (of
people's questions, and of the test questions themselves). Reads result files only; writes its own JSON (arguments,
commit, date, the source files with their commits); asserts nothing.

    .venv/bin/python bench/loop_ablation.py             # after one or more bench/loop.py runs
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
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
HARMFUL = ("random", "inverted", "shuffled")


@dataclass(frozen=True)
class Target:
    """A figure the loop was asked to reach on a corpus (issue 48), judged on every full run of the people it names."""

    corpus: str
    asked: str  # in words, as the README's table shows it
    behaviours: tuple[str, ...] = ("consistent",)
    gain: float | None = None  # the headline at least this far above the untrained default, p < 0.05
    level: float | None = None  # the headline at least this, served
    within: int | None = None  # judged at the last round within this many people's questions
    no_loss: bool = False  # not significantly (p < 0.05) below the untrained default
    nothing_promoted: bool = False  # the untrained default still served at the end


TARGETS = (
    Target("tatqa", "recall@5 at least +0.06 within 1,000 people's questions (p < 0.05)", gain=0.06, within=1000),
    Target("scifact", "nDCG@10 (by abstract) at least 0.78 after the 809 training claims", level=0.78),
    Target("conditionalqa", "recall@5 at least +0.04 on the held-out questions (p < 0.05)", gain=0.04),
    Target("squad", "no significant loss", no_loss=True),
    Target(
        "tatqa",
        "people who click at random, or whose judgements are flipped or shuffled: nothing promoted",
        behaviours=HARMFUL,
        nothing_promoted=True,
    ),
)


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


def trained_models(corpus: dict, metric: str) -> list[dict]:
    """Every model a run trained (served or not) with what it would serve on the test split (its `rerankers_on_test`
    / `embedders_on_test`) and the people's questions asked when it was trained: how close the loop's learners came,
    and what harm they could have done, whatever the gate and canary did. A kind's i-th model came from the i-th
    retrain (each retrain trains every learner of the run); where the counts differ, when is unknown (None)."""
    retrains = [
        r.get("asked_total")
        for r in corpus.get("rounds") or []
        for op in r.get("operations", [])
        if op.get("job") == "retrain_job" and op.get("success")
    ]
    out = []
    for key in ("rerankers_on_test", "embedders_on_test"):
        models = corpus.get(key) or []
        for i, c in enumerate(models):
            paired = _paired(c, metric)
            if paired and paired.get("delta") is not None:
                out.append(
                    {
                        "name": c.get("name"),
                        "gate": (c.get("gate") or {}).get("outcome"),
                        "people_questions": retrains[i] if len(retrains) == len(models) else None,
                        "paired": paired,
                    }
                )
    return out


def row_of(name: str, record: dict) -> dict | None:
    """One loop run summarised, or None for a file that is not a finished full run."""
    corpus, args = record.get("corpus") or {}, record.get("args") or {}
    rounds, first = corpus.get("rounds") or [], corpus.get("round_0")
    if args.get("quick") or not rounds or not first or corpus.get("harm_drill"):
        return None  # a harm drill is an operator's rehearsal, not a run of the loop: drills() reads it
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
        "rounds": [
            {
                "people_questions": r.get("asked_total"),
                "production": r.get("production"),
                metric: (r.get("scores") or {}).get(metric),
                "paired": _paired(r, metric),
            }
            for r in rounds
        ],
        "trained": trained_models(corpus, metric),
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
        return paired and {
            "questions": arm["questions"],
            "score": (arm.get("scores") or {}).get(metric),
            **{k: paired.get(k) for k in ("delta", "p_value")},
        }

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


def judged_round(row: dict, target: Target) -> dict | None:
    """The round a target judges a run at: its last within `target.within` people's questions (or its last)."""
    rounds = [r for r in row["rounds"] if target.within is None or (r["people_questions"] or 0) <= target.within]
    return rounds[-1] if rounds else None


def _plus(value: float | None, delta: float) -> float | None:
    return None if value is None else round(value + delta, 4)


def meets(paired: dict, value: float | None, target: Target) -> bool:
    """Whether a paired figure on the test split against the untrained default (`value`: the headline score it
    belongs to) meets a target's gain, level or no-loss."""
    delta, p = paired.get("delta") or 0.0, paired.get("p_value")
    significant = p is not None and p < 0.05
    if target.gain is not None:
        return significant and delta >= target.gain
    if target.level is not None:
        return value is not None and value >= target.level
    if target.no_loss:
        return not (significant and delta < 0)
    return False


def reached(row: dict, target: Target) -> bool:
    """Whether a run served what a target asks at the round it judges."""
    if target.nothing_promoted:
        return not any((row["production"] or {}).values())
    at = judged_round(row, target)
    return at is not None and meets(at["paired"] or {}, at.get(row["metric"]), target)


def targets(rows: list[dict], ceilings: list[dict]) -> list[dict]:
    """Per figure asked (TARGETS): the full runs that judge it, how many reached it, the best of them at the round
    judged, the best model any of them trained (served or not), and the corpus's ceiling on complete labels."""
    out = []
    for target in TARGETS:
        runs = [r for r in rows if r["corpus"] == target.corpus and r["behaviour"] in target.behaviours]
        if not runs:
            continue

        def at(row: dict) -> dict:
            judged = judged_round(row, target) or {}
            return {"source": row["source"], "source_commit": row["source_commit"], **judged}

        def served_delta(row: dict) -> float:
            return ((judged_round(row, target) or {}).get("paired") or {}).get("delta") or 0.0

        # Of corrupted people's runs the question is the harm their models would have done: the worst they trained
        which = "worst" if target.nothing_promoted else "best"
        # a paired delta over the same test questions: a model's own score is its run's untrained default's plus it
        trained = [
            {"source": r["source"], "score": _plus(r["round_0"].get(r["metric"]), m["paired"]["delta"]), **m}
            for r in runs
            for m in r.get("trained") or []
            if target.within is None or (m["people_questions"] or r["people_questions"] or 0) <= target.within
        ]
        pick = min if target.nothing_promoted else max
        chosen = pick(trained, key=lambda m: m["paired"]["delta"]) if trained else None
        ceiling = next((c for c in ceilings if c["corpus"] == target.corpus), {})
        default = ceiling.get("round_0", {}).get(runs[0]["metric"])
        could = [
            r["source"]
            for r in runs
            if any(
                meets(m["paired"], m["score"], target)
                for m in trained
                if m["source"] == r["source"] and not target.nothing_promoted
            )
        ]
        out.append(
            {
                **asdict(target),
                "metric": runs[0]["metric"],
                "runs": len(runs),
                "reached": [r["source"] for r in runs if reached(r, target)],
                # runs whose learners trained a model that would have reached it, had the gate or a canary promoted it
                "trained_reaching": could,
                "best_run": at(max(runs, key=served_delta)),
                "trained": chosen and {"which": which, **chosen},
                "untrained_default": default,
                "complete_labels": (ceiling.get("reranker") or {}).get("complete_users_labels"),
            }
        )
    return out


# What the issue asks of a canary of a harmful update, judged on bench/loop.py --harm-drill runs.
DRILL_TARGET = "a canary of a harmful model rolled back within 200 people's questions"
DRILL_WITHIN = 200


def drills(results: Path) -> list[dict]:
    """Every harm drill (bench/loop.py --harm-drill, quick ones left out): the deliberately harmful reranker's gate
    verdict, how its canary ended and after how many people's questions, and what it serves on the test split."""
    out = []
    for path in sorted(results.glob("loop-*.json")):
        record = json.loads(path.read_text())
        corpus, args = record.get("corpus") or {}, record.get("args") or {}
        drill = corpus.get("harm_drill")
        if not drill or args.get("quick"):
            continue
        metric = corpus.get("headline") or HEADLINE.get(corpus.get("corpus"), "recall@5")
        on_test = next((r for r in corpus.get("rerankers_on_test") or [] if r["name"] == drill["candidate"]), {})
        out.append(
            {
                "source": path.stem,
                "source_commit": record.get("commit"),
                "corpus": corpus.get("corpus"),
                "metric": metric,
                "canary_share": args.get("canary_share"),
                "tick_every": args.get("tick_every"),
                **drill,
                "on_test": _paired(on_test, metric) if on_test else None,
                "rolled_back_within": drill.get("outcome") == "rolled_back"
                and (drill.get("after_questions") or 0) <= DRILL_WITHIN,
            }
        )
    return out


def drill_target(found: list[dict]) -> list[dict]:
    """The drill's row of the targets: how many drills rolled their canary back within DRILL_WITHIN questions."""
    if not found:
        return []
    return [
        {
            "corpus": found[0]["corpus"],
            "asked": DRILL_TARGET,
            "drill": True,
            "metric": found[0]["metric"],
            "runs": len(found),
            "reached": [d["source"] for d in found if d["rolled_back_within"]],
            "drills": found,
        }
    ]


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
    record["harm_drills"] = drills(args.results)
    record["targets"] = targets(record["runs"], record["ceilings"]) + drill_target(record["harm_drills"])
    out = args.out or RESULTS / "loop-ablation.json"
    write(stamp_end(record), out, indent=2, default=str)
    print(markdown(record))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
