"""Trained models and the feedback loop from the command line, through the same code the Dagster jobs run:

    rag models list [--kind K] [--json]           every version: stage, created, gate verdict, key metrics
    rag models show VERSION [--kind K] [--json]   its manifest, gate verdict, metrics and training arguments
    rag models promote VERSION [--kind K]         rag.lifecycle.rollout.release (policy "direct"): the enforced gate
    rag models rollback [--kind K] [--reason R]   back to the previous production, logged (rag.lifecycle.rollout)
    rag models migrate-registry [--root DIR]      a folder registry (aliases.json + manifests) into MLflow, once
    rag retrain [--print-command] [--no-feedback] retrain_job, with the run request the feedback sensors build
    rag feedback export [OUT_DIR] [--json]        the feedback store's RAG-Dataset (BEIR folder) and its counts

Every command that changes something prints what changed (aliases, registered versions, rollout stage)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rag.registry import ALIASES, KINDS, NAME_PREFIX, ModelRegistry, ModelVersion, RegistryError

DEFAULT_REASON = "operator rollback from the command line (rag models rollback)"


def add_registry_commands(msub) -> None:
    """`list`, `show`, `promote` and `rollback` under `rag models` (rag.rollout.cli.add_models_command)."""
    ls = msub.add_parser(
        "list", help="every registered version of each kind: stage, created, gate verdict, key metrics"
    )
    ls.add_argument("--kind", choices=KINDS, help="only this kind (default: every kind)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    sh = msub.add_parser("show", help="one version: manifest, gate verdict, metrics, training arguments")
    sh.add_argument("version", help="v3, a served name (ft-minilm-v3, ce-ltr-v2), production or candidate")
    sh.add_argument(
        "--kind",
        choices=KINDS,
        help="default: from the name's prefix (ft-: embedder, ce-: reranker, cfg-: configuration), else embedder",
    )
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)

    pr = msub.add_parser(
        "promote",
        help="make a version production: refused without a passing gate verdict against "
        "today's production, while a canary runs, and under the 'canary' promotion policy",
        description="The same release step as production_embedder / production_reranker under the "
        "'direct' policy: gate verdict re-checked, an embedder's collections built for every chunk "
        "set, registry alias and serving aliases swapped. Under the 'canary' policy (rollout "
        "resource, RAG_PROMOTION_POLICY) it refuses and names the canary to start instead.",
    )
    pr.add_argument("version", help="v3, a served name (ft-minilm-v3) or candidate")
    pr.add_argument("--kind", choices=KINDS, help="default: from the name's prefix, else embedder")
    pr.add_argument("--distance", default="cosine", help="dense distance of new collections (as the index was built)")
    pr.set_defaults(func=cmd_promote)

    rb = msub.add_parser(
        "rollback",
        help="back to the previous production (or stop the running canary), logged",
        description="A running canary of the kind stops (production never moved). Otherwise production "
        "goes back to the version it replaced (its manifest's metrics.promotion.previous_version), "
        "through rag.lifecycle.rollout.roll_back_rollout: registry and serving aliases swapped back, "
        "recorded in the manifest (metrics.reverted) and models/rollout/log.jsonl.",
    )
    rb.add_argument("--kind", default="embedder", choices=KINDS)
    rb.add_argument("--reason", default=DEFAULT_REASON, help="why: logged and recorded in the manifest")
    rb.add_argument(
        "--distance",
        default="cosine",
        help="dense distance, when a reverted production's collection must be brought up to date",
    )
    rb.set_defaults(func=cmd_rollback)

    mg = msub.add_parser(
        "migrate-registry",
        help="register the versions of an old folder registry (aliases.json and "
        "vN/manifest.json) in MLflow and move its aliases there; safe to re-run",
        description="Every folder version becomes the MLflow version of the same number (served names "
        "such as ft-minilm-v3 stay), its folder the version's source; the aliases of aliases.json are "
        "set in MLflow and aliases.json is deleted last. A killed run completes on re-run; a finished "
        "one changes nothing. The store is the registry's (embedded under the root, or "
        "MLFLOW_TRACKING_URI).",
    )
    mg.add_argument("--root", type=Path, help="the registry folder (default: <data dir>/models)")
    mg.set_defaults(func=cmd_migrate_registry)


def add_loop_commands(sub) -> None:
    """`rag feedback export` (rag.cli.add_library_commands); `rag retrain`, which drives Dagster, is
    orchestration.retrain_cli's."""

    fb = sub.add_parser("feedback", help="the feedback store: export")
    fsub = fb.add_subparsers(dest="feedback_command", required=True)
    ex = fsub.add_parser(
        "export",
        help="write the feedback store as a BEIR-compatible RAG-Dataset and print its counts",
        description="corpus.jsonl, queries.jsonl, qrels/train.tsv (a BEIR folder: rag eval-beir reads "
        "it) plus answers.jsonl, ±1 chunk/document/answer qrels, feedback.jsonl and stats.json.",
    )
    ex.add_argument(
        "out_dir",
        nargs="?",
        type=Path,
        help="folder to write; default: the versioned export the retrain "
        "sensors use, <data dir>/feedback_dataset/hw-<high-water mark>",
    )
    ex.add_argument(
        "--db", help="SQLAlchemy URL of the store (default: FEEDBACK_DB_URL, else <data dir>/feedback.sqlite)"
    )
    ex.add_argument("--json", action="store_true", help="print stats.json")
    ex.set_defaults(func=cmd_feedback_export)


