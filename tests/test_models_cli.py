"""`rag models list|show|promote|rollback`, `rag retrain` and `rag feedback export`, driven through the `rag` command's
main(argv) against a temporary data dir whose registry holds hand-made versions (fake weights, recorded gate
verdicts): nothing is trained or embedded. Promotion and rollback use rerankers, whose release never opens Qdrant."""

import json
import shlex
from pathlib import Path

import pytest

from orchestration.cli import main
from rag.feedback import FeedbackStore, FeedbackSubmission, PassageRating
from rag.registry import ModelRegistry
from rag.lifecycle.rollout import history, read_state, start
from tests.test_rollout_serving import fake_model, verdict
from tests.verdicts import sound

quiet = lambda _: None  # noqa: E731


@pytest.fixture
def data(tmp_path, monkeypatch):
    root = tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    monkeypatch.setenv("DAGSTER_HOME", str(root / "dagster"))
    for name in ("QDRANT_URL", "RAG_QDRANT_PATH", "RAG_PROMOTION_POLICY", "FEEDBACK_DB_URL"):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture
def registry(data, tmp_path):
    """Embedder v1 production (promoted), v2 a candidate whose gate passed against v1, with gate figures.
    Reranker v1 production (promoted from the implicit v0), v2 registered and never gated."""
    registry = ModelRegistry(data / "models")
    for kind, n in (("embedder", 2), ("reranker", 2)):
        for i in range(1, n + 1):
            registry.register(
                kind,
                fake_model(tmp_path / f"{kind}{i}"),
                {
                    "base_model": "minilm",
                    "strategy": "paragraph",
                    "seed": 7,
                    "qa_set_version": "abc123",
                    "hyperparameters": {"epochs": i, "learning_rate": 2e-5},
                    "metrics": {"dev_selection": {"mrr@5": 0.5 + i / 10}},
                },
            )
        registry.set_alias(kind, "production", "v1")
        registry.update_metrics(
            kind, "v1", {"promotion": {"at": "2025-01-01T00:00:00+00:00", "previous_version": None, "forced": False}}
        )
    registry.set_alias("embedder", "candidate", "v2")
    verdict(registry, "embedder", registry.resolve("embedder", "v2"), production="v1")
    registry.update_metrics(
        "embedder",
        "v2",
        {
            "gate": {
                **sound(registry, "embedder"),
                **registry.resolve("embedder", "v2").metrics["gate"],
                "candidate_ndcg@10": 0.8123,
                "delta_ndcg@10": 0.0312,
                "p_value_ndcg@10": 0.0004,
            }
        },
    )
    return registry


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def production(registry, kind) -> str | None:
    return registry.aliases()[kind].get("production")


