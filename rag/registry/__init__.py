"""Model registry on MLflow: every trained model is a registered MLflow model version, every alias an MLflow alias.

    MLflow (embedded: sqlite:///<root>/mlflow.db; MLFLOW_TRACKING_URI: a team server, see rag.registry.backend)
      registered model rag-embedder   versions 1, 2, 3 ...   aliases production -> 2, candidate -> 3
      registered model rag-reranker   ...
      experiments rag-embedder-training, rag-reranker-training: one run per training (rag.registry.tracking)
    root/                             default <data dir>/models
      embedder/v2/                    the saved model + manifest.json: MLflow version 2's source (embedded mode)
      reranker/v1/ ...
      mlartifacts/                    the runs' artifacts (embedded mode)
      .changed                        rewritten by every registration and alias change (serving's cheap signal)
      .lock                           the writers' lock

The change signal and the writers' lock are rag.state's: these files by default, a row and a PostgreSQL advisory
lock when a database is configured (so writers on several machines sharing one MLflow exclude each other too).

MLflow alone says which versions exist and where the aliases point; there is no alias table beside it. The manifest
(how the model was made, its metrics, gate verdict, promotion record) stays in the version's folder, read with the
weights; its key fields are mirrored as version tags so the MLflow UI shows them.

Registration survives a kill at any point: the MLflow version is created in state `registering`, the folder is put
in place complete (files, manifest, one rename), and only then is the version tagged `ready`; readers see ready
versions only. Each registration (and a process's first use of the store) repairs what a kill left: a registering
version whose folder is complete is finished, any other is deleted together with its folder, staging folders are
reclaimed. Writers hold a lock around every read-check-write; moving an alias is one MLflow call.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from rag.registry.backend import DB_NAME, EXPERIMENT, MODEL_NAME, MlflowSettings
from rag.state import StateBusy, for_registry
from rag.store import data_dir, fsync_dir

Kind = Literal["embedder", "reranker", "configuration"]
# configuration: the serving configuration (chunk set, retrieval mode, hybrid weight) people's questions chose
# (rag.training.configuration); a version holds configuration.yaml instead of weights.
KINDS: tuple[str, ...] = ("embedder", "reranker", "configuration")
ALIASES = ("production", "candidate")
MANIFEST = "manifest.json"
# Prefix of the name a registered model is served under: ft-minilm-v2 (embedder), ce-minilm-v1 (reranker).
NAME_PREFIX = {"embedder": "ft", "reranker": "ce", "configuration": "cfg"}
_VERSION = re.compile(r"^v(\d+)$")
_NAME = re.compile(r"^(ft|ce|cfg)-(.+)-(v\d+)$")

STATE_TAG = "rag.state"  # on each MLflow version: "registering" until its folder is complete, then "ready"
READY, REGISTERING = "ready", "registering"
MANIFEST_SHA_TAG = "rag.manifest_sha256"  # shared store: which manifest.json artifact is current
GATE_RUN_TAG = "rag.gate_run_id"  # a version registered without a training run: the run its gate verdict went to
# On each registered model: what serves, as "vN · name", the base before any promotion included ("v0 · ..."). MLflow
# numbers versions from 1 and an alias can only name one of them, so the built-in base that serves first (the implicit
# v0, no weights of ours to register) is shown by this tag, kept in step with the production alias by set_alias.
PRODUCTION_TAG = "rag.production"
BASE_V0 = {
    "embedder": "v0 · minilm (the built-in all-MiniLM-L6-v2; no MLflow version: MLflow numbers from 1)",
    "reranker": "v0 · no reranker (the first stage's order)",
    "configuration": "v0 · the server's own settings",
}
MARKER = ".changed"
CHANGED = "registry/changed"  # the change signal's key in the state backend (the file backend's MARKER)
WRITERS = "registry"  # the writers' lock in the state backend
LEGACY_ALIASES = "aliases.json"  # the folder registry's alias table, before MLflow
# On a shared store another machine may be registering right now, beyond this machine's file lock: only versions
# left in `registering` for this long count as abandoned.
STALE_REGISTRATION_S = 24 * 3600


class RegistryError(ValueError):
    """A registry request that cannot be served; the message says what to do."""


class ModelVersion(BaseModel):
    """One registered model: where it lives and how it was made (the manifest)."""

    model_config = ConfigDict(extra="allow")
    kind: Kind
    version: str  # "v1", "v2", ...: MLflow version N is "vN"
    name: str  # what it is served under: "ft-minilm-v2"
    path: Path
    created_at: str
    base_model: str = ""  # what training started from: "minilm", a directory, or a registered name
    family: str = ""  # the built-in the lineage started from (names the versions)
    parent_version: str | None = None  # the production version it was meant to replace
    training_data_hash: str = ""  # the QA set version / hash of the training pairs
    hyperparameters: dict = Field(default_factory=dict)
    seed: int | None = None
    library_versions: dict[str, str] = Field(default_factory=dict)
    metrics: dict = Field(default_factory=dict)  # {"dev": {...}, "gate": {...}, "scifact": {...}}
    run_id: str | None = None  # the MLflow run that trained it (read from MLflow, never from the manifest file)
    _tags: dict = PrivateAttr(default_factory=dict)  # the MLflow version's tags when it was read

    def manifest(self) -> dict:
        return json.loads(self.model_dump_json(exclude={"path"}))


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("sentence-transformers", "transformers", "torch", "datasets", "ranx", "numpy"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def _write_json_atomic(path: Path, data: dict) -> None:
    from rag.store import atomic_write

    atomic_write(path, lambda fh: json.dump(data, fh, indent=2, sort_keys=True), mode="w")


def _manifest_file(mv: ModelVersion) -> dict:
    """What manifest.json holds: the run link is MLflow's, so it is not kept a second time in the file."""
    return json.loads(mv.model_dump_json(exclude={"path", "run_id"}))


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise RegistryError(f"unknown model kind {kind!r}: use one of {', '.join(KINDS)}")


