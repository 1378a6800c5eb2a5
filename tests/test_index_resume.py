"""A killed or failed embedding run resumes where it stopped: the batches a fresh collection had received are kept,
and the next run encodes only the chunks it lacks (or holds with another content hash), then swaps the alias.

Interrupted in-process (an exception from the encoder after N calls: nothing after it runs, as after a kill) on
every embedded engine, and once for real: a child process SIGKILLed once its progress shows batches stored."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rag.index.qdrant import CollectionName, QdrantSettings, alias_target, close_client, get_client, point_id
from rag.index.sync import sync_collection
from tests.test_retrieval import chunk_table

REPO = Path(__file__).resolve().parents[1]


def corpus(n: int = 40) -> dict[str, str]:
    sentence = "Passage {i} is about topic {t}. It has a second sentence with {w} words in it."
    return {f"c{i:03d}": sentence.format(i=i, t=i % 7, w=i * 3) * (1 + i % 3) for i in range(n)}


class Interrupted(RuntimeError):
    pass


class HashEmbedder:
    """Deterministic vectors from each text's hash; counts what it encodes and, with `fail_after`, raises on the
    call after that many (as a kill would stop it)."""

    name, dim, version, batch_size = "hash", 8, "hash01", 4

    def __init__(self, fail_after: int | None = None):
        self.fail_after, self.calls, self.texts = fail_after, 0, []

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise Interrupted(f"interrupted after {self.calls} encoder calls")
        self.calls += 1
        self.texts.extend(texts)
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[: 4 * self.dim], dtype=np.uint32) for t in texts]
        vecs = np.array(rows, dtype=np.float32) / 2**32 - 0.5
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)

    encode = encode_queries = encode_passages


@pytest.fixture(params=["local-path", "memory", "edge"])
def client(request, tmp_path):
    settings = {
        "local-path": QdrantSettings(path=str(tmp_path / "qdrant"), engine="local"),
        "memory": QdrantSettings(path=":memory:", engine="local"),
        "edge": QdrantSettings(path=str(tmp_path / "qdrant-edge"), engine="edge"),
    }[request.param]
    yield get_client(settings)
    close_client(settings)


def points(client, collection: str) -> dict[str, tuple]:
    """chunk_id -> (dense vector, sparse indices and values, payload) of every point."""
    out, offset = {}, None
    while True:
        page, offset = client.scroll(collection, limit=256, offset=offset, with_payload=True, with_vectors=True)
        for p in page:
            sparse = p.vector["bm25"]
            pairs = tuple(sorted(zip(sparse.indices, np.round(sparse.values, 5))))
            out[p.payload["chunk_id"]] = (np.asarray(p.vector["dense"]), pairs, p.payload)
        if offset is None:
            return out


def interrupt(client, chunks, strategy: str, fail_after: int) -> str:
    """Start a build that stops after `fail_after` encoder calls; the name of the collection it left."""
    with pytest.raises(Interrupted):
        sync_collection(client, chunks, HashEmbedder(fail_after), strategy=strategy, model="hash", batch_size=8)
    name = CollectionName(strategy, "hash")
    assert alias_target(client, name.alias) is None  # never served half-built
    return name.versioned(HashEmbedder.version, "cosine")


def test_an_interrupted_build_resumes_without_re_encoding_what_it_stored(client):
    texts = corpus(40)
    chunks = chunk_table(texts)
    # 6 calls of 4 texts fill 3 upsert batches of 8; the 7th call fails inside the 4th batch.
    leftover = interrupt(client, chunks, "t", fail_after=6)
    stored = set(points(client, leftover))
    assert len(stored) == 24

    again = HashEmbedder()
    run = sync_collection(client, chunks, again, strategy="t", model="hash", batch_size=8)
    assert sorted(again.texts) == sorted(texts[c] for c in texts if c not in stored)
    assert (run.rebuilt, run.resumed, run.added, run.collection) == (True, 24, 16, leftover)
    assert alias_target(client, run.alias) == leftover and run.points == len(texts)

    # The same points, vectors (dense and BM25) and payloads as a build that was never interrupted.
    reference = sync_collection(client, chunks, HashEmbedder(), strategy="ref", model="hash", batch_size=8)
    got, want = points(client, run.alias), points(client, reference.alias)
    assert set(got) == set(want) == set(texts)
    for cid in texts:
        assert np.allclose(got[cid][0], want[cid][0]) and got[cid][1] == want[cid][1], cid
        assert {k: v for k, v in got[cid][2].items() if k != "strategy"} == {
            k: v for k, v in want[cid][2].items() if k != "strategy"
        }


def test_a_resumed_build_re_encodes_chunks_that_changed_and_drops_those_gone(client):
    texts = corpus(24)
    leftover = interrupt(client, chunk_table(texts), "t", fail_after=4)  # 16 stored
    stored = sorted(points(client, leftover))
    changed, gone = stored[0], stored[1]
    texts[changed] = "A rewritten passage about comets and their icy tails."
    del texts[gone]

    again = HashEmbedder()
    run = sync_collection(client, chunk_table(texts), again, strategy="t", model="hash", batch_size=8)
    kept = set(stored) - {changed, gone}
    assert sorted(again.texts) == sorted(t for c, t in texts.items() if c not in kept)
    assert (run.resumed, run.updated, run.deleted, run.points) == (len(kept), 1, 1, len(texts))
    assert {c: p[2]["text"] for c, p in points(client, run.alias).items()} == texts


def test_a_leftover_of_another_shape_is_rebuilt_not_resumed(client):
    from rag.index.qdrant import create_collection

    texts = corpus(10)
    name = CollectionName("t", "hash")
    create_collection(client, name.versioned(HashEmbedder.version, "cosine"), HashEmbedder.dim, "cosine", bm25=False)
    again = HashEmbedder()
    run = sync_collection(client, chunk_table(texts), again, strategy="t", model="hash")
    assert run.resumed == 0 and len(again.texts) == len(texts) and run.bm25_in_engine


def test_embed_step_resumes_chunk_vectors_then_sentence_vectors(tmp_path):
    from rag.pipeline import embed_step
    from rag.qa.encoding import SentenceVectorStore, embedder_key, sentence_store_path
    from rag.store import CHUNKS_TABLE, TableStore

    texts = corpus(16)
    tables = TableStore(tmp_path / "tables")
    tables.write(chunk_table(texts), CHUNKS_TABLE, "t")
    settings = QdrantSettings(path=str(tmp_path / "qdrant"), engine="edge")
    client = get_client(settings)
    try:
        with pytest.raises(Interrupted):  # 2 of 4 chunk batches stored, no sentence vector yet
            embed_step(tables, client, "t", "hash", HashEmbedder(fail_after=2), batch_size=4)
        stored = points(client, CollectionName("t", "hash").versioned(HashEmbedder.version, "cosine"))
        assert len(stored) == 8
        first = HashEmbedder(fail_after=3)  # the 2 other chunk batches, then 1 sentence batch of 4
        with pytest.raises(Interrupted):
            embed_step(tables, client, "t", "hash", first, batch_size=4, sentence_batch_size=4)
        assert sorted(first.texts[:8]) == sorted(t for c, t in texts.items() if c not in stored)
        assert alias_target(client, "t__hash") is not None  # the chunk vectors were complete: served
        store = SentenceVectorStore(sentence_store_path(tmp_path), embedder_key(HashEmbedder()), HashEmbedder.dim)
        assert store.count() == 4
        store.close()

        last = HashEmbedder()
        run = embed_step(tables, client, "t", "hash", last, batch_size=4, sentence_batch_size=4)
        assert run.resumed == 0 and not run.rebuilt  # the chunk vectors were complete: in place, nothing to do
        assert not set(last.texts) & set(texts.values())  # no chunk encoded again
        sentences = run.sentence_vectors["sentences"]
        assert len(last.texts) == run.sentence_vectors["encoded"] == sentences - 4
        assert run.points == len(texts) and alias_target(client, "t__hash") == run.collection
    finally:
        close_client(settings)


CHILD = textwrap.dedent(
    """
    import sys, time
    from rag.index.qdrant import QdrantSettings, get_client
    from rag.index.sync import sync_collection
    from rag.progress import LogProgress
    from tests.test_index_resume import HashEmbedder, chunk_table, corpus

    class Slow(HashEmbedder):
        def encode_passages(self, texts):
            time.sleep(0.02)
            return super().encode_passages(texts)

    client = get_client(QdrantSettings(path=sys.argv[1], engine="edge"))
    progress = LogProgress(lambda line: print(line, flush=True), interval=0)
    sync_collection(client, chunk_table(corpus(400)), Slow(), strategy="t", model="hash", batch_size=16,
                    progress=progress)
    print("finished", flush=True)
    """
)


def test_a_run_killed_with_sigkill_resumes_where_it_stopped(tmp_path):
    folder = tmp_path / "qdrant"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    seen = []
    try:
        for line in child.stdout:  # "embedding t|hash: 96/400 chunks, ..."
            seen.append(line)
            if line.startswith("embedding t|hash: ") and int(line.split(": ")[1].split("/")[0]) >= 96:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL and "finished\n" not in seen, seen[-3:]

    settings = QdrantSettings(path=str(folder), engine="edge")
    client = get_client(settings)
    try:
        leftover = CollectionName("t", "hash").versioned(HashEmbedder.version, "cosine")
        stored = points(client, leftover)
        assert 0 < len(stored) < 400  # whole upsert batches that were written before the kill
        texts = corpus(400)
        again = HashEmbedder()
        run = sync_collection(client, chunk_table(texts), again, strategy="t", model="hash", batch_size=16)
        assert sorted(again.texts) == sorted(t for c, t in texts.items() if c not in stored)
        assert run.resumed == len(stored) and run.points == 400 and alias_target(client, "t__hash") == leftover
        got = points(client, leftover)
        want = HashEmbedder().encode_passages([texts[c] for c in sorted(texts)])
        assert np.allclose(np.vstack([got[c][0] for c in sorted(texts)]), want, atol=1e-6)
        assert {point_id(c) for c in texts} == {str(p.id) for p in client.scroll(leftover, limit=1000)[0]}
    finally:
        close_client(settings)
