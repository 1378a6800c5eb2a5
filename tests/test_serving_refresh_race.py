"""Two serving refreshes copying from one primary at once (production's background refresh and a canary's, or a
request opening the canary's index) share the process's primary client: the first to finish must not close it
under the other, and the last must still close it so the folder's lock goes back to Dagster."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from rag.index import edge as edge_module
from rag.index import qdrant as qdrant_module
from rag.index.qdrant import QdrantSettings
from rag.serving.index import replicate_collection


def test_concurrent_replications_never_use_a_closed_primary_client(tmp_path, monkeypatch):
    misuse: list[str] = []
    opened: dict[str, object] = {}
    both_copying = threading.Barrier(2, timeout=10)
    first_done = threading.Event()

    class RecordingClient:
        """Stands in for EdgeClient: every call on a closed client is recorded (a real one raises, or worse)."""

        def __init__(self, root):
            self.root, self.closed = str(root), False
            opened.setdefault(self.root, self)

        def _use(self, what: str) -> None:
            if self.closed:
                misuse.append(f"{what} on closed client {self.root}")

        def get_aliases(self, **_):
            self._use("get_aliases")
            return SimpleNamespace(aliases=[SimpleNamespace(alias_name="c", collection_name="c_v1")])

        def export_collection(self, collection, target_root, alias=None):
            self._use("export_collection")
            both_copying.wait()  # both copies are under way on the one shared client
            if str(target_root).endswith("second"):
                first_done.wait(10)  # the other copy has finished (and, before the fix, closed the client)
                self._use("export_collection, still copying")
            return collection

        def close(self, **_):
            self.closed = True

    monkeypatch.setattr(edge_module, "EdgeClient", RecordingClient)  # get_client imports it at call time
    primary = QdrantSettings(path=str(tmp_path / "primary"), engine="auto")
    targets = [QdrantSettings(path=str(tmp_path / name), engine="auto") for name in ("first", "second")]
    errors: list[BaseException] = []

    def copy(target, done=None):
        try:
            replicate_collection(primary, target, "c")
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)
        finally:
            if done is not None:
                done.set()

    threads = [
        threading.Thread(target=copy, args=(targets[0], first_done)),
        threading.Thread(target=copy, args=(targets[1],)),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors and misuse == []
        # The last copy out released the primary: a re-index in another process can take its lock again.
        assert opened[primary.location].closed and primary.location not in qdrant_module._clients
    finally:
        for target in targets:
            qdrant_module.close_client(target)
        qdrant_module.close_client(primary)
