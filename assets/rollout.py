"""The model loop's state, visible in the UI: `model_rollout` carries what production serves per kind (with its
MLflow run when the registry offers one), the running canary (stage, candidate, share, wins, losses, ties,
log-likelihood ratio and threshold), the last gate verdict per kind and the last rollout step.

It is observed on every change of that state: by canary_sensor (its cursor holds the state's fingerprint and the
canary's evidence: an unchanged tick observes nothing), by each gate check and release step of retrain_job, and
materialized by each rollout job (start, promote, rollback). Every event carries `state_fingerprint`, so the sensor
does not observe again what a job has just reported (and works stopped: the jobs report on their own).

In the lineage it is downstream of the release steps (production_embedder, production_reranker,
production_configuration): training → release → what serves. `rag demo` ends by recording what serves before any
retrain (serving_events: the base embedder, no reranker, the server's own settings), so neither it nor the release
steps read "Never materialized"."""

from collections.abc import Callable

from dagster import AssetKey, AssetMaterialization, AssetObservation, AssetSpec, Definitions, MetadataValue

from rag.registry import KINDS, ModelRegistry
from rag.rollout.ui_state import fingerprint, loop_state, tracking_url

ROLLOUT_ASSET = "model_rollout"
FINGERPRINT = "state_fingerprint"
RELEASE_ASSETS = {kind: f"production_{kind}" for kind in KINDS}  # assets/training.py: each kind's release step

model_rollout = AssetSpec(
    ROLLOUT_ASSET,
    deps=[AssetKey(name) for name in RELEASE_ASSETS.values()],
    group_name="training",
    kinds={"json"},
    description="The model loop (rag.rollout; state in `<data dir>/models/rollout/<kind>.json`): production embedder "
    "and reranker, the running canary of a gated candidate (candidate → canary on a share of sessions, team-draft "
    "interleaved with production → production or rolled_back) and the last gate verdicts. Observed on every change "
    "(canary_sensor, gate checks, release steps); materialized by start_canary_job, promote_canary_job and "
    "rollback_canary_job. Plot wins, losses or log_likelihood_ratio over time on this page.",
)


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def mlflow_link(
    registry: ModelRegistry, kind: str, version: str | None, warn: Callable[[str], None] | None = None
) -> MetadataValue | None:
    """The version's MLflow run as a URL metadata value, or None (no run, no tracking, or the lookup failed: a link
    must never fail the step or the sensor that shows it; the failure is logged through `warn`)."""
    try:
        url = tracking_url(registry, kind, version)
    except Exception as exc:
        if warn is not None:
            warn(f"no MLflow link for {kind} {version}: {exc}")
        return None
    return MetadataValue.url(url) if url else None


def rollout_metadata(registry: ModelRegistry, warn: Callable[[str], None] | None = None) -> dict:
    """model_rollout's metadata for the loop's state now: flat keys, numbers where the UI can plot them."""
    state = loop_state(registry)
    metadata: dict = {}
    for kind in KINDS:
        entry = state[kind]
        metadata[f"{kind}_production"] = entry["production"]
        metadata[f"{kind}_production_version"] = entry["production_version"] or "v0 (implicit)"
        link = mlflow_link(registry, kind, entry["production_version"], warn)
        if link is not None:
            metadata[f"{kind}_production_mlflow"] = link
        rollout = entry["rollout"]
        metadata[f"{kind}_rollout"] = (
            f"{rollout['candidate']} {rollout['stage']} (replacing {rollout['replaces']}, "
            f"{rollout['traffic_share']:.0%} of sessions)"
            if rollout
            else "none yet"
        )
        gate = entry["gate"]
        if gate is None:
            metadata[f"{kind}_gate"] = "no gate verdict yet"
            continue
        metadata[f"{kind}_gate"] = f"{gate['outcome']}: {gate['candidate']} vs {gate['against']}"
        metadata[f"{kind}_gate_passed"] = gate["passed"]
        metadata[f"{kind}_gate_at"] = gate["at"] or "?"
        for key, label in (("delta_ndcg@10", "delta_ndcg@10"), ("p_value_ndcg@10", "p_ndcg@10")):
            if _number(gate.get(key)) is not None:
                metadata[f"{kind}_gate_{label}"] = float(gate[key])
        if gate.get("reasons"):
            metadata[f"{kind}_gate_reasons"] = str(gate["reasons"])
    canary = state["canary"]
    metadata["canary"] = (
        f"{canary['kind']} {canary['candidate']} on {canary['traffic_share']:.0%} of sessions since "
        f"{canary['started_at']} (production {canary['replaces']})"
        if canary
        else "none running"
    )
    step = state["last_step"]
    metadata["last_step"] = (
        f"{step.get('at')}: {step.get('kind')} {step.get('step')} {step.get('candidate')} "
        f"({step.get('from') or 'new'} → {step.get('to')}): {step.get('reason')}"
        if step
        else "no rollout step yet"
    )
    metadata[FINGERPRINT] = fingerprint(state)
    return metadata


def rollout_observation(
    registry: ModelRegistry, description: str, warn: Callable[[str], None] | None = None, **extra
) -> AssetObservation:
    """An observation of model_rollout with the loop's state now (plus `extra`, e.g. the canary's evidence)."""
    return AssetObservation(
        ROLLOUT_ASSET, description=description, metadata={**rollout_metadata(registry, warn), **extra}
    )


def serving_events(registry: ModelRegistry, why: str) -> list[AssetMaterialization]:
    """What serves now, as materializations of each release step (the production version, or the implicit v0: the
    base embedder, no reranker, the server's own settings) and of model_rollout. `why` says who recorded it."""
    state = loop_state(registry)
    events = []
    for kind, asset in RELEASE_ASSETS.items():
        entry = state[kind]
        summary = f"{entry['production']} serves ({why})"
        metadata = {
            "action": "serving",
            "summary": summary,
            "production": entry["production"],
            "production_version": entry["production_version"] or "v0 (implicit)",
        }
        link = mlflow_link(registry, kind, entry["production_version"])
        if link is not None:
            metadata["mlflow"] = link
        events.append(AssetMaterialization(asset, description=summary, metadata=metadata))
    loop = rollout_metadata(registry)
    events.append(AssetMaterialization(ROLLOUT_ASSET, description=f"what serves ({why})", metadata=loop))
    return events


defs = Definitions(assets=[model_rollout])
