"""Documents in a folder: stable ids, content hashes, and refusal of paths that escape the root."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rag.parsing import sha256_file


@dataclass(frozen=True)
class SourceFile:
    doc_id: str  # path relative to the root, POSIX separators: stable across machines and re-runs
    path: Path
    size: int
    content_hash: str


@dataclass(frozen=True)
class RejectedFile:
    doc_id: str
    path: Path
    reason: str


@dataclass(frozen=True)
class SourceScan:
    files: list[SourceFile]
    rejected: list[RejectedFile]


def scan_folder(root: Path | str, *, with_hashes: bool = True) -> SourceScan:
    """Every non-hidden file under `root`, recursively, in doc_id order.

    Files of any extension are listed so that nothing is skipped silently: the parser quarantines
    what it cannot read. Symlinks are followed only when their target stays inside the root.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"document folder {root} does not exist; set the document source path")
    real_root = root.resolve()
    files: list[SourceFile] = []
    rejected: list[RejectedFile] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            doc_id = path.relative_to(root).as_posix()
            real = path.resolve()
            if not real.is_relative_to(real_root):
                rejected.append(
                    RejectedFile(doc_id, path, f"resolves to {real}, outside the document root {real_root}")
                )
                continue
            if not real.is_file():
                continue
            size = real.stat().st_size
            files.append(SourceFile(doc_id, path, size, sha256_file(real) if with_hashes else ""))
        # Symlinked directories are not walked (followlinks=False): each would need the same check,
        # and following them risks cycles.
    return SourceScan(files=sorted(files, key=lambda f: f.doc_id), rejected=sorted(rejected, key=lambda r: r.doc_id))


def resolve_inside(root: Path | str, doc_id: str) -> Path:
    """The path of `doc_id` under `root`; raises ValueError if it would escape the root."""
    real_root = Path(root).resolve()
    candidate = (real_root / doc_id).resolve()
    if not candidate.is_relative_to(real_root):
        raise ValueError(f"{doc_id!r} escapes the document root {real_root}")
    return candidate
