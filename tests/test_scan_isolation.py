"""No file stops a run: symlink loops, broken links, unreadable files and folders, files that vanish mid-scan,
FIFOs, sockets, devices and documents over the caps are each quarantined with their reason, and the other documents
are indexed (issue 47, items 2 and 3)."""

import errno
import os
import signal
import socket
from pathlib import Path

import pytest

import rag.source
from rag.chunk_sets import CHUNK_QUARANTINE_TABLE, ChunkLimits
from rag.parsing import ParseSettings
from rag.source import RejectedFile, scan_folder
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE, QUARANTINE_TABLE, TableStore

GOOD = {
    "good.txt": "A good note about comets. It is short and readable.",
    "sub/also-good.txt": "Another document, about the moons of Jupiter.",
}
# Eight paragraphs: the paragraph strategy makes one chunk each, over the chunk cap of 5 used below.
MANY_PARAGRAPHS = "\n\n".join(
    f"Paragraph {i} says something about tides and their causes, at enough length to stand as a chunk of its own."
    for i in range(8)
)


@pytest.fixture
def no_hang():
    """Fail instead of hanging forever if anything opens the FIFO (opening one for reading blocks)."""

    def timeout(signum, frame):
        raise TimeoutError("the scan blocked: something opened the FIFO")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def refuse_reading(monkeypatch, path: Path, exc: OSError) -> None:
    """Make `path` fail to open with `exc`, where permissions cannot (as root, chmod 000 does not stop reading)."""
    real_open = rag.source.open_regular

    def open_regular(p):
        if Path(p) == path.resolve():
            raise exc
        return real_open(p)

    monkeypatch.setattr(rag.source, "open_regular", open_regular)


def refuse_listing(monkeypatch, folder: Path) -> None:
    """Make `folder` fail to list, as chmod 000 does for anyone but root."""
    real_scandir = os.scandir

    def scandir(p="."):
        if isinstance(p, (str, os.PathLike)) and Path(p) == folder:  # os.scandir also takes a descriptor
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
        return real_scandir(p)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.fixture
def bad_folder(tmp_path, monkeypatch, no_hang):
    """Good documents beside every kind of entry that used to abort the scan."""
    root = tmp_path / "docs"
    for doc_id, text in GOOD.items():
        (root / doc_id).parent.mkdir(parents=True, exist_ok=True)
        (root / doc_id).write_text(text)
    (root / "loop-a.txt").symlink_to(root / "loop-b.txt")
    (root / "loop-b.txt").symlink_to(root / "loop-a.txt")
    (root / "broken.txt").symlink_to(root / "missing.txt")
    locked = root / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)
    os.mkfifo(root / "pipe.txt")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "socket.txt"))
    folder = root / "sub" / "locked-folder"
    folder.mkdir()
    (folder / "inside.txt").write_text("never listed")
    folder.chmod(0)
    (root / "gone.txt").write_text("deleted between the listing and the read")
    if os.geteuid() == 0:  # root reads and lists whatever the mode: make the reads fail where the OS would not
        refuse_reading(monkeypatch, locked, PermissionError(errno.EACCES, "Permission denied", str(locked)))
        refuse_listing(monkeypatch, folder)
    # A file deleted after os.walk listed it and before it was read.
    refuse_reading(monkeypatch, root / "gone.txt", FileNotFoundError(errno.ENOENT, "No such file", "gone.txt"))
    yield root
    server.close()
    locked.chmod(0o644)
    folder.chmod(0o755)


EXPECTED_REJECTIONS = {
    "broken.txt": ("broken-link", "broken symlink"),
    "gone.txt": ("unreadable", "vanished before it could be read"),
    "locked.txt": ("unreadable", "permission denied (chmod the file"),
    "loop-a.txt": ("broken-link", "symlink loop"),
    "loop-b.txt": ("broken-link", "symlink loop"),
    "pipe.txt": ("not-a-file", "a named pipe (FIFO)"),
    "socket.txt": ("not-a-file", "a socket"),
    "sub/locked-folder": ("unreadable", "permission denied (chmod the folder"),
}


def reasons(rejected: list[RejectedFile]) -> dict[str, tuple[str, str]]:
    return {r.doc_id: (r.reason.value, r.message) for r in rejected}


def assert_rejections(found: dict[str, tuple[str, str]], expected: dict[str, tuple[str, str]]) -> None:
    assert sorted(found) == sorted(expected)
    for doc_id, (reason, hint) in expected.items():
        assert found[doc_id][0] == reason, (doc_id, found[doc_id])
        assert hint in found[doc_id][1], (doc_id, found[doc_id])


def test_scan_folder_rejects_each_bad_entry_and_lists_the_good_ones(bad_folder):
    scan = scan_folder(bad_folder)
    assert [f.doc_id for f in scan.files] == sorted(GOOD)
    assert all(len(f.content_hash) == 64 and f.mtime_ns > 0 for f in scan.files)
    assert_rejections(reasons(scan.rejected), EXPECTED_REJECTIONS)


def test_the_cheap_listing_never_opens_a_file_and_still_isolates_bad_entries(bad_folder, monkeypatch):
    def never(path):
        raise AssertionError(f"the listing opened {path}")

    monkeypatch.setattr(rag.source, "open_regular", never)
    scan = scan_folder(bad_folder, with_hashes=False)
    # Unreadable and vanished files are found when they are hashed, not by a listing that only stats.
    assert [f.doc_id for f in scan.files] == sorted([*GOOD, "gone.txt", "locked.txt"])
    expected = {k: v for k, v in EXPECTED_REJECTIONS.items() if k not in ("gone.txt", "locked.txt")}
    assert_rejections(reasons(scan.rejected), expected)


