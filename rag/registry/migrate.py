"""`rag models migrate-registry`: a registry of the folder format (before MLflow: `aliases.json` plus
`<kind>/vN/manifest.json`) into MLflow, in place.

Every version keeps its number (MLflow version N for folder vN: served names like ft-minilm-v3 name Qdrant
collections and must not change) and its folder, which becomes the version's source; the aliases follow; the old
alias table is deleted last. Safe to re-run, and to kill: a re-run finishes what a killed one started (a version
created but not yet marked ready has its folder complete, so the repair finishes it) and changes nothing once done.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from rag.registry import (
    ALIASES,
    KINDS,
    LEGACY_ALIASES,
    MANIFEST,
    MANIFEST_SHA_TAG,
    READY,
    REGISTERING,
    STATE_TAG,
    ModelRegistry,
    ModelVersion,
    RegistryError,
    _complete,
    mirror_tags,
)
from rag.registry.backend import MODEL_NAME, MlflowSettings
from rag.store import fsync_dir


def folder_versions(root: Path, kind: str) -> list[int]:
    """The version numbers the folder registry holds: folders vN with the manifest of vN (the old registry ignored
    a folder without one, a registration that never completed)."""
    folder = Path(root) / kind
    if not folder.is_dir():
        return []
    numbers = (int(p.name[1:]) for p in folder.iterdir() if p.name[:1] == "v" and p.name[1:].isdigit())
    return sorted(n for n in numbers if _complete(folder / f"v{n}", f"v{n}"))


def migrate_folder_registry(
    root: Path, *, settings: MlflowSettings | None = None, log: Callable[[str], None] = print
) -> dict:
    """Register every folder version in MLflow under its number, set the aliases of aliases.json, delete
    aliases.json. Returns what it changed: {"versions": [...], "aliases": [...], "removed": bool}."""
    registry = ModelRegistry(root, settings)
    table_path = registry.root / LEGACY_ALIASES
    created, aliased = [], []
    with registry._locked():
        client = registry.mlflow_client(legacy_ok=True)
        registry._repair(client)  # finishes a version a killed migration created; drops a number it was skipping
        for kind in KINDS:
            present = {int(v.version): v for v in registry._all_versions(client, kind)}
            for number in folder_versions(registry.root, kind):
                found = present.get(number)
                if found is not None and found.tags.get(STATE_TAG) == READY:
                    continue
                if found is not None and found.tags.get(STATE_TAG) == REGISTERING and found.tags.get("rag.migrated"):
                    # A killed migration's, with its files uploaded before it was created (a shared store's repair
                    # leaves such versions to their owner; here, that is this migration).
                    client.set_model_version_tag(MODEL_NAME[kind], str(number), STATE_TAG, READY)
                    created.append(found.tags.get("rag.name", f"{kind} v{number}"))
                    continue
                if found is not None:
                    raise RegistryError(
                        f"MLflow's {MODEL_NAME[kind]} version {number} ({registry.registry_uri}) is not "
                        f"the folder version v{number} and not ready (state "
                        f"{found.tags.get(STATE_TAG, 'none: not made by rag')}): delete it in MLflow "
                        "(`make mlflow`) and re-run the migration"
                    )
                created.append(_register_in_place(registry, client, kind, number))
                log(f"{kind}: registered {created[-1]} in MLflow as version {number}")
        table = json.loads(table_path.read_text()) if table_path.exists() else {}
        for kind in KINDS:
            held = client.get_registered_model(MODEL_NAME[kind]).aliases
            for alias, version in sorted((table.get(kind) or {}).items()):
                if alias not in ALIASES:
                    log(f"{kind}: alias {alias!r} of aliases.json skipped: rag knows only {', '.join(ALIASES)}")
                    continue
                number = int(str(version).removeprefix("v"))
                if number not in folder_versions(registry.root, kind):
                    log(
                        f"{kind}: alias {alias} -> {version} of aliases.json skipped: "
                        "that version has no complete folder"
                    )
                    continue
                if held.get(alias) != number:
                    client.set_registered_model_alias(MODEL_NAME[kind], alias, str(number))
                    aliased.append(f"{kind} {alias} -> v{number}")
                    log(f"{kind}: {alias} -> v{number}")
        removed = table_path.exists()
        if removed:  # last: while it is there, every other command refuses and a re-run completes the migration
            table_path.unlink()
            fsync_dir(registry.root)
            log(f"removed {table_path}: MLflow holds the aliases now")
        if created or aliased or removed:
            registry._touch()
    return {"versions": created, "aliases": aliased, "removed": removed}


def _register_in_place(registry: ModelRegistry, client, kind: str, number: int) -> str:
    """MLflow version `number` for the folder vN as it is. MLflow numbers from one above the highest number it ever
    gave, so numbers the folder registry skipped are taken (created, then deleted) until `number` comes."""
    folder = registry.root / kind / f"v{number}"
    manifest = (folder / MANIFEST).read_bytes()
    mv = ModelVersion(**json.loads(manifest), path=folder)
    tags = {**mirror_tags(mv), STATE_TAG: REGISTERING, "rag.migrated": "from the folder registry (aliases.json)"}
    run_id, source = None, str(folder.resolve())
    if not registry.embedded:  # a shared store: the files travel as the artifacts of a run of their own
        run_id, source = registry._upload(client, kind, folder, None)
        client.log_artifact(run_id, str(folder / MANIFEST), "registry")
        tags[MANIFEST_SHA_TAG] = hashlib.sha256(manifest).hexdigest()
    for _ in range(number):
        got = int(client.create_model_version(MODEL_NAME[kind], source, run_id=run_id, tags=tags).version)
        if got == number:
            client.set_model_version_tag(MODEL_NAME[kind], str(number), STATE_TAG, READY)
            return mv.name
        if got > number:
            client.delete_model_version(MODEL_NAME[kind], str(got))
            raise RegistryError(
                f"MLflow's {MODEL_NAME[kind]} ({registry.registry_uri}) has already given out version "
                f"number {number}, so {kind} v{number} ({mv.name}) cannot keep its number, and its served "
                "name names Qdrant collections: migrate into a store that has not registered "
                f"{kind}s yet (unset MLFLOW_TRACKING_URI for the embedded store under {registry.root})"
            )
        client.delete_model_version(MODEL_NAME[kind], str(got))  # a number the folder registry never completed
    raise RegistryError(f"could not give {kind} v{number} its number in MLflow: re-run the migration")
