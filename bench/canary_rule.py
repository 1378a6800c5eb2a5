"""The canary's decision rule, measured: how often and after how many canary queries it promotes, rolls back on
evidence of harm, or reaches the horizon, with the one-sided harm test (rollback_alpha) and without it, and with
Wald's futility boundary at each --futility-win-shares (rolled back on evidence of no edge that size; the default
rule is the harm test with futility at 0.6).

1. Simulated canaries (rag.rollout.replay, the rule canary_sensor applies, ticking after every query): each canary
   query is a tie with probability --tie-rates, else a candidate win with probability p (its win share among
   decisive queries), over a grid of p; --runs canaries per cell, horizon --max-queries, alpha --alpha.
2. Recorded canaries (--replay-data-dir: a finished bench/loop.py run's work dir, or a retired loop bench's): the
   per-query outcomes its simulated users produced (rag.rollout.evidence.collect from the run's feedback store, from
   each canary's start, as many as the canary's logged decision counted) replayed under every rule: where each would
   have stopped. Those canaries' users were simulated too (bench.lib.loop.People), on the run's human questions.

    .venv/bin/python bench/canary_rule.py [--runs 400] [--replay-data-dir /tmp/self-improvement-scifact-...]
    .venv/bin/python bench/canary_rule.py --one-sided --json bench/results/canary-rule-one-sided.json

Writes bench/results/canary-rule.json (arguments, commit, date, machine); asserts nothing.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import numpy as np

from bench.lib import cli
from bench.lib.datasets import RESULTS
from bench.lib.provenance import run_record, stamp_end
from bench.lib.results import log, write

OUT = RESULTS / "canary-rule.json"
WIN_SHARES = (0.35, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65)


def rules(args) -> dict:
    """Label -> CanarySettings: the rule before the harm test, the harm test at each --rollback-alphas, the
    default harm test with Wald's futility boundary at each --futility-win-shares (the default rule among them), and
    with --one-sided the default rule with a one-sided promotion test."""
    from rag.rollout import CanarySettings

    defaults = CanarySettings()
    base = dict(alpha=args.alpha, max_queries=args.max_queries)
    out = {"two-sided only": CanarySettings(**base, rollback_alpha=None, futility_win_share=None)}
    for ra in args.rollback_alphas:
        out[f"harm test at {ra:g}"] = CanarySettings(**base, rollback_alpha=ra, futility_win_share=None)
    for share in args.futility_win_shares:
        default = " (default)" if share == defaults.futility_win_share else ""
        label = f"harm test at {defaults.rollback_alpha:g} + futility at a win share of {share:g}{default}"
        out[label] = CanarySettings(**base, futility_win_share=share)
    if args.one_sided:
        label = (
            f"harm test at {defaults.rollback_alpha:g} + futility at a win share of {defaults.futility_win_share:g} "
            "+ one-sided promotion test"
        )
        out[label] = CanarySettings(**base, promotion_test="one-sided")
    return out


def outcome_of(decision, max_queries: int) -> str:
    if decision.decision == "promote":
        return "promote"
    if decision.decision == "rollback" and decision.queries < max_queries:
        return "rollback_on_evidence"
    return "horizon"  # rolled back undecided (or, for a recorded stream, still running at its end)


def simulate(args) -> list[dict]:
    from rag.rollout import replay

    rows = []
    for tie_rate in args.tie_rates:
        for p in WIN_SHARES:
            rng = np.random.default_rng([args.seed, round(tie_rate * 1000), round(p * 1000)])
            ties = rng.random((args.runs, args.max_queries)) < tie_rate
            wins = rng.random((args.runs, args.max_queries)) < p
            streams = np.where(ties, "tie", np.where(wins, "b", "a"))
            for label, settings in rules(args).items():
                decisions = [replay(row, "candidate", settings) for row in streams]
                ends = [outcome_of(d, settings.max_queries) for d in decisions]
                queries = [d.queries for d in decisions]
                rows.append(
                    {
                        "tie_rate": tie_rate,
                        "win_share": p,
                        "rule": label,
                        "runs": args.runs,
                        **{
                            k: round(ends.count(k) / len(ends), 4)
                            for k in ("promote", "rollback_on_evidence", "horizon")
                        },
                        "median_queries": int(np.median(queries)),
                        "mean_queries": round(float(np.mean(queries)), 1),
                    }
                )
            cell = rows[-len(rules(args)) :]
            log(
                f"tie rate {tie_rate}, win share {p}: "
                + "; ".join(
                    f"{r['rule']}: promote {r['promote']}, harm {r['rollback_on_evidence']}, {r['median_queries']}q"
                    for r in cell
                )
            )
    return rows


def recorded(data_dir: Path, args, seen: set) -> list[dict]:
    """Every canary decided in a finished run's data dir, its logged outcome stream replayed under each rule. A
    canary already in `seen` (a data dir copied from another one holds its canaries too) is skipped."""
    from rag.feedback import FeedbackStore
    from rag.lifecycle.rollout import history
    from rag.registry import ModelRegistry
    from rag.rollout import replay
    from rag.rollout.evidence import collect

    store = FeedbackStore(root=data_dir, create=False)  # read only: the run's schema is there already
    out, started = [], {}
    for entry in history(ModelRegistry(data_dir / "models")):
        key = (entry["kind"], entry["candidate"])
        if entry["step"] == "start":
            started[key] = entry["at"]
            continue
        evidence = entry.get("evidence") or {}
        if key not in started or "queries" not in evidence:
            continue
        if (key, started[key], evidence["queries"]) in seen:
            started.pop(key)
            continue
        seen.add((key, started[key], evidence["queries"]))
        stream = collect(store, since=datetime.fromisoformat(started.pop(key))).outcomes[: evidence["queries"]]
        logged = {k: evidence.get(k) for k in ("candidate", "decision", "wins", "losses", "ties", "breaches", "reason")}
        replays = {}
        for label, settings in rules(args).items():
            d = replay(stream, evidence.get("candidate", "candidate"), settings)
            replays[label] = {
                "ends": outcome_of(d, settings.max_queries),
                "decision": d.decision,
                "queries": d.queries,
                "wins": d.wins,
                "losses": d.losses,
                "reason": d.reason,
            }
        out.append(
            {
                "data_dir": str(data_dir),
                "kind": entry["kind"],
                "logged": logged,
                "outcomes": len(stream),
                "replayed": replays,
            }
        )
        said = "; ".join(f"{k}: {v['decision']} after {v['queries']}" for k, v in replays.items())
        log(f"{data_dir.name} {entry['kind']} {logged['candidate']}: {said}")
    store.close()
    return out


def main() -> int:
    p = cli.parser(__doc__)
    p.add_argument("--runs", type=int, default=400, help="simulated canaries per cell")
    p.add_argument("--tie-rates", type=float, nargs="+", default=[0.5, 0.85], help="share of canary queries tied")
    p.add_argument("--alpha", type=float, default=0.05, help="the promotion side's error rate (product default)")
    p.add_argument("--rollback-alphas", type=float, nargs="+", default=[0.05, 0.10, 0.20])
    p.add_argument("--max-queries", type=int, default=2000, help="the horizon (product default)")
    p.add_argument(
        "--futility-win-shares",
        type=float,
        nargs="*",
        default=[0.6, 0.65],
        help="rules with the default harm test and Wald's futility boundary at each of these win shares",
    )
    p.add_argument(
        "--one-sided",
        action="store_true",
        help="also the default rule with a one-sided promotion test (CanarySettings.promotion_test)",
    )
    p.add_argument("--replay-data-dir", nargs="*", default=[], help="finished bench runs' data dirs")
    cli.add_seed(p)
    cli.add_output(p, OUT)
    args = p.parse_args()
    missing = [d for d in args.replay_data_dir if not (Path(d) / "models").is_dir()]
    if missing:
        p.error(f"not a finished bench run's data dir (no models/ folder): {', '.join(missing)}")
    record = run_record(args)
    record["simulated"] = simulate(args)
    seen: set = set()
    record["recorded"] = [r for d in args.replay_data_dir for r in recorded(Path(d), args, seen)]
    write(stamp_end(record), args.json)
    print(json.dumps(record["recorded"], indent=1)[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
