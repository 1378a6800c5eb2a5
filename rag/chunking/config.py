"""Named strategies (kind + params) read from config/chunking.yaml, and their fingerprints."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, SerializeAsAny, ValidationError

from .registry import KindParams, available_kinds, get_kind
from .spans import BUILDER_VERSION

CONFIG_ENV = "RAG_CHUNKING_CONFIG"
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "config" / "chunking.yaml"

# Strategy names end up in chunk ids, file names and partition keys: keep them plain.
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class ChunkingConfigError(ValueError):
    """A strategy file or strategy name is unusable; the message names the file and strategy."""


class StrategyConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    kind: str
    params: SerializeAsAny[KindParams]

    def to_mapping(self) -> dict[str, Any]:
        """The YAML entry form (`kind` + params), which `parse_strategy` reads back."""
        return {"kind": self.kind, **self.params.model_dump(mode="json")}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in a hand-edited file that hides a copy-paste slip."""

    def construct_mapping(self, node, deep=False):
        keys = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in keys:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


def _format_validation(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "params"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def parse_strategy(name: str, raw: Any, source: str = "<strategies>") -> StrategyConfig:
    """Validate one `name: {kind: ..., **params}` entry; errors say where and what."""
    where = f"{source}: strategy {name!r}"
    if not isinstance(name, str) or not _NAME.match(name):
        raise ChunkingConfigError(f"{where}: names use lowercase letters, digits, '-', '_' or '.'")
    if not isinstance(raw, Mapping):
        raise ChunkingConfigError(f"{where}: expected a mapping with a 'kind' key, got {type(raw).__name__}")
    params = dict(raw)
    kind_name = params.pop("kind", None)
    if kind_name is None:
        raise ChunkingConfigError(f"{where}: missing 'kind' (one of: {', '.join(available_kinds())})")
    try:
        kind = get_kind(str(kind_name))
    except KeyError:
        raise ChunkingConfigError(
            f"{where}: unknown kind {kind_name!r} (known: {', '.join(available_kinds())})"
        ) from None
    try:
        validated = kind.params_model.model_validate(params)
    except ValidationError as err:
        raise ChunkingConfigError(f"{where} (kind {kind.name!r}): {_format_validation(err)}") from None
    return StrategyConfig(name=name, kind=kind.name, params=validated)


def config_path(path: Path | str | None = None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get(CONFIG_ENV)
    return Path(env) if env else DEFAULT_CONFIG_PATH


def load_strategies(path: Path | str | None = None) -> dict[str, StrategyConfig]:
    """All strategies of the YAML file (default: $RAG_CHUNKING_CONFIG, else config/chunking.yaml),
    in file order."""
    path = config_path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise ChunkingConfigError(f"{path}: chunking config not found") from None
    except yaml.YAMLError as err:
        raise ChunkingConfigError(f"{path}: invalid YAML: {err}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("strategies"), Mapping):
        raise ChunkingConfigError(f"{path}: expected a top-level 'strategies:' mapping of name -> kind + params")
    return {name: parse_strategy(name, raw, str(path)) for name, raw in data["strategies"].items()}


def strategy_fingerprint(config: StrategyConfig) -> str:
    """Stable hash of what determines a strategy's chunks: kind (and its algorithm version), params
    (defaults included) and the shared builder's version. The name is left out on purpose: renaming
    a strategy does not change its chunks' content."""
    payload = {
        "kind": config.kind,
        "kind_version": get_kind(config.kind).version,
        "builder_version": BUILDER_VERSION,
        "params": config.params.model_dump(mode="json"),
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
