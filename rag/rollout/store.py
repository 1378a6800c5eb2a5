"""Where a rollout lives: one RolloutState per model kind beside the model registry, and a log of every step.

    <registry root>/rollout/embedder.json    the RolloutState of the embedder's latest rollout
    <registry root>/rollout/reranker.json
    <registry root>/rollout/log.jsonl        one line per step: time, kind, candidate, from → to, reason, evidence

The state file is replaced atomically, so the API (which looks at it on every request) reads the old state or the
new one. Every step reads, checks and writes under one lock, so the sensor's promotion and an operator's rollback
cannot both act on the same canary: whichever comes second finds the canary finished and is refused.

Steps:
- start: the candidate's manifest must hold a gate verdict against today's production that found it no worse
  (`not_worse`; a verdict that found it better implies it); for an embedder its collections are built first (training does not build them; promotion would have),
  so the API can serve the canary share from them and promotion later only swaps aliases.
- conclude: "promote" goes through the registry's enforced rag.training.pipeline.promote (the not_worse verdict
  re-checked, the online test's win recorded as the evidence of "better", serving aliases swapped); "rollback" leaves production untouched. Either way the canary's evidence is recorded in
  the candidate's manifest (`metrics.canary`).
- roll_back_rollout: the operator's one step, at any time: a running canary stops (production never moved), a
  promoted candidate is reverted to the production it replaced (its collections still exist: aliases swap back).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from rag.registry import KINDS, ModelRegistry, ModelVersion, RegistryError
from rag.rollout.config import CanarySettings
from rag.rollout.state import IllegalTransition, RolloutState, promote, roll_back, start_canary

Log = Callable[[str], None]
# What promotion needs to build collections and swap serving aliases (rag.training.pipeline.promote's keywords:
# tables, client, strategies, distance), or a function returning them: opened only when a step needs Qdrant, so
# stopping a canary works while another process holds an embedded Qdrant folder.
PromoteArgs = dict | Callable[[], dict] | None


def rollout_dir(registry: ModelRegistry) -> Path:
    return registry.root / "rollout"


def state_path(registry: ModelRegistry, kind: str) -> Path:
    _check_kind(kind)
    return rollout_dir(registry) / f"{kind}.json"


def log_path(registry: ModelRegistry) -> Path:
    return rollout_dir(registry) / "log.jsonl"


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise RegistryError(f"unknown model kind {kind!r}: use one of {', '.join(KINDS)}")


def _now() -> datetime:
    return datetime.now(UTC)


@contextlib.contextmanager
def _locked(registry: ModelRegistry) -> Iterator[None]:
    folder = rollout_dir(registry)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_state(registry: ModelRegistry, kind: str) -> RolloutState | None:
    """The latest rollout of `kind` (None: never started)."""
    path = state_path(registry, kind)
    try:
        return RolloutState.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None


def running_canary(registry: ModelRegistry) -> tuple[str, RolloutState] | None:
    """(kind, state) of the canary that serves traffic now, if any. At most one runs at a time: two canaries would
    put a session into two experiments whose clicks could not be told apart."""
    for kind in KINDS:
        state = read_state(registry, kind)
        if state is not None and state.stage == "canary":
            return kind, state
    return None


def history(registry: ModelRegistry, limit: int | None = None) -> list[dict]:
    """The logged steps, oldest first (the last `limit`)."""
    path = log_path(registry)
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[-limit:] if limit else lines


def _write(registry: ModelRegistry, kind: str, before: RolloutState | None, after: RolloutState, step: str, log: Log,
           evidence: dict | None = None, override: dict | None = None) -> None:
    from rag.store import atomic_write

    atomic_write(state_path(registry, kind), lambda fh: fh.write(after.model_dump_json(indent=2)), mode="w")
    entry = {"at": _now().isoformat(timespec="seconds"), "kind": kind, "step": step, "candidate": after.candidate_version,
             "production": after.production_version, "from": before.stage if before else None, "to": after.stage,
             "traffic_share": after.traffic_share, "reason": after.reason, **({"evidence": evidence} if evidence else {}),
             **({"override": override} if override else {})}
    with open(log_path(registry), "a", encoding="utf-8") as fh:  # one short line per append: never interleaved
        fh.write(json.dumps(entry, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    log(f"rollout {kind} {after.candidate_version}: {entry['from'] or 'new'} → {after.stage} ({after.reason})")


def chunk_sets(tables) -> list[str]:
    """Every chunk set present in a TableStore: the strategies whose collections promotion serves from."""
    from rag.store import CHUNKS_TABLE

    folder = tables.root / CHUNKS_TABLE
    return sorted(p.parent.name for p in folder.glob("*/data.parquet")) if folder.exists() else []


def _promote_args(args: PromoteArgs) -> dict:
    return dict(args() if callable(args) else args or {})


def _embedder_args(kind: str, args: PromoteArgs) -> dict:
    """Only an embedder's promotion touches Qdrant: a reranker's never opens it (nor its lock)."""
    return _promote_args(args) if kind == "embedder" else {}


def _resolve(registry: ModelRegistry, kind: str, version: str) -> ModelVersion:
    mv = registry.resolve(kind, version)
    if mv is None:
        raise RegistryError(f"{kind} {version!r} is not registered under {registry.root}: list them with "
                            "`rag models rollout status` or train one (retrain_job)")
    return mv


def name_of(registry: ModelRegistry, kind: str, version: str | None) -> str:
    """A version's served name (ft-minilm-v4), the implicit v0 for None."""
    if version is None:
        return "minilm (base, implicit v0)" if kind == "embedder" else "no reranker (implicit v0)"
    mv = registry.resolve(kind, version)
    return mv.name if mv is not None else version


