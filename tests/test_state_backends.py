"""The rollout state, the promotion journal and the locks on both backends (rag.state): files with flock, and
PostgreSQL with advisory locks (RAG_TEST_POSTGRES_URL; its cases are skipped with the reason without it).

Each behaviour the lifecycle relies on is checked on both: a lock held by another process refuses a non-waiting
caller and is released when that process is killed; the lock is re-entrant in its thread and exclusive to other
threads; a step killed (SIGKILL) between its writes is completed by the next open, its log line written once. On
PostgreSQL also: a replica with another data dir (no shared volume) learns a canary and a registry change from the
database, and a data dir's existing files are imported on the database's first use."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rag.lifecycle.journal import LifecycleBusy, history_entries, lifecycle_lock, pending, recover, state_marks
from rag.lifecycle.rollout import read_state, record_step, running_canary
from rag.registry import ModelRegistry
from rag.rollout.state import RolloutState
from rag import state
from rag.state import StateSettings
from tests.state_backends import scratch_database, use_database

REPO = Path(__file__).resolve().parents[1]
quiet = lambda _: None  # noqa: E731

HOLDER = r"""
import sys
from rag.lifecycle.journal import lifecycle_lock
from rag.registry import ModelRegistry

with lifecycle_lock(ModelRegistry(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()  # holds the lock until killed
"""

# A canary's start (a journaled step that moves no alias: no Qdrant, no MLflow), SIGKILLed right after `sys.argv[2]`.
KILLED_STEP = r"""
import os, signal, sys
from datetime import UTC, datetime
from rag.lifecycle import journal
from rag.lifecycle.rollout import record_step
from rag.registry import ModelRegistry
from rag.rollout.state import RolloutState, start_canary

def killed_after(fn):
    def wrapper(*args, **kwargs):
        fn(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    return wrapper

setattr(journal, sys.argv[2], killed_after(getattr(journal, sys.argv[2])))
state = start_canary(RolloutState(candidate_version="v2", production_version="v1"), datetime.now(UTC), 0.2, "test")
record_step(ModelRegistry(sys.argv[1]), "reranker", None, state, "start", lambda _: None, approved_by="kill test")
print("finished")
"""


@pytest.fixture(scope="module")
def database():
    with scratch_database() as url:
        yield url


@pytest.fixture(params=["files", "postgres"])
def backend(request, monkeypatch):
    """Both backends; the PostgreSQL one in a scratch database (skipped without RAG_TEST_POSTGRES_URL)."""
    if request.param == "postgres":
        use_database(monkeypatch, request.getfixturevalue("database"))
    else:
        monkeypatch.setenv("RAG_STATE_DB_URL", "files")
    return request.param


@pytest.fixture
def postgres(database, monkeypatch):
    use_database(monkeypatch, database)
    return database


def child(script: str, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, env=env, text=True, **kwargs)


def try_lock(registry: ModelRegistry) -> str:
    try:
        with lifecycle_lock(registry, wait=False):
            return "held"
    except LifecycleBusy:
        return "busy"


def test_state_follows_the_feedback_database_only_on_postgresql(monkeypatch):
    monkeypatch.delenv("RAG_STATE_DB_URL")
    monkeypatch.delenv("FEEDBACK_DB_URL", raising=False)
    assert StateSettings.from_env().url is None  # embedded default: files
    monkeypatch.setenv("FEEDBACK_DB_URL", "sqlite:////tmp/feedback.sqlite")
    assert StateSettings.from_env().url is None
    monkeypatch.setenv("FEEDBACK_DB_URL", "postgresql+psycopg://u:p@db/rag")
    assert StateSettings.from_env().url == "postgresql+psycopg://u:p@db/rag"  # one database for the product
    monkeypatch.setenv("RAG_STATE_DB_URL", "files")
    assert StateSettings.from_env().url is None  # an operator's explicit choice wins
    monkeypatch.setenv("RAG_STATE_DB_URL", "sqlite:////tmp/state.sqlite")
    with pytest.raises(ValueError, match="needs PostgreSQL .*RAG_STATE_DB_URL=files"):
        StateSettings.from_env()


def test_a_lock_another_process_holds_refuses_then_is_freed_when_it_is_killed(backend, tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    holder = child(HOLDER, str(registry.root), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert try_lock(registry) == "busy"
        with pytest.raises(LifecycleBusy, match="another process is changing production now"):
            recover(registry, log=quiet, wait=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 30  # PostgreSQL ends the dead client's session as soon as it sees the socket close
    while try_lock(registry) == "busy" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert try_lock(registry) == "held"


def test_the_lock_is_reentrant_in_its_thread_and_exclusive_to_other_threads(backend, tmp_path):
    registry = ModelRegistry(tmp_path / "models")
    seen = []
    with lifecycle_lock(registry):
        with lifecycle_lock(registry, wait=False):  # a step inside a step (conclude() holding it for promote())
            other = threading.Thread(target=lambda: seen.append(try_lock(registry)))
            other.start()
            other.join()
    assert seen == ["busy"] and try_lock(registry) == "held"


@pytest.mark.parametrize("killed_after", ["_write_intent", "_write_state"])
def test_a_step_killed_between_its_writes_is_completed_by_the_next_open(backend, tmp_path, killed_after):
    registry = ModelRegistry(tmp_path / "models")
    step = child(KILLED_STEP, str(registry.root), killed_after, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = step.communicate(timeout=120)
    assert step.returncode == -signal.SIGKILL, err[-2000:]
    intent = pending(registry)
    assert intent is not None and history_entries(registry) == []  # killed before its log line
    assert (read_state(registry, "reranker") is not None) == (killed_after == "_write_state")

    outcome = recover(registry, log=quiet)
    assert outcome == "completed an unfinished reranker canary-start"
    assert pending(registry) is None and read_state(registry, "reranker").stage == "canary"
    assert [(e["step"], e["op"]) for e in history_entries(registry)] == [("start", intent.id)]
    assert recover(registry, log=quiet) is None  # done once


def canary_state() -> RolloutState:
    from datetime import UTC, datetime

    from rag.rollout.state import start_canary

    return start_canary(RolloutState(candidate_version="v2", production_version="v1"), datetime.now(UTC), 0.2, "t")


def test_a_replica_without_the_shared_volume_learns_the_canary_and_registry_changes(postgres, tmp_path, monkeypatch):
    from rag.state import sql

    monkeypatch.setenv("RAG_STATE_NAMESPACE", "team-deployment")  # both places name one deployment
    monkeypatch.setattr(sql, "MARKS_TTL_SECONDS", 0)  # no reuse of the replica's last answer within the second
    writer = ModelRegistry(tmp_path / "pod-a" / "models")
    replica = ModelRegistry(tmp_path / "pod-b" / "models")  # another data dir: nothing on disk is shared
    marks, signature = state_marks(replica), replica.change_signature()
    assert running_canary(replica) is None

    record_step(writer, "reranker", None, canary_state(), "start", quiet, approved_by="test")
    writer._touch()  # what a registration or an alias change does
    assert state_marks(replica) != marks and replica.change_signature() != signature
    kind, canary = running_canary(replica)
    assert (kind, canary.candidate_version, canary.traffic_share) == ("reranker", "v2", 0.2)
    assert not (replica.root / "rollout").exists() and not (writer.root / "rollout").exists()


def test_a_replicas_canary_router_learns_a_canary_from_the_database(postgres, tmp_path, monkeypatch):
    """What `rag serve` routes by (rag.serving.canary): it re-reads the state when its marks change, and with the
    state in PostgreSQL a replica without the writer's volume sees the canary start."""
    from rag.serving.canary import CanaryRouter
    from rag.state import sql
    from tests.test_rollout_serving import fake_model

    monkeypatch.setenv("RAG_STATE_NAMESPACE", "team-deployment")
    monkeypatch.setattr(sql, "MARKS_TTL_SECONDS", 0)
    writer = ModelRegistry(tmp_path / "pod-a" / "models")
    replica = ModelRegistry(tmp_path / "pod-b" / "models")
    replica.register("reranker", fake_model(tmp_path / "r1"), {"base_model": "minilm"})
    router = CanaryRouter(replica, open_arm=lambda kind, candidate: object())
    assert router._sync() is None
    started = canary_state().model_copy(update={"candidate_version": "v1", "production_version": None})
    record_step(writer, "reranker", None, started, "start", quiet, approved_by="test")
    active = router._sync()
    assert active is not None and (active.kind, active.state.candidate_version) == ("reranker", "v1")


def test_a_data_dirs_files_are_imported_on_the_databases_first_use(postgres, tmp_path, monkeypatch):
    registry = ModelRegistry(tmp_path / "models")
    monkeypatch.setenv("RAG_STATE_DB_URL", "files")
    record_step(registry, "reranker", None, canary_state(), "start", quiet, approved_by="before the database")
    from rag.lifecycle.journal import Intent, _write_intent

    _write_intent(registry, Intent(kind="reranker", action="promote", production_before="v1", production_after="v2"))
    files = {"state": read_state(registry, "reranker"), "log": history_entries(registry), "intent": pending(registry)}

    use_database(monkeypatch, postgres)
    for _ in range(2):  # a second process's open (no backend cached) imports nothing again
        state._open.clear()
        assert read_state(registry, "reranker") == files["state"]
        assert history_entries(registry) == files["log"] and pending(registry) == files["intent"]
    (registry.root / "rollout" / "reranker.json").write_text(json.dumps({"stale": True}))  # no longer read
    assert read_state(registry, "reranker") == files["state"]


def test_while_the_state_store_cannot_be_reached_the_last_marks_are_repeated(backend, tmp_path, monkeypatch):
    from rag.lifecycle.journal import backend as store_of

    registry = ModelRegistry(tmp_path / "models")
    marks, signature = state_marks(registry), registry.change_signature()

    def unreachable(keys):
        raise ConnectionError("the state database cannot be reached")

    monkeypatch.setattr(store_of(registry), "marks", unreachable)
    assert state_marks(registry) == marks and registry.change_signature() == signature  # an outage is no change
