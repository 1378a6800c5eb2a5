"""Moving an embedded Qdrant folder written by qdrant-client's local mode to Qdrant Edge, the default engine.

The folder is rebuilt beside itself (`<folder>.edge-staging-<time>`: every collection copied with its vectors and
payloads, the payload indexes added, HNSW built, every alias set, point counts checked), then the two are swapped
by renames: the old folder is kept as `<folder>.local-mode-<time>` until you delete it. A failure before the swap
removes the staging folder and leaves the original as it was. Nothing is re-embedded. Collections written before
BM25 moved into the engine get its sparse vector from their payloads' texts on the way, so their searches rank
BM25 in the engine afterwards (rag.index.bm25_sparse)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rag.index.bm25_sparse import has_bm25
from rag.index.qdrant import (
    QdrantSettings,
    close_client,
    copy_collection,
    get_client,
    is_edge_folder,
    is_local_mode_folder,
    point_alias_to,
)


@dataclass
class Migration:
    folder: Path
    backup: Path  # the local-mode folder as it was, kept
    points: dict[str, int] = field(default_factory=dict)  # collection -> points copied
    bm25_added: list[str] = field(default_factory=list)  # collections that got the BM25 sparse vector on the way
    aliases: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def migrate_to_edge(folder: str | Path, *, log: Callable[[str], None] = print) -> Migration:
    """Rebuild a local-mode folder as an edge folder in place (see the module doc). Stop `rag serve` and Dagster
    first: the copy needs the folder's lock, and a process that opened it before the swap keeps the old files."""
    folder = Path(folder)
    if is_edge_folder(folder):
        raise ValueError(f"{folder} is already a Qdrant Edge folder: nothing to migrate")
    if not is_local_mode_folder(folder):
        raise FileNotFoundError(
            f"{folder} holds no qdrant-client local-mode index (no meta.json listing collections): "
            "point --path at the folder `rag index` or Dagster wrote (default <data dir>/qdrant)"
        )
    started, stamp = time.perf_counter(), time.strftime("%Y%m%dT%H%M%S")
    staging = folder.with_name(f"{folder.name}.edge-staging-{stamp}")
    backup = folder.with_name(f"{folder.name}.local-mode-{stamp}")
    source, target = QdrantSettings(path=str(folder), engine="local"), QdrantSettings(path=str(staging), engine="edge")
    result = Migration(folder=folder, backup=backup)
    src = get_client(source)  # QdrantLockedError when another process holds it: nothing has changed yet
    try:
        dst = get_client(target)
        for collection in sorted(c.name for c in src.get_collections().collections):
            result.points[collection] = copy_collection(src, dst, collection, add_bm25=True)
            if has_bm25(dst, collection) and not has_bm25(src, collection):
                result.bm25_added.append(collection)
            expected = src.count(collection, exact=True).count
            if dst.count(collection, exact=True).count != expected:
                raise RuntimeError(
                    f"{collection}: {dst.count(collection, exact=True).count} points copied of {expected}"
                )
            log(
                f"{collection}: {result.points[collection]} points"
                + (" (BM25 sparse vectors added)" if collection in result.bm25_added else "")
            )
        result.aliases = {a.alias_name: a.collection_name for a in src.get_aliases().aliases}
        for alias, collection in sorted(result.aliases.items()):
            point_alias_to(dst, alias, collection)
        close_client(target)
    except BaseException:
        close_client(target)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        close_client(source)
    os.rename(folder, backup)
    os.rename(staging, folder)
    result.seconds = round(time.perf_counter() - started, 2)
    log(
        f"{folder} is now a Qdrant Edge folder ({len(result.points)} collections, {len(result.aliases)} aliases, "
        f"{result.seconds} s); the local-mode folder is kept at {backup}: delete it once you are satisfied"
    )
    return result