def start(kind: str, registry: ModelRegistry, candidate: str | None = None, traffic_share: float | None = None, *,
          promote_args: PromoteArgs = None, force_reason: str | None = None, now: datetime | None = None,
          log: Log = print) -> RolloutState:
    """Start a canary of `candidate` (a version, name or alias; default the `candidate` alias) on `traffic_share`
    of sessions (default CanarySettings().traffic_share). Refused (PromotionRefused) unless its manifest holds a
    gate verdict against the current production that found it no worse (promotion_refusal(..., "not_worse")), and
    (IllegalTransition) while any canary runs. For an
    embedder the candidate's collections are built first (promote_args: tables, client, strategies, distance).

    `force_reason`: an operator's deliberate override of the gate (a candidate the gate rejected or never saw, e.g.
    to rehearse a rollback). Like promote(force_reason=...) it is logged as a WARNING with the gate's refusal,
    recorded in the state (`force_reason`, its reason), the log line (`override`) and the candidate's manifest
    (`metrics.canary_start`). It bypasses only the gate: one canary at a time, never of production itself. Such a
    canary is promoted only if it wins the online test, and the promotion is recorded as forced with this reason."""
    from rag.training.gate import PromotionRefused
    from rag.training.pipeline import build_collections, promotion_refusal

    _check_kind(kind)
    mv = registry.resolve(kind, candidate or "candidate")
    if mv is None:
        raise RegistryError(f"no {kind} {candidate or 'candidate'!r} in the registry under {registry.root}: train one "
                            "(retrain_job) and let its gate pass, or name a registered version")
    production = registry.resolve(kind, "production")
    if production is not None and production.version == mv.version:
        raise IllegalTransition(f"{kind} {mv.name} is already production: a canary needs a newer candidate")
    _refuse_while_running(registry)
    if force_reason is not None and not force_reason.strip():
        raise ValueError("force_reason must say why the gate is overridden: it is logged and recorded")
    # The offline gate first: a canary exposes users to the candidate, so the gate must have found it no worse than
    # production; whether it is better is the canary's question.
    refusal = promotion_refusal(kind, registry, mv, "not_worse")
    if refusal is not None and not force_reason:
        from rag.training.pipeline import _refused

        raise PromotionRefused(f"cannot start a canary: {_refused(kind, mv, refusal)} To start a canary anyway, an "
                               "operator passes force_reason='...' to start().")
    share = traffic_share if traffic_share is not None else CanarySettings().traffic_share
    state = RolloutState(candidate_version=mv.version, production_version=production.version if production else None,
                         traffic_share=share, force_reason=force_reason if refusal is not None else None)
    if refusal is not None:
        log(f"WARNING: starting a canary of {kind} {mv.name} without a valid gate verdict ({refusal}): {force_reason}")
    collections = {}
    if kind == "embedder":
        args = _promote_args(promote_args)
        if args.get("strategies"):
            # Outside the lock: embedding a corpus takes minutes, and nothing is serving the candidate yet.
            collections = build_collections(mv, tables=args["tables"], client=args["client"], strategies=args["strategies"],
                                            distance=args.get("distance", "cosine"), log=log)
        else:
            log(f"WARNING: no chunk sets given: no collection of {mv.name} was built, so the API cannot serve its canary "
                "share until `<strategy>__" + mv.name + "` exists")
    with _locked(registry):
        _refuse_while_running(registry)  # again under the lock: another start may have won meanwhile
        now_production = registry.resolve(kind, "production")
        if (now_production.version if now_production else None) != state.production_version:
            raise IllegalTransition(f"production {kind} moved to {name_of(registry, kind, now_production.version)} while "
                                    f"{mv.name}'s collections were built: gate {mv.name} against it and start again")
        before = read_state(registry, kind)
        at = now or _now()
        why = (f"operator override of the gate ({refusal}): {force_reason}" if refusal is not None
               else f"gate found it no worse than {name_of(registry, kind, state.production_version)}")
        started = start_canary(state, at, reason=f"{why}; canary on {share:.0%} of sessions")
        override = {"forced": True, "force_reason": force_reason, "gate_refusal": refusal} if refusal is not None else None
        _write(registry, kind, before if before and before.candidate_version == mv.version else None, started, "start", log,
               {"collections": collections} if collections else None, override=override)
        registry.update_metrics(kind, mv.version, {"canary_start": {
            "at": at.isoformat(timespec="seconds"), "traffic_share": share, "production_version": state.production_version,
            "forced": refusal is not None, **({"force_reason": force_reason, "gate_refusal": refusal} if override else {})}})
    return started


