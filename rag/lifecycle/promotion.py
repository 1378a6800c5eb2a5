"""Promotion: production moves to a gated candidate (or back), as one journaled transaction (rag.lifecycle.journal).

The collections of an embedder are built first (minutes, incremental: nothing is embedded twice); then one intent
holds every change — the serving aliases `<strategy>__production` onto the new collections, the registry's
`production` alias, the `candidate` alias cleared, the promotion record (who approved it, why) in the manifest,
and, when a rollout step promotes, the rollout state and its log line. A kill anywhere leaves either the old
production or the new one once the next open has recovered."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable
from datetime import UTC, datetime

from rag.embedding import load_embedder
from rag.index.qdrant import CollectionName, alias_target
from rag.index.stored import ReusingEmbedder, other_chunk_sets
from rag.index.sync import sync_collection
from rag.lifecycle.journal import Intent, lifecycle_lock, recover, run
from rag.lifecycle.target import ServingTarget
from rag.lifecycle.verdicts import PromotionRefused, promotion_refusal, refused
from rag.registry import IMPLICIT_PRODUCTION, ModelRegistry, ModelVersion
from rag.store import CHUNKS_TABLE, TableStore
from rag.training.pipeline import model_label

SERVING = "production"  # the model name (and Qdrant alias suffix) searches use to reach the production embedder
Log = Callable[[str], None]


def serving_alias(strategy: str) -> str:
    return CollectionName(strategy, SERVING).alias


def operator() -> str:
    """Who is at the keyboard, for approval records when no one else is named."""
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001 - no user database in some containers
        return f"unknown@{socket.gethostname()}"


def build_collections(
    embedder: ModelVersion | None,
    *,
    tables: TableStore,
    client,
    strategies: list[str],
    distance: str = "cosine",
    log: Log = print,
) -> dict[str, str]:
    """A complete collection of an embedder (None: the base model, production's implicit v0) for every chunk set
    (incremental: a collection that exists is only brought up to date), under its own alias <strategy>__<name>.
    Serving aliases are not touched. {strategy: collection}. Used by promotion and by a canary's start, which
    serves the candidate from them."""
    collections = {}
    name = embedder.name if embedder is not None else IMPLICIT_PRODUCTION["embedder"]
    model = load_embedder(str(embedder.path) if embedder is not None else name)
    for strategy in strategies:
        # A text another chunk set's collection of these weights holds (the same paragraph in two chunk sets) takes
        # that vector: each text is encoded once per weights version, as in rag.pipeline.embed_step.
        reusing = ReusingEmbedder(model, other_chunk_sets(client, strategy, name, model.version, distance))
        synced = sync_collection(
            client, tables.read(CHUNKS_TABLE, strategy), reusing, strategy=strategy, model=name, distance=distance
        )
        collections[strategy] = synced.collection
        reused = f", {reusing.reused} of them from another chunk set's vectors" if reusing.reused else ""
        log(f"{strategy}: collection {synced.collection} ready ({synced.points} points, {synced.added} added{reused})")
    return collections


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def plan_promotion(
    kind: str,
    registry: ModelRegistry,
    candidate: ModelVersion | None,
    *,
    target: ServingTarget | None,
    action: str,
    approved_by: str,
    log: Log = print,
    record: dict | None = None,
) -> Intent:
    """The intent of making `candidate` production (None: the implicit v0, no registered model). For an embedder
    with a target, its collections are brought up to date now and the serving aliases' current targets recorded,
    so that recovery can undo. `record`: the promotion record merged into the candidate's manifest."""
    previous = registry.resolve(kind, "production")
    before, after = {}, {}
    if kind == "embedder" and target is not None and target.chunk_sets():
        client = target.client()
        after = {
            serving_alias(s): c
            for s, c in build_collections(
                candidate,
                tables=target.tables,
                client=client,
                strategies=target.chunk_sets(),
                distance=target.distance,
                log=log,
            ).items()
        }
        before = {alias: alias_target(client, alias) for alias in after}
    version = candidate.version if candidate is not None else None
    manifests = {version: {"promotion": record}} if candidate is not None and record is not None else {}
    return Intent(
        kind=kind,
        action=action,
        approved_by=approved_by,
        production_before=previous.version if previous else None,
        production_after=version,
        serving_before=before,
        serving_after=after,
        clear_candidate=version,
        manifests=manifests,
    )


def promote(
    kind: str,
    registry: ModelRegistry,
    candidate: ModelVersion,
    *,
    target: ServingTarget | None = None,
    log: Log = print,
    force_reason: str | None = None,
    online_evidence: str | None = None,
    approved_by: str | None = None,
    extend: Callable[[Intent], None] | None = None,
) -> dict:
    """Move `production` to the candidate, only when its gate passed against the current production (else
    PromotionRefused, before anything changes): the collections brought up to date, then one journaled intent
    swaps the serving aliases and the registry alias and records the promotion.

    `force_reason`: an operator's deliberate bypass of the gate (deploying a base model, a rollback); it is logged
    and recorded in the candidate's manifest (`promotion`: forced, force_reason, gate_refusal).
    `online_evidence`: a canary's verdict that the candidate is better on live traffic; the gate then needs only
    to have found it no worse, and the evidence is recorded.
    `approved_by`: who or what decided (an operator, a sensor's run); default the user at this machine.
    `extend`: adds a rollout step's own changes (state, log line, canary record) to the same intent."""
    with lifecycle_lock(registry):
        recover(registry, target.client if target is not None else None, log)
        previous = registry.resolve(kind, "production")
        refusal = promotion_refusal(kind, registry, candidate, "not_worse" if online_evidence else "better")
        if refusal is not None and not force_reason:
            raise refused(kind, candidate, refusal)  # before any side effect: production stays exactly as it was
        if refusal is not None:
            log(f"WARNING: promoting {kind} {candidate.name} without a valid gate verdict ({refusal}): {force_reason}")
        who = approved_by or operator()
        record = {
            "at": _now(),
            "previous_version": previous.version if previous else None,
            "forced": refusal is not None,
            "approved_by": who,
            **({"online_evidence": online_evidence} if online_evidence else {}),
        }
        if refusal is not None:
            record.update(force_reason=force_reason, gate_refusal=refusal)
        intent = plan_promotion(
            kind, registry, candidate, target=target, action="promote", approved_by=who, log=log, record=record
        )
        now = registry.resolve(kind, "production")
        if (now.version if now else None) != (previous.version if previous else None):
            raise PromotionRefused(
                f"refusing to promote {kind} {candidate.name}: production moved from "
                f"{model_label(kind, previous)} to {model_label(kind, now)} meanwhile. Gate it again "
                "against the new production"
            )
        if extend is not None:
            extend(intent)
        run(registry, intent, target.client() if intent.serving_after else None, log)
    return {
        "promoted": candidate.name,
        "previous": previous.name if previous else None,
        "serving_aliases": dict(intent.serving_after),
        "approved_by": who,
    }


def restore_implicit_production(
    kind: str,
    registry: ModelRegistry,
    *,
    target: ServingTarget | None,
    approved_by: str,
    reason: str,
    log: Log = print,
    extend: Callable[[Intent], None] | None = None,
) -> None:
    """Production back to the implicit v0 (the base embedder, or no reranker) as one journaled intent; an
    embedder's serving aliases move onto the base model's collections (built incrementally)."""
    with lifecycle_lock(registry):
        intent = plan_promotion(
            kind, registry, None, target=target, action="rollback-to-base", approved_by=approved_by, log=log
        )
        if extend is not None:
            extend(intent)
        run(registry, intent, target.client() if intent.serving_after else None, log)
        for alias, collection in intent.serving_after.items():
            log(f"{alias} → {collection} (base model): {reason}")
