"""kill -9 at every step of a promotion and of a rollback, then a restart: `rag serve` (build_app, which recovers an
unfinished transaction first) starts and answers, and registry production = serving alias = rollout state.

The full sweep with a real SIGKILL and `rag serve` after each step takes minutes (a process and a server per step):
it is marked slow (`make test-all`). The fast suite interrupts the same steps in-process (nothing after the
interruption runs, as after a kill) and recovers, and kills one real process mid-promotion before `rag serve`.

The child process concludes a canary with "promote" (or reverts that promotion) and SIGKILLs itself right after
its k-th side effect (the intent written, an alias swapped, a manifest record, the state, the log line, the
intent cleared), for k = 1, 2, ... until a run finishes without reaching k. Collections are built before any of
that (by the canary's start), so the child reuses them instead of loading the model again."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rag.registry import ModelRegistry
from tests.test_api import AUTH, TOKEN

REPO = Path(__file__).resolve().parents[1]
quiet = lambda _: None  # noqa: E731

CHILD = r"""
import os, signal, sys, time
from rag.index.qdrant import QdrantSettings, alias_target, get_client
from rag.lifecycle import journal, promotion
from rag.lifecycle.target import ServingTarget
from rag.registry import ModelRegistry
from rag.lifecycle.rollout import conclude, roll_back_rollout
from rag.store import TableStore
from tests.verdicts import won

root = os.environ["RAG_DATA_DIR"]
kill_at, done = int(os.environ["KILL_AT"]), [0]

