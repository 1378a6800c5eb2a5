"""The rollout steps of a model kind, each one journaled transaction (rag.lifecycle.journal) under one lock:

    <registry root>/rollout/embedder.json    the RolloutState of the embedder's latest rollout
    <registry root>/rollout/reranker.json
    <registry root>/rollout/log.jsonl        one line per step: time, kind, candidate, from → to, reason, evidence
    <registry root>/rollout/intent.json      the step being applied (absent when none): recovery rolls it
                                             forward or back

(the file backend; with a database, the same documents and log are rows of rag.state.sql's tables.)

The state is replaced atomically, so the API (which looks at it on every request) reads the old state or the
new one. Every step recovers an unfinished one first, then reads, checks and writes under the lock, so the
sensor's promotion and an operator's rollback cannot both act on the same canary: whichever comes second finds the
canary finished and is refused.

Steps:
- start: the candidate's manifest must hold a gate verdict against today's production that found it no worse
  (`not_worse`; a verdict that found it better implies it); for an embedder its collections are built first, so
  the API can serve the canary share from them and promotion later only swaps aliases.
- conclude: "promote" re-evaluates the canary's evidence (the sequential test and guardrails on the feedback
  store) and refuses unless they say promote; an operator's override needs a reason and is recorded as an
  override, never as a win. Promotion goes through rag.lifecycle.promotion.promote (the not_worse verdict
  re-checked, serving aliases swapped) in the same transaction as the rollout state. "rollback" leaves
  production untouched. Either way the canary's evidence is recorded in the candidate's manifest (`metrics.canary`).
- roll_back_rollout: the operator's one step, at any time: a running canary stops (production never moved), a
  promoted candidate is reverted to the production it replaced (its collections still exist: aliases swap back).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

from rag.lifecycle.journal import (
    Intent,
    history_entries,
    lifecycle_lock,
    log_path,
    read_state_text,
    recover,
    run,
    state_marks,
    state_path,
)
from rag.lifecycle.promotion import build_collections, operator, promote as promote_model, restore_implicit_production
from rag.lifecycle.target import ServingTarget, chunk_sets
from rag.lifecycle.verdicts import PromotionRefused, check_promotable, promotion_refusal, refused
from rag.registry import KINDS, ModelRegistry, ModelVersion, RegistryError
from rag.rollout.config import CanarySettings
from rag.rollout.state import IllegalTransition, RolloutState, promote, roll_back, start_canary

Log = Callable[[str], None]
EvidenceSource = Callable[[datetime], object]  # the canary's start -> rag.rollout.evidence.CanaryEvidence

__all__ = [
    "start",
    "release",
    "conclude",
    "roll_back_rollout",
    "status",
    "read_state",
    "running_canary",
    "history",
    "name_of",
    "gate_estimate",
    "queued_candidate",
    "queued_candidates",
    "stronger_waiting",
    "record_step",
    "roll_back_production",
    "chunk_sets",
    "state_path",
    "state_marks",
    "log_path",
    "ServingTarget",
]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise RegistryError(f"unknown model kind {kind!r}: use one of {', '.join(KINDS)}")


def _now() -> datetime:
    return datetime.now(UTC)


def read_state(registry: ModelRegistry, kind: str) -> RolloutState | None:
    """The latest rollout of `kind` (None: never started)."""
    _check_kind(kind)
    raw = read_state_text(registry, kind)
    return RolloutState.model_validate_json(raw) if raw is not None else None


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
    return history_entries(registry, limit)


def _entry(
    kind: str,
    before: RolloutState | None,
    after: RolloutState,
    step: str,
    evidence: dict | None,
    override: dict | None,
    approved_by: str,
) -> dict:
    return {
        "at": _now().isoformat(timespec="seconds"),
        "kind": kind,
        "step": step,
        "candidate": after.candidate_version,
        "production": after.production_version,
        "from": before.stage if before else None,
        "to": after.stage,
        "traffic_share": after.traffic_share,
        "reason": after.reason,
        "approved_by": approved_by,
        **({"evidence": evidence} if evidence else {}),
        **({"override": override} if override else {}),
    }


def _fill(
    intent: Intent,
    kind: str,
    before: RolloutState | None,
    after: RolloutState,
    step: str,
    *,
    evidence: dict | None = None,
    override: dict | None = None,
    manifest: dict | None = None,
    approved_by: str = "",
) -> None:
    """Add a rollout step's state, log line and manifest record to an intent."""
    intent.rollout_state = json.loads(after.model_dump_json())
    intent.log_entry = _entry(kind, before, after, step, evidence, override, approved_by or intent.approved_by)
    if manifest:
        intent.manifests.setdefault(after.candidate_version, {}).update(manifest)


