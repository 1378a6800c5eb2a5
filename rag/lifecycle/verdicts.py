"""Whether a candidate may replace production now: its recorded gate verdict, checked before any side effect.

A verdict counts only when it was computed for this very version, against the version that is production now,
with gate settings above the floors (GateSettings' bounds: a gate run at p 0.99 or on one question passes anything)
and, for a reranker, over the first-stage embedder that serves now (a reranker gated over ft-minilm-v2's
candidates says nothing about re-ranking ft-minilm-v3's)."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError

from rag.registry import ModelRegistry, ModelVersion
from rag.training.config import GateSettings
from rag.training.pipeline import model_label

Need = Literal["better", "not_worse"]
TRAINING_ASSET = {
    "embedder": "finetuned_embedder",
    "reranker": "trained_reranker",
    "configuration": "trained_configuration",
}


class PromotionRefused(ValueError):
    """A promotion that the gate has not (or not currently) approved; the message says what to run."""


def promotion_refusal(kind: str, registry: ModelRegistry, candidate: ModelVersion, need: Need = "better") -> str | None:
    """Why the candidate may not replace production now, or None when its manifest holds a passing gate verdict
    computed for this very version against the version that is production now (a verdict against an older
    production says nothing about beating the current one).

    `need`: "better" (direct promotion: the gate found it significantly better), or "not_worse" (starting a canary,
    and promoting one whose online test showed it better: the gate found it no worse)."""
    current = registry.resolve(
        kind, candidate.version
    )  # the manifest on disk: the gate may have run after `candidate` was read
    if current is None:
        return f"{candidate.version} is not registered under {registry.root}"
    gate = current.metrics.get("gate")
    if not isinstance(gate, dict) or "candidate_version" not in gate or "production_version" not in gate:
        return "it has no gate verdict"
    if gate["candidate_version"] != candidate.version:
        return f"its gate verdict is for {kind} {gate['candidate_version']}, not {candidate.version}"
    production = registry.resolve(kind, "production")
    now = production.version if production else None
    if gate["production_version"] != now:
        return (
            f"it was gated against {gate['production_version'] or 'the implicit v0'} ({gate.get('gated_at', '?')}), "
            f"but production is now {model_label(kind, production)}"
        )
    weak = _weak_settings(gate)
    if weak:
        return weak
    if kind == "reranker":
        embedder = registry.resolve("embedder", "production")
        serving = embedder.version if embedder else None
        if "first_stage_embedder" not in gate:
            return (
                "its gate verdict does not record the first-stage embedder it re-ranked: gate it again (the "
                "trained_reranker_gate check)"
            )
        if gate["first_stage_embedder"] != serving:
            return (
                "it was gated over the first stage of embedder "
                f"{gate['first_stage_embedder'] or 'minilm (implicit v0)'}, but production embedder is now "
                f"{model_label('embedder', embedder)}: gate it again over it"
            )
    if kind == "configuration":
        stale = _configuration_ranked_through(registry, gate)
        if stale:
            return stale
    # Verdicts recorded before the two criteria existed hold only `passed`, decided by "better" (which implies
    # not worse); newer ones record both.
    passed = gate.get("passed") is True
    if gate.get(need, passed and (need == "not_worse" or gate.get("criterion", "better") == "better")) is not True:
        if need == "better" and gate.get("not_worse") is True:
            return (
                f"the gate found it no worse than {model_label(kind, production)} but not significantly better "
                f"({gate.get('better_reasons') or gate.get('reasons', 'no reason recorded')}): only a canary's online "
                "test can promote it (promotion policy 'canary')"
            )
        if gate.get("outcome") == "no verdict":
            return f"the gate reached no verdict against {model_label(kind, production)}: {gate.get('reasons', '')}"
        return (
            f"the gate rejected it against {model_label(kind, production)}: {gate.get('reasons', 'no reason recorded')}"
        )
    return None


def _configuration_ranked_through(registry: ModelRegistry, gate: dict) -> str | None:
    """Why a configuration's verdict does not hold for the models serving now: it ranked its questions through the
    production embedder and reranker of its time (None: they still serve)."""
    for kind, key in (("embedder", "first_stage_embedder"), ("reranker", "served_reranker")):
        serving = registry.resolve(kind, "production")
        now = serving.version if serving else None
        if key not in gate:
            return f"its gate verdict does not record the {kind} it ranked through: gate it again"
        if gate[key] != now:
            return (
                f"it was gated through {kind} {gate[key] or 'implicit v0'}, but production {kind} is now "
                f"{model_label(kind, serving)}: gate it again"
            )
    return None


def _weak_settings(gate: dict) -> str | None:
    """Why the settings a verdict was computed with cannot vouch for a promotion (None: they can)."""
    settings = gate.get("settings")
    if not isinstance(settings, dict):
        return "its gate verdict does not record the settings it was computed with: gate it again"
    try:
        GateSettings.model_validate(settings)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return (
            f"its gate verdict was computed with settings below the floors ({problems}): "
            "gate it again with sound settings"
        )
    return None


def rejected_by_gate(kind: str, registry: ModelRegistry, candidate: ModelVersion, need: Need = "better") -> str | None:
    """Why the candidate's own current gate verdict (for this version, against the production of now) keeps
    production, or None when there is no such verdict or it allows `need`. A rejection is a normal outcome of a
    retrain; a missing or stale verdict is not a rejection (promotion_refusal then says what to run)."""
    current = registry.resolve(kind, candidate.version)
    gate = current.metrics.get("gate") if current is not None else None
    if not isinstance(gate, dict) or gate.get("candidate_version") != candidate.version:
        return None
    production = registry.resolve(kind, "production")
    if gate.get("production_version") != (production.version if production else None):
        return None
    return promotion_refusal(kind, registry, candidate, need)


def check_promotable(kind: str, registry: ModelRegistry, candidate: ModelVersion, need: Need = "better") -> None:
    """Raise PromotionRefused (saying what to run) unless promotion_refusal finds nothing. Call it before any side
    effect: a refused promotion must leave aliases and collections exactly as they were."""
    why = promotion_refusal(kind, registry, candidate, need)
    if why is not None:
        raise refused(kind, candidate, why)


def refused(kind: str, candidate: ModelVersion, why: str) -> PromotionRefused:
    asset = TRAINING_ASSET[kind]
    return PromotionRefused(
        f"refusing to promote {kind} {candidate.name}: {why}. Run its gate first (the {asset}_gate check: run "
        f"retrain_job, or materialize {asset} together with its check) and promote only when it passes; "
        "production stays as it is. An operator who means to bypass the gate passes force_reason='...' to promote()."
    )
