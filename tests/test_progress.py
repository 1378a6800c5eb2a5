"""Progress reporting (rag.progress): rate-limited lines off a terminal, a tqdm bar on one, the counts the library
reports while indexing, and the lines a Dagster asset logs through context.log."""

import io
import random
import re
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from rag.index.qdrant import QdrantSettings, close_client, get_client
from rag.progress import BarProgress, LogProgress, cli_progress, counter, progress_line


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, task, done, total, unit="items"):
        self.calls.append((task, done, total, unit))

    def of(self, task):
        return [(call[1], call[2]) for call in self.calls if call[0] == task]


# --- the helper ----------------------------------------------------------------------------------------------------


def test_log_progress_is_periodic_and_rate_limited():
    clock, lines = FakeClock(), []
    progress = LogProgress(lines.append, interval=10.0, clock=clock)
    for i in range(0, 5001, 50):  # 5000 chunks at 100/s over 50 s, reported 100 times
        clock.now = i / 100
        progress("embedding p|m", i, 5000, "chunks")
    # Every 10 s (at 10, 20, 30, 40 s), then one closing line: not one line per report.
    assert len(lines) == 5, lines
    assert lines[0] == "embedding p|m: 1000/5000 chunks, 100/s, ETA 40 s"
    assert lines[3] == "embedding p|m: 4000/5000 chunks, 100/s, ETA 10 s"
    assert lines[-1] == "embedding p|m: 5000/5000 chunks, 100/s, done in 50 s"


def test_log_progress_says_nothing_for_a_short_task_and_tracks_tasks_apart():
    clock, lines = FakeClock(), []
    progress = LogProgress(lines.append, interval=10.0, clock=clock)
    for i in range(11):
        clock.now = i * 0.5  # done in 5 s: shorter than the interval
        progress("chunking fast", i, 10, "documents")
    assert lines == []
    clock.now = 0.0
    progress("a", 0, 100)
    clock.now = 5.0
    progress("b", 0, 100)
    clock.now = 10.0
    progress("a", 30, 100)  # a: 10 s since it started
    progress("b", 30, 100)  # b: 5 s since it started: too early
    assert lines == ["a: 30/100 items, 3.0/s, ETA 23 s"]


def test_progress_line_formats_long_durations_and_unknown_totals():
    assert progress_line("t", 10, 10_000, "steps", 60.0, 0.1) == "t: 10/10000 steps, 0.1/s, ETA 27 h 45 min"
    assert progress_line("t", 500, None, "candidates", 250.0, 2.0) == "t: 500 candidates, 2.0/s"


def test_non_tty_cli_progress_prints_plain_lines():
    stream = io.StringIO()
    progress = cli_progress(stream, interval=0.0)
    assert isinstance(progress, LogProgress)
    progress("parsing", 0, 2, "documents")
    progress("parsing", 2, 2, "documents")
    text = stream.getvalue()
    assert "parsing: 0/2 documents" in text and "parsing: 2/2 documents" in text and "\r" not in text


def test_tty_path_draws_a_tqdm_bar_with_rate_and_eta():
    from tqdm import tqdm

    tty = FakeTTY()
    assert isinstance(cli_progress(tty), BarProgress)
    bar = BarProgress(tty, delay=0.0, mininterval=0.0)
    bar("training minilm", 0, 100, "steps")
    bar("training minilm", 40, 100, "steps")
    assert isinstance(bar._bar, tqdm)
    bar("training minilm", 100, 100, "steps")
    assert bar._bar is None  # closed when its task completed
    out = tty.getvalue()
    assert "training minilm" in out and "40/100" in out and "steps/s" in out and "\r" in out
    assert re.search(r"<\d\d:\d\d", out)  # tqdm's ETA


def test_counter_is_a_no_op_without_a_sink_or_work():
    advance = counter(None, "x", 10)
    advance()  # nothing to call
    rec = Recorder()
    counter(rec, "nothing", 0)()
    assert rec.calls == []
    advance = counter(rec, "x", 3, "files")
    advance()
    advance(2)
    assert rec.calls == [("x", 0, 3, "files"), ("x", 1, 3, "files"), ("x", 3, 3, "files")]


class ByteRecorder(Recorder):
    def __call__(self, task, done, total, unit="items", nbytes=None):
        self.calls.append((task, done, total, unit, nbytes))