def record_step(
    registry: ModelRegistry,
    kind: str,
    before: RolloutState | None,
    after: RolloutState,
    step: str,
    log: Log = print,
    *,
    evidence: dict | None = None,
    override: dict | None = None,
    manifest: dict | None = None,
    approved_by: str = "",
) -> None:
    """A step that moves no alias (a canary's start or rollback, a direct promotion logged afterwards) as one
    journaled transaction: state, log line and manifest record land together."""
    intent = Intent(kind=kind, action=f"canary-{step}", approved_by=approved_by or operator(), set_production=False)
    _fill(
        intent,
        kind,
        before,
        after,
        step,
        evidence=evidence,
        override=override,
        manifest=manifest,
        approved_by=approved_by,
    )
    with lifecycle_lock(registry):
        run(registry, intent, None, log)
    log(
        f"rollout {kind} {after.candidate_version}: {before.stage if before else 'new'} → {after.stage} "
        f"({after.reason})"
    )


def _opener(target: ServingTarget | None):
    return target.client if target is not None else None


def _resolve(registry: ModelRegistry, kind: str, version: str) -> ModelVersion:
    mv = registry.resolve(kind, version)
    if mv is None:
        raise RegistryError(
            f"{kind} {version!r} is not registered under {registry.root}: list them with "
            "`rag models rollout status` or train one (retrain_job)"
        )
    return mv


IMPLICIT_NAMES = {
    "embedder": "minilm (base, implicit v0)",
    "reranker": "no reranker (implicit v0)",
    "configuration": "the server's own settings (implicit v0)",
}


def name_of(registry: ModelRegistry, kind: str, version: str | None) -> str:
    """A version's served name (ft-minilm-v4), the implicit v0 for None."""
    if version is None:
        return IMPLICIT_NAMES[kind]
    mv = registry.resolve(kind, version)
    return mv.name if mv is not None else version


