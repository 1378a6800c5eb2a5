"""A replica's mapped collection pages are unmapped past a budget (rag.serving.residency): they leave the process's
resident size, what they hold reads the same afterwards, and private mappings (which may hold changes their file has
not) are never touched."""

from __future__ import annotations

import mmap
import shutil
import subprocess
from pathlib import Path

import pytest

from rag.serving.residency import MappedPagesBudget, file_mappings, resident_file_mb, unmap_pages

LINUX = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux only: /proc/self/maps")

MB = 2**20


def mapped_file(path: Path, size_mb: int, access=mmap.ACCESS_READ) -> tuple[mmap.mmap, object]:
    """A file of `size_mb` distinct bytes, mapped and every page read (resident)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(range(256)) * (size_mb * MB // 256))
    fh = path.open("r+b")
    mapped = mmap.mmap(fh.fileno(), 0, access=access)
    sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE))
    return mapped, fh


@LINUX
def test_a_shared_mapping_leaves_the_resident_size_and_reads_the_same(tmp_path):
    mapped, fh = mapped_file(tmp_path / "serving" / "replica-1" / "vectors.dat", 32)
    try:
        before = resident_file_mb()
        regions = file_mappings(tmp_path / "serving")
        assert [length for _, length in regions] == [32 * MB]
        assert unmap_pages(regions) == 32 * MB
        assert before - resident_file_mb() > 24  # the 32 MB mapped, less what other threads map meanwhile
        assert mapped[: 256 * 3] == bytes(range(256)) * 3 and mapped[-1] == 255  # faulted back from the cache
    finally:
        mapped.close()
        fh.close()


@LINUX
def test_only_mappings_under_the_folder_are_found(tmp_path):
    inside, fh_in = mapped_file(tmp_path / "serving" / "a.dat", 1)
    outside, fh_out = mapped_file(tmp_path / "models" / "model.onnx", 1)
    try:
        serving, models = file_mappings(tmp_path / "serving"), file_mappings(tmp_path / "models")
        assert len(serving) == 1 and len(models) == 1 and serving != models
        assert sorted(file_mappings(tmp_path)) == sorted(serving + models)
    finally:
        for m, fh in ((inside, fh_in), (outside, fh_out)):
            m.close()
            fh.close()


@LINUX
def test_private_mappings_are_left_alone_and_keep_their_own_changes(tmp_path):
    mapped, fh = mapped_file(tmp_path / "serving" / "copy.dat", 1, access=mmap.ACCESS_COPY)
    read_only = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    try:
        mapped[:5] = b"hello"  # in this process only: the file still holds 0..4
        assert file_mappings(tmp_path / "serving") == []  # neither the written one nor the read-only one
        unmap_pages(file_mappings(tmp_path / "serving"))
        assert mapped[:5] == b"hello"
        assert (tmp_path / "serving" / "copy.dat").read_bytes()[:5] == bytes(range(5))
    finally:
        read_only.close()
        mapped.close()
        fh.close()


@LINUX
def test_the_budget_unmaps_only_past_its_limit(tmp_path):
    mapped, fh = mapped_file(tmp_path / "serving" / "replica-1" / "graph.dat", 16)
    try:
        assert MappedPagesBudget(tmp_path / "serving", None).check() is False
        assert MappedPagesBudget(tmp_path / "serving", 10**6).check() is False
        budget = MappedPagesBudget(tmp_path / "serving", 0)
        assert budget.check() is True and budget.trims == 1 and budget.last_trim_mb > 8
        assert budget.info()["mapped_pages_limit_mb"] == 0 and budget.info()["mapped_pages_trims"] == 1
        assert mapped[1000] == 1000 % 256
    finally:
        mapped.close()
        fh.close()


def cached_bytes(path: Path) -> int | None:
    """What the page cache holds of `path` (util-linux fincore); None without it."""
    if shutil.which("fincore") is None:
        return None
    done = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", str(path)], **CAPTURE)
    return int(done.stdout.strip())


CAPTURE = {"capture_output": True, "text": True, "check": True}


@LINUX
def test_a_copy_bigger_than_the_budget_is_written_back_and_leaves_the_page_cache(tmp_path):
    copy = tmp_path / "serving" / "replica-1"
    data = copy / "segments" / "vectors.dat"
    data.parent.mkdir(parents=True)
    data.write_bytes(bytes(range(256)) * (8 * MB // 256))  # just written: dirty, in the cache
    assert MappedPagesBudget(tmp_path / "serving", None).settle_copy(copy) is False
    assert MappedPagesBudget(tmp_path / "serving", 64).settle_copy(copy) is False  # fits in the budget: stays
    budget = MappedPagesBudget(tmp_path / "serving", 4)
    assert budget.settle_copy(copy) is True and budget.info()["replica_copies_dropped_from_page_cache"] == 1
    cached = cached_bytes(data)
    assert cached is None or cached < MB, cached
    assert data.read_bytes()[: 256 * 2] == bytes(range(256)) * 2 and data.stat().st_size == 8 * MB


def test_the_budget_is_set_from_the_environment(monkeypatch):
    from rag.serving.settings import ServeSettings

    monkeypatch.delenv("RAG_SERVE_MAPPED_MB", raising=False)
    assert ServeSettings.from_env().mapped_pages_mb == 256
    monkeypatch.setenv("RAG_SERVE_MAPPED_MB", "512")
    assert ServeSettings.from_env().mapped_pages_mb == 512
    monkeypatch.setenv("RAG_SERVE_MAPPED_MB", "off")
    assert ServeSettings.from_env().mapped_pages_mb is None
    monkeypatch.setenv("RAG_SERVE_MAPPED_MB", "lots")
    with pytest.raises(ValueError, match="RAG_SERVE_MAPPED_MB must be a number of MB or 'off'"):
        ServeSettings.from_env()
