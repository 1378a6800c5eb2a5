"""What an embedded Qdrant folder is: which engine wrote it, which engine opens it, and the error when another
process holds it. Apart from rag.index.qdrant so that the edge engine can know its own folders without importing
the client layer that opens it."""

from __future__ import annotations

import json
from pathlib import Path

EDGE_ENGINE_MARK = "qdrant-edge"  # meta.json's "engine" in a folder rag.index.edge owns
EDGE_META = "meta.json"


def is_edge_folder(path: str | Path) -> bool:
    """Whether a folder holds an edge engine index. Here, not in rag.index.edge, so local mode can refuse such a
    folder without importing qdrant_edge."""
    try:
        return json.loads((Path(path) / EDGE_META).read_text()).get("engine") == EDGE_ENGINE_MARK
    except (FileNotFoundError, NotADirectoryError, ValueError, AttributeError):
        return False


def is_local_mode_folder(path: str | Path) -> bool:
    """Whether a folder was written by qdrant-client's local mode (its meta.json lists collections, no edge mark)."""
    try:
        meta = json.loads((Path(path) / EDGE_META).read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("engine") != EDGE_ENGINE_MARK and "collections" in meta


def embedded_engine(location: str, engine: str) -> str:
    """The engine that opens an embedded folder: "auto" is Qdrant Edge, except for a folder local mode already
    wrote, which stays on local mode (its data is kept; `rag migrate-engine` moves it to edge)."""
    if engine != "auto":
        return engine
    return "local" if location != ":memory:" and is_local_mode_folder(location) else "edge"


class QdrantLockedError(RuntimeError):
    """The embedded Qdrant folder is held by another process."""
