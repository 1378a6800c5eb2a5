"""Promotions and rollbacks as journaled transactions, so that none can half-happen.

A change of production touches stores that share no transaction: the registry's `production` alias (and
`candidate`), the Qdrant serving aliases `<strategy>__production`, the versions' manifests (the promotion record),
and the rollout state with its log. A kill between two of them used to leave registry production v2 with serving on
v1, which no command could repair. Now:

1. everything the change needs is prepared first (an embedder's collections built: minutes, outside the lock);
2. the **intent** is written (atomically) with every target value *and* the values it replaces;
3. each step sets a value (never toggles), so repeating one is harmless; the log line carries the intent's id
   and is appended once;
4. the intent is removed last.

The next open — `rag serve` starting or refreshing, canary_sensor's tick, every lifecycle step and `rag models`
command (via recover()) — finds an unfinished intent and rolls it forward; when a step can no longer be done (a
collection or a version is gone) it rolls back to the recorded values instead. Either way it ends whole and says so.

Where the intent, the rollout states, the log and the lock live is rag.state's backend: files under the registry
root with flock (the default; the paths below), or PostgreSQL tables with an advisory lock when a database is
configured (RAG_STATE_DB_URL, or FEEDBACK_DB_URL naming PostgreSQL). The steps and their guarantees are these, on
either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from rag.index.qdrant import alias_target, point_alias_to
from rag.registry import KINDS, ModelRegistry
from rag.state import StateBackend, StateBusy, for_registry

Log = Callable[[str], None]
_held = threading.local()  # lock depth per (thread, lock): a step inside a step must not deadlock on its own lock
LIFECYCLE = "lifecycle"  # the lock's name in the state backend
INTENT = "rollout/intent"
_last_marks: dict[StateBackend, tuple] = {}  # per backend: the last state marks read (see state_marks)
logger = logging.getLogger(__name__)


class PendingTransaction(RuntimeError):
    """An unfinished promotion or rollback needs Qdrant to complete and none could be opened here."""


class LifecycleBusy(RuntimeError):
    """Another process holds the lifecycle lock: a promotion or rollback is running now (a killed one holds none)."""


class Intent(BaseModel):
    """One change of production, written before its first step: what to set, and what it replaces."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    kind: str
    action: str  # promote | revert | canary-promote | canary-rollback | canary-start | rollback-to-base
    at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    approved_by: str = ""  # who or what decided: an operator's reason, a sensor's run, a gate verdict
    production_before: str | None = None
    production_after: str | None = None
    set_production: bool = True  # False: production's alias is left alone (a canary's start or rollback)
    serving_before: dict[str, str | None] = Field(default_factory=dict)  # serving alias -> collection (None: absent)
    serving_after: dict[str, str] = Field(default_factory=dict)
    clear_candidate: str | None = None  # this version's `candidate` alias is cleared (if it still points there)
    manifests: dict[str, dict] = Field(default_factory=dict)  # version -> metrics merged into its manifest
    rollout_state: dict | None = None  # the RolloutState written for `kind`
    log_entry: dict | None = None  # the rollout log line


def lifecycle_dir(registry: ModelRegistry) -> Path:
    """The file backend's folder (rag.state.files); with a database the state is not there."""
    return registry.root / "rollout"


def intent_path(registry: ModelRegistry) -> Path:
    return lifecycle_dir(registry) / "intent.json"


def state_path(registry: ModelRegistry, kind: str) -> Path:
    return lifecycle_dir(registry) / f"{kind}.json"


def log_path(registry: ModelRegistry) -> Path:
    return lifecycle_dir(registry) / "log.jsonl"


def state_key(kind: str) -> str:
    return f"rollout/{kind}"


def backend(registry: ModelRegistry) -> StateBackend:
    return for_registry(registry)