def start(
    kind: str,
    registry: ModelRegistry,
    candidate: str | None = None,
    traffic_share: float | None = None,
    *,
    target: ServingTarget | None = None,
    force_reason: str | None = None,
    now: datetime | None = None,
    approved_by: str | None = None,
    log: Log = print,
) -> RolloutState:
    """Start a canary of `candidate` (a version, name or alias; default the `candidate` alias) on `traffic_share`
    of sessions (default CanarySettings().traffic_share). Refused (PromotionRefused) unless its manifest holds a
    gate verdict against the current production that found it no worse (promotion_refusal(..., "not_worse")), and
    (IllegalTransition) while any canary runs. For an embedder the candidate's collections are built first (in
    `target`'s Qdrant, for its chunk sets).

    `force_reason`: an operator's deliberate override of the gate (a candidate the gate rejected or never saw, e.g.
    to rehearse a rollback). Like promote(force_reason=...) it is logged as a WARNING with the gate's refusal,
    recorded in the state (`force_reason`, its reason), the log line (`override`) and the candidate's manifest
    (`metrics.canary_start`). It bypasses only the gate: one canary at a time, never of production itself. Such a
    canary is promoted only if it wins the online test, and the promotion is recorded as forced with this reason."""

    _check_kind(kind)
    recover(registry, _opener(target), log)
    mv = registry.resolve(kind, candidate or "candidate")
    if mv is None:
        raise RegistryError(
            f"no {kind} {candidate or 'candidate'!r} in the registry under {registry.root}: train one "
            "(retrain_job) and let its gate pass, or name a registered version"
        )
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
        raise PromotionRefused(
            f"cannot start a canary: {refused(kind, mv, refusal)} To start a canary anyway, an "
            "operator passes force_reason='...' to start()."
        )
    share = traffic_share if traffic_share is not None else CanarySettings().traffic_share
    state = RolloutState(
        candidate_version=mv.version,
        production_version=production.version if production else None,
        traffic_share=share,
        force_reason=force_reason if refusal is not None else None,
    )
    if refusal is not None:
        log(f"WARNING: starting a canary of {kind} {mv.name} without a valid gate verdict ({refusal}): {force_reason}")
    collections = {}
    if kind == "embedder":
        if target is not None and target.chunk_sets():
            # Outside the lock: embedding a corpus takes minutes, and nothing is serving the candidate yet.
            collections = build_collections(
                mv,
                tables=target.tables,
                client=target.client(),
                strategies=target.chunk_sets(),
                distance=target.distance,
                log=log,
            )
        else:
            log(
                f"WARNING: no chunk sets given: no collection of {mv.name} was built, so the API cannot serve "
                "its canary share until `<strategy>__" + mv.name + "` exists"
            )
    who = approved_by or operator()
    with lifecycle_lock(registry):
        _refuse_while_running(registry)  # again under the lock: another start may have won meanwhile
        now_production = registry.resolve(kind, "production")
        if (now_production.version if now_production else None) != state.production_version:
            raise IllegalTransition(
                f"production {kind} moved to {name_of(registry, kind, now_production.version)} while "
                f"{mv.name}'s collections were built: gate {mv.name} against it and start again"
            )
        before = read_state(registry, kind)
        at = now or _now()
        why = (
            f"operator override of the gate ({refusal}): {force_reason}"
            if refusal is not None
            else f"gate found it no worse than {name_of(registry, kind, state.production_version)}"
        )
        started = start_canary(state, at, reason=f"{why}; canary on {share:.0%} of sessions")
        override = (
            {"forced": True, "force_reason": force_reason, "gate_refusal": refusal} if refusal is not None else None
        )
        record_step(
            registry,
            kind,
            before if before and before.candidate_version == mv.version else None,
            started,
            "start",
            log,
            evidence={"collections": collections} if collections else None,
            override=override,
            approved_by=who,
            manifest={
                "canary_start": {
                    "at": at.isoformat(timespec="seconds"),
                    "traffic_share": share,
                    "production_version": state.production_version,
                    "approved_by": who,
                    "forced": refusal is not None,
                    **({"force_reason": force_reason, "gate_refusal": refusal} if override else {}),
                }
            },
        )
    return started


def _refuse_while_running(registry: ModelRegistry) -> None:
    running = running_canary(registry)
    if running is not None:
        kind, state = running
        raise IllegalTransition(
            f"a canary of {kind} {name_of(registry, kind, state.candidate_version)} is running: wait "
            f"for the canary_sensor's decision or roll it back first (`rag models rollout rollback "
            f"--kind {kind}`, or launch rollback_canary_job)"
        )


POLICIES = ("auto", "direct", "canary")