def _refuse_while_running(registry: ModelRegistry) -> None:
    running = running_canary(registry)
    if running is not None:
        kind, state = running
        raise IllegalTransition(f"a canary of {kind} {name_of(registry, kind, state.candidate_version)} is running: wait "
                                f"for the canary_sensor's decision or roll it back first (`rag models rollout rollback "
                                f"--kind {kind}`, or launch rollback_canary_job)")


POLICIES = ("direct", "canary")


def release(kind: str, registry: ModelRegistry, candidate: ModelVersion, *, policy: str = "direct",
            traffic_share: float | None = None, promote_args: PromoteArgs = None, log: Log = print) -> dict:
    """What a training run does with a gated candidate (production_embedder, production_reranker):

    - policy "direct": promote it now (rag.training.pipeline.promote: the gate must have found it significantly
      better, re-checked; an embedder's
      collections built, serving aliases swapped). Refused (IllegalTransition) while any canary runs: swapping
      production under a canary would end it silently (its wins were against the production it replaced) and the
      sensor would then roll it back.
    - policy "canary": start its canary (start(): the gate must have found it no worse; an embedder's collections built, state →
      canary on `traffic_share` of sessions); production is untouched and canary_sensor decides. While another
      canary runs (one retrain_job gates an embedder and a reranker), the candidate waits instead: its manifest is
      marked `canary_queued` and canary_sensor starts its canary once the running one has ended, if its gate verdict
      is still against the production of that moment.

    A refusal happens before anything changes. Returns what happened: action ("promoted" | "canary" | "waiting"),
    summary (one line), production (the name serving production now), and the step's details."""
    from rag.training.pipeline import build_collections, check_promotable
    from rag.training.pipeline import promote as promote_model

    if policy not in POLICIES:
        raise ValueError(f"unknown promotion policy {policy!r}: use one of {', '.join(POLICIES)}")
    mv = _resolve(registry, kind, candidate.version)
    if policy == "canary":
        running = running_canary(registry)
        if running is not None and (running[0], running[1].candidate_version) != (kind, mv.version):
            return _queue(kind, registry, mv, running, log)
        state = start(kind, registry, mv.version, traffic_share, promote_args=promote_args, log=log)
        return {"action": "canary", "production": name_of(registry, kind, state.production_version),
                "summary": f"canary started: {mv.name} at {state.traffic_share:.0%} of sessions (production "
                           f"{name_of(registry, kind, state.production_version)} unchanged; canary_sensor decides)",
                "traffic_share": state.traffic_share, "started_at": state.started_at.isoformat(), "reason": state.reason}

    def refuse_if_canary() -> None:
        running = running_canary(registry)
        if running is not None:
            other, state = running
            raise IllegalTransition(
                f"refusing to promote {kind} {mv.name} directly: a canary of {other} "
                f"{name_of(registry, other, state.candidate_version)} is running (on {state.traffic_share:.0%} of sessions "
                f"since {state.started_at.isoformat(timespec='seconds') if state.started_at else '?'}); a direct promotion "
                "would replace production under it and end it. Wait for canary_sensor's decision or roll it back "
                f"(`rag models rollout rollback --kind {other}`, or rollback_canary_job), then materialize "
                f"production_{kind} again (its gate verdict must still be against the production then), or set the "
                "rollout resource's promotion to 'canary' to start this candidate's canary instead. Production is unchanged.")

    refuse_if_canary()
    check_promotable(kind, registry, mv)  # before Qdrant is opened: a refusal changes nothing
    args = _embedder_args(kind, promote_args)
    if args.get("strategies"):
        # The minutes of embedding outside the lock (as start() does); promotion below only brings them up to date.
        build_collections(mv, tables=args["tables"], client=args["client"], strategies=args["strategies"],
                          distance=args.get("distance", "cosine"), log=log)
    with _locked(registry):  # a canary cannot start between this check and the alias swap
        refuse_if_canary()
        outcome = promote_model(kind, registry, mv, log=log, **args)
    return {"action": "promoted", "production": outcome["promoted"], "previous": outcome["previous"],
            "serving_aliases": outcome["serving_aliases"],
            "summary": f"promoted: {outcome['promoted']} is production (was {outcome['previous'] or name_of(registry, kind, None)})"}


