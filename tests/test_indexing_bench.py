"""bench/indexing.py on a tiny folder: every stage of `rag index`'s path is timed from nothing, the counts agree with
what the index holds, the bare encodes cover the same texts, the stage functions are put back, the docs render its
file (and say "not measured yet" without it), and an absent shared data set is a clean skip. No wall-clock bounds."""

import json

import pytest

import rag.pipeline
import rag.qa.encoding
from bench import indexing
from tests.test_docs import copy_tree, load_renderer

DOCS = {
    "cats.txt": "Cats purr when they are content. A cat sleeps for most of the day.\n\n"
    "Domestic cats were first kept in the Near East. They hunt mice and birds.",
    "bread.md": "# Baking bread\n\nBread is baked from flour, water, salt and yeast. The dough rises before baking.\n\n"
    "## Crust\n\nA hot oven gives the loaf a dark crust. Steam keeps the crust thin.",
    "rivers.txt": "The Rhine flows from the Alps to the North Sea. It passes Basel, Cologne and Rotterdam.\n\n"
    "The Danube flows east into the Black Sea.",
    "zz-extra.txt": "A fourth file that --limit leaves out of the run.",
}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("indexing")
    folder = tmp / "docs"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    real = {name: getattr(rag.pipeline, name) for name in ("ingest_step", "sync_collection", "load_embedder")}
    real_sentences = rag.qa.encoding.store_sentence_vectors
    out = tmp / "indexing-docs.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAG_DATA_DIR", str(tmp / "unused"))  # the bench sets its own; this puts the old value back
        code = indexing.main(["--folder", str(folder), "--limit", "3", "--onnx-threads", "1", "--out", str(out)])
    assert code == 0
    assert all(getattr(rag.pipeline, name) is fn for name, fn in real.items())
    assert rag.qa.encoding.store_sentence_vectors is real_sentences
    return json.loads(out.read_text())


def test_every_stage_is_measured_with_positive_counts(result):
    rows = {row["stage"]: row for row in result["stages"]}
    assert list(rows) == ["load model", "parse", "chunk", "bm25", "chunk vectors", "sentence vectors"]
    assert rows["parse"]["items"] == rows["parse"]["files"] == result["corpus"]["documents"] == 3
    assert rows["parse"]["bytes"] == sum(len(DOCS[n].encode()) for n in sorted(DOCS)[:3]) == result["corpus"]["bytes"]
    for stage in ("parse", "chunk", "bm25", "chunk vectors", "sentence vectors"):
        row = rows[stage]
        # Counts and memory are asserted; times are only recorded (a loaded or fast machine may round one to 0).
        assert row["items"] > 0 and row["peak_rss_mb"] > 0
        assert all(isinstance(row[k], (int, float)) and row[k] >= 0 for k in ("seconds", "per_s"))
    assert rows["parse"]["mb_per_s"] >= 0 and rows["parse"]["quarantined"] == 0
    assert {rows[s]["strategy"] for s in ("chunk", "bm25", "chunk vectors", "sentence vectors")} == {"paragraph"}
    assert result["total"]["seconds"] >= sum(row["seconds"] for row in result["stages"]) - 0.01
    assert result["args"]["limit"] == 3 and result["commit"] and result["date"] and result["machine"]["cpus"]


def test_the_chunk_count_is_what_the_index_holds(result):
    rows = {row["stage"]: row for row in result["stages"]}
    chunks = rows["chunk"]["items"]
    assert rows["bm25"]["items"] == rows["chunk vectors"]["items"] == rows["chunk vectors"]["points"] == chunks
    assert result["index_holds"] == {
        "paragraph|minilm": {
            "chunk_table": chunks,
            "bm25_documents": chunks,
            "collection_points": chunks,
            "sentence_vectors_stored": rows["sentence vectors"]["distinct_sentences"],
        }
    }
    # From nothing, the sentence stage encodes at most every distinct sentence (fewer where a vector is reused); the
    # bare encodes cover the same chunk texts and every distinct sentence.
    assert 0 < rows["sentence vectors"]["items"] <= rows["sentence vectors"]["distinct_sentences"]
    for kind in ("fp32", "int8"):
        bare = result["bare"]["paragraph"][kind]
        assert bare["chunks"]["texts"] == chunks and isinstance(bare["chunks"]["seconds"], (int, float))  # recorded
        assert bare["sentences"]["texts"] == rows["sentence vectors"]["distinct_sentences"]
    ratios = result["ratios"]["paragraph"]
    assert {"chunk_vectors_vs_fp32", "sentence_vectors_vs_fp32", "chunk_vectors_vs_int8"} <= set(ratios)
    if rows["chunk vectors"]["seconds"] > 0:  # the ratio is derived from the recorded stage times
        assert ratios["sentence_vectors_over_chunk_vectors"] == pytest.approx(
            rows["sentence vectors"]["seconds"] / rows["chunk vectors"]["seconds"], abs=0.01
        )


def test_the_docs_render_the_result_and_say_when_it_is_missing(result, tmp_path):
    render = load_renderer()
    root = copy_tree(tmp_path)
    page = root / "docs" / "zz-page.md"
    page.write_text("<!-- figures:indexing-zz? -->\n<!-- /figures -->\n")
    assert "Not measured yet: `bench/results/indexing-zz.json` is absent." in render.render(root)[page]
    (root / "bench" / "results" / "indexing-zz.json").write_text(json.dumps(result))
    text = render.render(root)[page]
    assert "| chunk vectors | paragraph |" in text and "| paragraph sentences (by minilm-int8) |" in text
    assert "did not fit" not in text and "Not measured" not in text


def test_an_absent_shared_data_set_is_a_clean_skip(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(indexing.PRESETS, "tatqa", tmp_path / "absent")
    out = tmp_path / "never.json"
    assert indexing.main(["--corpus", "tatqa", "--out", str(out)]) == 0
    assert "skipped" in capsys.readouterr().out and not out.exists()