def release(
    kind: str,
    registry: ModelRegistry,
    candidate: ModelVersion,
    *,
    policy: str = "direct",
    traffic_share: float | None = None,
    target: ServingTarget | None = None,
    approved_by: str | None = None,
    log: Log = print,
) -> dict:
    """What a training run does with a gated candidate (production_embedder, production_reranker):

    - policy "direct": promote it now (rag.lifecycle.promotion.promote: the gate must have found it significantly
      better, re-checked; an embedder's collections built, serving aliases swapped). Refused (IllegalTransition)
      while any canary runs: swapping production under a canary would end it silently (its wins were against the
      production it replaced) and the sensor would then roll it back.
    - policy "canary": start its canary (start(): the gate must have found it no worse; an embedder's collections
      built, state → canary on `traffic_share` of sessions); production is untouched and canary_sensor decides.
      While another canary runs (one retrain_job gates an embedder and a reranker), the candidate waits instead:
      its manifest is marked `canary_queued` and canary_sensor starts its canary once the running one has ended, if
      its gate verdict is still against the production of that moment.
    - policy "auto": "direct" when the gate found it significantly better (a canary that has not decided, of
      another kind or an older candidate of its own, is ended first: _preempt); otherwise "canary" (the gate found it
      no worse but could not show it better: it waits behind a running canary).

    A refusal happens before anything changes. Returns what happened: action ("promoted" | "canary" | "waiting"),
    summary (one line), production (the name serving production now), and the step's details."""
    if policy not in POLICIES:
        raise ValueError(f"unknown promotion policy {policy!r}: use one of {', '.join(POLICIES)}")
    recover(registry, _opener(target), log)
    mv = _resolve(registry, kind, candidate.version)
    if policy == "auto":
        better = promotion_refusal(kind, registry, mv, "better") is None
        if better:
            _preempt(kind, registry, mv, target=target, approved_by=approved_by, log=log)
        policy = "direct" if better and running_canary(registry) is None else "canary"
    if policy == "canary":
        running = running_canary(registry)
        if running is not None and (running[0], running[1].candidate_version) != (kind, mv.version):
            return _queue(kind, registry, mv, running, log)
        ahead = stronger_waiting(registry, kind, mv) if running is None else None
        if ahead is not None:
            return _queue(kind, registry, mv, None, log, ahead=ahead)
        state = start(kind, registry, mv.version, traffic_share, target=target, approved_by=approved_by, log=log)
        return {
            "action": "canary",
            "production": name_of(registry, kind, state.production_version),
            "summary": f"canary started: {mv.name} at {state.traffic_share:.0%} of sessions (production "
            f"{name_of(registry, kind, state.production_version)} unchanged; canary_sensor decides)",
            "traffic_share": state.traffic_share,
            "started_at": state.started_at.isoformat(),
            "reason": state.reason,
        }

    def refuse_if_canary() -> None:
        running = running_canary(registry)
        if running is not None:
            other, state = running
            raise IllegalTransition(
                f"refusing to promote {kind} {mv.name} directly: a canary of {other} "
                f"{name_of(registry, other, state.candidate_version)} is running (on {state.traffic_share:.0%} of "
                f"sessions since {state.started_at.isoformat(timespec='seconds') if state.started_at else '?'}); "
                "a direct promotion would replace production under it and end it. Wait for canary_sensor's decision "
                f"or roll it back (`rag models rollout rollback --kind {other}`, or rollback_canary_job), then "
                f"materialize production_{kind} again (its gate verdict must still be against the production then), "
                "or set the rollout resource's promotion to 'canary' to start this candidate's canary instead. "
                "Production is unchanged."
            )

    refuse_if_canary()
    check_promotable(kind, registry, mv)  # before Qdrant is opened: a refusal changes nothing
    embedder_target = target if kind == "embedder" else None  # a reranker's promotion never opens Qdrant (nor its lock)
    if embedder_target is not None and embedder_target.chunk_sets():
        # The minutes of embedding outside the lock (as start() does); promotion below only brings them up to date.
        build_collections(
            mv,
            tables=target.tables,
            client=target.client(),
            strategies=target.chunk_sets(),
            distance=target.distance,
            log=log,
        )
    with lifecycle_lock(registry):  # a canary cannot start between this check and the alias swap
        refuse_if_canary()
        outcome = promote_model(kind, registry, mv, target=embedder_target, approved_by=approved_by, log=log)
    return {
        "action": "promoted",
        "production": outcome["promoted"],
        "previous": outcome["previous"],
        "serving_aliases": outcome["serving_aliases"],
        "summary": (
            f"promoted: {outcome['promoted']} is production "
            f"(was {outcome['previous'] or name_of(registry, kind, None)})"
        ),
    }


def _preempt(
    kind: str,
    registry: ModelRegistry,
    mv: ModelVersion,
    *,
    target: ServingTarget | None,
    approved_by: str | None,
    log: Log,
) -> None:
    """Under policy "auto", a candidate the gate found significantly better on held-out questions ends a canary that
    has not decided: an offline win on people's questions is stronger evidence than a canary still short of its
    threshold, and waiting behind it (up to its horizon) would hold a known gain back. A canary of another kind is
    retrained and canaried again later; one of an older candidate of the same kind is superseded by a model trained
    on more of people's feedback (retraining goes on while a canary runs, so interleavings that mostly tie cannot
    hold the kind at its first candidate). The canary is rolled back either way: production never moved for it."""
    running = running_canary(registry)
    if running is None or (running[0] == kind and running[1].candidate_version == mv.version):
        return
    other, state = running
    running_name = f"{other} {name_of(registry, other, state.candidate_version)}"
    reason = (
        f"superseded by {mv.name}, a later candidate the gate found significantly better on held-out questions; "
        f"{running_name} had not decided"
        if other == kind
        else f"pre-empted by {kind} {mv.name}, which the gate found significantly better on held-out questions; "
        f"{running_name} had not decided (retrain to try it again)"
    )
    log(f"ending the canary of {other}: {reason}")
    roll_back_rollout(other, registry, reason, target=target, approved_by=approved_by, log=log)