def test_a_stage_that_reads_bytes_shows_its_data_rate_beside_the_item_rate():
    clock, lines = FakeClock(), []
    advance = counter(LogProgress(lines.append, interval=10.0, clock=clock), "parsing", 40, "documents")
    for i in range(1, 41):
        clock.now = i / 2  # 2 documents of 250 kB a second
        advance(1, 250_000)
    assert lines[0] == "parsing: 20/40 documents, 2.0/s, 0.50 MB/s, ETA 10 s"
    assert lines[-1] == "parsing: 40/40 documents, 2.0/s, 0.50 MB/s, done in 20 s"
    assert progress_line("p", 5, 10, "documents", 1.0, 5.0, 3_500_000) == "p: 5/10 documents, 5.0/s, 3.5 MB/s, ETA 1 s"


def test_counter_sends_bytes_only_to_sinks_that_take_them():
    plain, sized = Recorder(), ByteRecorder()
    for sink in (plain, sized):
        advance = counter(sink, "parsing", 2, "documents")
        advance(1, 100)
        advance(1, 50)
    assert plain.calls == [
        ("parsing", 0, 2, "documents"),
        ("parsing", 1, 2, "documents"),
        ("parsing", 2, 2, "documents"),
    ]
    assert [c[-1] for c in sized.calls] == [None, 100, 150]


def test_the_bar_shows_the_data_rate():
    tty = FakeTTY()
    bar = BarProgress(tty, delay=0.0, mininterval=0.0)
    bar("parsing", 0, 10, "documents")
    bar("parsing", 4, 10, "documents", nbytes=4_000_000)
    bar("parsing", 5, 10, "documents", nbytes=5_000_000)
    assert re.search(r"\d+(\.\d+)? MB/s", tty.getvalue())


# --- the library reports ---------------------------------------------------------------------------------------------


def _chunks(n: int):
    import hashlib

    import pandas as pd

    rng = random.Random(0)
    words = "rocket orbit fuel bread flour yeast pasta water planet sun jupiter moon star galaxy comet".split()
    rows = []
    for i in range(n):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 30)))
        rows.append(
            {
                "chunk_id": f"c{i}",
                "doc_id": f"d{i // 10}",
                "strategy": "p",
                "text": text,
                "char_start": 0,
                "char_end": len(text),
                "page_start": 1,
                "page_end": 1,
                "section_path": [],
                "prev_chunk_id": None,
                "next_chunk_id": None,
                "n_tokens": len(text.split()),
                "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                "table_html": None,
            }
        )
    return pd.DataFrame(rows)


def test_sync_collection_reports_chunks_up_to_the_total_and_embeds_the_same_vectors():
    from rag.embedding import load_embedder
    from rag.index.qdrant import DENSE, point_id
    from rag.index.sync import sync_collection

    embedder = load_embedder("wordllama")  # batch size 256: several reports per 512-chunk upsert batch
    chunks = _chunks(700)
    settings = QdrantSettings(path=":memory:")
    client, rec = get_client(settings), Recorder()
    try:
        run = sync_collection(client, chunks, embedder, strategy="p", model="wordllama", progress=rec)
        counts = rec.of("embedding p|wordllama")
        assert counts[0] == (0, 700) and counts[-1] == (700, 700)
        assert [d for d, _ in counts] == sorted(d for d, _ in counts) and len(counts) >= 4
        assert run.points == 700
        # Encoding in the embedder's own batches gives the vectors one call for everything gives.
        ids = chunks["chunk_id"].tolist()[:50]
        stored = {
            p.id: p.vector[DENSE] for p in client.retrieve(run.alias, [point_id(c) for c in ids], with_vectors=True)
        }
        expected = embedder.encode_passages(chunks["text"].tolist()[:50])
        assert np.allclose([stored[point_id(c)] for c in ids], expected, atol=1e-5)
        # Nothing changed: nothing to embed, nothing reported.
        rec.calls.clear()
        sync_collection(client, chunks, embedder, strategy="p", model="wordllama", progress=rec)
        assert rec.calls == []
    finally:
        close_client(settings)


def _docs(folder, n=3):
    folder.mkdir()
    rng = random.Random(1)
    words = "rocket orbit fuel bread flour yeast pasta water planet sun jupiter moon star galaxy comet".split()
    for i in range(n):
        paragraphs = [" ".join(rng.choice(words) for _ in range(40)) + "." for _ in range(20)]
        (folder / f"doc{i}.txt").write_text("\n\n".join(paragraphs))
    return folder


