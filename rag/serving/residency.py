"""Keeps what a serving replica holds of its collection's files within a budget.

The engine reads a collection's on-disk parts (vectors, HNSW graph, BM25 postings, payloads) through memory maps.
Every page a search touches stays mapped into the replica, and counted in its resident size, until the kernel needs
the memory: a replica grows with the questions it is asked toward the size of its collection's files, not with the
hits it returns. Unmapping those pages (madvise MADV_DONTNEED) takes them out of the replica, not out of the
kernel's page cache: the next search that needs one maps it again from the cache (a minor fault, no disk read), and
the cache stays shared between replicas and reclaimable, which the kernel gives back under pressure (then a search
reads the disk again). Only shared file mappings are
unmapped (the engine's are all shared): a private one may hold copied-on-write changes its file has not, which
unmapping would lose, even one read-only now.

A replica's copy of the collection is written, not read: a copy bigger than the budget is written back and dropped
from the page cache once it is made (drop_from_page_cache), as a well-behaved bulk copy does, so that what the cache
holds of it is what searches read, in the pieces they read, not all of it in the large folios a copy writes, each of
which a search's fault would map whole. What both save and cost at 1M chunks: bench/serving_memory.py
(docs/indexes.md, "Serving memory").

Linux only (/proc/self/maps and /proc/self/status); elsewhere a budget does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# Mapped file pages (libraries and model files included, about 160 MB) above which a replica unmaps its collection's
# before the next question. The page cache keeps them, so it costs minor faults, not disk reads.
MAPPED_PAGES_MB = 256.0
MADV_DONTNEED = 4  # Linux's value (asm-generic/mman-common.h)
STATUS = Path("/proc/self/status")
MAPS = Path("/proc/self/maps")


def resident_file_mb() -> float | None:
    """The process's mapped file pages now (RssFile), MB; None where /proc does not say."""
    try:
        with STATUS.open() as fh:
            for line in fh:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def file_mappings(folder: Path) -> list[tuple[int, int]]:
    """(start, length) of this process's shared mappings of files under `folder`: what they hold is the page
    cache's, so unmapping cannot change it. Private mappings are left out."""
    # As the engine was given the path, or resolved (a data dir behind a symbolic link).
    prefixes = tuple({str(Path(folder).absolute()) + "/", str(Path(folder).resolve()) + "/"})
    regions = []
    try:
        with MAPS.open() as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) < 6 or not parts[5].startswith(prefixes):
                    continue
                if parts[1][3] != "s":
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                regions.append((start, end - start))
    except OSError:
        return []
    return regions


def unmap_pages(regions: list[tuple[int, int]]) -> int:
    """MADV_DONTNEED over each region; the bytes advised. A region the kernel refuses (locked pages, a mapping gone
    meanwhile) is skipped."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    advised = 0
    for start, length in regions:
        if libc.madvise(start, length, MADV_DONTNEED) == 0:
            advised += length
        else:
            log.debug("madvise refused %#x+%d: errno %d", start, length, ctypes.get_errno())
    return advised


def folder_bytes(folder: Path) -> int:
    """Bytes the files under `folder` take on disk (allocated blocks: the engine preallocates sparse files)."""
    return sum(p.lstat().st_blocks * 512 for p in Path(folder).rglob("*") if p.is_file())


def drop_from_page_cache(folder: Path) -> None:
    """Write back every file under `folder` and drop its pages from the page cache (POSIX_FADV_DONTNEED drops only
    clean pages, hence fdatasync first; pages mapped now stay). Where the platform has no posix_fadvise: nothing."""
    if not hasattr(os, "posix_fadvise"):
        return
    for path in Path(folder).rglob("*"):
        if not path.is_file():
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # removed meanwhile (a retired replica's folder)
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            log.debug("could not drop %s from the page cache: %s", path, exc)
        finally:
            os.close(fd)


@dataclass
class MappedPagesBudget:
    """Before a question: when the process's mapped file pages exceed `limit_mb`, unmap those of files under
    `folder` (the replicas' collections). Libraries and model files mapped elsewhere count toward the limit but are
    left alone. `limit_mb` None: never."""

    folder: Path
    limit_mb: float | None
    trims: int = 0
    last_trim_mb: float = 0.0
    copies_dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check(self) -> bool:
        """Unmap when over the limit; True when it did."""
        if self.limit_mb is None:
            return False
        mapped = resident_file_mb()
        if mapped is None or mapped <= self.limit_mb:
            return False
        if not self._lock.acquire(blocking=False):  # another question is trimming now: one is enough
            return False
        try:
            unmap_pages(file_mappings(self.folder))
            after = resident_file_mb() or 0.0
            self.trims += 1
            self.last_trim_mb = round(mapped - after, 1)
            return True
        finally:
            self._lock.release()

    def settle_copy(self, copy: Path) -> bool:
        """After a replica's copy is made: drop it from the page cache when it is bigger than the budget (a copy
        within the budget may as well stay cached). True when it did."""
        if self.limit_mb is None or folder_bytes(copy) <= self.limit_mb * 2**20:
            return False
        drop_from_page_cache(copy)
        self.copies_dropped += 1
        return True

    def info(self) -> dict:
        return {
            "mapped_pages_limit_mb": self.limit_mb,
            "mapped_pages_trims": self.trims,
            "mapped_pages_last_trim_mb": self.last_trim_mb,
            "replica_copies_dropped_from_page_cache": self.copies_dropped,
        }