def gate_estimate(mv: ModelVersion) -> float | None:
    """The gate's estimate of what a candidate gains over production: its delta on the gate's first metric, over all
    the gate's questions (None when the verdict records none). Only to order candidates waiting for the one canary
    slot: generated questions may weigh in this estimate, so it never promotes anything; the canary decides."""
    gate = mv.metrics.get("gate") if isinstance(mv.metrics, dict) else None
    if not isinstance(gate, dict):
        return None
    metrics = (gate.get("settings") or {}).get("metrics") or ["ndcg@10"]
    value = gate.get(f"delta_{metrics[0]}")
    return float(value) if isinstance(value, int | float) else None


def stronger_waiting(registry: ModelRegistry, kind: str, mv: ModelVersion) -> tuple[str, ModelVersion] | None:
    """A candidate of another kind that would start a canary too (its gate found it no worse than today's
    production; it has had no canary) and whose gate estimate is larger than `mv`'s: it should take the one canary
    slot first. One retrain_job gates every kind and releases them one after another, so without this the first
    kind released took the slot whatever the others' candidates looked like: on TAT-QA and ConditionalQA a
    configuration or an embedder barely different from production held it while a reranker the test questions found
    5 to 7 points better waited (docs/training.md#the-loop-measured)."""
    own = gate_estimate(mv)
    if own is None:
        return None
    best: tuple[float, str, ModelVersion] | None = None
    aliases = registry.aliases()
    for other in KINDS:
        if other == kind:
            continue
        candidate = registry.resolve(other, "candidate")
        if candidate is None or "canary_start" in candidate.metrics:
            continue
        if candidate.version == (aliases.get(other) or {}).get("production"):
            continue
        estimate = gate_estimate(candidate)
        if estimate is None or estimate <= own or (best is not None and estimate <= best[0]):
            continue
        if promotion_refusal(other, registry, candidate, "not_worse") is None:
            best = (estimate, other, candidate)
    return (best[1], best[2]) if best else None


def _queue(
    kind: str,
    registry: ModelRegistry,
    mv: ModelVersion,
    running: tuple[str, RolloutState] | None,
    log: Log,
    *,
    ahead: tuple[str, ModelVersion] | None = None,
) -> dict:
    """Mark the candidate `canary_queued`: behind the running canary, or (`ahead`) behind another kind's candidate
    whose gate estimate is larger and that starts its canary first; canary_sensor starts the queued candidate with
    the largest estimate whenever no canary runs."""
    refusal = promotion_refusal(kind, registry, mv, "not_worse")
    if refusal is not None:  # the same refusal start() would give, before anything is recorded
        raise PromotionRefused(f"cannot queue a canary: {refused(kind, mv, refusal)}")
    if running is not None:
        other, state = running
        behind = f"{other} {name_of(registry, other, state.candidate_version)}"
        why = f"the canary of {behind} is running (one canary at a time)"
    else:
        other, candidate = ahead
        behind = f"{other} {candidate.name}"
        why = (
            f"{behind}'s gate estimate is larger ({gate_estimate(candidate):+.4f} against {gate_estimate(mv):+.4f}), "
            "so its canary goes first (one canary at a time)"
        )
    registry.update_metrics(
        kind, mv.version, {"canary_queued": {"at": _now().isoformat(timespec="seconds"), "behind": behind}}
    )
    summary = (
        f"waiting: {mv.name} passed its gate, but {why}; canary_sensor starts {mv.name}'s canary when that one ends"
    )
    log(summary)
    return {
        "action": "waiting",
        "production": name_of(registry, kind, (registry.aliases()[kind] or {}).get("production")),
        "summary": summary,
        "behind": behind,
    }


def queued_candidates(registry: ModelRegistry) -> list[tuple[str, ModelVersion]]:
    """Every kind's queued candidate that may start now (queued_candidate), the largest gate estimate first (those
    without one last, in KINDS order)."""
    found = [(kind, mv, gate_estimate(mv)) for kind in KINDS if (mv := queued_candidate(registry, kind)) is not None]
    found.sort(key=lambda item: (item[2] is None, -(item[2] or 0.0)))  # stable: KINDS order among equals
    return [(kind, mv) for kind, mv, _ in found]


