"""The feedback loop end to end at toy size (bench/feedback_loop.py is the full-size run): SciFact train queries
replayed through /ask with feedback from their qrels until feedback_volume_sensor requests retrain_job; the run
executes in-process (fine-tune, gate, promote only on a pass); the API serves whatever production is afterwards;
test nDCG@10 before and after are measured, and the sensor counts from the new mark."""

import math

import pytest

from tests.conftest import SHARED

pytestmark = pytest.mark.slow


def test_sensor_driven_retrain_from_replayed_feedback(tmp_path, monkeypatch):
    if not (SHARED / "scifact" / "corpus.jsonl").exists():
        pytest.skip("shared SciFact not available")
    from bench.feedback_loop import run_loop

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))  # "production" resolves through this data dir's registry
    monkeypatch.delenv("QDRANT_URL", raising=False)
    threshold = 100
    out = run_loop(
        tmp_path,
        n_train=30,
        n_test=20,
        n_distractors=40,
        n_pseudo=80,
        threshold=threshold,
        batch=8,
        training={"max_steps": 4, "max_seq_length": 64, "batch_size": 16, "max_pairs": 300},
        log=print,
    )

    # The sensor said how far it was until it fired, and fired once the threshold was reached.
    *skips, fired = out["ticks"]
    assert out["fired"] and fired.startswith("RunRequest feedback-volume:")
    assert skips and all(s.endswith(f"/{threshold} new feedback events since model v1") for s in skips)
    assert out["feedback_events"] >= threshold
    # The gates decided; production moved exactly when the embedder gate passed, and the API followed it.
    gate = out["gates"]["finetuned_embedder_gate"]
    assert "trained_reranker_gate" in out["gates"]
    if gate["passed"]:
        assert out["production_after"] == "v2" and out["served_after"] != out["served_before"]
    else:
        assert out["production_after"] == "v1" and out["served_after"] == out["served_before"]
        assert math.isclose(out["ndcg@10_after"], out["ndcg@10_before"], abs_tol=1e-9)
        assert out["rejected_candidate"] == "ft-minilm-v2" and 0 < out["rejected_candidate_ndcg@10"] <= 1
    assert 0 < out["ndcg@10_before"] <= 1 and 0 < out["ndcg@10_after"] <= 1
    # The feedback that trained this run is consumed: the count starts again from its high-water mark.
    assert out["tick_after"].startswith(f"0/{threshold} new feedback events since model {out['production_after']}")
