"""Model registry: every trained model is a versioned directory with a manifest, plus an alias table.

    root/                       default <data dir>/models
      aliases.json              {"embedder": {"production": "v2", "candidate": "v3"}, "reranker": {...}}
      embedder/v1/              the saved model + manifest.json
      embedder/v2/ ...
      reranker/v1/ ...

Versions are never deleted or overwritten. Alias changes replace aliases.json atomically (temp file, fsync,
rename) under a file lock, so a reader sees the old table or the new one, never a torn one.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rag.store import data_dir

Kind = Literal["embedder", "reranker"]
KINDS: tuple[str, ...] = ("embedder", "reranker")
ALIASES = ("production", "candidate")
MANIFEST = "manifest.json"
# Prefix of the name a registered model is served under: ft-minilm-v2 (embedder), ce-minilm-v1 (reranker).
NAME_PREFIX = {"embedder": "ft", "reranker": "ce"}
_VERSION = re.compile(r"^v(\d+)$")
_NAME = re.compile(r"^(ft|ce)-(.+)-(v\d+)$")


class RegistryError(ValueError):
    """A registry request that cannot be served; the message says what to do."""


class ModelVersion(BaseModel):
    """One registered model: where it lives and how it was made (the manifest)."""

    model_config = ConfigDict(extra="allow")
    kind: Kind
    version: str  # "v1", "v2", ...
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


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise RegistryError(f"unknown model kind {kind!r}: use one of {', '.join(KINDS)}")


class ModelRegistry:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else data_dir() / "models"

    # --- locking and the alias table ---------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def aliases(self) -> dict[str, dict[str, str]]:
        path = self.root / "aliases.json"
        table = json.loads(path.read_text()) if path.exists() else {}
        return {kind: dict(table.get(kind) or {}) for kind in KINDS}

    def set_alias(self, kind: Kind, alias: str, version: str | None) -> None:
        """Point `alias` at `version` (None removes it) in one atomic replacement of the alias table."""
        _check_kind(kind)
        if alias not in ALIASES:
            raise RegistryError(f"unknown alias {alias!r}: use one of {', '.join(ALIASES)}")
        with self._locked():
            if version is not None and self._load(kind, version) is None:
                raise RegistryError(f"{kind} {version} is not registered under {self.root}: register it first")
            table = self.aliases()
            if version is None:
                table[kind].pop(alias, None)
            else:
                table[kind][alias] = version
            _write_json_atomic(self.root / "aliases.json", table)

    # --- versions ----------------------------------------------------------------------------------
    def _load(self, kind: str, version: str) -> ModelVersion | None:
        folder = self.root / kind / version
        manifest = folder / MANIFEST
        if not manifest.exists():
            return None  # absent, or a half-copied registration that never got its manifest
        return ModelVersion(**json.loads(manifest.read_text()), path=folder)

    def versions(self, kind: Kind) -> list[ModelVersion]:
        _check_kind(kind)
        folder = self.root / kind
        if not folder.exists():
            return []
        numbers = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _VERSION.match(p.name)))
        return [mv for n in numbers if (mv := self._load(kind, f"v{n}")) is not None]

    def register(self, kind: Kind, model_dir: Path, manifest: dict, *, move: bool = False) -> ModelVersion:
        """Copy (or move) a saved model into the next version directory and write its manifest last, so a
        crash mid-copy leaves a directory without a manifest, which is ignored (and its number skipped)."""
        _check_kind(kind)
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise RegistryError(f"{model_dir} is not a directory: save the model there first")
        with self._locked():
            (self.root / kind).mkdir(parents=True, exist_ok=True)
            taken = [int(m.group(1)) for p in (self.root / kind).iterdir() if (m := _VERSION.match(p.name))]
            version = f"v{max(taken, default=0) + 1}"
            target = self.root / kind / version
            staging = self.root / kind / f".staging-{version}"
            shutil.rmtree(staging, ignore_errors=True)
            if move:
                shutil.move(str(model_dir), staging)
            else:
                shutil.copytree(model_dir, staging)
            base = str(manifest.get("base_model") or "")
            family = manifest.get("family") or self._family(base)
            record = ModelVersion(**{**manifest, "kind": kind, "version": version, "path": target, "family": family,
                                     "name": f"{NAME_PREFIX[kind]}-{family}-{version}",
                                     "created_at": manifest.get("created_at") or datetime.now(UTC).isoformat(timespec="seconds")})
            _write_json_atomic(staging / MANIFEST, record.manifest())
            os.replace(staging, target)
            return record

    def _family(self, base: str) -> str:
        """A fine-tune of ft-minilm-v2 is still of the minilm family: names stay ft-minilm-vN."""
        match = _NAME.match(base)
        if match:
            return match.group(2)
        slug = re.sub(r"[^a-z0-9]+", "-", Path(base).name.lower()).strip("-")
        return slug or "model"

    def update_metrics(self, kind: Kind, version: str, metrics: dict) -> ModelVersion:
        """Merge metrics (e.g. gate results, a benchmark) into a version's manifest."""
        with self._locked():
            mv = self._load(kind, version)
            if mv is None:
                raise RegistryError(f"{kind} {version} is not registered under {self.root}")
            mv.metrics = {**mv.metrics, **metrics}
            _write_json_atomic(mv.path / MANIFEST, mv.manifest())
            return mv

    def resolve(self, kind: Kind, alias_or_version: str) -> ModelVersion | None:
        """"production" | "candidate" | "v3" | "ft-minilm-v3" -> the version, or None when there is none."""
        _check_kind(kind)
        key = alias_or_version
        if key in ALIASES:
            key = self.aliases()[kind].get(key)
            if key is None:
                return None
        match = _NAME.match(key)
        if match and match.group(1) == NAME_PREFIX[kind]:
            mv = self._load(kind, match.group(3))
            return mv if mv is not None and mv.name == key else None
        return self._load(kind, key) if _VERSION.match(key) else None

    def names(self, kind: Kind) -> list[str]:
        return [mv.name for mv in self.versions(kind)]


def is_registry_name(name: str, kind: Kind = "embedder") -> bool:
    """Whether a model name is one the registry answers for (an alias or a registered version's name)."""
    match = _NAME.match(name)
    return name in ALIASES or bool(match and match.group(1) == NAME_PREFIX[kind])


# With nothing promoted yet, "production" means the base model: the implicit v0 every candidate must beat.
IMPLICIT_PRODUCTION = {"embedder": "minilm", "reranker": None}


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
    raise RegistryError(f"no embedder {name!r} in the model registry under {(registry or ModelRegistry()).root}: "
                        "train one (materialize finetuned_embedder / run retrain_job) or use a built-in name")


__all__ = ["ModelRegistry", "ModelVersion", "RegistryError", "ALIASES", "KINDS", "IMPLICIT_PRODUCTION", "is_registry_name",
           "library_versions", "registered_embedder"]