def test_an_unlistable_root_stops_the_scan_with_what_to_do(tmp_path, monkeypatch):
    root = tmp_path / "docs"
    root.mkdir()
    refuse_listing(monkeypatch, root)
    with pytest.raises(PermissionError, match="cannot be listed .*chmod it"):
        scan_folder(root)


def test_a_special_file_is_rejected_without_being_opened(tmp_path, monkeypatch):
    """A device node (made where the OS allows it) is refused from its mode alone."""
    root = tmp_path / "docs"
    root.mkdir()
    try:
        os.mknod(root / "null.txt", 0o600 | 0o020000, os.makedev(1, 3))  # S_IFCHR, like /dev/null
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here ({exc}); FIFOs and sockets are covered above")
    monkeypatch.setattr(rag.source, "open_regular", lambda p: pytest.fail(f"opened {p}"))
    assert_rejections(reasons(scan_folder(root).rejected), {"null.txt": ("not-a-file", "a character device")})


def test_a_symlinked_folder_outside_the_root_is_rejected_and_one_inside_adds_nothing(tmp_path):
    root, outside = tmp_path / "docs", tmp_path / "outside"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (root / "real" / "a.txt").write_text("inside")
    (outside / "b.txt").write_text("outside")
    (root / "alias").symlink_to(root / "real")
    (root / "escape").symlink_to(outside)
    (root / "cycle").symlink_to(root)
    scan = scan_folder(root)
    assert [f.doc_id for f in scan.files] == ["real/a.txt"]
    assert_rejections(reasons(scan.rejected), {"escape": ("outside-root", "outside the document root")})


def test_index_folder_indexes_the_good_documents_and_quarantines_each_bad_one(bad_folder, tmp_path):
    """The path `rag index` runs (and the Dagster assets share): no entry aborts it, and nothing over a cap is
    written to the document or chunk tables."""
    from rag.pipeline import index_folder

    (bad_folder / "huge.txt").write_text("x" * 3000)  # over the 2,000-character cap before it is parsed
    (bad_folder / "many.txt").write_text(MANY_PARAGRAPHS)  # under the character cap, over the paragraph chunk cap
    data = tmp_path / "data"
    report = index_folder(
        bad_folder,
        data,
        strategies=["paragraph", "whole-document"],
        parse_settings=ParseSettings(max_document_chars=2000),
        chunk_limits=ChunkLimits(max_chunks_per_document=5),
    )
    tables = TableStore(data / "tables")
    assert sorted(tables.read(DOCUMENTS_TABLE).doc_id) == sorted([*GOOD, "many.txt"])
    quarantine = tables.read(QUARANTINE_TABLE)
    expected = EXPECTED_REJECTIONS | {
        "huge.txt": ("too-large", "its text is 3,000 characters, whitespace aside; the cap is 2,000 "
                     "(RAG_MAX_DOCUMENT_CHARS / ParseSettings.max_document_chars): split the file or raise the cap"),
    }
    assert_rejections({r["doc_id"]: (r["reason"], r["message"]) for r in quarantine.to_dict("records")}, expected)
    assert {q["doc_id"] for q in report.parse["quarantine"]} == set(expected)

    paragraph = tables.read(CHUNKS_TABLE, "paragraph")
    assert set(paragraph.doc_id) == set(GOOD)  # many.txt refused whole: not one partial row
    refused = tables.read(CHUNK_QUARANTINE_TABLE, "paragraph")
    assert list(refused.doc_id) == ["many.txt"] and refused.n_chunks.iloc[0] == 8
    assert "the cap is 5 per document (RAG_MAX_CHUNKS_PER_DOCUMENT" in refused.message.iloc[0]
    assert [q["doc_id"] for q in report.chunks["paragraph"]["quarantine"]] == ["many.txt"]
    assert set(tables.read(CHUNKS_TABLE, "whole-document").doc_id) == {*GOOD, "many.txt"}  # under the cap there
    assert tables.read(CHUNK_QUARANTINE_TABLE, "whole-document").empty


def test_the_new_documents_sensor_lists_a_folder_of_bad_entries_without_crashing(bad_folder, tmp_path):
    from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

    from resources.chunking import ChunkingStrategies
    from resources.documents import DocumentSource
    from resources.models import EmbeddingModels
    from resources.storage import DataStore
    from sensors.documents import new_documents_sensor

    resources = {
        "document_source": DocumentSource(path=str(bad_folder), passwords_file=str(bad_folder / "none.yaml")),
        "chunking": ChunkingStrategies(),
        "embedding_models": EmbeddingModels(),
        "data_store": DataStore(data_dir=str(tmp_path / "data")),
    }
    with DagsterInstance.ephemeral() as instance:

        def tick(cursor=None):
            return new_documents_sensor(build_sensor_context(cursor=cursor, instance=instance, resources=resources))

        first = tick()
        assert isinstance(first, SensorResult) and first.run_requests
        same = tick(first.cursor)
        assert isinstance(same, SkipReason) and "refused" in same.skip_message
        (bad_folder / "broken.txt").unlink()  # a mended link is a change worth a run
        (bad_folder / "broken.txt").symlink_to(bad_folder / "good.txt")
        changed = tick(first.cursor)
        assert isinstance(changed, SensorResult) and changed.cursor != first.cursor and changed.run_requests
