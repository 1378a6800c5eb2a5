"""The drift sensor's reference is production traffic, not the QA set: replayed real questions (SQuAD dev) with a
QA set of sentences copied from the documents never start a retrain; questions from another corpus (SciFact
claims) do; the reference restarts after a promotion or a finished retrain; the QA-set fallback is stated; no
statistics run without new queries."""

import gzip
import json
import random
import re
import time

import pandas as pd
import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, SensorResult, SkipReason

import sensors.drift
from rag.evaluation.qaset import QA_COLUMNS
from rag.feedback import FeedbackStore
from rag.store import TableStore
from sensors.drift import drift_sensor
from tests.conftest import SHARED
from tests.test_drift import chunks, make_loop, tick


@pytest.fixture(scope="module")
def corpora() -> dict[str, list[str]]:
    squad, scifact = SHARED / "squad-dev" / "dev-v1.1.json.gz", SHARED / "scifact" / "queries.jsonl"
    if not (squad.exists() and scifact.exists()):
        pytest.skip(f"shared SQuAD dev / SciFact not available under {SHARED}")
    articles = json.loads(gzip.decompress(squad.read_bytes()))["data"]
    paragraphs = [p for a in articles for p in a["paragraphs"]]
    questions = [q["question"] for p in paragraphs for q in p["qas"]]
    # What the QA set holds without an LLM: sentences of the documents as "questions" (inverse cloze).
    sentences = [s for p in paragraphs for s in re.split(r"(?<=[.!?])\s+", p["context"]) if 6 <= len(s.split()) <= 30]
    claims = [json.loads(line)["text"] for line in scifact.read_text().splitlines()]
    rng = random.Random(0)  # shuffled: in article order, a later window would be about other topics (a real shift)
    for texts in (questions, sentences, claims):
        rng.shuffle(texts)
    return {"questions": questions, "sentences": sentences, "claims": claims}


def write_qa_set(loop, questions: list[str], source: str) -> None:
    qtype = "inverse-cloze" if source == "inverse-cloze" else "factual"
    rows = [
        {
            "qid": f"q{i}",
            "question": q,
            "qtype": qtype,
            "doc_id": "d",
            "evidence_json": "[]",
            "answer": None,
            "split": "dev",
            "source": source,
        }
        for i, q in enumerate(questions)
    ]
    TableStore(loop.root / "tables").write(pd.DataFrame(rows, columns=QA_COLUMNS), "synthetic_qa")


def ask(store, texts) -> None:
    for text in texts:
        store.record_query(text, answer="a", chunks=chunks("p1"))


def reference_loop(tmp_path, **overrides):
    return make_loop(tmp_path, drift_reference_window=40, **overrides)


def replay(instance, loop, store, batches, cursor=None):
    results = []
    for batch in batches:
        ask(store, batch)
        results.append(tick(drift_sensor, instance, loop, cursor))
        cursor = results[-1].cursor
    return results, cursor


def requested(results) -> list[str]:
    return [r.run_key for result in results if isinstance(result, SensorResult) for r in result.run_requests]


def observations(results):
    return [
        e
        for result in results
        if isinstance(result, SensorResult)
        for e in result.asset_events
        if e.asset_key.path == ["query_drift"]
    ]


def test_no_shift_replay_never_requests_a_retrain(tmp_path, corpora):
    loop = reference_loop(tmp_path)
    write_qa_set(loop, corpora["sentences"][:200], "inverse-cloze")
    store = FeedbackStore(loop.db_url)
    questions = corpora["questions"]
    with DagsterInstance.ephemeral() as instance:
        # From the first query on: a reference window, then recent windows from the same distribution.
        results, _ = replay(instance, loop, store, [questions[i : i + 15] for i in range(0, 180, 15)])
    assert requested(results) == []
    seen = observations(results)
    assert len(seen) >= 10 and not any(o.metadata["drifted"].value for o in seen)
    assert all(
        o.metadata["reference"].value.endswith(
            "production queries since the first query, nothing promoted or retrained yet"
        )
        for o in seen
    )
    # The first tick had too few queries for a production reference, and the copied sentences are none.
    first = results[0].skip_reason.skip_message
    assert first.startswith("no reference yet: only 15 production queries since the first query")
    assert first.endswith(
        "the QA set has 0 written questions (need 10): its other 200 are sentences copied from the "
        "documents, which real questions always look drifted from"
    )
    store.close()


def test_questions_from_another_corpus_request_a_retrain(tmp_path, corpora):
    loop = reference_loop(tmp_path)
    write_qa_set(loop, corpora["sentences"][:200], "inverse-cloze")
    store = FeedbackStore(loop.db_url)
    ask(store, corpora["questions"][:40])
    claims = corpora["claims"]
    with DagsterInstance.ephemeral() as instance:
        results, _ = replay(instance, loop, store, [claims[i : i + 40] for i in range(0, 120, 40)])
    first, second, third = results
    assert not first.run_requests and "1/2 drifted ticks in a row" in first.skip_reason.skip_message
    observation = observations([first])[0]
    assert observation.metadata["drifted"].value is True
    assert observation.metadata["reference"].value.startswith("40 production queries since the first query")
    assert observation.metadata["classifier_auc"].value > 0.9
    assert len(second.run_requests) == 1 and second.run_requests[0].run_key.startswith("drift:")
    assert not third.run_requests and "1/2 drifted ticks in a row" in third.skip_reason.skip_message
    store.close()


