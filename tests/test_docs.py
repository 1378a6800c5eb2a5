"""The docs' figures are rendered from bench/results/*.json, never typed: the committed pages must equal a fresh
render (`make docs` rewrites them), and README.md stays short enough to read."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300


def load_renderer():
    spec = importlib.util.spec_from_file_location("docs_render", ROOT / "docs" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def render():
    return load_renderer()


def copy_tree(tmp_path: Path) -> Path:
    """The inputs of a render in a scratch folder, so a render there touches nothing committed."""
    (tmp_path / "bench").mkdir()
    shutil.copytree(ROOT / "bench" / "results", tmp_path / "bench" / "results")
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


def test_committed_docs_equal_a_fresh_render(render, tmp_path):
    root = copy_tree(tmp_path)
    pages = render.render(root)
    stale = [str(path.relative_to(root)) for path, text in pages.items() if path.read_text() != text]
    assert not stale, f"out of date, run `make docs`: {stale}"


def test_render_is_deterministic(render, tmp_path):
    root = copy_tree(tmp_path)
    assert render.render(root) == render.render(root)


def test_every_result_file_has_a_section_with_its_provenance(render):
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        record = json.loads(path.read_text())
        section = page.split(f"\n## {path.stem}\n", 1)
        assert len(section) == 2, f"no section for {path.name}"
        body = section[1].split("\n## ", 1)[0]
        assert "- commit: " in body and "- arguments: " in body and "- machine: " in body
        if record.get("commit"):
            assert record["commit"][:7] in body


def test_an_unknown_kind_of_result_file_renders_generically(render, tmp_path):
    root = copy_tree(tmp_path)
    record = {
        "commit": "0123456789abcdef",
        "date": "2030-01-01T00:00:00+00:00",
        "args": {"clients": 10},
        "machine": {"cpus": 4},
        "summary": {"requests_per_s": 12.5, "errors": 0},
        "per_query": {str(i): 1.0 for i in range(100)},
    }
    (root / "bench" / "results" / "zz-new-benchmark.json").write_text(json.dumps(record))
    page = render.render(root)[root / "docs" / "benchmarks.md"]
    section = page.split("\n## zz-new-benchmark\n", 1)[1]
    assert "0123456" in section and '{"clients": 10}' in section and "4 CPUs" in section
    assert "| summary / requests_per_s | 12.5000 |" in section
    assert "| summary / errors | 0 |" in section
    assert "per_query" not in section


def test_a_figure_block_is_filled_from_its_result_file(render, tmp_path):
    root = copy_tree(tmp_path)
    record = {"commit": "fedcba9876543210", "date": "2030-01-02", "figures": {"recall@5": 0.5}}
    (root / "bench" / "results" / "zz-block.json").write_text(json.dumps(record))
    page = root / "docs" / "zz-page.md"
    page.write_text("before\n<!-- figures:zz-block -->\ntyped 0.99\n<!-- /figures -->\nafter\n")
    text = render.render(root)[page]
    assert "typed 0.99" not in text
    assert "| figures / recall@5 | 0.5000 |" in text and "commit fedcba9" in text
    assert text.startswith("before\n") and text.endswith("<!-- /figures -->\nafter\n")


def test_a_block_naming_a_missing_result_file_fails(render, tmp_path):
    root = copy_tree(tmp_path)
    (root / "docs" / "zz-page.md").write_text("<!-- figures:no-such-result -->\n<!-- /figures -->\n")
    with pytest.raises(SystemExit, match="no-such-result"):
        render.render(root)


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_loop_section_quotes_only_figures_its_rendered_tables_show(render):
    """The self-improvement section's figures come from the loop bench's result files: a decimal typed into its
    prose (a gain, a p-value, a score) must be one its rendered blocks show, so a rerun cannot leave it stale."""
    import re

    text = (ROOT / "README.md").read_text()
    start = text.index("## Does the loop help the people who ask?")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = "".join(m.group(0) for m in render.BLOCK.finditer(section))
    assert "figures:loop-ablation:targets" in blocks, "the section shows what was asked and how far the runs got"
    prose = render.BLOCK.sub("", section)
    typed = [f for f in re.findall(r"[-+−]?\d+\.\d+", prose) if f.lstrip("+-−") not in blocks]
    assert not typed, f"figures typed into the README's loop section, not in its rendered tables: {typed}"


def test_a_file_of_a_known_kind_but_another_shape_falls_back_to_the_generic_rendering(render, tmp_path):
    root = copy_tree(tmp_path)
    record = {
        "commit": "abcdef0123456789",
        "date": "2030-01-03",
        "runs": [{"points": 10, "figure": 0.25}],
        "summary": {"p95_ms": 12.5},
    }
    (root / "bench" / "results" / "edge-latency-zz-other-shape.json").write_text(json.dumps(record))
    page = render.render(root)[root / "docs" / "benchmarks.md"]
    section = page.split("\n## edge-latency-zz-other-shape\n", 1)[1].split("\n## ", 1)[0]
    assert "edge_latency did not fit this file" in section
    assert "| summary / p95_ms | 12.5000 |" in section