# --- reading the registry ----------------------------------------------------------------------------------------
def _registry() -> ModelRegistry:
    from rag.store import data_dir

    return ModelRegistry(data_dir() / "models")


def _name(registry: ModelRegistry, kind: str, version: str | None) -> str:
    from rag.lifecycle.rollout import name_of

    return name_of(registry, kind, version)


def stages(registry: ModelRegistry, mv: ModelVersion) -> list[str]:
    """Where a version stands: production, candidate, canary (serving its share now), rolled back (by a canary's
    decision or an operator's revert), retired (was production once)."""
    from rag.lifecycle.rollout import read_state

    aliases = registry.aliases()[mv.kind]
    state = read_state(registry, mv.kind)
    out = [alias for alias in ALIASES if aliases.get(alias) == mv.version]
    if state is not None and state.stage == "canary" and state.candidate_version == mv.version:
        out.append("canary")
    canary = mv.metrics.get("canary")
    if "production" not in out and (
        "reverted" in mv.metrics or (isinstance(canary, dict) and canary.get("decision") == "rollback")
    ):
        out.append("rolled back")
    elif "production" not in out and "promotion" in mv.metrics:
        out.append("retired")
    return out


def gate_summary(registry: ModelRegistry, mv: ModelVersion) -> str:
    """ "passed vs ft-minilm-v1", "rejected vs ..." (with "stale" when production moved since), or "not gated"."""
    gate = mv.metrics.get("gate")
    if not isinstance(gate, dict) or "passed" not in gate:
        return "not gated"
    against = gate.get("against") or _name(registry, mv.kind, gate.get("production_version"))
    verdict = (
        "passed" if gate["passed"] is True else ("no verdict" if gate.get("outcome") == "no verdict" else "rejected")
    )
    out = f"{verdict} vs {against}"
    production = registry.resolve(mv.kind, "production")
    now = production.version if production else None
    if "production_version" in gate and gate["production_version"] != now and now != mv.version:
        out += f" (stale: production is now {_name(registry, mv.kind, now)})"
    return out


def gate_report(registry: ModelRegistry, mv: ModelVersion) -> list[str]:
    """Before/after on the gate questions with each metric's interval, the per-type breakdown, and the decision:
    what `rag retrain` prints per trained model."""
    gate = mv.metrics.get("gate") if isinstance(mv.metrics.get("gate"), dict) else None
    if gate is None:
        return [f"{mv.kind} {mv.name}: not gated (the run stopped before its gate; see its logs)"]
    settings = gate.get("settings") or {}
    metrics = [*(settings.get("metrics") or ["ndcg@10", "mrr@10"]), settings.get("recall_metric", "recall@20")]
    aside = gate.get("copied_questions_set_aside", gate.get("copied_questions", 0))
    lines = [
        f"{mv.kind} {mv.name} vs {gate.get('against', '?')} on {gate.get('questions', '?')} held-out gate questions"
        + (f" ({aside} copied from the documents set aside)" if aside else "")
        + ":"
    ]
    if gate.get("gate_set"):  # which questions decided: experts' first when there are enough of them
        lines.append(f"  gate set (before copies are set aside): {gate['gate_set']}")
    if gate.get("gate_questions_by_fold"):  # cross-fitted: each share scored by the ranker trained without it
        shares = ", ".join(f"{n} of share {f}" for f, n in gate["gate_questions_by_fold"].items())
        lines.append(
            f"  cross-fitted: {shares} (share 0 this model's own held-out questions, each other share scored by a "
            "ranker trained the same way without it)"
        )
    for metric in dict.fromkeys(metrics):
        if f"candidate_{metric}" not in gate:
            continue
        interval = (
            f", {settings.get('confidence', 0.95):.0%} CI {gate[f'ci_low_{metric}']:+.4f} "
            f"to {gate[f'ci_high_{metric}']:+.4f}"
            if f"ci_low_{metric}" in gate
            else ""
        )
        p = f", p {gate[f'p_value_{metric}']:.4g}" if f"p_value_{metric}" in gate else ""
        lines.append(
            f"  {metric:10s} {gate[f'production_{metric}']:.4f} -> {gate[f'candidate_{metric}']:.4f} "
            f"({gate[f'delta_{metric}']:+.4f}{interval}{p})"
        )
    types = sorted({k.split("_")[1] for k in gate if k.startswith("type_") and k.endswith("_questions")})
    if types:
        lines.append(
            "  by type ("
            + metrics[0]
            + "): "
            + "; ".join(f"{t} {gate[f'type_{t}_questions']} questions {gate[f'type_{t}_delta']:+.4f}" for t in types)
        )
    if gate.get("min_detectable_effect") is not None:
        lines.append(
            f"  smallest gain these questions detect (80% power): {gate['min_detectable_effect']:+.4f}"
            + (
                f"; {gate['questions_needed']} questions would detect {settings.get('target_effect', 0.02):+.2f}"
                if gate.get("questions_needed")
                else ""
            )
        )
    lines.append("  -> " + _release_line(registry, mv, gate))
    return lines