def _queue(kind: str, registry: ModelRegistry, mv: ModelVersion, running: tuple[str, RolloutState], log: Log) -> dict:
    from rag.training.pipeline import promotion_refusal

    refusal = promotion_refusal(kind, registry, mv, "not_worse")
    if refusal is not None:  # the same refusal start() would give, before anything is recorded
        from rag.training.gate import PromotionRefused
        from rag.training.pipeline import _refused

        raise PromotionRefused(f"cannot queue a canary: {_refused(kind, mv, refusal)}")
    other, state = running
    behind = f"{other} {name_of(registry, other, state.candidate_version)}"
    registry.update_metrics(kind, mv.version, {"canary_queued": {"at": _now().isoformat(timespec="seconds"), "behind": behind}})
    summary = (f"waiting: {mv.name} passed its gate, but the canary of {behind} is running (one canary at a time); "
               f"canary_sensor starts {mv.name}'s canary when that one ends")
    log(summary)
    return {"action": "waiting", "production": name_of(registry, kind, (registry.aliases()[kind] or {}).get("production")),
            "summary": summary, "behind": behind}


def queued_candidate(registry: ModelRegistry, kind: str) -> ModelVersion | None:
    """The `candidate` of `kind` when release() queued it behind another canary and it has had no canary since, and
    its gate verdict still lets it start against today's production; else None."""
    from rag.training.pipeline import promotion_refusal

    mv = registry.resolve(kind, "candidate")
    if mv is None or "canary_queued" not in mv.metrics or "canary_start" in mv.metrics:
        return None
    state = read_state(registry, kind)
    if state is not None and state.candidate_version == mv.version:
        return None
    return mv if promotion_refusal(kind, registry, mv, "not_worse") is None else None


