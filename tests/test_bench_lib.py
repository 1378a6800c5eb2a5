"""bench.lib, the library the benchmark scripts share: installed with the package (no script edits sys.path),
results written whole, absent data said and skipped, and the output option keeping the name result files record."""

import json
import subprocess
import sys
from pathlib import Path

from bench.lib import cli
from bench.lib.datasets import absent, scifact_absent
from bench.lib.results import write

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_no_bench_script_edits_the_import_path():
    offenders = [
        p.relative_to(BENCH).as_posix()
        for p in sorted(BENCH.rglob("*.py"))
        if ("sys.path" in p.read_text() or "noqa: E402" in p.read_text())
    ]
    assert offenders == []


def test_bench_imports_from_any_directory(tmp_path):
    """Installed with the package (setup.py): `python -m bench.<name>` and imports work outside the repository."""
    done = subprocess.run(
        [sys.executable, "-c", "import bench.lib.edge, bench.lib.loop; print('ok')"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "results" / "r.json"
    write({"a": 1}, path)
    write({"a": 2, "b": Path("x")}, path, indent=2, default=str)
    assert json.loads(path.read_text()) == {"a": 2, "b": "x"} and path.read_text().endswith("\n")
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left behind


def test_absent_data_is_said_and_skipped(tmp_path, capsys):
    assert scifact_absent(tmp_path) is True
    assert str(tmp_path / "corpus.jsonl") in capsys.readouterr().out
    (tmp_path / "corpus.jsonl").write_text("")
    assert scifact_absent(tmp_path) is False and absent(tmp_path, "anything") is False


def test_output_option_keeps_the_first_flags_name():
    p = cli.parser("doc")
    cli.add_output(p, Path("default.json"))
    assert p.parse_args(["--out", "x.json"]).json == Path("x.json")
    q = cli.parser("doc")
    cli.add_output(q, flags=("--out",))
    assert q.parse_args([]).out is None


def test_no_bench_script_imports_another_script():
    # What scripts share lives in bench.lib; only bench/run.py (`make bench`) runs the others by design.
    import re

    scripts = {p.stem for p in BENCH.glob("*.py")} - {"__init__"}
    pattern = re.compile(r"^\s*(?:from bench(?:\.(\w+))? import ([\w, ]+)|import bench\.(\w+))", re.M)
    offenders = []
    for path in sorted(BENCH.glob("*.py")):
        if path.name == "run.py":
            continue
        for module, names, imported in pattern.findall(path.read_text()):
            used = {module or imported} if (module or imported) else {n.strip() for n in names.split(",")}
            offenders += [f"{path.name} imports bench.{name}" for name in used & scripts]
    assert offenders == []


def test_a_result_names_the_processor_and_the_library_versions_it_was_measured_with(monkeypatch):
    """Two runs of the same code and seed that rank differently must be told apart by their records."""
    from importlib.metadata import version

    from bench.lib import provenance

    record = provenance.machine()
    assert record["packages"]["torch"] == version("torch")
    assert set(record["packages"]) <= set(provenance.MEASURED_WITH)
    if Path("/proc/cpuinfo").exists():
        assert record["cpu"]["model"] and set(record["cpu"]["vector"]) <= set(provenance.VECTOR_FLAGS)
    monkeypatch.setattr(provenance, "Path", lambda *_: Path("/nonexistent/cpuinfo"))
    assert provenance.cpu() == {}  # another OS: nothing recorded, nothing made up


def test_a_result_is_marked_dirty_for_uncommitted_code_not_for_results_or_prose(tmp_path, monkeypatch):
    # Benches run one after another write their results into the tree: the next one's figures still come from the
    # committed code, so only code (anything but bench/results and Markdown) marks a result dirty.
    from bench.lib import provenance

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "bench" / "results").mkdir(parents=True)
    files = {"code.py": "x = 1\n", "README.md": "# r\n", "bench/results/a.json": "{}\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    assert not provenance.commit().endswith("-dirty")
    (tmp_path / "bench/results/a.json").write_text('{"figure": 1}\n')
    (tmp_path / "README.md").write_text("# rendered\n")
    assert not provenance.commit().endswith("-dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.commit().endswith("-dirty")