def queued_candidate(registry: ModelRegistry, kind: str) -> ModelVersion | None:
    """The `candidate` of `kind` when release() queued it behind another canary and it has had no canary since, and
    its gate verdict still lets it start against today's production; else None."""
    mv = registry.resolve(kind, "candidate")
    if mv is None or "canary_queued" not in mv.metrics or "canary_start" in mv.metrics:
        return None
    state = read_state(registry, kind)
    if state is not None and state.candidate_version == mv.version:
        return None
    return mv if promotion_refusal(kind, registry, mv, "not_worse") is None else None


def _canary_record(
    state: RolloutState,
    decision: str,
    reason: str,
    evidence: dict | None,
    at: datetime,
    approved_by: str,
    override: dict | None = None,
) -> dict:
    return {
        "decision": decision,
        "reason": reason,
        "traffic_share": state.traffic_share,
        "started_at": state.started_at.isoformat() if state.started_at else None,
        "decided_at": at.isoformat(timespec="seconds"),
        "production_version": state.production_version,
        "approved_by": approved_by,
        "evidence": evidence or {},
        **({"force_reason": state.force_reason} if state.force_reason else {}),
        **({"override": override} if override else {}),
    }


def conclude(
    kind: str,
    registry: ModelRegistry,
    decision: str,
    reason: str,
    *,
    candidate: str | None = None,
    evidence: dict | None = None,
    evidence_source: EvidenceSource | None = None,
    settings: CanarySettings | None = None,
    override_reason: str | None = None,
    target: ServingTarget | None = None,
    approved_by: str | None = None,
    now: datetime | None = None,
    log: Log = print,
) -> RolloutState:
    """End the running canary of `kind`: "promote" or "rollback".

    `candidate`: the version the decision was made for; a canary of another version (or none) is refused with
    IllegalTransition, so a stale request (an operator rolled it back meanwhile) changes nothing.

    "promote" never trusts the caller's word: the evidence is read again (`evidence_source(started_at)`, e.g.
    rag.rollout.evidence.collect over the feedback store) and the sequential test and guardrails must say promote
    now (PromotionRefused otherwise, nothing changes). An operator who promotes anyway passes `override_reason`:
    the promotion is then recorded as an override (forced, with what the test said), never as a won canary.
    Promotion goes through rag.lifecycle.promotion.promote (the gate's not_worse verdict re-checked; production
    must not have moved) in the same journaled transaction as the rollout state. "rollback" needs no evidence:
    production never moved during the canary."""
    from rag.rollout.evidence import evaluate, summary

    if decision not in ("promote", "rollback"):
        raise ValueError(f"unknown canary decision {decision!r}: use promote or rollback")
    if override_reason is not None and not override_reason.strip():
        raise ValueError("override_reason must say why the sequential test is overridden: it is recorded")
    who = approved_by or operator()
    with lifecycle_lock(registry):
        recover(registry, _opener(target), log)
        state = read_state(registry, kind)
        if state is None or state.stage != "canary" or (candidate and state.candidate_version != candidate):
            what = f"{state.candidate_version} is in stage {state.stage!r}" if state else "nothing was started"
            raise IllegalTransition(f"no canary of {kind} {candidate or ''} to {decision}: {what}".replace("  ", " "))
        at = now or _now()
        mv = _resolve(registry, kind, state.candidate_version)
        if decision == "rollback":
            after = roll_back(state, at, reason)  # production never moved during the canary: nothing to swap
            record_step(
                registry,
                kind,
                state,
                after,
                decision,
                log,
                evidence=evidence,
                approved_by=who,
                manifest={"canary": _canary_record(state, decision, reason, evidence, at, who)},
            )
            return after
        verdict = None
        if evidence_source is not None:
            observed = evidence_source(state.started_at)
            verdict = evaluate(observed, mv.name, settings or CanarySettings())
            evidence = {
                **(evidence or {}),
                **{k: v for k, v in summary(verdict, observed, settings).items() if v is not None},
            }
        said = verdict.decision if verdict is not None else "nothing (no evidence was read)"
        override = None
        if verdict is None or verdict.decision != "promote":
            if not override_reason:
                raise PromotionRefused(
                    f"refusing to promote the canary of {kind} {mv.name}: the sequential test says {said}"
                    f"{': ' + verdict.reason if verdict is not None else ''}. Production is unchanged; "
                    "the canary keeps running until the test decides. An operator who promotes anyway passes an "
                    "override reason (recorded as an override, not as a win)"
                )
            override = {
                "override_reason": override_reason,
                "test_said": said,
                **({"test_reason": verdict.reason} if verdict is not None else {}),
            }
        production = registry.resolve(kind, "production")
        if (production.version if production else None) != state.production_version:
            raise IllegalTransition(
                f"cannot promote {kind} {mv.name}: production moved to "
                f"{name_of(registry, kind, production.version if production else None)} during its "
                "canary; roll it back"
            )
        force = None
        if override is not None:
            force = f"operator override of the canary's sequential test (it said {said}): {override_reason}"
        elif state.force_reason:
            # Started over the gate by an operator: its verdict would refuse the promotion, the online test is the
            # evidence, and the promotion is recorded as forced with that reason.
            force = (
                f"canary started with an operator override of the gate ({state.force_reason}) and won: {verdict.reason}"
            )
        why = reason if override is None else f"{reason}; override: {override_reason}"
        after = promote(state, at, why)

        def add_rollout(intent: Intent) -> None:
            _fill(
                intent,
                kind,
                state,
                after,
                "promote",
                evidence=evidence,
                override=override,
                approved_by=who,
                manifest={"canary": _canary_record(state, "promote", why, evidence, at, who, override)},
            )

        outcome = promote_model(
            kind,
            registry,
            mv,
            target=target if kind == "embedder" else None,
            log=log,
            force_reason=force,
            online_evidence=None if force else verdict.reason,
            approved_by=who,
            extend=add_rollout,
        )
        log(
            f"rollout {kind} {mv.name}: canary → production ({why}); "
            f"serving {outcome['serving_aliases'] or 'unchanged'}"
        )
    return after