def _canary_record(state: RolloutState, decision: str, reason: str, evidence: dict | None, at: datetime) -> dict:
    return {"decision": decision, "reason": reason, "traffic_share": state.traffic_share,
            "started_at": state.started_at.isoformat() if state.started_at else None,
            "decided_at": at.isoformat(timespec="seconds"), "production_version": state.production_version,
            "evidence": evidence or {}, **({"force_reason": state.force_reason} if state.force_reason else {})}


def conclude(kind: str, registry: ModelRegistry, decision: str, reason: str, *, candidate: str | None = None,
             evidence: dict | None = None, promote_args: PromoteArgs = None, now: datetime | None = None,
             log: Log = print) -> RolloutState:
    """End the running canary of `kind` as the sequential test (or its guardrails) decided: "promote" or "rollback".

    `candidate`: the version the decision was made for; a canary of another version (or none) is refused with
    IllegalTransition, so a stale request (an operator rolled it back meanwhile) changes nothing. Promotion goes
    through rag.training.pipeline.promote, which re-checks the gate verdict (PromotionRefused when production
    moved since: roll the canary back then) and swaps the serving aliases onto the collections start() built."""
    from rag.training.pipeline import promote as promote_model

    if decision not in ("promote", "rollback"):
        raise ValueError(f"unknown canary decision {decision!r}: use promote or rollback")
    with _locked(registry):
        state = read_state(registry, kind)
        if state is None or state.stage != "canary" or (candidate and state.candidate_version != candidate):
            what = f"{state.candidate_version} is in stage {state.stage!r}" if state else "nothing was started"
            raise IllegalTransition(f"no canary of {kind} {candidate or ''} to {decision}: {what}".replace("  ", " "))
        at = now or _now()
        mv = _resolve(registry, kind, state.candidate_version)
        if decision == "promote":
            force = None
            if state.force_reason:
                # Started over the gate by an operator: its verdict would refuse the promotion, the online test is
                # the evidence. Still only against the production it was compared with.
                production = registry.resolve(kind, "production")
                if (production.version if production else None) != state.production_version:
                    raise IllegalTransition(f"cannot promote {kind} {mv.name}: production moved to "
                                            f"{name_of(registry, kind, production.version if production else None)} "
                                            "during its canary; roll it back")
                force = f"canary started with an operator override of the gate ({state.force_reason}) and won: {reason}"
            # Without an override the gate's not_worse verdict against this production is re-checked, and the
            # online test's win is the evidence of "better" the gate could not give.
            outcome = promote_model(kind, registry, mv, log=log, force_reason=force, online_evidence=None if force else reason,
                                    **_embedder_args(kind, promote_args))
            evidence = {**(evidence or {}), "serving_aliases": outcome["serving_aliases"]}
            after = promote(state, at, reason)
        else:
            after = roll_back(state, at, reason)  # production never moved during the canary: nothing to swap
        registry.update_metrics(kind, mv.version, {"canary": _canary_record(state, decision, reason, evidence, at)})
        _write(registry, kind, state, after, decision, log, evidence)
    return after