def _release_line(registry: ModelRegistry, mv: ModelVersion, gate: dict) -> str:
    """What became of a gated candidate: promoted, in its canary (or waiting for one, or decided by one), or kept
    out of production, and why."""
    from rag.lifecycle.rollout import read_state

    production = registry.aliases()[mv.kind].get("production")
    if production == mv.version:
        return f"promoted: {mv.name} is production"
    state = read_state(registry, mv.kind)
    if state is not None and state.candidate_version == mv.version and state.stage == "canary":
        return (
            f"canary running on {state.traffic_share:.0%} of sessions ({state.reason}): canary_sensor promotes "
            "it on a significant online win and rolls it back otherwise; production "
            f"{_name(registry, mv.kind, production)} serves the other sessions, and retraining waits until it ends "
            f"(`rag models rollout rollback --kind {mv.kind}` ends it now)"
        )
    canary = mv.metrics.get("canary")
    if isinstance(canary, dict) and canary.get("decision"):
        return f"canary decided: {canary['decision']} ({canary.get('reason', 'no reason recorded')})"
    queued = mv.metrics.get("canary_queued")
    if isinstance(queued, dict) and "canary_start" not in mv.metrics:
        return (
            f"waiting for its canary behind the canary of {queued.get('behind', '?')} (one canary at a time): "
            "canary_sensor starts it when that one ends"
        )
    if mv.metrics.get("promotion") or gate.get("passed") is True:
        return f"gate passed ({gate.get('outcome', 'better')}); production is {_name(registry, mv.kind, production)}"
    outcome = gate.get("outcome", "rejected")
    why = gate.get("reasons", "")
    hint = (
        f"; only online evidence can decide: start its canary (`rag models rollout start --kind {mv.kind} "
        f"--candidate {mv.version}`), or let retrain_job start canaries (RAG_PROMOTION_POLICY=auto, the default, "
        "or canary)"
        if outcome == "inconclusive"
        else ""
    )
    return f"kept production ({outcome}): {why}{hint}"


def key_metrics(mv: ModelVersion) -> str:
    """The gate's first metric: candidate score, delta against production and p-value (else the selection metrics)."""
    gate = mv.metrics.get("gate") if isinstance(mv.metrics.get("gate"), dict) else {}
    metrics = (gate.get("settings") or {}).get("metrics") or ["ndcg@10", "mrr@10"]
    shown = []
    for metric in metrics:
        if f"candidate_{metric}" in gate:
            p = gate.get(f"p_value_{metric}")
            shown.append(
                f"{metric} {gate[f'candidate_{metric}']:.4f} ({gate.get(f'delta_{metric}', 0):+.4f}"
                + (f", p={p:.4g})" if p is not None else ")")
            )
    if not shown:
        selection = mv.metrics.get("dev_selection") or {}
        shown = [f"{k} {v:.4f}" for k, v in list(selection.items())[:2] if isinstance(v, (int, float))]
    if mv.kind == "configuration":  # what it changes serving to, before its figures
        shown.insert(0, configuration_label(mv))
    return ", ".join(shown)


def configuration_label(mv: ModelVersion) -> str:
    from rag.training.configuration import ServingConfiguration

    try:
        return ServingConfiguration.load(mv.path).label
    except (FileNotFoundError, ValueError) as exc:
        return f"(configuration unreadable: {exc})"