@contextlib.contextmanager
def lifecycle_lock(registry: ModelRegistry, wait: bool = True) -> Iterator[None]:
    """One lifecycle change at a time across processes (the backend's lock: flock, or a PostgreSQL advisory lock),
    re-entrant within a thread: conclude() holds it while its promotion runs. `wait=False` raises LifecycleBusy
    instead of waiting (readers that must not block for the minutes a promotion spends building collections under
    the lock)."""
    store = backend(registry)
    key = store.lock_id(LIFECYCLE)
    depth = getattr(_held, "depth", {})
    _held.depth = depth
    if depth.get(key):
        depth[key] += 1
        try:
            yield
        finally:
            depth[key] -= 1
        return
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(store.hold(LIFECYCLE, wait))
        except StateBusy as busy:
            raise LifecycleBusy(f"another process is changing production now ({busy})") from None
        depth[key] = 1
        try:
            yield
        finally:
            depth[key] = 0


def pending(registry: ModelRegistry) -> Intent | None:
    raw = backend(registry).read(INTENT)
    return Intent.model_validate_json(raw) if raw is not None else None


def _write_intent(registry: ModelRegistry, intent: Intent) -> None:
    backend(registry).write(INTENT, intent.model_dump_json(indent=2))


def _clear_intent(registry: ModelRegistry) -> None:
    backend(registry).delete(INTENT)


def read_state_text(registry: ModelRegistry, kind: str) -> str | None:
    """The stored RolloutState of `kind` as JSON (None: never started)."""
    return backend(registry).read(state_key(kind))


def state_marks(registry: ModelRegistry) -> tuple:
    """Changes whenever a kind's rollout state is written: a server re-reads the states only then. On a database
    it is one query at most every rag.state.sql.MARKS_TTL_SECONDS; while the database cannot be reached the last
    marks are repeated (an outage is no change: the server keeps serving what it read)."""
    store = backend(registry)
    try:
        marks = store.marks([state_key(kind) for kind in KINDS])
    except Exception as exc:  # noqa: BLE001 - connection errors of the state database
        if store not in _last_marks:
            raise
        logger.warning("rollout state not re-read: %s cannot be reached (%s)", store.describe(), exc)
        return _last_marks[store]
    _last_marks[store] = marks
    return marks


def _write_state(registry: ModelRegistry, kind: str, state: dict) -> None:
    backend(registry).write(state_key(kind), json.dumps(state, indent=2, default=str))


def _logged(registry: ModelRegistry, intent_id: str) -> bool:
    return backend(registry).logged(intent_id)


def append_log(registry: ModelRegistry, entry: dict) -> None:
    backend(registry).append(entry)


def history_entries(registry: ModelRegistry, limit: int | None = None) -> list[dict]:
    return backend(registry).entries(limit)


def _needs_qdrant(intent: Intent) -> bool:
    return bool(intent.serving_after or intent.serving_before)


def _apply(registry: ModelRegistry, intent: Intent, client) -> None:
    """Every step of the intent, each idempotent, in an order where the registry follows serving: readers that
    resolve `production` and the serving aliases see the new model no earlier than its collection serves."""
    for alias, collection in intent.serving_after.items():
        if alias_target(client, alias) != collection:
            point_alias_to(client, alias, collection)
    if intent.set_production and registry.aliases()[intent.kind].get("production") != intent.production_after:
        registry.set_alias(intent.kind, "production", intent.production_after)
    if intent.clear_candidate and registry.aliases()[intent.kind].get("candidate") == intent.clear_candidate:
        registry.set_alias(intent.kind, "candidate", None)
    for version, metrics in intent.manifests.items():
        registry.update_metrics(intent.kind, version, metrics)
    if intent.rollout_state is not None:
        _write_state(registry, intent.kind, intent.rollout_state)
    if intent.log_entry is not None and not _logged(registry, intent.id):
        append_log(registry, {**intent.log_entry, "op": intent.id})
    _clear_intent(registry)