def _complete(folder: Path, version: str) -> bool:
    """A version folder put in place by a registration: it has the manifest of exactly that version."""
    try:
        return json.loads((folder / MANIFEST).read_text()).get("version") == version
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return False


def mirror_tags(mv: ModelVersion) -> dict[str, str]:
    """Manifest fields shown as MLflow version tags: lineage, the gate's outcome, who approved a promotion."""
    extra = mv.model_extra or {}
    tags = {
        "rag.name": mv.name,
        "rag.base_model": mv.base_model,
        "rag.family": mv.family,
        "rag.parent_version": mv.parent_version,
        "rag.training_data_hash": mv.training_data_hash,
        "rag.qa_set_version": extra.get("qa_set_version"),
        "rag.strategy": extra.get("strategy"),
        "rag.seed": mv.seed,
    }
    for section, keys in (
        ("gate", ("outcome", "passed", "against", "questions", "gated_at")),
        ("promotion", ("approved_by", "at", "previous_version", "forced", "force_reason")),
        ("canary", ("decision", "reason")),
        ("reverted", ("at", "reason")),
    ):
        record = mv.metrics.get(section)
        if isinstance(record, dict):
            tags.update({f"{section}.{k}": record.get(k) for k in keys})
    return {k: str(v)[:5000] for k, v in tags.items() if v is not None and v != ""}


class _RootLock:
    """The registry's writers' lock, re-entrant within a process: register() repairs and reads while holding it."""

    def __init__(self):
        self.rlock = threading.RLock()
        self.depth = 0
        self.held: contextlib.ExitStack | None = None


_root_locks: dict[Path, _RootLock] = {}
_root_state: dict[tuple, dict] = {}
_guard = threading.Lock()


def _shared(table: dict, key, factory):
    with _guard:
        if key not in table:
            table[key] = factory()
        return table[key]


