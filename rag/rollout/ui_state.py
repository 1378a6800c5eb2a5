"""The model loop's state in one read: what production serves per kind, the latest rollout of each kind, the last gate
verdict per kind and the last logged rollout step. It only reads (aliases, manifests, rollout state and log); the
Dagster layer shows it as `model_rollout`'s metadata and fingerprints it to observe only changes.

MLflow links: a registry that tracks its versions in MLflow offers `rag.registry.tracking.run_url(registry,
model_version) -> str | None`; tracking_url() calls it when that function exists (None otherwise)."""

from __future__ import annotations

import hashlib
import importlib
import json

from rag.registry import KINDS, ModelRegistry
from rag.lifecycle.rollout import history, name_of, read_state


def tracking_url(registry: ModelRegistry, kind: str, version: str | None) -> str | None:
    """The MLflow page of a registered version, when rag.registry.tracking.run_url exists (None otherwise, and for
    the implicit v0, which no run produced)."""
    if version is None:
        return None
    try:
        tracking = importlib.import_module("rag.registry.tracking")
    except ImportError:
        return None
    run_url = getattr(tracking, "run_url", None)
    mv = registry.resolve(kind, version) if callable(run_url) else None
    return run_url(registry, mv) if mv is not None else None


def gate_outcome(gate: dict) -> str:
    """What a recorded verdict says in one word: no verdict, better, inconclusive (no worse), worse; verdicts
    recorded before outcomes were, by `passed`."""
    if gate.get("outcome"):
        return str(gate["outcome"])
    return "passed" if gate.get("passed") is True else "rejected"


def last_gate_verdict(registry: ModelRegistry, kind: str) -> dict | None:
    """The most recent gate verdict among `kind`'s versions (by gated_at; the highest version on a tie), or None."""
    latest = None
    for mv in registry.versions(kind):
        gate = mv.metrics.get("gate")
        if isinstance(gate, dict) and (
            latest is None or str(gate.get("gated_at") or "") >= str(latest[1].get("gated_at") or "")
        ):
            latest = (mv, gate)
    if latest is None:
        return None
    mv, gate = latest
    return {
        "candidate": mv.name,
        "candidate_version": mv.version,
        "against": gate.get("against") or name_of(registry, kind, gate.get("production_version")),
        "production_version": gate.get("production_version"),
        "outcome": gate_outcome(gate),
        "passed": gate.get("passed") is True,
        "criterion": gate.get("criterion", "better"),
        "delta_ndcg@10": gate.get("delta_ndcg@10"),
        "p_value_ndcg@10": gate.get("p_value_ndcg@10"),
        "questions": gate.get("questions"),
        "at": gate.get("gated_at"),
        "reasons": gate.get("reasons"),
    }


def loop_state(registry: ModelRegistry) -> dict:
    """Per kind: production (name and version; None is the implicit v0), the candidate alias, the latest rollout
    (stage, candidate, share, times, reason) and the last gate verdict; the running canary, if any; the last logged
    rollout step. JSON-serializable."""
    out: dict = {"canary": None}
    aliases = registry.aliases()
    for kind in KINDS:
        production = aliases[kind].get("production")
        candidate = aliases[kind].get("candidate")
        state = read_state(registry, kind)
        rollout = None
        if state is not None:
            rollout = {
                "stage": state.stage,
                "candidate": name_of(registry, kind, state.candidate_version),
                "candidate_version": state.candidate_version,
                "replaces": name_of(registry, kind, state.production_version),
                "traffic_share": state.traffic_share,
                "started_at": state.started_at.isoformat() if state.started_at else None,
                "decided_at": state.decided_at.isoformat() if state.decided_at else None,
                "reason": state.reason,
            }
            if state.stage == "canary" and out["canary"] is None:
                out["canary"] = {"kind": kind, **rollout}
        out[kind] = {
            "production": name_of(registry, kind, production),
            "production_version": production,
            "candidate": name_of(registry, kind, candidate) if candidate else None,
            "rollout": rollout,
            "gate": last_gate_verdict(registry, kind),
        }
    steps = history(registry, limit=1)
    out["last_step"] = steps[-1] if steps else None
    return out


def fingerprint(state: dict) -> str:
    """A short hash of a loop_state(): equal exactly when nothing in it changed."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()[:16]


def current_verdict(registry: ModelRegistry, kind: str, version: str) -> dict | None:
    """The gate verdict recorded in `version`'s manifest when it was computed for that version against today's
    production (None: never gated, or gated against another production)."""
    mv = registry.resolve(kind, version)
    gate = mv.metrics.get("gate") if mv is not None else None
    if not isinstance(gate, dict) or gate.get("candidate_version") != version:
        return None
    return gate if gate.get("production_version") == registry.aliases()[kind].get("production") else None