def test_list_shows_each_kinds_versions_with_stage_created_gate_and_metrics(registry, capsys):
    start("embedder", registry, "v2", log=quiet)  # a running canary (no chunk sets: nothing embedded)
    code, out, _ = run(capsys, "models", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "embedder: production ft-minilm-v1, candidate ft-minilm-v2"
    v1 = next(line for line in lines if "ft-minilm-v1 " in line)
    v2 = next(line for line in lines if "ft-minilm-v2 " in line)
    assert "production" in v1 and "gate: not gated" in v1 and "mrr@5 0.6000" in v1
    assert (
        "candidate, canary" in v2
        and "gate: passed vs ft-minilm-v1" in v2
        and "ndcg@10 0.8123 (+0.0312, p=0.0004)" in v2
    )
    assert registry.resolve("embedder", "v2").created_at in v2
    assert any(line.startswith("reranker: production ce-minilm-v1, candidate -") for line in lines)

    code, out, _ = run(capsys, "models", "list", "--kind", "reranker", "--json")
    rows = json.loads(out)
    assert code == 0 and list(rows) == ["reranker"]
    assert [(r["version"], r["stages"], r["gate"]) for r in rows["reranker"]] == [
        ("v1", ["production"], "not gated"),
        ("v2", [], "not gated"),
    ]


def test_show_prints_manifest_gate_result_metrics_and_training_args(registry, capsys):
    code, out, _ = run(capsys, "models", "show", "ft-minilm-v2", "--json")  # the kind comes from the name
    shown = json.loads(out)
    assert code == 0
    assert (shown["kind"], shown["version"], shown["stages"]) == ("embedder", "v2", ["candidate"])
    assert shown["gate_verdict"]["passed"] is True and shown["gate_verdict"]["production_version"] == "v1"
    assert shown["promotable"] is True and shown["promotion_refusal"] is None
    assert shown["training"]["hyperparameters"] == {"epochs": 2, "learning_rate": 2e-5}
    assert shown["training"]["seed"] == 7 and shown["training"]["parent_version"] is None
    assert shown["metrics"]["dev_selection"] == {"mrr@5": 0.7}
    assert shown["manifest"]["name"] == "ft-minilm-v2" and shown["manifest"]["qa_set_version"] == "abc123"

    code, out, _ = run(capsys, "models", "show", "v2", "--kind", "reranker")
    assert code == 0
    assert out.startswith("reranker ce-minilm-v2 (v2): registered; created ")
    assert "not promotable now: it has no gate verdict" in out
    assert '    hyperparameters: {"epochs": 2, "learning_rate": 2e-05}' in out

    code, _, err = run(capsys, "models", "show", "v9", "--kind", "reranker")
    assert code == 2 and "no reranker 'v9'" in err and "ce-minilm-v1, ce-minilm-v2" in err
    code, _, err = run(capsys, "models", "show", "ce-minilm-v1", "--kind", "embedder")
    assert code == 2 and "names a reranker" in err


def test_promote_is_refused_without_a_passing_gate_and_says_why(registry, capsys):
    code, out, err = run(capsys, "models", "promote", "v2", "--kind", "reranker")
    assert code == 2 and "changed" not in out
    assert "refusing to promote reranker ce-minilm-v2: it has no gate verdict" in err
    assert "trained_reranker_gate" in err
    assert production(registry, "reranker") == "v1"

    verdict(registry, "reranker", registry.resolve("reranker", "v2"), passed=False, production="v1")
    code, _, err = run(capsys, "models", "promote", "ce-minilm-v2")
    assert code == 2 and "the gate rejected it against ce-minilm-v1" in err
    assert production(registry, "reranker") == "v1" and "promotion" not in registry.resolve("reranker", "v2").metrics


def test_promote_with_a_passing_gate_moves_production_and_prints_what_changed(registry, capsys):
    verdict(registry, "reranker", registry.resolve("reranker", "v2"), production="v1")
    registry.set_alias("reranker", "candidate", "v2")
    code, out, _ = run(capsys, "models", "promote", "candidate", "--kind", "reranker")
    assert code == 0
    assert "reranker: promoted: ce-minilm-v2 is production (was ce-minilm-v1)" in out
    assert "  reranker production: ce-minilm-v1 → ce-minilm-v2" in out
    assert "  reranker candidate: ce-minilm-v2 → -" in out
    assert production(registry, "reranker") == "v2"
    assert registry.resolve("reranker", "v2").metrics["promotion"] == {
        **registry.resolve("reranker", "v2").metrics["promotion"],
        "previous_version": "v1",
        "forced": False,
    }

    code, _, err = run(capsys, "models", "promote", "v2", "--kind", "reranker")
    assert code == 2 and "already production" in err


def test_promote_under_the_canary_policy_says_to_start_a_canary(registry, capsys, monkeypatch):
    monkeypatch.setenv("RAG_PROMOTION_POLICY", "canary")
    code, out, err = run(capsys, "models", "promote", "v2")
    assert code == 2
    assert "promotion policy is 'canary'" in err and "`rag models rollout start --kind embedder --candidate v2`" in err
    assert production(registry, "embedder") == "v1" and read_state(registry, "embedder") is None


def test_promote_is_refused_while_a_canary_runs(registry, capsys):
    start("embedder", registry, "v2", log=quiet)
    verdict(registry, "reranker", registry.resolve("reranker", "v2"), production="v1")
    code, _, err = run(capsys, "models", "promote", "v2", "--kind", "reranker")
    assert code == 2 and "a canary of embedder ft-minilm-v2 is running" in err
    assert production(registry, "reranker") == "v1"


def test_rollback_returns_a_direct_promotion_to_the_previous_production_logged(registry, capsys):
    verdict(registry, "reranker", registry.resolve("reranker", "v2"), production="v1")
    assert run(capsys, "models", "promote", "v2", "--kind", "reranker")[0] == 0

    code, out, _ = run(capsys, "models", "rollback", "--kind", "reranker", "--reason", "answers got worse")
    assert code == 0
    assert "  reranker production: ce-minilm-v2 → ce-minilm-v1" in out
    assert "  reranker rollout of ce-minilm-v2: none → rolled_back" in out
    assert production(registry, "reranker") == "v1"
    assert registry.resolve("reranker", "v2").metrics["reverted"]["reason"] == "answers got worse"
    steps = [(h["kind"], h["step"], h["candidate"], h["to"]) for h in history(registry)]
    assert steps == [("reranker", "direct-promotion", "v2", "production"), ("reranker", "revert", "v2", "rolled_back")]
    rows = json.loads(run(capsys, "models", "list", "--kind", "reranker", "--json")[1])["reranker"]
    assert [r["stages"] for r in rows] == [["production"], ["rolled back"]]

    # Rolling back again would bring back the version just rolled back: refused, nothing moves.
    code, _, err = run(capsys, "models", "rollback", "--kind", "reranker")
    assert code == 2 and "because of a rollback" in err and production(registry, "reranker") == "v1"


def test_rollback_of_the_first_promotion_restores_the_implicit_v0(registry, capsys):
    code, out, _ = run(capsys, "models", "rollback", "--kind", "reranker")
    assert code == 0 and "  reranker production: ce-minilm-v1 → no reranker (implicit v0)" in out
    assert production(registry, "reranker") is None


def test_rollback_stops_a_running_canary_and_leaves_production(registry, capsys):
    start("embedder", registry, "v2", log=quiet)
    code, out, _ = run(capsys, "models", "rollback", "--reason", "latency")
    assert code == 0 and "  embedder rollout of ft-minilm-v2: canary → rolled_back" in out
    assert "production" not in out.split("changed:")[1]
    assert production(registry, "embedder") == "v1" and read_state(registry, "embedder").stage == "rolled_back"
    assert run(capsys, "models", "rollout", "status", "--json")[0] == 0  # the existing subcommands still work


def test_rollout_status_says_when_a_running_canary_would_decide(registry, capsys):
    start("embedder", registry, "v2", log=quiet)
    code, out, _ = run(capsys, "models", "rollout", "status")
    # No user has been shown the canary yet: the test has nothing to project, so the horizon is what ends it.
    assert code == 0 and "canary ft-minilm-v2: 0 queries" in out
    assert "no edge the test would decide at the rates so far: the horizon (2000 canary queries) ends it" in out
    figures = json.loads(run(capsys, "models", "rollout", "status", "--json")[1])["embedder"]["evidence"]
    assert figures["queries_to_decide"] is None and figures["max_queries"] == 2000


# --- a promotion a killed process left half done ---------------------------------------------------------------------


def interrupted_canary_promotion(registry, monkeypatch) -> None:
    """A canary of embedder v2 promoted up to the registry alias, killed before the rollout state was written:
    registry production v2 while the state still says canary (no chunk sets: the intent swaps no serving alias)."""
    from rag.lifecycle import journal
    from rag.lifecycle.rollout import conclude
    from tests.verdicts import won

    start("embedder", registry, "v2", log=quiet)

    def killed(*_args, **_kwargs):
        raise KeyboardInterrupt("killed before the rollout state was written")

    with monkeypatch.context() as patch:
        patch.setattr(journal, "_write_state", killed)
        with pytest.raises(KeyboardInterrupt):
            conclude("embedder", registry, "promote", "won", candidate="v2", evidence_source=won(), log=quiet)


@pytest.mark.parametrize(
    "argv", [("models", "list"), ("models", "show", "v2"), ("models", "rollout", "status"), ("models", "rollback")]
)
def test_every_models_command_first_completes_a_promotion_a_kill_left_half_done(registry, capsys, monkeypatch, argv):
    from rag.lifecycle.journal import consistency, pending
    from rag.registry.cli import stages

    interrupted_canary_promotion(registry, monkeypatch)
    assert stages(registry, registry.resolve("embedder", "v2")) == ["production", "canary"]  # what a kill leaves

    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert "completed an unfinished embedder promote" in err
    assert pending(registry) is None
    if argv[1] != "rollback":  # the readers show the completed promotion; the rollback then reverts it
        assert consistency(registry, "embedder") == {
            "registry": "v2",
            "rollout": "v2",
            "rollout_stage": "production",
            "pending": False,
        }
        assert "canary" not in stages(registry, registry.resolve("embedder", "v2"))
    else:
        assert production(registry, "embedder") == "v1" and read_state(registry, "embedder").stage == "rolled_back"
    if argv[1] == "list":
        assert "production   " in next(line for line in out.splitlines() if "ft-minilm-v2 " in line)


def test_a_models_command_that_cannot_complete_it_warns_and_names_the_fix(registry, capsys, monkeypatch):
    from rag.index import qdrant
    from rag.lifecycle.journal import Intent, _write_intent, pending

    # A promotion that swaps a serving alias needs Qdrant, which a Dagster run may hold.
    _write_intent(
        registry,
        Intent(
            kind="embedder",
            action="promote",
            production_before="v1",
            production_after="v2",
            serving_after={"paragraph__production": "paragraph__ft-minilm-v2"},
        ),
    )

    def held(*_args, **_kwargs):
        raise qdrant.QdrantLockedError("the Qdrant folder is held by another process")

    monkeypatch.setattr(qdrant, "get_client", held)
    code, out, err = run(capsys, "models", "list", "--json")
    assert code == 0 and json.loads(out)["embedder"]  # the listing still comes, parseable
    assert "WARNING: the embedder promote started" in err and "was interrupted" in err
    assert "may disagree" in err and "Run `rag models recover`" in err
    assert pending(registry) is not None


def test_a_models_command_does_not_wait_on_a_promotion_running_elsewhere(registry, capsys):
    import threading

    from rag.lifecycle.journal import Intent, _write_intent, lifecycle_lock, pending

    _write_intent(registry, Intent(kind="reranker", action="promote", production_before="v1", production_after="v2"))
    held, release = threading.Event(), threading.Event()

    def promoting() -> None:
        with lifecycle_lock(registry):
            held.set()
            release.wait(30)

    worker = threading.Thread(target=promoting)
    worker.start()
    try:
        held.wait(10)
        code, _, err = run(capsys, "models", "show", "v1", "--kind", "reranker")
    finally:
        release.set()
        worker.join()
    assert code == 0 and "is running in another process now" in err
    assert pending(registry) is not None  # a live promotion's intent is left to it


def rated_store(data: Path) -> None:
    store = FeedbackStore(root=data)
    chunks = [{"chunk_id": f"c{i}", "doc_id": "d.md", "text": f"passage {i}", "rank": i} for i in (1, 2)]
    for n in range(3):
        q = store.record_query(f"question {n}", answer="an answer", chunks=chunks, session_id=f"s{n}")
        store.submit_feedback(
            FeedbackSubmission(
                query_id=q.query_id,
                idempotency_key=f"k{n}",
                answer_score=1 if n else -1,
                passages=[PassageRating(chunk_id="c1", score=1), PassageRating(chunk_id="c2", score=-1)],
            )
        )
    store.record_query("unrated question", answer="a", chunks=chunks, session_id="s9")
    store.close()


def test_feedback_export_writes_the_beir_folder_and_prints_counts(data, tmp_path, capsys):
    code, _, err = run(capsys, "feedback", "export", str(tmp_path / "out"))
    assert code == 2 and "no feedback store" in err

    rated_store(data)
    code, out, _ = run(capsys, "feedback", "export", str(tmp_path / "out"))
    assert code == 0
    assert "3 queries, 2 passages, 3 answers, 9 feedback events" in out
    assert "chunk qrels +3 / -3, answer qrels +2 / -1, 3 document qrels" in out
    assert len((tmp_path / "out" / "queries.jsonl").read_text().splitlines()) == 3
    assert (tmp_path / "out" / "qrels" / "train.tsv").read_text().count("\tc1\t1") == 3

    code, out, _ = run(capsys, "feedback", "export", "--json")  # the versioned export the retrain sensors use
    stats = json.loads(out)
    assert code == 0 and Path(stats["path"]).parent == data / "feedback_dataset" and stats["feedback_events"] == 9


def test_retrain_help_explains_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["retrain", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "retrain_job" in out and "feedback_volume_sensor" in out and "execute_in_process" in out
    assert "--print-command" in out and "dagster job launch" in out


def test_retrain_print_command_is_the_sensors_request(data, capsys):
    rated_store(data)
    code, out, err = run(capsys, "retrain", "--print-command")
    assert code == 0 and "exported the feedback dataset" in err
    words = shlex.split(out.strip())
    assert words[0] == f"DAGSTER_HOME={data / 'dagster'}" and words[1:4] == ["dagster", "job", "launch"]
    assert words[words.index("-j") + 1] == "retrain_job" and Path(words[words.index("-w") + 1]).name == "workspace.yaml"
    config = json.loads(words[words.index("--config-json") + 1])
    folder = Path(config["ops"]["finetuned_embedder"]["config"]["feedback_dataset"])
    assert config["ops"]["trained_reranker"]["config"]["feedback_dataset"] == str(folder)
    assert json.loads((folder / "stats.json").read_text())["feedback_events"] == 9
    tags = json.loads(words[words.index("--tags") + 1])
    assert tags["feedback/high_water_mark"] == "9" and tags["trigger"] == "cli"


def test_retrain_waits_while_a_canary_runs(registry, capsys):
    start("embedder", registry, "v2", log=quiet)
    code, _, err = run(capsys, "retrain", "--print-command", "--no-feedback")
    assert code == 2 and "a canary of embedder ft-minilm-v2 is running" in err


def test_retrain_runs_retrain_job_in_process_with_the_sensors_run_config(data, capsys, monkeypatch):
    from dagster import JobDefinition
    from dagster._core.execution.validate_run_config import validate_run_config

    rated_store(data)
    launched = {}

    class Result:
        success, run_id = True, "run-1"

    def execute_in_process(self, **kwargs):
        launched.update(kwargs, job=self)
        return Result()

    monkeypatch.setattr(JobDefinition, "execute_in_process", execute_in_process)
    code, out, _ = run(capsys, "retrain")
    assert code == 0 and "retrain_job run run-1: succeeded" in out and "nothing changed" in out
    assert launched["job"].name == "retrain_job" and launched["tags"]["feedback/high_water_mark"] == "9"
    assert launched["instance"].root_directory == str(data / "dagster")
    validate_run_config(launched["job"], launched["run_config"])  # the job accepts the config it was given
