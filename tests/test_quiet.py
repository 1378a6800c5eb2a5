"""CLI output without the libraries' known noise, while real warnings and errors still show."""

import importlib.util
import logging
import subprocess
import sys
import warnings

import pytest
from dagster_shared.utils.warnings import BetaWarning, PreviewWarning, SupersessionWarning

from rag.quiet import QUIET_LOGGERS, _at_least_warning, quiet_known_noise
from tests.conftest import REPO


@pytest.fixture
def quiet():
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    quiet_known_noise()
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
        logging.getLogger(name).removeFilter(_at_least_warning)


def test_known_warnings_are_dropped_and_others_kept(recwarn, quiet):
    for category in (PreviewWarning, BetaWarning, SupersessionWarning):
        warnings.warn(f"some API is currently in {category.__name__}", category)
    unsafe = "unsafe cast from uint64 to int64. Precision may be lost."
    warnings.warn_explicit(unsafe, UserWarning, "ndcg.py", 72, module="ranx.metrics.ndcg")  # numba's, from ranx
    warnings.warn_explicit(unsafe, UserWarning, "mine.py", 1, module="mine")  # same text elsewhere: not known
    # As numba re-issues it after compiling ranx's metrics: its own category, ranx's file, no module.
    from numba.core.errors import NumbaTypeSafetyWarning, WarningsFixer

    fixer = WarningsFixer(NumbaTypeSafetyWarning)
    with fixer.catch_warnings(filename=importlib.util.find_spec("ranx.metrics.ndcg").origin, lineno=72):
        warnings.warn(unsafe, NumbaTypeSafetyWarning)
    fixer.flush()
    warnings.warn("a real problem", UserWarning)
    warnings.warn("a real deprecation", FutureWarning)
    assert sorted(str(w.message) for w in recwarn) == ["a real deprecation", "a real problem", unsafe]


def test_great_expectations_info_is_dropped_but_its_warnings_shown(quiet, caplog):
    caplog.set_level(logging.INFO)
    gx = logging.getLogger("great_expectations.data_context.types.base")
    gx.setLevel(logging.INFO)  # what GX does to this logger when it is imported, after the helper ran
    gx.info("Created temporary directory '/tmp/x' for ephemeral docs site")
    gx.warning("expectation suite is missing")
    logging.getLogger("rag.ingest").info("our own info")
    # matplotlib's one-time line when it builds its font cache (the evaluation's plots); its warnings still show.
    fonts = logging.getLogger("matplotlib.font_manager")
    fonts.info("generated new fontManager")
    fonts.warning("findfont: Font family 'x' not found.")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("great_expectations.data_context.types.base", "expectation suite is missing"),
        ("rag.ingest", "our own info"),
        ("matplotlib.font_manager", "findfont: Font family 'x' not found."),
    ]


def test_loading_the_definitions_prints_no_dagster_warnings_but_real_ones():
    # Loading the Definitions warns PreviewWarning (partitioned checks), resolving a job BetaWarning (sensor owners).
    code = (
        "from rag.quiet import quiet_known_noise; quiet_known_noise(); from orchestration.definitions import defs; "
        "defs.resolve_job_def('ingest_documents_job'); import warnings; warnings.warn('a real problem')"
    )
    run = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "PreviewWarning" not in run.stderr and "BetaWarning" not in run.stderr
    assert "UserWarning: a real problem" in run.stderr


def test_cli_instance_has_telemetry_off_and_prints_no_banner(tmp_path, monkeypatch, capfd):
    from dagster import asset, materialize

    from orchestration.launch import cli_instance

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    instance = cli_instance()

    @asset
    def tiny() -> int:
        return 1

    assert materialize([tiny], instance=instance).success
    assert not instance.telemetry_enabled
    assert "Telemetry" not in capfd.readouterr().err


def test_telemetry_setting_keeps_what_the_file_says(tmp_path):
    from orchestration.launch import disable_telemetry

    own = tmp_path / "own.yaml"
    own.write_text("telemetry:\n  enabled: true\n")
    disable_telemetry(own)
    assert own.read_text() == "telemetry:\n  enabled: true\n"
    other = tmp_path / "other.yaml"
    other.write_text("concurrency:\n  pools:\n    default_limit: 2")
    disable_telemetry(other)
    assert other.read_text() == "concurrency:\n  pools:\n    default_limit: 2\ntelemetry:\n  enabled: false\n"
