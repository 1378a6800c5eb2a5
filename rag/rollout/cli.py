"""`rag models rollout status|start|rollback` and `rag models recover`: the canary of a trained model, without Dagster.

status lists each kind's production, candidate and latest rollout (with the running canary's evidence when the
feedback store is reachable); start begins a canary of a gated candidate (building an embedder's collections in
the data dir's Qdrant); rollback stops a canary, or reverts a promotion, in one logged step. Promotion is
canary_sensor's (promote_canary_job): it needs the sequential test's evidence."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable

from rag.lifecycle.target import data_dir_target
from rag.registry import KINDS

# `recover` is the recovery itself; `migrate-registry` moves a folder registry into MLflow, which must not be changed
# (recovery sets aliases there) before the folder's own aliases are moved.
NOT_RECOVERED_FIRST = ("recover", "migrate-registry")


def add_models_command(sub) -> None:
    m = sub.add_parser(
        "models", help="trained models: list, show, promote, rollback; gradual rollout (canary) of a gated candidate"
    )
    msub = m.add_subparsers(dest="models_command", required=True)
    from rag.registry.cli import add_registry_commands  # list, show, promote, rollback

    add_registry_commands(msub)
    r = msub.add_parser("rollout", help="canary state of the embedder and the reranker: status | start | rollback")
    rsub = r.add_subparsers(dest="rollout_command", required=True)

    st = rsub.add_parser("status", help="production, candidate, the latest rollout and a running canary's evidence")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    s = rsub.add_parser("start", help="start a canary of a candidate whose gate passed against production")
    s.add_argument("--kind", default="embedder", choices=KINDS)
    s.add_argument("--candidate", help="version or name (v4, ft-minilm-v4); default: the `candidate` alias")
    s.add_argument("--share", type=float, help="share of sessions the canary serves (default 0.1)")
    s.add_argument("--distance", default="cosine", help="dense distance of new collections (as the index was built)")
    s.add_argument(
        "--force-reason",
        help="start it although its gate verdict does not allow it (say why: logged and "
        "recorded); e.g. rehearsing a rollback with a deliberately worse model",
    )
    s.set_defaults(func=cmd_start)

    b = rsub.add_parser(
        "rollback", help="stop the running canary, or revert a promoted candidate to the previous production"
    )
    b.add_argument("--kind", default="embedder", choices=KINDS)
    b.add_argument("--reason", required=True, help="why: logged and recorded in the candidate's manifest")
    b.add_argument(
        "--distance",
        default="cosine",
        help="dense distance, when a reverted production's collection must be brought up to date",
    )
    b.set_defaults(func=cmd_rollback)

    rec = msub.add_parser(
        "recover",
        help="finish (or undo) a promotion or rollback a killed process left unfinished; "
        "`rag serve`, canary_sensor and every lifecycle step do it too",
    )
    rec.add_argument("--distance", default="cosine", help="dense distance of the collections (as the index was built)")
    rec.set_defaults(func=cmd_recover)
    for commands in (msub, rsub):
        _recover_first_in(commands)


def _recover_first_in(commands) -> None:
    """Every command under `commands` (an argparse subparsers action) recovers first, so a command added later
    cannot forget to."""
    for name, parser in commands.choices.items():
        func = parser.get_default("func")
        if func is not None and name not in NOT_RECOVERED_FIRST:
            parser.set_defaults(func=recovering_first(func))


def recovering_first(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A `rag models` command that first finishes (or undoes) a promotion or rollback a killed process left half
    done: what it prints or changes then starts from registry, serving aliases and rollout state that agree."""

    @functools.wraps(func)
    def command(args: argparse.Namespace) -> int:
        recover_first(_registry())
        return func(args)

    return command


def _warn(line: str) -> None:
    print(line, file=sys.stderr)  # stderr: `--json` output stays parseable