class ModelRegistry:
    def __init__(self, root: Path | None = None, settings: MlflowSettings | None = None):
        self.root = Path(root) if root is not None else data_dir() / "models"
        self.settings = settings or MlflowSettings.from_env()

    # --- where MLflow is ---------------------------------------------------------------------------
    @property
    def embedded(self) -> bool:
        return self.settings.embedded

    @property
    def tracking_uri(self) -> str:
        return self.settings.uris(self.root)[0]

    @property
    def registry_uri(self) -> str:
        return self.settings.uris(self.root)[1]

    def _state(self) -> dict:
        """Per process and store: whether it was repaired, experiment ids, the last alias table seen."""
        return _shared(_root_state, (str(self.root.resolve()), *self.settings.uris(self.root)), dict)

    def _refuse_legacy(self) -> None:
        # Refused, not migrated on the fly: migrating writes a new store (with MLFLOW_TRACKING_URI, onto a team's
        # server), and a serving process or a sensor tick is no place to do that behind the operator's back.
        db_missing = self.embedded and not (self.root / DB_NAME).exists()
        if (self.root / LEGACY_ALIASES).exists() or (
            db_missing and any(any((self.root / kind).glob(f"v*/{MANIFEST}")) for kind in KINDS)
        ):
            raise RegistryError(
                f"{self.root} holds a model registry in the old folder format (aliases.json and version "
                f"manifests) that MLflow does not know yet: run `rag models migrate-registry --root "
                f"{self.root}` once (it registers every version in MLflow under its number and sets "
                "the aliases; safe to re-run)"
            )

    def mlflow_client(self, *, create: bool = True, legacy_ok: bool = False):
        """The MlflowClient of this registry's store. `create`: make the embedded store (a copy of the template) if
        there is none yet; without it, None when there is no store yet (nothing was ever registered)."""
        from rag.registry import backend

        if not legacy_ok:
            self._refuse_legacy()
        db = self.root / DB_NAME
        if self.embedded and not db.exists():
            if not create:
                return None
            with self._locked():
                if not db.exists():
                    self.root.mkdir(parents=True, exist_ok=True)
                    backend.create_embedded_store(db)
        client = backend.client(*self.settings.uris(self.root))
        state = self._state()
        # A store made before a kind existed (an embedded one copied from an older template too) lacks its model.
        if create and not state.get("models"):
            backend.ensure_registered_models(client)
            state["models"] = True
        if not state.get("repaired"):
            # The first use in a process repairs what a killed registration left, unless a writer holds the lock
            # right now (a registration, which repairs first itself). Readers never see a half version either way.
            with contextlib.suppress(OSError), self._locked(blocking=False) as held:
                if held:
                    self._repair(client)
                    state["repaired"] = True
        return client

    def experiment_id(self, kind: Kind) -> str:
        """The kind's training experiment (created on first use; embedded: its artifacts under <root>/mlartifacts)."""
        from rag.registry.backend import already_exists

        state = self._state().setdefault("experiments", {})
        if kind in state:
            return state[kind]
        client = self.mlflow_client()
        found = client.get_experiment_by_name(EXPERIMENT[kind])
        if found is None:
            location = (self.root.resolve() / "mlartifacts" / kind).as_uri() if self.embedded else None
            try:
                experiment = client.create_experiment(
                    EXPERIMENT[kind], artifact_location=location, tags={"rag.kind": kind}
                )
            except Exception as exc:  # noqa: BLE001 - another process created it first
                if not already_exists(exc):
                    raise
                experiment = client.get_experiment_by_name(EXPERIMENT[kind]).experiment_id
        else:
            experiment = found.experiment_id
        state[kind] = experiment
        return experiment

    # --- locking and the change signal -------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, blocking: bool = True) -> Iterator[bool]:
        """Holds the registry's writers' lock; `blocking=False` yields False instead of waiting for another holder."""
        lock = _shared(_root_locks, self.root.resolve(), _RootLock)
        if not lock.rlock.acquire(blocking=blocking):
            yield False
            return
        try:
            if lock.depth == 0:
                self.root.mkdir(parents=True, exist_ok=True)
                held = contextlib.ExitStack()
                try:
                    held.enter_context(for_registry(self).hold(WRITERS, blocking))
                except StateBusy:
                    yield False
                    return
                lock.held = held
            lock.depth += 1
            try:
                yield True
            finally:
                lock.depth -= 1
                if lock.depth == 0:
                    lock.held.close()
                    lock.held = None
        finally:
            lock.rlock.release()

    def changed_marker(self) -> Path:
        """The file backend's change signal, rewritten by every registration and alias change made here."""
        return self.root / MARKER

    def _touch(self) -> None:
        for_registry(self).write(CHANGED, uuid.uuid4().hex)

    def change_signature(self) -> tuple:
        """Changes whenever a version is registered or an alias moves: the change signal (changes made through a
        registry: a file's stat, or a database row's token), and the alias table as MLflow holds it (changes made in
        the MLflow UI or from another machine). A store that cannot be reached repeats the last value it gave, so an
        outage does not look like a change."""
        state = self._state()
        try:
            mark = for_registry(self).marks([CHANGED])[0]
            state["signature_mark"] = mark
        except Exception:  # noqa: BLE001 - the state database cannot be reached right now
            mark = state.get("signature_mark")
        try:
            table = tuple((kind, tuple(sorted(aliases.items()))) for kind, aliases in self.aliases().items())
            state["signature_aliases"] = table
        except RegistryError:
            raise
        except Exception:  # noqa: BLE001 - MlflowException / connection errors of a remote store
            table = state.get("signature_aliases")
        return mark, table

    # --- aliases -----------------------------------------------------------------------------------
    def aliases(self) -> dict[str, dict[str, str]]:
        from rag.registry.backend import not_found

        out: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}
        client = self.mlflow_client(create=False)
        if client is None:
            return out
        for kind in KINDS:
            try:
                held = client.get_registered_model(MODEL_NAME[kind]).aliases
            except Exception as exc:  # noqa: BLE001 - a shared store before the first registration
                if not_found(exc):
                    continue
                raise
            out[kind] = {alias: f"v{number}" for alias, number in held.items() if alias in ALIASES}
        return out

    def set_alias(self, kind: Kind, alias: str, version: str | None) -> None:
        """Point `alias` at `version` (None removes it): one MLflow call."""
        from rag.registry.backend import not_found

        _check_kind(kind)
        if alias not in ALIASES:
            raise RegistryError(f"unknown alias {alias!r}: use one of {', '.join(ALIASES)}")
        with self._locked():
            client = self.mlflow_client()
            if version is None:
                try:
                    client.delete_registered_model_alias(MODEL_NAME[kind], alias)
                except Exception as exc:  # noqa: BLE001 - removing an alias that is not set changes nothing
                    if not not_found(exc):
                        raise
            else:
                found = self._mlflow_version(client, kind, version)
                if found is None:
                    raise RegistryError(
                        f"{kind} {version} is not registered under {self.root} ({self.registry_uri}): register it first"
                    )
                client.set_registered_model_alias(MODEL_NAME[kind], alias, found.version)
            if alias == "production":
                self._tag_production(client, kind, None if version is None else found)
            self._touch()

    def record_serving(self) -> dict[str, str]:
        """Make what serves visible in MLflow from the first minute: the store, each kind's training experiment and
        each registered model's PRODUCTION_TAG (the base's "v0 · ..." before any promotion). Idempotent; returns the
        tag per kind."""
        with self._locked():
            client = self.mlflow_client()
            out = {}
            for kind in KINDS:
                self.experiment_id(kind)
                production = self.resolve(kind, "production")
                found = None if production is None else self._mlflow_version(client, kind, production.version)
                out[kind] = self._tag_production(client, kind, found)
            return out

    def _tag_production(self, client, kind: str, found) -> str:
        value = BASE_V0[kind] if found is None else f"v{found.version} · {found.tags.get('rag.name', '')}".strip()
        client.set_registered_model_tag(MODEL_NAME[kind], PRODUCTION_TAG, value)
        return value

    # --- versions ----------------------------------------------------------------------------------
    def _all_versions(self, client, kind: str) -> list:
        """Every MLflow version of the kind's registered model, in any state."""
        from rag.registry.backend import not_found

        try:
            return list(client.search_model_versions(f"name='{MODEL_NAME[kind]}'"))
        except Exception as exc:  # noqa: BLE001
            if not_found(exc):
                return []
            raise

    def _mlflow_version(self, client, kind: str, version: str):
        """The ready MLflow version "vN" names, or None."""
        from rag.registry.backend import not_found

        match = _VERSION.match(version)
        if match is None:
            return None
        try:
            found = client.get_model_version(MODEL_NAME[kind], match.group(1))
        except Exception as exc:  # noqa: BLE001
            if not_found(exc):
                return None
            raise
        return found if found.tags.get(STATE_TAG) == READY else None

    def _record(self, kind: str, found) -> ModelVersion:
        version = f"v{found.version}"
        folder = self.root / kind / version
        if not self.embedded:
            self._fetch(kind, found, folder)
        try:
            data = json.loads((folder / MANIFEST).read_text())
        except FileNotFoundError:
            raise RegistryError(
                f"{kind} {version} is registered in MLflow ({self.registry_uri}) but {folder} has no "
                f"{MANIFEST}: restore that folder from a backup, or, if the model is gone for good, "
                f"delete version {found.version} of {MODEL_NAME[kind]} in MLflow (`make mlflow`)"
            ) from None
        mv = ModelVersion(**{**data, "path": folder, "run_id": found.run_id or None})
        mv._tags = dict(found.tags)
        return mv

    def versions(self, kind: Kind) -> list[ModelVersion]:
        _check_kind(kind)
        client = self.mlflow_client(create=False)
        if client is None:
            return []
        ready = sorted(
            (v for v in self._all_versions(client, kind) if v.tags.get(STATE_TAG) == READY),
            key=lambda v: int(v.version),
        )
        return [self._record(kind, v) for v in ready]

    def resolve(self, kind: Kind, alias_or_version: str) -> ModelVersion | None:
        """ "production" | "candidate" | "v3" | "ft-minilm-v3" -> the version, or None when there is none."""
        from rag.registry.backend import not_found

        _check_kind(kind)
        key = alias_or_version
        client = self.mlflow_client(create=False)
        if client is None:
            return None
        if key in ALIASES:
            try:
                found = client.get_model_version_by_alias(MODEL_NAME[kind], key)
            except Exception as exc:  # noqa: BLE001 - MlflowException
                if not_found(exc):  # a shared store before the first registration
                    return None
                # An unset alias is an INVALID_PARAMETER_VALUE there, like a malformed request: told apart here.
                if key not in self.aliases()[kind]:
                    return None
                raise
            return self._record(kind, found) if found.tags.get(STATE_TAG) == READY else None
        match = _NAME.match(key)
        if match:
            if match.group(1) != NAME_PREFIX[kind]:
                return None
            found = self._mlflow_version(client, kind, match.group(3))
            mv = self._record(kind, found) if found is not None else None
            return mv if mv is not None and mv.name == key else None
        found = self._mlflow_version(client, kind, key)
        return self._record(kind, found) if found is not None else None

    def names(self, kind: Kind) -> list[str]:
        return [mv.name for mv in self.versions(kind)]

    def register(
        self, kind: Kind, model_dir: Path, manifest: dict, *, move: bool = False, run_id: str | None = None
    ) -> ModelVersion:
        """Copy (or move) a saved model into the next version: MLflow version N, folder <root>/<kind>/vN.
        `run_id`: the MLflow run that trained it (rag.registry.tracking), linked from the version.

        Steps, each safe to be killed after: stage the files; create the MLflow version (state registering, its
        source the final folder); write the manifest into the staged folder and rename it into place; tag the
        version ready. Until that last call no reader sees it; the next registration (or a process's first use of
        the store) finishes it if its folder was in place, else deletes it."""
        _check_kind(kind)
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise RegistryError(f"{model_dir} is not a directory: save the model there first")
        with self._locked():
            client = self.mlflow_client()
            highest = self._repair(client, (kind,))[kind]
            folder = self.root / kind
            folder.mkdir(parents=True, exist_ok=True)
            staging = folder / f".staging-{uuid.uuid4().hex[:12]}"
            if move:
                shutil.move(str(model_dir), staging)
            else:
                shutil.copytree(model_dir, staging)
            base = str(manifest.get("base_model") or "")
            family = manifest.get("family") or self._family(base)
            fields = {
                **manifest,
                "kind": kind,
                "family": family,
                "created_at": manifest.get("created_at") or datetime.now(UTC).isoformat(timespec="seconds"),
            }

            def record(number: int) -> ModelVersion:
                return ModelVersion(
                    **{
                        **fields,
                        "version": f"v{number}",
                        "name": f"{NAME_PREFIX[kind]}-{family}-v{number}",
                        "path": folder / f"v{number}",
                        "run_id": run_id,
                    }
                )

            source = None
            if not self.embedded:
                run_id, source = self._upload(client, kind, staging, run_id)
            mv = record(self._create_version(client, kind, run_id, source, highest + 1, record))
            _write_json_atomic(staging / MANIFEST, _manifest_file(mv))
            self._place(staging, mv.path)
            if not self.embedded:
                self._log_manifest(client, kind, mv)
                for key, value in mirror_tags(mv).items():  # its number was not known when it was created
                    client.set_model_version_tag(MODEL_NAME[kind], mv.version[1:], key, value)
            client.set_model_version_tag(MODEL_NAME[kind], mv.version[1:], STATE_TAG, READY)  # the commit point
            self._touch()
            if run_id is not None:  # the way back, for someone looking at the run first
                client.set_tag(run_id, "rag.version", mv.name)
            return mv

    def _create_version(self, client, kind: str, run_id: str | None, source: str | None, expected: int, record) -> int:
        """The new MLflow version's number, created in state registering with the mirror tags of `record(number)`."""
        from rag.registry.backend import ensure_registered_models, not_found

        model = MODEL_NAME[kind]

        def create(source: str, tags: dict) -> int:
            try:
                return int(client.create_model_version(model, source, run_id=run_id, tags=tags).version)
            except Exception as exc:  # noqa: BLE001 - a store another program made (`mlflow ui` on a new path)
                if not not_found(exc):
                    raise
            ensure_registered_models(client)
            return int(client.create_model_version(model, source, run_id=run_id, tags=tags).version)

        if source is not None:
            return create(source, {STATE_TAG: REGISTERING})
        # Embedded: the source is the version's own folder, so its number is asked for: one above every number seen
        # (a repair's deletions included). MLflow gives max + 1 over every number it ever gave, so a number deleted
        # unseen (by someone in the UI) makes the version got name the wrong folder: it is deleted, the next asked for.
        for _ in range(5):
            tags = {**mirror_tags(record(expected)), STATE_TAG: REGISTERING}
            got = create(str((self.root / kind / f"v{expected}").resolve()), tags)
            if got == expected:
                return got
            client.delete_model_version(model, str(got))
            expected = got + 1
        raise RegistryError(
            f"MLflow kept giving {model} version numbers other than the one asked for: is another "
            f"program registering into {self.registry_uri}? Retry the registration"
        )

    def _place(self, staging: Path, target: Path) -> None:
        if target.exists():  # left by a number MLflow gave once and a repair took back: no version owns it
            self._discard(target)
        os.replace(staging, target)
        fsync_dir(target.parent)

    def _discard(self, folder: Path) -> None:
        """Renamed first, then deleted: a kill mid-delete leaves a .deleted-* folder the next repair removes."""
        doomed = folder.parent / f".deleted-{folder.name}-{uuid.uuid4().hex[:8]}"
        os.replace(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _repair(self, client, kinds: tuple[str, ...] = KINDS) -> dict[str, int]:
        """Under the lock: finish or remove what killed registrations left (see the module docstring). Returns the
        highest version number seen per kind, deleted ones included (the next registration asks for one above)."""
        changed, highest = False, {}
        for kind in kinds:
            folder = self.root / kind
            if folder.is_dir():
                for leftover in [*folder.glob(".staging-*"), *folder.glob(".deleted-*")]:
                    shutil.rmtree(leftover, ignore_errors=True)
            found_all = self._all_versions(client, kind)
            highest[kind] = max((int(v.version) for v in found_all), default=0)
            for found in found_all:
                if found.tags.get(STATE_TAG) != REGISTERING:
                    continue
                if not self.embedded and time.time() - found.last_updated_timestamp / 1000 < STALE_REGISTRATION_S:
                    continue
                target = folder / f"v{found.version}"
                if self.embedded and _complete(target, f"v{found.version}"):
                    # Killed after the folder was in place: the version is whole, only its commit is missing.
                    client.set_model_version_tag(MODEL_NAME[kind], found.version, STATE_TAG, READY)
                else:
                    client.delete_model_version(MODEL_NAME[kind], found.version)
                    if target.exists() and self.embedded:
                        self._discard(target)
                changed = True
        if changed:
            self._touch()
        return highest

    def _family(self, base: str) -> str:
        """A fine-tune of ft-minilm-v2 is still of the minilm family: names stay ft-minilm-vN."""
        match = _NAME.match(base)
        if match:
            return match.group(2)
        slug = re.sub(r"[^a-z0-9]+", "-", Path(base).name.lower()).strip("-")
        return slug or "model"

    def update_metrics(self, kind: Kind, version: str, metrics: dict) -> ModelVersion:
        """Merge metrics (e.g. gate results, a promotion record) into a version's manifest; its tags follow."""
        _check_kind(kind)
        with self._locked():
            client = self.mlflow_client()
            found = self._mlflow_version(client, kind, version)
            if found is None:
                raise RegistryError(f"{kind} {version} is not registered under {self.root}")
            mv = self._record(kind, found)
            mv.metrics = {**mv.metrics, **metrics}
            _write_json_atomic(mv.path / MANIFEST, _manifest_file(mv))
            if not self.embedded:
                self._log_manifest(client, kind, mv)
            for key, value in mirror_tags(mv).items():
                if mv._tags.get(key) != value:
                    client.set_model_version_tag(MODEL_NAME[kind], found.version, key, value)
            return mv

    # --- a shared store (MLFLOW_TRACKING_URI): files travel as run artifacts -----------------------
    def _upload(self, client, kind: str, staging: Path, run_id: str | None) -> tuple[str, str]:
        if run_id is None:  # registered by hand (not by a training): a run of its own carries the files
            run_id = client.create_run(
                self.experiment_id(kind), run_name="registration", tags={"rag.kind": kind}
            ).info.run_id
            client.set_terminated(run_id)
        client.log_artifacts(run_id, str(staging), "model")
        return run_id, f"{client.get_run(run_id).info.artifact_uri}/model"

    def _log_manifest(self, client, kind: str, mv: ModelVersion) -> None:
        """The manifest as it is now, uploaded beside the run's files, and its digest as the version's tag."""
        path = mv.path / MANIFEST
        client.log_artifact(mv.run_id, str(path), "registry")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        client.set_model_version_tag(MODEL_NAME[kind], mv.version[1:], MANIFEST_SHA_TAG, digest)

    def _fetch(self, kind: str, found, folder: Path) -> None:
        """The local copy of a shared store's version: weights downloaded once, the manifest whenever the
        version's tag says another one is current."""
        client = self.mlflow_client(create=False)
        if not folder.exists():
            folder.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".download-") as tmp:
                model = Path(client.download_artifacts(found.run_id, "model", tmp))
                manifest = client.download_artifacts(found.run_id, f"registry/{MANIFEST}", str(Path(tmp) / "registry"))
                os.replace(manifest, model / MANIFEST)
                with contextlib.suppress(OSError):  # another process put the same version in place first
                    os.replace(model, folder)
            return
        manifest = folder / MANIFEST
        wanted = found.tags.get(MANIFEST_SHA_TAG)
        if wanted and (not manifest.exists() or hashlib.sha256(manifest.read_bytes()).hexdigest() != wanted):
            with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".download-") as tmp:
                os.replace(client.download_artifacts(found.run_id, f"registry/{MANIFEST}", tmp), manifest)