def version_row(registry: ModelRegistry, mv: ModelVersion) -> dict:
    return {
        "kind": mv.kind,
        "version": mv.version,
        "name": mv.name,
        "stages": stages(registry, mv),
        "created_at": mv.created_at,
        "gate": gate_summary(registry, mv),
        "key_metrics": key_metrics(mv),
    }


def _target(registry: ModelRegistry, args: argparse.Namespace) -> ModelVersion:
    """The version a command names, with its kind from --kind or the name's prefix (ft-/ce-)."""
    prefix = args.version.split("-", 1)[0]
    implied = next((kind for kind, p in NAME_PREFIX.items() if p == prefix and "-" in args.version), None)
    if args.kind and implied and args.kind != implied:
        raise RegistryError(f"{args.version} names a {implied}, not a {args.kind}: drop --kind or name a {args.kind}")
    kind = args.kind or implied or "embedder"
    mv = registry.resolve(kind, args.version)
    if mv is None:
        known = ", ".join(registry.names(kind)) or "none registered"
        raise RegistryError(
            f"no {kind} {args.version!r} in the registry under {registry.root} ({kind} versions: {known}); "
            "list them with `rag models list`"
        )
    return mv


# --- what changed ------------------------------------------------------------------------------------------------
def snapshot(registry: ModelRegistry) -> dict:
    """The registry state a mutation can change: aliases, registered versions and the latest rollout per kind."""
    from rag.lifecycle.rollout import read_state

    aliases = registry.aliases()
    out = {}
    for kind in KINDS:
        state = read_state(registry, kind)
        out[kind] = {
            **{alias: aliases[kind].get(alias) for alias in ALIASES},
            "versions": [mv.version for mv in registry.versions(kind)],
            "rollout": (state.candidate_version, state.stage) if state else None,
        }
    return out


def changes(registry: ModelRegistry, before: dict, after: dict) -> list[str]:
    lines = []
    for kind in KINDS:
        b, a = before[kind], after[kind]
        for version in a["versions"]:
            if version not in b["versions"]:
                mv = registry.resolve(kind, version)
                lines.append(f"{kind}: registered {mv.name} (gate: {gate_summary(registry, mv)})")
        for alias in ALIASES:
            if b[alias] != a[alias]:
                label = (
                    (lambda v: _name(registry, kind, v))
                    if alias == "production"
                    else (lambda v: _name(registry, kind, v) if v else "-")
                )
                lines.append(f"{kind} {alias}: {label(b[alias])} → {label(a[alias])}")
        if b["rollout"] != a["rollout"] and a["rollout"] is not None:
            version, stage = a["rollout"]
            was = b["rollout"][1] if b["rollout"] and b["rollout"][0] == version else "none"
            lines.append(f"{kind} rollout of {_name(registry, kind, version)}: {was} → {stage}")
    return lines


def _print_changes(registry: ModelRegistry, before: dict) -> None:
    lines = changes(registry, before, snapshot(registry))
    print("changed:" if lines else "nothing changed")
    for line in lines:
        print(f"  {line}")


