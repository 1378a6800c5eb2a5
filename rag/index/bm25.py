"""BM25 over a chunk set with bm25s: one tokenizer (lower-case, English stopwords, Snowball stemming)
for index and query time; saved as versioned folders with an atomically replaced CURRENT pointer."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.store import atomic_write, fsync_dir

K1, B = 1.2, 0.75


def _quiet_bm25s() -> None:
    # bm25s sets its logger to DEBUG on import and logs every index build; keep it to warnings.
    logging.getLogger("bm25s").setLevel(logging.WARNING)


def _bm25s():
    """bm25s, imported without numba. bm25s imports numba whenever it can, for its "numba" retrieval backend, which
    nothing here uses (BM25 retrieves with its default, numpy); numba's LLVM library alone maps about 100 MB into
    every process that imports it, a serving replica's included (bench/serving_memory.py). Hidden only while bm25s
    is first imported: a later `import numba` (ranx) works as usual."""
    if "bm25s" not in sys.modules:
        missing = object()
        numba = sys.modules.get("numba", missing)
        sys.modules["numba"] = None  # `import numba` raises ImportError, which bm25s handles
        try:
            import bm25s  # noqa: F401
        finally:
            if numba is missing:
                del sys.modules["numba"]
            else:
                sys.modules["numba"] = numba
    import bm25s

    return bm25s


def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("english")


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    bm25s = _bm25s()
    return bm25s.tokenize(list(texts), stopwords="en", stemmer=_stemmer(), return_ids=False, show_progress=False)


def corpus_fingerprint(chunk_ids: Sequence[str], content_hashes: Sequence[str]) -> str:
    digest = hashlib.sha256(f"bm25s|k1={K1}|b={B}|v1".encode())
    for cid, h in sorted(zip(chunk_ids, content_hashes)):
        digest.update(f"{cid}:{h}\n".encode())
    return digest.hexdigest()[:16]


class BM25Index:
    def __init__(self, retriever, chunk_ids: list[str], fingerprint: str):
        self._retriever = retriever
        self.chunk_ids = chunk_ids
        self.fingerprint = fingerprint
        self._position = {cid: i for i, cid in enumerate(chunk_ids)}

    @classmethod
    def build(cls, chunk_ids: Sequence[str], texts: Sequence[str], fingerprint: str = "") -> BM25Index:
        bm25s = _bm25s()
        _quiet_bm25s()
        retriever = bm25s.BM25(k1=K1, b=B)
        if texts:
            retriever.index(tokenize(texts), show_progress=False)
        return cls(retriever, list(chunk_ids), fingerprint)

    def __len__(self) -> int:
        return len(self.chunk_ids)

    def mask_for(self, allowed_chunk_ids: set[str]) -> np.ndarray:
        mask = np.zeros(len(self.chunk_ids), dtype=np.float32)
        for cid in allowed_chunk_ids:
            pos = self._position.get(cid)
            if pos is not None:
                mask[pos] = 1.0
        return mask

    def search(self, query: str, k: int, mask: np.ndarray | None = None) -> list[tuple[str, float]]:
        """(chunk_id, score) best first; chunks sharing no term with the query are not returned."""
        if not self.chunk_ids or k <= 0:
            return []
        tokens = tokenize([query])
        if not tokens[0]:
            return []
        k = min(k, len(self.chunk_ids))
        docs, scores = self._retriever.retrieve(tokens, k=k, show_progress=False, weight_mask=mask, n_threads=1)
        return [(self.chunk_ids[int(d)], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]

    # --- persistence: <root>/<fingerprint>/ folders, <root>/CURRENT names the live one -----------------
    def save(self, root: Path) -> Path:
        """Write this version durably, then swap CURRENT to it in one rename. The version CURRENT named
        before stays on disk until the next save: a reader that read the old pointer a moment ago can
        still load it. A crash at any point leaves CURRENT naming a complete version."""
        root.mkdir(parents=True, exist_ok=True)
        final = root / self.fingerprint
        previous = self.current_fingerprint(root)
        if not final.exists():
            tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
            if self.chunk_ids:  # bm25s cannot save an index of nothing
                self._retriever.save(str(tmp / "bm25s"))
            (tmp / "chunk_ids.json").write_text(json.dumps(self.chunk_ids))
            _fsync_tree(tmp)  # the files' contents are on disk before any name points at them
            os.replace(tmp, final)
            fsync_dir(root)  # ... and so is the folder's new name, before CURRENT names it
        atomic_write(root / "CURRENT", lambda fh: fh.write(self.fingerprint), mode="w")
        fsync_dir(root)
        _drop_versions(root, keep={self.fingerprint, previous})
        return final

    @staticmethod
    def current_fingerprint(root: Path) -> str | None:
        pointer = root / "CURRENT"
        return pointer.read_text().strip() if pointer.exists() else None

    @classmethod
    def load(cls, root: Path) -> BM25Index:
        fingerprint = cls.current_fingerprint(root)
        if fingerprint is None:
            raise FileNotFoundError(
                f"no BM25 index under {root}: build it first (materialize bm25_indexes or run `rag index`)"
            )
        try:
            return cls.load_version(root, fingerprint)
        except FileNotFoundError:
            # Two saves passed between reading CURRENT and reading the folder: the pointer has moved on.
            now = cls.current_fingerprint(root)
            if now is None or now == fingerprint:
                raise
            return cls.load_version(root, now)

    @classmethod
    def load_version(cls, root: Path, fingerprint: str) -> BM25Index:
        bm25s = _bm25s()
        folder = root / fingerprint
        chunk_ids = json.loads((folder / "chunk_ids.json").read_text())
        retriever = bm25s.BM25.load(str(folder / "bm25s")) if chunk_ids else bm25s.BM25(k1=K1, b=B)
        return cls(retriever, chunk_ids, fingerprint)


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):  # files before the folders that name them
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        else:
            fsync_dir(path)
    fsync_dir(folder)


def _drop_versions(root: Path, keep: set[str | None]) -> None:
    """Versions older than the previous one, and leftovers of crashed builds (.tmp-* folders and files)."""
    for old in root.iterdir():
        if old.name.startswith(".tmp-") and old.is_file():
            old.unlink(missing_ok=True)
        elif old.is_dir() and old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
