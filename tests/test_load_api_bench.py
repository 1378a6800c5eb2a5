"""bench/load_api.py's parts that decide its figures: closed-loop clients against a real uvicorn server (every
answered ask counted once, in the store too; refused asks are errors, not throughput), the per-stage timings read
from whatever /ask returns, the percentiles, the target check, and the corpus edits a re-index round makes and
undoes."""

import itertools
from collections.abc import Callable

import pytest

from bench.load_api import (
    TOKEN,
    Corpus,
    latency_summary,
    measure,
    meets_targets,
    stage_medians,
    stage_timings,
)
from rag.feedback import FeedbackStore
from rag.serving.app import create_app
from rag.serving.settings import ServeSettings
from tests.test_api import FakeAnswerer
from tests.test_web_ui import running


@pytest.fixture
def store(tmp_path):
    st = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    yield st
    st.close()


def stepping(step: float = 1.0) -> Callable[[], float]:
    """A clock that moves `step` on every read: a phase of `seconds` starts an ask on each read before its end."""
    reads = itertools.count(0.0, step)
    return lambda: next(reads)


def busy_for(looks: int) -> Callable[[], bool]:
    """A re-index still running on its first `looks` looks, then done."""
    answers = iter([True] * looks)
    return lambda: next(answers, False)


def test_clients_count_each_answered_ask_once_and_refusals_as_errors(store):
    app = create_app(lambda: FakeAnswerer(), store, ServeSettings(api_token=TOKEN))
    with running(app) as base:
        phase = measure(base, ["which animal does purr", "how is bread baked"], clients=3, seconds=1.0)
        stored = store.counts()["queries"]
        # Reads 1 to 9 of the clock fall inside the 10 s: nine asks, over the three clients, then every client stops.
        timed = measure(base, ["which animal does purr"], clients=3, seconds=10, clock=stepping())
        # A re-index still running: the phase's seconds are over at once, the client asks on until it has finished.
        longer = measure(base, ["which animal does purr"], clients=1, seconds=0, busy=busy_for(4), clock=stepping())
    assert phase["errors"] == 0 and phase["answered"] >= 1
    assert phase["answered"] == phase["ask"]["n"] == stored
    assert phase["requests_per_s"] == pytest.approx(phase["answered"] / phase["seconds"], rel=0.02, abs=0.01)
    assert phase["ask"]["p50_ms"] <= phase["ask"]["p95_ms"] <= phase["ask"]["p99_ms"] <= phase["ask"]["max_ms"]
    assert "query_id" in phase["response_keys"]
    assert timed["answered"] == 9 and timed["errors"] == 0
    assert longer["answered"] == 4 and longer["errors"] == 0
    assert store.counts()["queries"] == stored + 9 + 4  # each answered ask stored once
    # Each question's first ask is new, every later one a repeat (its vector cached in the server).
    assert phase["ask_new_questions"]["n"] <= 2 and phase["ask_new_questions"]["n"] >= 1
    assert phase["ask_new_questions"]["n"] + phase["ask_repeated_questions"]["n"] == phase["answered"]
    asked = {"which animal does purr"}
    with running(app) as base:
        again = measure(base, ["which animal does purr"], clients=1, seconds=3, asked=asked, clock=stepping())
    assert again["ask_new_questions"]["n"] == 0 and again["ask_repeated_questions"]["n"] == again["answered"] == 2

    other = create_app(lambda: FakeAnswerer(), store, ServeSettings(api_token="another-token-0123456789"))
    with running(other) as base:
        refused = measure(base, ["which animal does purr"], clients=1, seconds=3, clock=stepping())
    assert refused["answered"] == 0 and refused["requests_per_s"] == 0 and refused["errors"] == 2
    assert refused["error_samples"][0].startswith("ask 401")


def test_stage_timings_are_read_from_any_timings_field():
    assert stage_timings({"answer": "x", "timings_ms": {"retrieve": 3, "generate": 1.5, "ok": True, "why": "x"}}) == {
        "retrieve": 3.0,
        "generate": 1.5,
    }
    assert stage_timings({"answer": "x", "timings": {"embed": 2}}) == {"embed": 2.0}
    assert stage_timings({"answer": "x", "latency_ms": 4.0}) is None
    medians = stage_medians([{"retrieve": 1.0, "generate": 9.0}, {"retrieve": 3.0}, {"retrieve": 2.0, "generate": 7.0}])
    assert medians == {"generate": 8.0, "retrieve": 2.0}  # each over the responses that timed it, slowest first


def test_latency_summary_and_targets():
    summary = latency_summary([float(ms) for ms in range(1, 101)])
    assert summary["n"] == 100 and summary["p50_ms"] == 50.5 and summary["p99_ms"] == 99.0 and summary["max_ms"] == 100
    assert latency_summary([]) == {"n": 0}
    phases = [
        {"clients": 1, "reindex": False, "ask": {"p95_ms": 42.0}, "requests_per_s": 20.0},
        {"clients": 10, "reindex": False, "ask": {"p95_ms": 300.0}, "requests_per_s": 39.9},
        {"clients": 10, "reindex": True, "ask": {"p95_ms": 900.0}, "requests_per_s": 80.0},
    ]
    assert meets_targets(phases) == {"ask_p95_ms_at_1_client": True, "requests_per_s_at_10_clients": False}
    assert meets_targets(phases[:1]) == {"ask_p95_ms_at_1_client": True, "requests_per_s_at_10_clients": None}


def test_reindex_edits_are_undone_by_writing_the_pristine_corpus(tmp_path):
    corpus = Corpus("sample", tmp_path)
    docs = tmp_path / "docs"
    assert corpus.write_pristine(docs) == len(corpus.files) and corpus.write_pristine(docs) == 0
    assert corpus.churnable and all(name.endswith((".md", ".txt")) for name in corpus.churnable)
    corpus.edit(docs, 7)
    edited = (docs / corpus.churnable[0]).read_text()
    assert edited.endswith("Revision 7 of this document.\n")
    (docs / "stray.md").write_text("not in the corpus")
    assert corpus.write_pristine(docs) == len(corpus.churnable) + 1
    assert {str(p.relative_to(docs)) for p in docs.rglob("*") if p.is_file()} == set(corpus.files)
    assert (docs / corpus.churnable[0]).read_bytes() == corpus.files[corpus.churnable[0]]
