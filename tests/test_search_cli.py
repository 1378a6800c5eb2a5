"""`rag index`, `rag search`, `rag eval-beir` as a user runs them, including every bad-input error."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO


def rag(args, env, **kw):
    return subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
        **kw,
    )


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, shared_mixed):
    root = tmp_path_factory.mktemp("cli")
    docs = root / "docs"
    docs.mkdir()
    for name in ["book-war-and-peace-1p.txt", "fake-html.html", "handbook-1p.docx"]:
        (docs / name).write_bytes((shared_mixed / name).read_bytes())
    env = {**os.environ, "RAG_DATA_DIR": str(root / "data")}
    out = rag(["index", str(docs), "--strategy", "paragraph", "--model", "wordllama", "--json"], env)
    assert out.returncode == 0, out.stderr
    return env, json.loads(out.stdout), docs


def test_index_reports_counts_and_a_rerun_writes_nothing(indexed):
    env, report, docs = indexed
    coll = report["collections"]["paragraph|wordllama"]
    assert coll["points"] == report["chunks"]["paragraph"]["chunks"] > 0 and coll["rebuilt"]
    again = json.loads(
        rag(["index", str(docs), "--strategy", "paragraph", "--model", "wordllama", "--json"], env).stdout
    )
    assert again["collections"]["paragraph|wordllama"]["added"] == 0 and again["parse"]["parsed"] == 0


def test_search_json_returns_cited_chunks(indexed):
    env, _, _ = indexed
    out = rag(
        [
            "search",
            "Who was Anna Pavlovna?",
            "--strategy",
            "paragraph",
            "--model",
            "wordllama",
            "--mode",
            "hybrid-rrf",
            "--k",
            "3",
            "--json",
        ],
        env,
    )
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)
    assert [h["rank"] for h in hits] == [1, 2, 3]
    assert set(hits[0]) == {
        "rank",
        "score",
        "chunk_id",
        "doc_id",
        "page_start",
        "page_end",
        "char_start",
        "char_end",
        "text",
    }
    assert hits[0]["doc_id"] == "book-war-and-peace-1p.txt" and "Anna Pavlovna" in hits[0]["text"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["search", "   ", "--strategy", "paragraph"], "the query is empty"),
        (["search", "q", "--strategy", "nope"], "no chunk set for strategy 'nope'"),
        (["search", "q", "--strategy", "paragraph", "--mode", "fuzzy"], "unknown retrieval mode 'fuzzy'"),
        (
            ["search", "q", "--strategy", "paragraph", "--model", "minilm"],
            "no collection for strategy 'paragraph' and model 'minilm'",
        ),
        (["search", "q", "--strategy", "paragraph", "--model", "no-such-model", "--mode", "dense"], "no collection"),
        (["index", "/no/such/folder", "--strategy", "paragraph"], "does not exist"),
        (["index", ".", "--strategy", "no-such-strategy"], "unknown chunking strategies"),
    ],
)
def test_cli_errors_are_one_clear_line(indexed, args, message):
    env, _, _ = indexed
    out = rag(args, env)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_locked_qdrant_folder_is_a_clear_error(indexed):
    env, _, _ = indexed
    holder = textwrap.dedent("""
        import sys, time
        from rag.index.qdrant import get_client
        get_client()
        print("locked", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        out = rag(["search", "q", "--strategy", "paragraph", "--model", "wordllama", "--mode", "dense"], env)
        assert out.returncode == 2 and "in use by another process" in out.stderr and "QDRANT_URL" in out.stderr
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow  # about a minute; tests/test_qa_eval.py checks the metrics by hand in make test
def test_eval_beir_on_a_tiny_dataset(tmp_path):
    folder = tmp_path / "tiny"
    (folder / "qrels").mkdir(parents=True)
    docs = {
        "d1": ("Cats", "Cats purr and chase mice."),
        "d2": ("Rockets", "Rockets launch satellites into orbit."),
        "d3": ("Bread", "Bread is baked from flour and yeast."),
    }
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": k, "title": t, "text": x, "metadata": {}}) + "\n" for k, (t, x) in docs.items())
    )
    (folder / "queries.jsonl").write_text(
        "".join(
            json.dumps({"_id": q, "text": t, "metadata": {}}) + "\n"
            for q, t in [("q1", "what animal purrs"), ("q2", "launching satellites"), ("q3", "unjudged")]
        )
    )
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq2\td2\t1\r\n")
    env = {**os.environ, "RAG_DATA_DIR": str(tmp_path / "data")}
    for mode in ["bm25", "dense", "hybrid-cc"]:
        out = rag(["eval-beir", str(folder), "--mode", mode, "--model", "wordllama", "--json"], env)
        assert out.returncode == 0, out.stderr
        metrics = json.loads(out.stdout)
        assert metrics["n_queries"] == 2
        assert metrics["ndcg@10"] == 1.0 and metrics["recall@100"] == 1.0 and metrics["mrr@10"] == 1.0
        assert {"recall@10", "map@10", "seconds"} <= set(metrics)
