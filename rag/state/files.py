"""The file backend: the state under the registry root, as it always was (one machine, or one shared volume).

<registry root>/rollout/<kind>.json    a document per key rollout/<kind>
<registry root>/rollout/intent.json    rollout/intent
<registry root>/rollout/log.jsonl      the log, one JSON line per entry
<registry root>/rollout/.lock          flock of the lock "lifecycle"
<registry root>/.changed               registry/changed
<registry root>/.lock                  flock of the lock "registry"
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from rag.state import StateBusy
from rag.store import atomic_write, fsync_dir

# Keys and locks whose files predate this backend keep their names; any other key is <key>.json under the root.
PATHS = {"rollout/intent": "rollout/intent.json", "registry/changed": ".changed"}
LOCKS = {"lifecycle": "rollout/.lock", "registry": ".lock"}
LOG = "rollout/log.jsonl"
# An intent's log line, if written, is among the last ones: recovery runs before the next step is logged.
RECENT_LINES = 20


class FileState:
    def __init__(self, root: Path):
        self.root = Path(root)

    def describe(self) -> str:
        return f"files under {self.root}"

    def path(self, key: str) -> Path:
        return self.root / PATHS.get(key, f"{key}.json")

    def read(self, key: str) -> str | None:
        try:
            return self.path(key).read_text()
        except FileNotFoundError:
            return None

    def write(self, key: str, text: str) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda fh: fh.write(text), mode="w")

    def delete(self, key: str) -> None:
        path = self.path(key)
        path.unlink(missing_ok=True)
        if path.parent.exists():
            fsync_dir(path.parent)

    def marks(self, keys: list[str]) -> tuple:
        out = []
        for key in keys:
            try:
                stat = self.path(key).stat()
                out.append((stat.st_ino, stat.st_mtime_ns, stat.st_size))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def append(self, entry: dict) -> None:
        path = self.root / LOG
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:  # one short line per append: never interleaved
            fh.write(json.dumps(entry, sort_keys=True, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _lines(self) -> list[str]:
        path = self.root / LOG
        return path.read_text().splitlines() if path.exists() else []

    def entries(self, limit: int | None = None) -> list[dict]:
        lines = [json.loads(line) for line in self._lines() if line.strip()]
        return lines[-limit:] if limit else lines

    def logged(self, op: str) -> bool:
        return any(json.loads(line).get("op") == op for line in self._lines()[-RECENT_LINES:] if line.strip())

    def lock_path(self, name: str) -> Path:
        return self.root / LOCKS.get(name, f"locks/{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.lock")

    def lock_id(self, name: str) -> str:
        return str(self.lock_path(name).resolve())

    @contextlib.contextmanager
    def hold(self, name: str, wait: bool = True) -> Iterator[None]:
        path = self.lock_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StateBusy(f"it holds {path}") from None
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def documents(self) -> Iterator[tuple[str, str]]:
        """(key, text) of every rollout document held here (what a database imports on its first use)."""
        folder = self.root / "rollout"
        if folder.is_dir():
            for path in sorted(folder.glob("*.json")):
                yield f"rollout/{path.stem}", path.read_text()