def test_index_folder_reports_every_step_up_to_its_total(tmp_path):
    from rag.pipeline import index_folder

    docs, rec = _docs(tmp_path / "docs"), Recorder()
    report = index_folder(
        docs,
        tmp_path / "data",
        strategies=["paragraph"],
        models=["wordllama"],
        qdrant=QdrantSettings(path=str(tmp_path / "qdrant")),
        progress=rec,
    )
    assert rec.of("parsing") == [(i, 3) for i in range(4)]
    assert rec.of("chunking paragraph") == [(i, 3) for i in range(4)]
    points = report.collections["paragraph|wordllama"]["points"]
    assert rec.of("embedding paragraph|wordllama")[-1] == (points, points) and points > 0
    close_client(QdrantSettings(path=str(tmp_path / "qdrant")))


def test_update_documents_counts_only_files_to_parse(tmp_path):
    from rag.ingest import update_documents
    from rag.parsing import ParseSettings
    from rag.source import scan_folder

    docs = _docs(tmp_path / "docs", n=2)
    first = update_documents(scan_folder(docs), None, None, ParseSettings())
    (docs / "doc9.txt").write_text("A new document about comets.")
    rec = ByteRecorder()
    update_documents(scan_folder(docs), first.documents, first.quarantine, ParseSettings(), progress=rec)
    assert rec.of("parsing") == [(0, 1), (1, 1)]
    assert rec.calls[-1][-1] == (docs / "doc9.txt").stat().st_size  # the bytes of the one file it parsed


def test_training_callback_reports_steps():
    pytest.importorskip("transformers")
    from rag.training.embedder import progress_callback

    rec, lines = Recorder(), []
    callback = progress_callback(lines.append, rec, "training minilm")
    state = SimpleNamespace(global_step=0, max_steps=20)
    callback.on_train_begin(None, state, None)
    for step in range(1, 21):
        state.global_step = step
        callback.on_step_end(None, state, None)
    assert rec.of("training minilm") == [(i, 20) for i in range(21)]
    assert lines == []  # the loss lines still come from on_log only


def test_search_evaluations_count_distinct_candidates():
    from rag.tuning.fitness import Evaluations

    rec = Recorder()
    space = SimpleNamespace(key=lambda g: str(g))
    evals = Evaluations(space, lambda g: SimpleNamespace(fitness=1.0), budget=3, advance=counter(rec, "grid search", 3))
    for genome in [(0,), (1,), (0,), (2,)]:
        evals(genome)
    assert rec.of("grid search") == [(0, 3), (1, 3), (2, 3), (3, 3)]


# --- Dagster ---------------------------------------------------------------------------------------------------------


def test_embedding_asset_logs_progress_through_context_log(tmp_path, monkeypatch):
    from dagster import DagsterInstance, materialize

    import assets.indexing
    from assets.indexing import embedding_collections
    from orchestration.partitions import collection_key
    from rag.pipeline import chunk_step, ingest_step
    from rag.source import scan_folder
    from resources.chunking import ChunkingStrategies
    from resources.models import EmbeddingModels
    from resources.qdrant import QdrantResource
    from resources.storage import DataStore
    from rag.parsing import ParseSettings

    config = tmp_path / "chunking.yaml"
    config.write_text(yaml.safe_dump({"strategies": {"paragraph": {"kind": "paragraph"}}}))
    store = DataStore(data_dir=str(tmp_path / "data"))
    ingest_step(store.tables, scan_folder(_docs(tmp_path / "docs")), ParseSettings())
    chunks = len(chunk_step(store.tables, ChunkingStrategies(config_path=str(config)).chunker("paragraph")).chunks)
    # A tiny set embeds in well under the 10 s interval: log every report instead.
    monkeypatch.setattr(assets.indexing, "LogProgress", lambda log: LogProgress(log, interval=0.0))
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chunking_strategy", ["paragraph"])
    instance.add_dynamic_partitions("embedding_model", ["wordllama"])
    result = materialize(
        [embedding_collections],
        partition_key=collection_key("paragraph", "wordllama"),
        instance=instance,
        resources={
            "data_store": store,
            "qdrant": QdrantResource(path=str(tmp_path / "qdrant")),
            "embedding_models": EmbeddingModels(config_path=str(tmp_path / "embedders.yaml")),
        },
    )
    assert result.success
    messages = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
    assert f"embedding paragraph|wordllama: 0/{chunks} chunks" in messages
    assert any(
        m.startswith(f"embedding paragraph|wordllama: {chunks}/{chunks} chunks") and "done in" in m for m in messages
    )
