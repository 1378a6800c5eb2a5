"""Parquet tables on local disk with atomic replacement, one file per (table, partition)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

_SAFE_PART = re.compile(r"^[A-Za-z0-9._=-]+$")


def data_dir(explicit: str | Path | None = None) -> Path:
    """Where all data and state live: `RAG_DATA_DIR`, else ./data."""
    return Path(explicit or os.environ.get("RAG_DATA_DIR") or "data").resolve()


class TableStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, table: str, partition: str | None = None) -> Path:
        for part in (table, partition):
            if part is not None and not _SAFE_PART.match(part):
                raise ValueError(f"unsafe table or partition name {part!r}: use letters, digits, '.', '_', '-', '='")
        folder = self.root / table
        if partition is not None:
            folder = folder / partition
        return folder / "data.parquet"

    def exists(self, table: str, partition: str | None = None) -> bool:
        return self.path(table, partition).exists()

    def read(self, table: str, partition: str | None = None, columns: list[str] | None = None) -> pd.DataFrame | None:
        path = self.path(table, partition)
        if not path.exists():
            return None
        return pq.read_table(path, columns=columns).to_pandas()

    def write(
        self, df: pd.DataFrame, table: str, partition: str | None = None, schema: pa.Schema | None = None
    ) -> Path:
        """Write to a temp file in the same folder, fsync, then rename: readers never see a torn file."""
        path = self.path(table, partition)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrow = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
        atomic_write(path, lambda fh: pq.write_table(arrow, fh))
        return path


# Table names shared by the Dagster assets and the library pipeline (`rag index`), so both see one state.
DOCUMENTS_TABLE = "parsed_documents"
QUARANTINE_TABLE = "document_quarantine"
CHUNKS_TABLE = "chunk_sets"
CHUNK_FAILURES_TABLE = "chunk_failures"  # documents whose last chunking failed, per strategy


def bm25_root(root: Path, strategy: str) -> Path:
    """Folder of the BM25 index of a strategy's chunk set under a data dir."""
    return Path(root) / "indexes" / "bm25" / strategy


def fsync_dir(folder: Path) -> None:
    """Make a rename or removal inside `folder` durable: it is only once the folder itself is synced."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write, mode: str = "wb") -> None:
    """Write a file so readers see the old or the new content, never a torn one (even after kill -9 or a power
    cut): a temp file beside it, fsync, rename, then fsync of the folder (the rename is durable only then)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
