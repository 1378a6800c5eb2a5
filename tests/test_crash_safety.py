"""kill -9 during `rag index` at random points: tables stay readable, the alias only ever names a complete
collection, and a re-run ends with exactly the expected points, no duplicates and no orphan collections."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rag.index.bm25 import BM25Index
from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE, TableStore, bm25_root
from tests.conftest import REPO, SHARED

ALIAS = "paragraph__minilm"


@pytest.fixture
def corpus(tmp_path):
    path = SHARED / "scifact" / "corpus.jsonl"
    if not path.exists():
        pytest.skip("shared SciFact not available")
    docs = tmp_path / "docs"
    docs.mkdir()
    with open(path) as fh:
        for i, line in zip(range(40), fh):
            d = json.loads(line)
            (docs / f"{d['_id']}.md").write_text(f"# {d['title']}\n\n{d['text']}\n")
    return docs


def check_state(root, settings, complete: bool, corpus_unchanged: bool = True):
    tables = TableStore(root / "tables")
    docs, chunks = tables.read(DOCUMENTS_TABLE), tables.read(CHUNKS_TABLE, "paragraph")  # never torn
    client = get_client(settings)
    try:
        live = alias_target(client, ALIAS)
        if live is not None and chunks is not None and not complete and corpus_unchanged:
            # A first build only gets the alias once every point is in. (After the corpus changes, a killed
            # run may have written new chunks but not yet synced them; the final check covers that case.)
            assert client.count(live, exact=True).count == len(chunks)
        if complete:
            stored = []
            offset = None
            while True:
                batch, offset = client.scroll(ALIAS, limit=512, offset=offset, with_payload=["chunk_id"])
                stored += [p.payload["chunk_id"] for p in batch]
                if offset is None:
                    break
            assert len(stored) == len(set(stored)) == len(chunks)
            assert set(stored) == set(chunks["chunk_id"])
            names = [c.name for c in client.get_collections().collections if c.name.startswith(ALIAS + "__")]
            assert names == [live]
            assert len(BM25Index.load(bm25_root(root, "paragraph"))) == len(chunks)
            assert set(docs["doc_id"]) == {p.name for p in (root.parent / "docs").iterdir()}
    finally:
        close_client(settings)


def _written_since(folder, moment: float) -> bool:
    for parent, _dirs, files in os.walk(folder):  # os.walk skips folders removed while it looks
        for name in files:
            try:
                if os.stat(os.path.join(parent, name)).st_mtime >= moment:
                    return True
            except FileNotFoundError:  # removed while we looked (a temp file renamed into place, a reclaimed folder)
                continue
    return False


def wait_for_index_writes(root, proc) -> float | None:
    """When this process first wrote under the Qdrant folder (it reached the index phase: embedding and upserts
    follow); None if it ended first. By file times, so a folder left by a killed run counts only once touched."""
    launched = time.time()
    while proc.poll() is None:
        if _written_since(root / "qdrant", launched):
            return time.monotonic()
        time.sleep(0.05)
    return None


@pytest.mark.slow  # six indexing processes, about 3 minutes: tests/test_index_resume.py keeps a kill -9 in make test
def test_kill_9_during_indexing_then_rerun(tmp_path, corpus):
    import shutil

    root = tmp_path / "data"
    env = {**os.environ, "RAG_DATA_DIR": str(root)}
    cmd = [
        sys.executable,
        "-m",
        "orchestration.cli",
        "index",
        str(corpus),
        "--strategy",
        "paragraph",
        "--model",
        "minilm",
    ]
    settings = QdrantSettings(path=str(root / "qdrant"))
    # One clean run, then lose the vector index: every later run re-embeds everything (parse and chunk
    # are already done), so kills land in the embed-and-upsert phase of a full build.
    assert subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, timeout=600).returncode == 0
    shutil.rmtree(root / "qdrant")
    # Kills are timed from the build's first write to the Qdrant folder (the embed-and-upsert phase), as a share of
    # that phase's length in a run that only re-embeds like the killed ones: a clock started at launch would, on a
    # loaded machine, put every kill before the phase or after the process ended.
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    embedding_started = wait_for_index_writes(root, proc)
    assert proc.wait(timeout=600) == 0 and embedding_started is not None
    embed_phase = time.monotonic() - embedding_started
    shutil.rmtree(root / "qdrant")
    rng = random.Random(7)
    killed = 0
    for attempt in range(3):
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait_for_index_writes(root, proc) is not None:
            time.sleep(rng.uniform(0.1, 0.8) * embed_phase)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait()
        check_state(root, settings, complete=False, corpus_unchanged=attempt <= 1)
        if attempt == 1:  # a content change between crashes: the re-run must reconcile it too
            victim = sorted(corpus.iterdir())[0]
            victim.write_text(victim.read_text() + "\nAn added closing sentence changes this document.\n")
    final = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr
    check_state(root, settings, complete=True)
    assert killed >= 1  # at least one run really died mid-way