def _undo(registry: ModelRegistry, intent: Intent, client, why: str, log: Log) -> None:
    """Back to the values the intent recorded as before: serving aliases, production alias. Manifests and rollout
    state are left as they were before the intent (they are written after every alias, so an intent that could not
    set its aliases never reached them)."""
    for alias, collection in intent.serving_before.items():
        if collection is None:
            if alias_target(client, alias) is not None:
                from qdrant_client import models

                client.update_collection_aliases(
                    change_aliases_operations=[
                        models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))
                    ]
                )
        elif alias_target(client, alias) != collection:
            point_alias_to(client, alias, collection)
    if intent.set_production and registry.aliases()[intent.kind].get("production") != intent.production_before:
        registry.set_alias(intent.kind, "production", intent.production_before)
    append_log(
        registry,
        {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "kind": intent.kind,
            "step": "recovered",
            "op": intent.id,
            "reason": f"unfinished {intent.action} rolled back: {why}",
            "production": intent.production_before,
        },
    )
    _clear_intent(registry)
    log(
        f"WARNING: unfinished {intent.kind} {intent.action} ({intent.at}) rolled back: {why}; production is "
        f"{intent.production_before or 'the implicit v0'} again"
    )


def run(registry: ModelRegistry, intent: Intent, client=None, log: Log = print) -> None:
    """Record the intent, then apply it. Call under lifecycle_lock, after recover()."""
    if _needs_qdrant(intent) and client is None:
        raise PendingTransaction(f"{intent.kind} {intent.action} changes serving aliases: it needs a Qdrant client")
    _write_intent(registry, intent)
    _apply(registry, intent, client)


def recover(
    registry: ModelRegistry, client_opener: Callable[[], object] | None = None, log: Log = print, wait: bool = True
) -> str | None:
    """Finish or undo an unfinished transaction left by a killed process. Returns what was done (None: nothing was
    pending). `client_opener` opens Qdrant when the transaction swaps serving aliases; without one such a
    transaction raises PendingTransaction (saying what will complete it) and stays pending. `wait=False`: raise
    LifecycleBusy while another process holds the lock (its intent is live, not abandoned)."""
    with lifecycle_lock(registry, wait):
        intent = pending(registry)
        if intent is None:
            return None
        client = None
        if _needs_qdrant(intent):
            if client_opener is None:
                raise PendingTransaction(
                    f"an unfinished {intent.kind} {intent.action} (started {intent.at}) must swap Qdrant serving "
                    "aliases to complete: it completes on the next `rag serve` start, lifecycle step or "
                    "`rag models recover`"
                )
            client = client_opener()
        missing = _missing(registry, intent, client)
        if missing:
            _undo(registry, intent, client, missing, log)
            return f"rolled back an unfinished {intent.kind} {intent.action}: {missing}"
        _apply(registry, intent, client)
        log(
            f"completed an unfinished {intent.kind} {intent.action} ({intent.at}): production "
            f"{intent.production_after if intent.set_production else 'unchanged'}"
        )
        return f"completed an unfinished {intent.kind} {intent.action}"


def _missing(registry: ModelRegistry, intent: Intent, client) -> str | None:
    """Why the intent can no longer be rolled forward (None: it can)."""
    if (
        intent.set_production
        and intent.production_after is not None
        and registry.resolve(intent.kind, intent.production_after) is None
    ):
        return f"{intent.kind} {intent.production_after} is no longer registered"
    if intent.serving_after:
        existing = {c.name for c in client.get_collections().collections}
        gone = sorted(c for c in intent.serving_after.values() if c not in existing)
        if gone:
            return f"collection(s) {', '.join(gone)} no longer exist"
    return None


def consistency(registry: ModelRegistry, kind: str) -> dict:
    """Registry production, the rollout state's view of production and the pending intent, for checks and /health."""
    from rag.rollout.state import RolloutState

    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}")
    raw = read_state_text(registry, kind)
    state = RolloutState.model_validate_json(raw) if raw is not None else None
    by_state = None
    if state is not None:
        by_state = state.candidate_version if state.stage == "production" else state.production_version
    return {
        "registry": registry.aliases()[kind].get("production"),
        "rollout": by_state,
        "rollout_stage": state.stage if state else None,
        "pending": pending(registry) is not None,
    }