def roll_back_rollout(kind: str, registry: ModelRegistry, reason: str, *, promote_args: PromoteArgs = None,
                      now: datetime | None = None, log: Log = print) -> RolloutState:
    """The operator's rollback, one step at any time. A running canary stops: the API serves production to everyone
    on its next request (production's aliases never moved). A candidate the canary promoted is reverted to the
    production it replaced: registry alias and serving aliases swap back onto that version's collections (kept since;
    brought up to date incrementally), recorded in its manifest as a forced promotion with this reason."""
    from rag.training.pipeline import promote as promote_model

    if not reason.strip():
        raise ValueError("say why (reason): it is logged and recorded in the candidate's manifest")
    with _locked(registry):
        state = read_state(registry, kind)
        if state is None or state.stage not in ("candidate", "canary", "production"):
            what = f"{state.candidate_version} is already {state.stage}" if state else "no rollout was ever started"
            raise IllegalTransition(f"nothing to roll back for {kind}: {what}")
        at = now or _now()
        mv = _resolve(registry, kind, state.candidate_version)
        if state.stage != "production":
            after = roll_back(state, at, f"operator: {reason}")
            registry.update_metrics(kind, mv.version, {"canary": _canary_record(state, "rollback", after.reason, None, at)})
            _write(registry, kind, state, after, "rollback", log)
            return after
        production = registry.resolve(kind, "production")
        if production is None or production.version != state.candidate_version:
            raise IllegalTransition(f"{kind} {mv.name} is no longer production (now "
                                    f"{name_of(registry, kind, production.version if production else None)}): roll back "
                                    "the rollout that put that one there, or set the alias by hand")
        previous = state.production_version
        why = f"rollback of {mv.name} after its promotion: {reason}"
        if previous is not None:
            promote_model(kind, registry, _resolve(registry, kind, previous), force_reason=why, log=log,
                          **_embedder_args(kind, promote_args))
        else:
            _restore_implicit_production(kind, registry, _embedder_args(kind, promote_args), log)
        # Not RolloutState.roll_back: that refuses a finished rollout (a new candidate's rollout changes one); an
        # operator's revert is the exception, and it is logged as its own step.
        after = RolloutState.model_validate({**state.model_dump(), "stage": "rolled_back", "decided_at": at,
                                             "reason": f"operator: {why}; production is "
                                                       f"{name_of(registry, kind, previous)} again"})
        registry.update_metrics(kind, mv.version, {"reverted": {"at": at.isoformat(timespec="seconds"), "reason": reason,
                                                                "production_version": previous}})
        _write(registry, kind, state, after, "revert", log)
        return after


def _restore_implicit_production(kind: str, registry: ModelRegistry, args: dict, log: Log) -> None:
    """Production back to the implicit v0: no registered model (the base embedder, or no reranker). For an embedder
    each serving alias <strategy>__production moves onto the base model's collection (built incrementally)."""
    from rag.embedding import load_embedder
    from rag.index.qdrant import point_alias_to
    from rag.index.sync import sync_collection
    from rag.registry import IMPLICIT_PRODUCTION
    from rag.store import CHUNKS_TABLE
    from rag.training.pipeline import serving_alias

    collections = {}
    if kind == "embedder" and args.get("strategies"):
        base = IMPLICIT_PRODUCTION["embedder"]
        embedder = load_embedder(base)
        for strategy in args["strategies"]:
            run = sync_collection(args["client"], args["tables"].read(CHUNKS_TABLE, strategy), embedder, strategy=strategy,
                                  model=base, distance=args.get("distance", "cosine"))
            collections[strategy] = run.collection
    registry.set_alias(kind, "production", None)
    for strategy, collection in collections.items():
        point_alias_to(args["client"], serving_alias(strategy), collection)
        log(f"{strategy}: {serving_alias(strategy)} → {collection} (base model)")


def status(registry: ModelRegistry) -> dict[str, dict]:
    """Per kind: the latest rollout (stage, candidate and production names, share, times, reason) and the registry's
    aliases, with whether the current candidate could start a canary now."""
    from rag.training.pipeline import promotion_refusal

    out = {}
    for kind in KINDS:
        state = read_state(registry, kind)
        aliases = registry.aliases()[kind]
        entry: dict = {"production": name_of(registry, kind, aliases.get("production")),
                       "candidate": name_of(registry, kind, aliases["candidate"]) if aliases.get("candidate") else None}
        if state is not None:
            entry["rollout"] = {"stage": state.stage, "candidate": name_of(registry, kind, state.candidate_version),
                                "candidate_version": state.candidate_version,
                                "replaces": name_of(registry, kind, state.production_version),
                                "traffic_share": state.traffic_share,
                                "started_at": state.started_at.isoformat() if state.started_at else None,
                                "decided_at": state.decided_at.isoformat() if state.decided_at else None,
                                "reason": state.reason}
        candidate = registry.resolve(kind, "candidate")
        if candidate is not None and not (state is not None and state.stage == "canary"
                                          and state.candidate_version == candidate.version):
            refusal = promotion_refusal(kind, registry, candidate, "not_worse")
            entry["candidate_can_start"] = refusal is None
            if refusal is not None:
                entry["candidate_refusal"] = refusal
        out[kind] = entry
    return out