def roll_back_rollout(
    kind: str,
    registry: ModelRegistry,
    reason: str,
    *,
    target: ServingTarget | None = None,
    now: datetime | None = None,
    approved_by: str | None = None,
    log: Log = print,
) -> RolloutState:
    """The operator's rollback, one step at any time. A running canary stops: the API serves production to everyone
    on its next request (production's aliases never moved). A candidate the canary promoted is reverted to the
    production it replaced: registry alias and serving aliases swap back onto that version's collections (kept since;
    brought up to date incrementally), recorded in its manifest as a forced promotion with this reason."""
    if not reason.strip():
        raise ValueError("say why (reason): it is logged and recorded in the candidate's manifest")
    who = approved_by or operator()
    with lifecycle_lock(registry):
        recover(registry, _opener(target), log)
        state = read_state(registry, kind)
        if state is None or state.stage not in ("candidate", "canary", "production"):
            what = f"{state.candidate_version} is already {state.stage}" if state else "no rollout was ever started"
            raise IllegalTransition(f"nothing to roll back for {kind}: {what}")
        at = now or _now()
        mv = _resolve(registry, kind, state.candidate_version)
        if state.stage != "production":
            after = roll_back(state, at, f"operator: {reason}")
            record_step(
                registry,
                kind,
                state,
                after,
                "rollback",
                log,
                approved_by=who,
                manifest={"canary": _canary_record(state, "rollback", after.reason, None, at, who)},
            )
            return after
        production = registry.resolve(kind, "production")
        if production is None or production.version != state.candidate_version:
            raise IllegalTransition(
                f"{kind} {mv.name} is no longer production (now "
                f"{name_of(registry, kind, production.version if production else None)}): roll back "
                "the rollout that put that one there, or set the alias by hand"
            )
        previous = state.production_version
        why = f"rollback of {mv.name} after its promotion: {reason}"
        # Not RolloutState.roll_back: that refuses a finished rollout (a new candidate's rollout changes one); an
        # operator's revert is the exception, and it is logged as its own step.
        after = RolloutState.model_validate(
            {
                **state.model_dump(),
                "stage": "rolled_back",
                "decided_at": at,
                "reason": f"operator: {why}; production is {name_of(registry, kind, previous)} again",
            }
        )

        def add_revert(intent: Intent) -> None:
            _fill(
                intent,
                kind,
                state,
                after,
                "revert",
                approved_by=who,
                manifest={
                    "reverted": {
                        "at": at.isoformat(timespec="seconds"),
                        "reason": reason,
                        "production_version": previous,
                        "approved_by": who,
                    }
                },
            )

        embedder_target = target if kind == "embedder" else None
        if previous is not None:
            promote_model(
                kind,
                registry,
                _resolve(registry, kind, previous),
                target=embedder_target,
                force_reason=why,
                approved_by=who,
                log=log,
                extend=add_revert,
            )
        else:
            restore_implicit_production(
                kind, registry, target=embedder_target, approved_by=who, reason=why, log=log, extend=add_revert
            )
        return after


