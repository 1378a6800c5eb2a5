"""The configuration that serves queries: `<data dir>/active_configuration.yaml` (AnswerSettings fields, what
`rag ask` and the API read), replaced only by an explicit apply step that is logged with what it replaced."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml

from rag.store import data_dir

ACTIVE_FILE = "active_configuration.yaml"
HISTORY_FILE = "active_configuration_log.jsonl"


def active_path(root: Path | None = None) -> Path:
    return Path(root or data_dir()) / ACTIVE_FILE


def active_file(root: Path | None = None) -> Path | None:
    """The active configuration's file when one was applied: what `rag ask` and the API read by default."""
    path = active_path(root)
    return path if path.exists() else None


def load_active_configuration(root: Path | None = None) -> dict | None:
    """The active settings as a dict (None when nothing was applied yet)."""
    path = active_file(root)
    if path is None:
        return None
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of answer settings")
    return raw


def apply_configuration(source: Path, root: Path | None = None, *, reason: str = "") -> dict:
    """Make the settings in `source` (a best_config.yaml) the active ones. Validated against AnswerSettings when
    the answer pipeline is installed; written atomically; appended to the log with the previous settings."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist: run `rag search-config` first")
    text = source.read_text()
    settings = yaml.safe_load(text) or {}
    if not isinstance(settings, dict):
        raise ValueError(f"{source}: expected a mapping of answer settings")
    try:
        from rag.qa import AnswerSettings
    except ImportError:
        AnswerSettings = None
    if AnswerSettings is not None:
        AnswerSettings(**settings)  # a config the answer pipeline would refuse must not become active
    settings, text = _follow_production(settings, text)
    path = active_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = load_active_configuration(root)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-active-", suffix=".yaml")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    entry = {
        "applied_at": datetime.now(timezone.utc).isoformat(),
        "source": str(source),
        "reason": reason,
        "settings": settings,
        "previous": previous,
    }
    with open(path.parent / HISTORY_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, default=str) + "\n")
    return entry


def _follow_production(settings: dict, text: str) -> tuple[dict, str]:
    """A winner that names the base embedder serves `production` instead: the search measured the base model, and
    production is the base or a model the gate found better than it. Pinning the base would hide every later
    promotion from users while the configuration is active."""
    from rag.registry import IMPLICIT_PRODUCTION

    if settings.get("model") != IMPLICIT_PRODUCTION["embedder"]:
        return settings, text
    settings = {**settings, "model": "production"}
    note = (
        f"# model: production (the search measured {IMPLICIT_PRODUCTION['embedder']}, the base model production "
        "starts from; promotions are served)\n"
    )
    return settings, note + yaml.safe_dump(settings, sort_keys=False)


def history(root: Path | None = None) -> list[dict]:
    path = Path(root or data_dir()) / HISTORY_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