# --- commands ----------------------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    registry = _registry()
    kinds = [args.kind] if args.kind else list(KINDS)
    out = {kind: [version_row(registry, mv) for mv in registry.versions(kind)] for kind in kinds}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for kind in kinds:
        aliases = registry.aliases()[kind]
        print(
            f"{kind}: production {_name(registry, kind, aliases.get('production'))}, candidate "
            f"{_name(registry, kind, aliases['candidate']) if aliases.get('candidate') else '-'}"
        )
        if not out[kind]:
            print("  no versions registered (retrain_job / `rag retrain` trains one)")
        for row in out[kind]:
            print(
                f"  {row['version']:4s} {row['name']:18s} {', '.join(row['stages']) or '-':22s} "
                f"{row['created_at']:25s} gate: {row['gate']}"
                + (f"; {row['key_metrics']}" if row["key_metrics"] else "")
            )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from rag.lifecycle.verdicts import promotion_refusal

    registry = _registry()
    mv = _target(registry, args)
    manifest = mv.manifest()
    row = version_row(registry, mv)
    refusal = None if "production" in row["stages"] else promotion_refusal(mv.kind, registry, mv)
    training = {
        k: manifest.get(k)
        for k in (
            "base_model",
            "family",
            "parent_version",
            "training_data_hash",
            "qa_set_version",
            "strategy",
            "seed",
            "hyperparameters",
        )
    }
    out = {
        **row,
        "path": str(mv.path),
        "promotable": "production" not in row["stages"] and refusal is None,
        "promotion_refusal": refusal,
        "gate_verdict": mv.metrics.get("gate"),
        "metrics": {k: v for k, v in mv.metrics.items() if k != "gate"},
        "training": training,
        "manifest": manifest,
    }
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"{mv.kind} {mv.name} ({mv.version}): {', '.join(row['stages']) or 'registered'}; created {mv.created_at}")
    print(f"  path: {mv.path}")
    print(f"  gate: {row['gate']}" + (f"; {row['key_metrics']}" if row["key_metrics"] else ""))
    if isinstance(out["gate_verdict"], dict):
        print(f"  gate reasons: {out['gate_verdict'].get('reasons', '-')}")
    if "production" not in row["stages"]:
        print("  promotable now" if refusal is None else f"  not promotable now: {refusal}")
    print("  training:")
    for key, value in training.items():
        print(f"    {key}: {json.dumps(value, default=str) if isinstance(value, (dict, list)) else value}")
    print("  metrics:")
    for key, value in out["metrics"].items():
        print(f"    {key}: {json.dumps(value, default=str)}")
    if isinstance(out["gate_verdict"], dict):
        print(f"    gate: {json.dumps(out['gate_verdict'], default=str)}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from rag.lifecycle.target import data_dir_target as serving_target
    from rag.lifecycle.rollout import release
    from rag.lifecycle.verdicts import promotion_refusal
    from rag.rollout.config import promotion_policy

    registry = _registry()
    mv = _target(registry, args)
    production = registry.resolve(mv.kind, "production")
    if production is not None and production.version == mv.version:
        raise RegistryError(f"{mv.kind} {mv.name} is already production: nothing to promote")
    policy = promotion_policy()  # the policy production_embedder / production_reranker release under
    if policy == "canary":
        refusal = promotion_refusal(mv.kind, registry, mv)
        raise RegistryError(
            f"refusing to promote {mv.kind} {mv.name} directly: the promotion policy is 'canary' (rollout resource, "
            "RAG_PROMOTION_POLICY), so a gated candidate replaces production only by winning a canary. Start one: "
            f"`rag models rollout start --kind {mv.kind} --candidate {mv.version}`"
            + (f" (it will be refused too: {refusal})" if refusal else "")
            + ". Production is unchanged."
        )
    before = snapshot(registry)
    outcome = release(mv.kind, registry, mv, policy="direct", target=serving_target(args.distance))
    print(f"{mv.kind}: {outcome['summary']} (gate: {gate_summary(registry, registry.resolve(mv.kind, mv.version))})")
    _print_changes(registry, before)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from rag.lifecycle.rollout import roll_back_production
    from rag.lifecycle.target import data_dir_target as serving_target

    registry = _registry()
    before = snapshot(registry)
    roll_back_production(args.kind, registry, args.reason, target=serving_target(args.distance))
    _print_changes(registry, before)
    return 0


def cmd_migrate_registry(args: argparse.Namespace) -> int:
    from rag.registry.migrate import migrate_folder_registry

    root = args.root or _registry().root
    done = migrate_folder_registry(root)
    if not (done["versions"] or done["aliases"] or done["removed"]):
        print(
            f"nothing to migrate under {root}: MLflow ({ModelRegistry(root).registry_uri}) already holds its versions "
            "and aliases"
        )
    return 0


def cmd_feedback_export(args: argparse.Namespace) -> int:
    from rag.feedback import FeedbackStore, default_url, export_rag_dataset, export_versioned
    from rag.store import data_dir

    url = args.db or default_url(data_dir())
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise FileNotFoundError(
            f"no feedback store at {url.removeprefix('sqlite:///')}: nothing to export (`rag serve` "
            "collects feedback; --db or FEEDBACK_DB_URL names another store)"
        )
    store = FeedbackStore(url)
    try:
        folder = export_rag_dataset(store, args.out_dir) if args.out_dir else export_versioned(store, data_dir())
    finally:
        store.close()
    stats = json.loads((folder / "stats.json").read_text())
    if args.json:
        print(json.dumps({"path": str(folder), **stats}, indent=2))
        return 0
    print(
        f"exported the feedback store to {folder} (version {stats['version']}, "
        f"high-water mark {stats['high_water_mark']})"
    )
    print(
        f"  {stats['queries']} queries, {stats['passages']} passages, {stats['answers']} answers, "
        f"{stats['feedback_events']} feedback events"
    )
    print(
        f"  chunk qrels +{stats['chunk_qrels_positive']} / -{stats['chunk_qrels_negative']}, answer qrels "
        f"+{stats['answer_qrels_positive']} / -{stats['answer_qrels_negative']}, "
        f"{stats['document_qrels']} document qrels"
    )
    return 0