def recover_first(registry) -> str | None:
    """rag.lifecycle.journal.recover without waiting on a live promotion. When it cannot run here it warns (on
    stderr) that what follows may show a half-done change, and says what completes it. Returns what was done."""
    from rag.lifecycle.journal import LifecycleBusy, pending, recover

    intent = pending(registry)
    if intent is None:
        return None
    what = f"the {intent.kind} {intent.action} started {intent.at}"
    try:
        return recover(registry, data_dir_target().client, log=_warn, wait=False)
    except LifecycleBusy:
        _warn(f"WARNING: {what} is running in another process now: what follows may change when it ends")
    except Exception as exc:  # noqa: BLE001 - e.g. Qdrant held by a Dagster run: the command still shows what it can
        _warn(
            f"WARNING: {what} was interrupted and could not be completed here ({type(exc).__name__}: {exc}); "
            "production, the serving aliases and the rollout state may disagree below. Run `rag models recover` "
            "once Qdrant is free (no Dagster run or `rag index` holding it); `rag serve` completes it too"
        )
    return None


def cmd_recover(args: argparse.Namespace) -> int:
    from rag.lifecycle.journal import pending, recover

    registry = _registry()
    intent = pending(registry)
    if intent is None:
        print("nothing to recover: no promotion or rollback was left unfinished")
        return 0
    print(
        f"found an unfinished {intent.kind} {intent.action} started {intent.at} ({intent.approved_by}): "
        f"production {intent.production_before or 'implicit v0'} → {intent.production_after or 'implicit v0'}"
    )
    print(recover(registry, data_dir_target(args.distance).client))
    return 0


def _registry():
    from rag.registry.cli import _registry as registry

    return registry()


def cmd_status(args: argparse.Namespace) -> int:
    from rag.lifecycle.rollout import name_of, running_canary, status

    registry = _registry()
    out = status(registry)
    running = running_canary(registry)
    if running is not None:
        kind, state = running
        try:
            from rag.feedback import FeedbackStore
            from rag.rollout.config import CanarySettings
            from rag.rollout.evidence import collect, evaluate, past_max_days, summary

            store = FeedbackStore()
            try:
                evidence = collect(store, state.started_at)
            finally:
                store.close()
            # The default settings: the sensor's resource may differ (a smaller alpha needs more evidence).
            settings = CanarySettings()
            decision = evaluate(evidence, name_of(registry, kind, state.candidate_version), settings)
            out[kind]["evidence"] = summary(past_max_days(decision, state.started_at, settings), evidence, settings)
        except Exception as exc:  # noqa: BLE001 - the state is still worth printing without the evidence
            out[kind]["evidence"] = f"unavailable: {type(exc).__name__}: {exc}"
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    for kind, entry in out.items():
        print(f"{kind}: production {entry['production']}, candidate {entry['candidate'] or '-'}")
        rollout = entry.get("rollout")
        if rollout:
            print(
                f"  rollout of {rollout['candidate']}: {rollout['stage']} (share {rollout['traffic_share']:.0%}, "
                f"replaces {rollout['replaces']}; started {rollout['started_at'] or '-'}, "
                f"decided {rollout['decided_at'] or '-'})"
            )
            print(f"  {rollout['reason']}")
        if "candidate_can_start" in entry:
            print(
                "  candidate can start a canary"
                if entry["candidate_can_start"]
                else f"  candidate cannot start a canary: {entry['candidate_refusal']}"
            )
        evidence = entry.get("evidence")
        if evidence:
            print(f"  evidence: {evidence['reason'] if isinstance(evidence, dict) else evidence}")
        if isinstance(evidence, dict) and evidence.get("decision") == "continue":
            needed = evidence.get("queries_to_decide")
            print(
                f"  at the rates so far the test would decide after about {needed} canary queries "
                f"(horizon {evidence['max_queries']})"
                if needed
                else f"  no edge the test would decide at the rates so far: the horizon ({evidence['max_queries']} "
                "canary queries) ends it"
            )
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from rag.lifecycle.rollout import name_of, start

    registry = _registry()
    state = start(
        args.kind,
        registry,
        args.candidate,
        args.share,
        target=data_dir_target(args.distance),
        force_reason=args.force_reason,
    )
    print(
        f"canary of {args.kind} {name_of(registry, args.kind, state.candidate_version)} started on "
        f"{state.traffic_share:.0%} of sessions; `rag serve` picks it up on its next request. Watch it with "
        "`rag models rollout status` or canary_sensor in the Dagster UI (turn it on under Automation)."
    )
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from rag.lifecycle.rollout import name_of, roll_back_rollout

    registry = _registry()
    state = roll_back_rollout(args.kind, registry, args.reason, target=data_dir_target(args.distance))
    print(f"{args.kind} {name_of(registry, args.kind, state.candidate_version)}: {state.stage} ({state.reason})")
    return 0
