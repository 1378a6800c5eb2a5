"""Sentence vectors remembered per text: the extractive generator and attribution encode the same passage
sentences, a bake-off sees the same passages under every retrieval mode, and a served corpus asks about the same
chunks again and again.

Three layers, fastest first: a bounded dict in memory; a SQLite store in the data dir keyed by (embedder, text
hash), filled when a chunk set is indexed (rag.pipeline.embed_step) so no chunk sentence is encoded at question
time, and surviving restarts; the embedder itself for any text neither knows (then remembered in both). The store
is an accelerator only: a missing, corrupt or read-only one is logged once and answering goes on by encoding.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from typing import Literal
from pathlib import Path

import numpy as np

from rag.embedding import TextEmbedder
from rag.progress import Progress, counter

log = logging.getLogger(__name__)

SENTENCE_STORE_FILE = "sentence_vectors.sqlite"
LOOKUP_BATCH = 500  # keys per SELECT ... IN (...): under SQLite's bound-parameter limit


def sentence_store_path(root: Path) -> Path:
    return Path(root) / "indexes" / SENTENCE_STORE_FILE


def embedder_key(embedder: TextEmbedder) -> str:
    """Which vectors a text gets: the model's name, its weights version and its passage prefix. A promoted or
    re-trained embedder has another version, so it never reads another model's vectors."""
    base = getattr(embedder, "embedder", embedder)  # a CachedEmbedder names the model it wraps
    prefix = getattr(base, "passage_prefix", "") or ""
    return f"{embedder.name}@{embedder.version}" + (f"|{prefix}" if prefix else "")


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class SentenceVectorStore:
    """Passage-side vectors of one embedder, by text hash, in a SQLite file shared by every model (one table, the
    model in the key). Safe across threads (one connection, one lock) and processes (SQLite WAL). Every failure
    turns the store off for this process with one warning: callers then encode, as without a store."""

    def __init__(self, path: Path, model: str, dim: int):
        self.path, self.model, self.dim = Path(path), model, dim
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.broken: str | None = None  # why the store is off, once it is

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is None and self.broken is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS sentence_vectors (model TEXT NOT NULL, text_hash TEXT NOT NULL, "
                    "vector BLOB NOT NULL, PRIMARY KEY (model, text_hash))"
                )
                conn.commit()
                self._conn = conn
            except (sqlite3.Error, OSError) as exc:
                self._fail(exc)
        return self._conn

    def _fail(self, exc: Exception) -> None:
        self.broken = f"{type(exc).__name__}: {exc}"
        log.warning(
            "sentence vector store %s is unusable (%s): sentences are encoded at question time instead; "
            "delete the file and re-index (`rag index` or the embedding_collections asset) to rebuild it",
            self.path,
            self.broken,
        )
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self._conn = None

    def get(self, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """The stored vectors of those hashes that have one (a row of the wrong size counts as missing)."""
        wanted = list(dict.fromkeys(hashes))
        found: dict[str, np.ndarray] = {}
        with self._lock:
            conn = self._connect()
            if conn is None or not wanted:
                return found
            try:
                for i in range(0, len(wanted), LOOKUP_BATCH):
                    batch = wanted[i : i + LOOKUP_BATCH]
                    rows = conn.execute(
                        f"SELECT text_hash, vector FROM sentence_vectors WHERE model = ? AND text_hash "
                        f"IN ({','.join('?' * len(batch))})",
                        [self.model, *batch],
                    ).fetchall()
                    for key, blob in rows:
                        if len(blob) == 4 * self.dim:
                            found[key] = np.frombuffer(blob, dtype=np.float32)
            except sqlite3.Error as exc:
                self._fail(exc)
                return {}
        return found

    def vectors_of(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The stored vectors of those `texts` that have one, by text."""
        keys = {t: text_hash(t) for t in dict.fromkeys(texts)}
        stored = self.get(keys.values())
        return {t: stored[k] for t, k in keys.items() if k in stored}

    def put(self, vectors: dict[str, np.ndarray]) -> None:
        if not vectors:
            return
        with self._lock:
            conn = self._connect()
            if conn is None:
                return
            try:
                conn.executemany(
                    "INSERT OR REPLACE INTO sentence_vectors (model, text_hash, vector) VALUES (?, ?, ?)",
                    [(self.model, key, np.asarray(v, dtype=np.float32).tobytes()) for key, v in vectors.items()],
                )
                conn.commit()
            except sqlite3.Error as exc:
                self._fail(exc)

    def count(self) -> int:
        with self._lock:
            conn = self._connect()
            if conn is None:
                return 0
            try:
                return int(
                    conn.execute("SELECT COUNT(*) FROM sentence_vectors WHERE model = ?", [self.model]).fetchone()[0]
                )
            except sqlite3.Error as exc:
                self._fail(exc)
                return 0

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


SentenceEncoder = Literal["model", "int8"]
# Who encodes sentence vectors unless told: the one default of the index (rag.pipeline.embed_step) and the answer
# stage (AnswerSettings.sentence_encoder), so both use one store. Why this one: docs/answering.md.
DEFAULT_SENTENCE_ENCODER: SentenceEncoder = "int8"


def sentence_encoder(
    model: str, embedder: TextEmbedder, choice: SentenceEncoder, *, threads: int | None = None
) -> TextEmbedder:
    """Who encodes passage sentences for `embedder` (loaded as `model`): the model itself, or with "int8" its int8
    ONNX twin (rag.embedding.onnx_int8), whose vectors the store keeps under the twin's own key, so float and int8
    sentence vectors never mix. The index (rag.pipeline.embed_step) and the answer stage (rag.qa.pipeline) both ask
    here, so they agree. A twin that cannot load or disagrees with the model falls back to the model, with a warning.
    `threads`: the twin's intra-op threads (None: the query encoder's setting, RAG_ONNX_THREADS)."""
    if choice == "model":
        return embedder
    from rag.embedding.onnx_int8 import OnnxInt8Embedder, int8_query_encoder

    base = getattr(embedder, "embedder", embedder)  # a CachedEmbedder: the twin of the model it wraps
    if isinstance(base, OnnxInt8Embedder):
        return embedder  # already int8
    twin, why_not = int8_query_encoder(model, base, threads=threads)
    if twin is None:
        log.warning("sentence vectors: %s", (why_not or "no int8 twin").replace("questions", "sentences"))
        return embedder
    return twin


def open_sentence_store(root: Path | None, embedder: TextEmbedder) -> SentenceVectorStore | None:
    """The data dir's store for `embedder` (None without a data dir)."""
    if root is None:
        return None
    return SentenceVectorStore(sentence_store_path(root), embedder_key(embedder), embedder.dim)


class CachedEmbedder:
    """Wraps a TextEmbedder; `encode_passages` answers known texts from memory (bounded: cleared when full), then
    from `store` (a SentenceVectorStore) and encodes only the rest, which both then remember. `query_vector`: where
    question vectors come from when retrieval already has them (rag.retrieval.Index.query_vector), so a question
    is encoded once per answer, not once for retrieval and again for the answer."""

    def __init__(
        self,
        embedder: TextEmbedder,
        max_entries: int = 50_000,
        *,
        store: SentenceVectorStore | None = None,
        query_vector: Callable[[str], np.ndarray] | None = None,
    ):
        self.embedder, self.max_entries, self.store, self.query_vector = embedder, max_entries, store, query_vector
        self.name, self.dim, self.version = embedder.name, embedder.dim, embedder.version
        self._vectors: dict[str, np.ndarray] = {}

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        # This call's vectors are collected apart from the shared dict, which another request's thread may clear.
        found: dict[str, np.ndarray] = {}
        for t in dict.fromkeys(texts):
            if (v := self._vectors.get(t)) is not None:
                found[t] = v
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing and self.store is not None:
            new = self.store.vectors_of(missing)
            found.update(new)
            missing = [t for t in missing if t not in new]
            self._remember(new)
        if missing:
            encoded = dict(zip(missing, self.embedder.encode_passages(missing)))
            found.update(encoded)
            self._remember(encoded)
            if self.store is not None:
                self.store.put({text_hash(t): v for t, v in encoded.items()})
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.vstack([found[t] for t in texts])

    def _remember(self, vectors: dict[str, np.ndarray]) -> None:
        if len(self._vectors) + len(vectors) > self.max_entries:
            self._vectors.clear()
        self._vectors.update(vectors)

    encode = encode_passages

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        if self.query_vector is not None and texts:
            return np.vstack([self.query_vector(t) for t in texts])
        return self.embedder.encode_queries(texts)


def store_sentence_vectors(
    root: Path,
    texts: Iterable[str],
    embedder: TextEmbedder,
    batch_size: int = 256,
    progress: Progress | None = None,
    task: str = "sentence vectors",
    known: Callable[[list[str]], dict[str, np.ndarray]] | None = None,
) -> dict[str, int | float]:
    """Encode and store the sentences of `texts` (chunk texts) the store does not hold yet for `embedder`: the
    index-time half of CachedEmbedder's store. `known` (sentences -> the vectors `embedder` already gave some of them,
    e.g. a chunk whose text is one sentence, in its collection: rag.index.stored) answers before encoding. Batches are
    sorted by length, so each pads little. Returns {"sentences": distinct ones, "encoded": newly encoded, "reused":
    taken from `known`}."""
    from rag.qa.generators import sentence_units

    store = open_sentence_store(root, embedder)
    units = list(dict.fromkeys(u for text in texts for u in sentence_units(text or "")))
    keys = [text_hash(u) for u in units]
    stored: set[str] = set()
    for i in range(0, len(keys), 5000):
        stored.update(store.get(keys[i : i + 5000]))
    todo = [(u, k) for u, k in zip(units, keys) if k not in stored]
    reused, left = 0, []
    for i in range(0, len(todo) if known is not None else 0, 5000):
        part = todo[i : i + 5000]
        found = known([u for u, _ in part])
        store.put({k: found[u] for u, k in part if u in found})
        reused += len(found)
        left += [(u, k) for u, k in part if u not in found]
    todo = left if known is not None else todo
    # Longest first, as chunks are (rag.index.sync): a batch of similar lengths pads little, and memory peaks at once.
    todo.sort(key=lambda unit: len(unit[0]), reverse=True)
    advance = counter(progress, task, len(todo), "sentences")
    started = time.perf_counter()
    for i in range(0, len(todo), batch_size):
        batch = todo[i : i + batch_size]
        vectors = embedder.encode_passages([u for u, _ in batch])
        store.put({k: v for (_, k), v in zip(batch, vectors)})
        advance(len(batch))
    out: dict = {
        "sentences": len(units),
        "encoded": len(todo),
        "reused": reused,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if store.broken:
        out["store_error"] = store.broken
    store.close()
    return out
