"""Documents in a folder: stable ids, content hashes, and refusal of paths that escape the root.

No entry can stop a scan: a symlink loop, a broken link, an unreadable file or folder, a file that vanishes
mid-scan, a FIFO, socket or device each becomes a RejectedFile with a reason, which the ingest quarantines like a
file that failed to parse, and the scan goes on with the other entries.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rag.parsing import ParseError, QuarantineReason
from rag.parsing.errors import symlink_loop, unreadable


@dataclass(frozen=True)
class SourceFile:
    doc_id: str  # path relative to the root, POSIX separators: stable across machines and re-runs
    path: Path
    size: int
    content_hash: str
    mtime_ns: int = 0  # of the file (a symlink's target), read by the scan so watchers need not stat it again


@dataclass(frozen=True)
class RejectedFile:
    doc_id: str
    path: Path
    reason: QuarantineReason
    message: str  # what is wrong and what to do about it
    exception_class: str = "ParseError"

    @classmethod
    def of(cls, doc_id: str, path: Path, error: ParseError) -> RejectedFile:
        return cls(doc_id, path, error.reason, error.message, error.exception_class)


@dataclass(frozen=True)
class SourceScan:
    files: list[SourceFile]
    rejected: list[RejectedFile]


def require_folder(root: Path | str) -> Path:
    """`root` as a Path, or the error a user reads when the document folder is missing."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"document folder {root} does not exist; set the document source path")
    return root


def scan_folder(root: Path | str, *, with_hashes: bool = True) -> SourceScan:
    """Every non-hidden file under `root`, recursively, in doc_id order; what cannot be read is in `rejected`.

    Files of any extension are listed so that nothing is skipped silently: the parser quarantines what it cannot
    read. Symlinks are followed only when their target stays inside the root. FIFOs and devices are never opened.
    Without hashes (a cheap listing for watchers) files are only stat'ed, so unreadable ones are found when hashed.
    Only the root itself failing stops the scan: an unreadable root would otherwise read as every document deleted.
    """
    root = require_folder(root)
    real_root = root.resolve()
    files: list[SourceFile] = []
    rejected: list[RejectedFile] = []
    walk = os.walk(root, onerror=_folder_error_handler(root, rejected), followlinks=False)
    for dirpath, dirnames, filenames in walk:
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rejected += _linked_folders_outside(root, real_root, Path(dirpath), dirnames)
        for name in sorted(n for n in filenames if not n.startswith(".")):
            entry = _scan_entry(root, real_root, Path(dirpath) / name, with_hashes)
            (files if isinstance(entry, SourceFile) else rejected).append(entry)
    return SourceScan(files=sorted(files, key=lambda f: f.doc_id), rejected=sorted(rejected, key=lambda r: r.doc_id))


def _folder_error_handler(root: Path, rejected: list[RejectedFile]):
    """os.walk's onerror: a subfolder it cannot list is rejected (its files are left out of this run); the root
    failing raises, naming what to do."""

    def on_error(exc: OSError) -> None:
        folder = Path(exc.filename) if exc.filename else root
        if folder == root:
            # OSError(errno, ...) is built as the matching subclass (PermissionError for EACCES).
            raise OSError(
                exc.errno, f"document folder {root} cannot be listed ({exc.strerror}): chmod it for the pipeline's user"
            ) from exc
        error = unreadable(exc, "folder")
        message = f"{error.message}; the files in it are left out until it can be listed"
        rejected.append(RejectedFile(_doc_id(root, folder), folder, error.reason, message, error.exception_class))

    return on_error


def _linked_folders_outside(root: Path, real_root: Path, folder: Path, dirnames: list[str]) -> list[RejectedFile]:
    """Symlinked folders are never walked (that risks cycles); one leading inside the root adds nothing (its files
    are scanned where they are), one leading outside is rejected like a file symlink that does."""
    rejected = []
    for name in dirnames:
        path = folder / name
        if path.is_symlink() and not isinstance(entry := _resolve(root, real_root, path), Path):
            rejected.append(entry)
    return rejected


def _doc_id(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _scan_entry(root: Path, real_root: Path, path: Path, with_hashes: bool = True) -> SourceFile | RejectedFile:
    """One entry of the folder as a file to parse, or as a rejection saying why not; never raises for the entry."""
    real = _resolve(root, real_root, path)
    if isinstance(real, RejectedFile):
        return real
    try:
        return _read(_doc_id(root, path), path, real, with_hashes)
    except ParseError as error:
        return RejectedFile.of(_doc_id(root, path), path, error)


def _resolve(root: Path, real_root: Path, path: Path) -> Path | RejectedFile:
    """Where `path` really is, if that is inside the root and exists."""
    doc_id = _doc_id(root, path)
    try:
        real = path.resolve(strict=True)
    except RuntimeError as exc:  # Python 3.11: "Symlink loop from ..."
        return RejectedFile.of(doc_id, path, symlink_loop(exc))
    except FileNotFoundError as exc:
        if not path.is_symlink():
            return RejectedFile.of(doc_id, path, unreadable(exc))  # vanished since it was listed
        message = f"broken symlink: its target {_link_target(path)} does not exist (fix the link or remove it)"
        return RejectedFile.of(doc_id, path, ParseError(QuarantineReason.BROKEN_LINK, message, exc))
    except OSError as exc:
        return RejectedFile.of(doc_id, path, unreadable(exc))
    if not real.is_relative_to(real_root):
        message = f"resolves to {real}, outside the document root {real_root}"
        return RejectedFile(doc_id, path, QuarantineReason.OUTSIDE_ROOT, message, "ValueError")
    return real


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "(unreadable)"


def _read(doc_id: str, path: Path, real: Path, with_hashes: bool) -> SourceFile:
    """Stat `real` and, with hashes, read it; the mode is checked before any open, since opening a FIFO blocks."""
    try:
        info = os.stat(real)
        _require_regular(info.st_mode)
        if not with_hashes:
            return SourceFile(doc_id, path, info.st_size, "", info.st_mtime_ns)
        with open_regular(real) as fh:
            info = os.fstat(fh.fileno())
            _require_regular(info.st_mode)  # it may have been swapped for a FIFO or device since the stat
            content_hash = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        raise unreadable(exc) from exc
    return SourceFile(doc_id, path, info.st_size, content_hash, info.st_mtime_ns)


def open_regular(path: Path) -> BinaryIO:
    """Open for reading without ever blocking: O_NONBLOCK makes even a FIFO swapped in after the stat return at once
    (it changes nothing for a regular file). The one place the scan opens files, so tests can refuse a read here."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


_SPECIAL_FILES = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _require_regular(mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = _SPECIAL_FILES.get(stat.S_IFMT(mode), "not a regular file")
    raise ParseError(
        QuarantineReason.NOT_A_FILE,
        f"{kind}, not a document: never opened, since reading one can block or have side effects "
        "(move it out of the document folder)",
    )


def resolve_inside(root: Path | str, doc_id: str) -> Path:
    """The path of `doc_id` under `root`; raises ValueError if it would escape the root."""
    real_root = Path(root).resolve()
    candidate = (real_root / doc_id).resolve()
    if not candidate.is_relative_to(real_root):
        raise ValueError(f"{doc_id!r} escapes the document root {real_root}")
    return candidate