def roll_back_production(
    kind: str, registry: ModelRegistry, reason: str, *, target: ServingTarget | None = None, log: Log = print
) -> RolloutState:
    """Production back to the version it replaced, or a running canary stopped, through
    roll_back_rollout. A production that was promoted directly (retrain_job under the 'direct'
    policy, `rag models promote`) has no rollout behind it: its promotion (from its manifest's metrics.promotion) is
    first logged as a finished rollout, then reverted like a canary's promotion."""
    with lifecycle_lock(registry):
        recover(registry, target.client if target is not None else None, log)
        state = read_state(registry, kind)
        production = registry.resolve(kind, "production")
        covered = state is not None and (
            state.stage == "canary"
            or (
                state.stage == "production" and production is not None and production.version == state.candidate_version
            )
        )
        if not covered:
            if production is None:
                raise IllegalTransition(
                    f"nothing to roll back for {kind}: no version is production "
                    f"({name_of(registry, kind, None)} serves)"
                )
            promotion = production.metrics.get("promotion")
            if not isinstance(promotion, dict) or "previous_version" not in promotion:
                raise IllegalTransition(
                    f"{kind} {production.name} has no promotion record in its manifest (its alias was "
                    "set by hand?): the production before it is unknown; promote the one you want "
                    f"with `rag models promote VERSION --kind {kind}`"
                )
            if str(promotion.get("force_reason") or "").startswith("rollback of "):
                raise IllegalTransition(
                    f"{kind} {production.name} is production because of a rollback "
                    f"({promotion['force_reason']}): rolling back again would restore the version that "
                    "was rolled back. Promote the version you want instead"
                )
            previous = promotion["previous_version"]
            at = datetime.fromisoformat(promotion["at"]) if promotion.get("at") else None
            promoted = RolloutState(
                stage="production",
                candidate_version=production.version,
                production_version=previous,
                decided_at=at,
                reason=(
                    "promoted directly ("
                    f"{'forced: ' + promotion['force_reason'] if promotion.get('force_reason') else 'gate passed'}"
                    "), without a canary"
                ),
            )
            record_step(
                registry, kind, None, promoted, "direct-promotion", log, approved_by=promotion.get("approved_by", "")
            )
        return roll_back_rollout(kind, registry, reason, target=target, log=log)


def status(registry: ModelRegistry) -> dict[str, dict]:
    """Per kind: the latest rollout (stage, candidate and production names, share, times, reason) and the registry's
    aliases, with whether the current candidate could start a canary now."""
    out = {}
    for kind in KINDS:
        state = read_state(registry, kind)
        aliases = registry.aliases()[kind]
        entry: dict = {
            "production": name_of(registry, kind, aliases.get("production")),
            "candidate": name_of(registry, kind, aliases["candidate"]) if aliases.get("candidate") else None,
        }
        if state is not None:
            entry["rollout"] = {
                "stage": state.stage,
                "candidate": name_of(registry, kind, state.candidate_version),
                "candidate_version": state.candidate_version,
                "replaces": name_of(registry, kind, state.production_version),
                "traffic_share": state.traffic_share,
                "started_at": state.started_at.isoformat() if state.started_at else None,
                "decided_at": state.decided_at.isoformat() if state.decided_at else None,
                "reason": state.reason,
            }
        candidate = registry.resolve(kind, "candidate")
        if candidate is not None and not (
            state is not None and state.stage == "canary" and state.candidate_version == candidate.version
        ):
            refusal = promotion_refusal(kind, registry, candidate, "not_worse")
            entry["candidate_can_start"] = refusal is None
            if refusal is not None:
                entry["candidate_refusal"] = refusal
        out[kind] = entry
    return out