def is_registry_name(name: str, kind: Kind = "embedder") -> bool:
    """Whether a model name is one the registry answers for (an alias or a registered version's name)."""
    match = _NAME.match(name)
    return name in ALIASES or bool(match and match.group(1) == NAME_PREFIX[kind])


# With nothing promoted yet, "production" means the base model: the implicit v0 every candidate must beat.
IMPLICIT_PRODUCTION = {"embedder": "minilm", "reranker": None, "configuration": None}


def registered_embedder(name: str, registry: ModelRegistry | None = None) -> tuple[str, str | None] | None:
    """For rag.embedding: None when `name` is not a registry name; else (served name, model directory), or
    (built-in name, None) for "production" before any promotion."""
    if not is_registry_name(name, "embedder"):
        return None
    mv = (registry or ModelRegistry()).resolve("embedder", name)
    if mv is not None:
        return mv.name, str(mv.path)
    if name == "production":
        return IMPLICIT_PRODUCTION["embedder"], None
    raise RegistryError(
        f"no embedder {name!r} in the model registry under {(registry or ModelRegistry()).root}: "
        "train one (materialize finetuned_embedder / run retrain_job) or use a built-in name"
    )


__all__ = [
    "ModelRegistry",
    "ModelVersion",
    "RegistryError",
    "ALIASES",
    "KINDS",
    "IMPLICIT_PRODUCTION",
    "BASE_V0",
    "PRODUCTION_TAG",
    "is_registry_name",
    "library_versions",
    "registered_embedder",
]