@pytest.mark.parametrize("refresh", ["promotion", "retrain"])
def test_the_reference_restarts_after_a_promotion_or_a_finished_retrain(tmp_path, corpora, refresh):
    loop = reference_loop(tmp_path, drift_consecutive_ticks=2)
    write_qa_set(loop, corpora["questions"][200:300], "llm:test")  # written questions: the new reference ignores them
    store = FeedbackStore(loop.db_url)
    claims = corpora["claims"]
    with DagsterInstance.ephemeral() as instance:
        (before, drifted), cursor = replay(instance, loop, store, [corpora["questions"][:40], claims[:40]])
        assert "0/2" in before.skip_reason.skip_message and "1/2 drifted ticks" in drifted.skip_reason.skip_message
        time.sleep(1.1)  # the promotion record and the run's creation time have whole seconds
        if refresh == "promotion":
            from rag.registry import ModelRegistry
            from rag.lifecycle.promotion import promote

            model_dir = tmp_path / "m"
            model_dir.mkdir()
            (model_dir / "weights.bin").write_bytes(b"0")
            registry = ModelRegistry(tmp_path / "models")
            candidate = registry.register("embedder", model_dir, {"base_model": "minilm"})
            promote("embedder", registry, candidate, force_reason="test: a promotion", log=lambda _: None)
            label = "since promotion of embedder v1"
        else:
            instance.add_run(DagsterRun(job_name="retrain_job", run_id="r1", status=DagsterRunStatus.SUCCESS))
            label = "since retrain run r1"
        time.sleep(1.1)
        # The shifted traffic goes on, but the models have seen it now: it is the new reference.
        (after,), _ = replay(instance, loop, store, [claims[40:70]], cursor)
    assert not after.run_requests and "0/2 drifted ticks in a row" in after.skip_reason.skip_message
    assert observations([after])[0].metadata["reference"].value.startswith(f"10 production queries {label}")
    store.close()


def test_drifted_ticks_count_again_from_a_new_reference(tmp_path, corpora):
    loop = reference_loop(tmp_path, drift_consecutive_ticks=2)
    store = FeedbackStore(loop.db_url)
    questions, claims = corpora["questions"], corpora["claims"]
    with DagsterInstance.ephemeral() as instance:
        (_, drifted), cursor = replay(instance, loop, store, [questions[:40], claims[:40]])
        assert "1/2 drifted ticks" in drifted.skip_reason.skip_message
        time.sleep(1.1)
        instance.add_run(DagsterRun(job_name="retrain_job", run_id="r1", status=DagsterRunStatus.SUCCESS))
        time.sleep(1.1)
        # After the retrain the traffic shifts again: drifted from the new reference, a first tick of it.
        ask(store, claims[40:60])
        (again,), _ = replay(instance, loop, store, [questions[300:340]], cursor)
    assert observations([again])[0].metadata["reference"].value.startswith("20 production queries since retrain run r1")
    assert not again.run_requests and "1/2 drifted ticks in a row" in again.skip_reason.skip_message
    store.close()


def test_the_qa_set_fallback_is_stated(tmp_path, corpora):
    loop = reference_loop(tmp_path)
    write_qa_set(loop, corpora["questions"][:100], "llm:test")  # written questions, as an LLM would
    store = FeedbackStore(loop.db_url)
    ask(store, corpora["questions"][100:115])
    with DagsterInstance.ephemeral() as instance:
        result = tick(drift_sensor, instance, loop)
    source = (
        "QA set (fallback: only 15 production queries since the first query, nothing promoted or retrained "
        "yet; 20 make a reference)"
    )
    assert f"15 recent queries vs reference: {source}" in result.skip_reason.skip_message
    assert observations([result])[0].metadata["reference"].value == source
    store.close()


@pytest.fixture
def drift_reports(monkeypatch) -> list[int]:
    """One item per drift_report call the sensor makes."""
    calls = []
    real = sensors.drift.drift_report
    monkeypatch.setattr(sensors.drift, "drift_report", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_no_statistics_without_new_queries(tmp_path, corpora, drift_reports):
    loop = reference_loop(tmp_path)
    write_qa_set(loop, corpora["questions"][:100], "llm:test")
    store = FeedbackStore(loop.db_url)
    ask(store, corpora["questions"][100:140])
    with DagsterInstance.ephemeral() as instance:
        measured = tick(drift_sensor, instance, loop)
        assert drift_reports == [1] and observations([measured])
        unchanged = tick(drift_sensor, instance, loop, measured.cursor)
    assert (
        isinstance(unchanged, SkipReason)
        and unchanged.skip_message == "no new queries since the last tick (0 drifted ticks in a row)"
    )
    assert drift_reports == [1]
    store.close()


def test_no_statistics_against_sentences_copied_from_the_documents(tmp_path, corpora, drift_reports):
    loop = reference_loop(tmp_path)
    write_qa_set(loop, corpora["sentences"][:100], "inverse-cloze")
    store = FeedbackStore(loop.db_url)
    ask(store, corpora["questions"][:15])
    with DagsterInstance.ephemeral() as instance:
        waiting = tick(drift_sensor, instance, loop)
        assert drift_reports == [] and waiting.skip_reason.skip_message.startswith(
            "no reference yet: only 15 production queries"
        )
        ask(store, corpora["questions"][15:40])  # now production traffic is its own reference
        measured = tick(drift_sensor, instance, loop, waiting.cursor)
    assert drift_reports == [1] and not observations([measured])[0].metadata["drifted"].value
    store.close()