def counted(fn):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        done[0] += 1
        if done[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    return wrapper

for owner, name in [(journal, "_write_intent"), (journal, "point_alias_to"), (journal, "_write_state"),
                    (journal, "append_log"), (journal, "_clear_intent"), (ModelRegistry, "set_alias"),
                    (ModelRegistry, "update_metrics")]:
    setattr(owner, name, counted(getattr(owner, name)))

qdrant = QdrantSettings(path=root + "/qdrant")
for attempt in range(50):  # a running `rag serve` may be copying its replica from the folder for a moment
    try:
        client = get_client(qdrant)
        break
    except Exception:
        time.sleep(0.2)
else:
    client = get_client(qdrant)
# Built when the canary started (v2) and at the first promotion (v1): only looked up here.
promotion.build_collections = lambda mv, **kw: {s: alias_target(client, f"{s}__{mv.name}") for s in kw["strategies"]}
target = ServingTarget.of_client(TableStore(root + "/tables"), client, ["t"])
registry = ModelRegistry(root + "/models")
if sys.argv[1] == "promote":
    conclude("embedder", registry, "promote", "kill test", candidate="v2", evidence_source=won(), target=target,
             log=lambda _: None)
else:
    roll_back_rollout("embedder", registry, "kill test", target=target, log=lambda _: None)
print("finished after", done[0], "side effects")
"""


def canary_of_v2(root: Path):
    """A data dir where MiniLM v1 is production (its serving alias `t__production`) and v2 (the same weights, gated
    no worse) runs a canary with its collection built; chunk set "t" with its BM25 files. (registry, target)."""
    from rag.embedding import _minilm_dir
    from rag.index.qdrant import QdrantSettings, get_client
    from rag.index.sync import sync_bm25
    from rag.lifecycle.promotion import promote
    from rag.lifecycle.rollout import start
    from rag.lifecycle.target import ServingTarget
    from rag.store import CHUNKS_TABLE, TableStore, bm25_root
    from tests.test_rollout_serving import TEXTS, chunk_table
    from tests.verdicts import sound

    tables = TableStore(root / "tables")
    chunks = chunk_table(TEXTS)
    tables.write(chunks, CHUNKS_TABLE, "t")
    sync_bm25(chunks, bm25_root(root, "t"))
    registry = ModelRegistry(root / "models")
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    target = ServingTarget(tables, lambda: get_client(qdrant), ["t"])
    v1 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    promote("embedder", registry, v1, target=target, force_reason="the starting point", log=quiet)
    v2 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    registry.update_metrics(
        "embedder",
        v2.version,
        {
            "gate": {
                **sound(registry, "embedder"),
                "passed": True,
                "criterion": "not_worse",
                "better": False,
                "not_worse": True,
                "candidate_version": "v2",
                "production_version": "v1",
                "gated_at": "2026-01-01T00:00:00+00:00",
            }
        },
    )
    start("embedder", registry, "v2", 0.2, target=target, log=quiet)
    return registry, target


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Two data dirs: a canary of v2 running beside production v1 (for the promotion), and v2 promoted by that
    canary (for the rollback)."""
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.lifecycle.rollout import conclude
    from rag.lifecycle.target import ServingTarget
    from rag.store import TableStore
    from tests.verdicts import won

    base = tmp_path_factory.mktemp("kill") / "canary"
    canary_of_v2(base)
    close_client(QdrantSettings(path=str(base / "qdrant")))
    promoted = base.parent / "promoted"
    shutil.copytree(base, promoted)
    qdrant = QdrantSettings(path=str(promoted / "qdrant"))
    conclude(
        "embedder",
        ModelRegistry(promoted / "models"),
        "promote",
        "won",
        candidate="v2",
        evidence_source=won(),
        target=ServingTarget(TableStore(promoted / "tables"), lambda: get_client(qdrant), ["t"]),
        log=quiet,
    )
    close_client(qdrant)
    return {"promote": base, "rollback": promoted}


def killed_at(source: Path, workdir: Path, op: str, k: int) -> tuple[Path, int]:
    root = workdir / f"{op}-{k}"
    shutil.copytree(source, root)
    return root, kill_child(root, op, k)


def kill_child(root: Path, op: str, k: int) -> int:
    """The child's promotion (or rollback) on the data dir `root`, SIGKILLed after its k-th side effect."""
    env = {**os.environ, "RAG_DATA_DIR": str(root), "KILL_AT": str(k), "PYTHONPATH": str(REPO)}
    for name in ("QDRANT_URL", "RAG_QDRANT_PATH", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(name, None)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, op], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode in (0, -signal.SIGKILL), child.stderr[-3000:]
    return child.returncode


def restarted(root: Path, monkeypatch) -> dict:
    """`rag serve` on the data dir: it must start (recovering first) and answer; what it serves and what the
    registry, the serving alias and the rollout state say."""
    from rag.feedback import FeedbackStore
    from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
    from rag.lifecycle.journal import consistency
    from rag.serving.server import build_app
    from rag.serving.settings import ServeSettings

    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    store = FeedbackStore(f"sqlite:///{root / 'fb.sqlite'}")
    app = build_app(ServeSettings(api_token=TOKEN, refresh_seconds=0), root=root, store=store, strategy="t")
    with TestClient(app) as client:
        answered = client.post("/ask", json={"question": "which animal does purr"}, headers=AUTH)
        assert answered.status_code == 200, answered.text
        served = client.get("/health").json()["served"]["embedder"]
    registry = ModelRegistry(root / "models")
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    try:
        db = get_client(qdrant)
        production = registry.resolve("embedder", "production")
        aliases = {
            "serving": alias_target(db, "t__production"),
            "production's own": alias_target(db, f"t__{production.name}"),
        }
    finally:
        close_client(qdrant)
    return {"served": served, "production": production, "aliases": aliases, **consistency(registry, "embedder")}


def check(root: Path, seen: dict, op: str, before: str, after: str, k: int) -> str:
    from rag.lifecycle.rollout import history

    version = seen["production"].version
    assert version in (before, after), f"killed after step {k}: production {version}"
    assert seen["registry"] == seen["rollout"] == version and not seen["pending"], (k, seen)  # registry = rollout state
    assert seen["aliases"]["serving"] == seen["aliases"]["production's own"], (k, seen)  # = serving alias
    steps = [e["step"] for e in history(ModelRegistry(root / "models"))]
    assert steps.count("revert" if op == "rollback" else "promote") == (version == after), (k, steps)  # logged once
    return version


class Interrupted(BaseException):
    """What a kill looks like from inside: nothing after it runs (no except clause catches a BaseException)."""


def interrupted_at(source: Path, workdir: Path, op: str, k: int, monkeypatch) -> tuple[Path, bool]:
    """The child's run in this process, interrupted right after its k-th side effect (False: it finished first)."""
    from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
    from rag.lifecycle import journal, promotion
    from rag.lifecycle.target import ServingTarget
    from rag.lifecycle.rollout import conclude, roll_back_rollout
    from rag.store import TableStore
    from tests.verdicts import won

    root = workdir / f"{op}-{k}"
    shutil.copytree(source, root)
    done = [0]

    def counted(fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            done[0] += 1
            if done[0] == k:
                raise Interrupted(f"after side effect {k}")
            return out

        return wrapper

    for owner, name in [
        (journal, "_write_intent"),
        (journal, "point_alias_to"),
        (journal, "_write_state"),
        (journal, "append_log"),
        (journal, "_clear_intent"),
        (ModelRegistry, "set_alias"),
        (ModelRegistry, "update_metrics"),
    ]:
        monkeypatch.setattr(owner, name, counted(getattr(owner, name)))
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    client = get_client(qdrant)
    monkeypatch.setattr(
        promotion,
        "build_collections",
        lambda mv, **kw: {s: alias_target(client, f"{s}__{mv.name}") for s in kw["strategies"]},
    )
    target = ServingTarget.of_client(TableStore(root / "tables"), client, ["t"])
    registry = ModelRegistry(root / "models")
    try:
        if op == "promote":
            conclude(
                "embedder",
                registry,
                "promote",
                "kill test",
                candidate="v2",
                evidence_source=won(),
                target=target,
                log=quiet,
            )
        else:
            roll_back_rollout("embedder", registry, "kill test", target=target, log=quiet)
        return root, False
    except Interrupted:
        return root, True
    finally:
        monkeypatch.undo()
        close_client(qdrant)


def recovered(root: Path) -> dict:
    """What the next open finds after recover() (the first thing `rag serve` and every lifecycle step do)."""
    from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
    from rag.lifecycle.journal import consistency, recover

    registry = ModelRegistry(root / "models")
    qdrant = QdrantSettings(path=str(root / "qdrant"))
    try:
        db = get_client(qdrant)
        recover(registry, lambda: db, log=quiet)
        production = registry.resolve("embedder", "production")
        aliases = {
            "serving": alias_target(db, "t__production"),
            "production's own": alias_target(db, f"t__{production.name}"),
        }
    finally:
        close_client(qdrant)
    return {"production": production, "aliases": aliases, **consistency(registry, "embedder")}


@pytest.mark.parametrize("op, before, after", [("promote", "v1", "v2"), ("rollback", "v2", "v1")])
def test_interrupted_after_every_step_the_next_open_ends_on_one_side(
    prepared, tmp_path, monkeypatch, op, before, after
):
    outcomes = []
    for k in range(1, 30):
        root, interrupted = interrupted_at(prepared[op], tmp_path, op, k, monkeypatch)
        outcomes.append(check(root, recovered(root), op, before, after, k))
        if not interrupted:
            break
    else:
        pytest.fail("the transaction never finished")
    assert k >= 5 and set(outcomes) == {after}  # every step met; once the intent is written it rolls forward


def test_kill_9_in_the_middle_of_a_promotion_then_rag_serve_starts_and_answers(prepared, tmp_path, monkeypatch):
    for name in ("QDRANT_URL", "RAG_QDRANT_PATH"):
        monkeypatch.delenv(name, raising=False)
    root, code = killed_at(prepared["promote"], tmp_path, "promote", 2)  # the serving alias moved, nothing else
    assert code == -signal.SIGKILL
    seen = restarted(root, monkeypatch)
    assert check(root, seen, "promote", "v1", "v2", 2) == "v2"  # rolled forward
    assert seen["served"].startswith("ft-minilm-v2"), seen


def test_a_running_rag_serve_completes_a_promotion_killed_while_it_serves(prepared, tmp_path, monkeypatch):
    from rag.feedback import FeedbackStore
    from rag.lifecycle.journal import consistency
    from rag.serving.server import build_app
    from rag.serving.settings import ServeSettings

    for name in ("QDRANT_URL", "RAG_QDRANT_PATH"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "serving"
    shutil.copytree(prepared["promote"], root)
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    registry = ModelRegistry(root / "models")
    store = FeedbackStore(f"sqlite:///{root / 'fb.sqlite'}")
    app = build_app(ServeSettings(api_token=TOKEN, refresh_seconds=0.2), root=root, store=store, strategy="t")
    with TestClient(app) as client:
        assert client.get("/health").json()["served"]["embedder"].startswith("ft-minilm-v1")
        assert kill_child(root, "promote", 2) == -signal.SIGKILL  # the serving alias moved, nothing else
        deadline, seen = time.monotonic() + 60, {}
        while time.monotonic() < deadline:  # the refresh loop recovers, then serves what recovery completed
            seen = {**consistency(registry, "embedder"), "served": client.get("/health").json()["served"]["embedder"]}
            if not seen["pending"] and seen["served"].startswith("ft-minilm-v2"):
                break
            time.sleep(0.2)
        answered = client.post("/ask", json={"question": "which animal does purr"}, headers=AUTH)
    assert not seen["pending"] and seen["registry"] == seen["rollout"] == "v2", seen
    assert seen["served"].startswith("ft-minilm-v2") and answered.status_code == 200, seen


@pytest.mark.slow
@pytest.mark.parametrize("op, before, after", [("promote", "v1", "v2"), ("rollback", "v2", "v1")])
def test_kill_9_at_every_step_then_rag_serve_starts_and_answers(prepared, tmp_path, monkeypatch, op, before, after):
    for name in ("QDRANT_URL", "RAG_QDRANT_PATH"):
        monkeypatch.delenv(name, raising=False)
    outcomes = []
    for k in range(1, 30):
        root, code = killed_at(prepared[op], tmp_path, op, k)
        seen = restarted(root, monkeypatch)
        outcomes.append(check(root, seen, op, before, after, k))
        assert seen["served"].startswith(seen["production"].name), (k, seen)  # and `rag serve` serves it
        if code == 0:  # the child finished before its k-th side effect: every step has been killed once
            break
    else:
        pytest.fail("the transaction never finished")
    assert k >= 5 and outcomes[-1] == after
