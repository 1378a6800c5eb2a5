"""A new chunking strategy backfilled from the Dagster UI, in real headless Chromium against `dagster dev` (issue 49,
item 1), then one more from chunking_strategy_sensor, as a user does after `make demo`:

- a data dir built by `rag sync-strategies --materialize` (one strategy, the QA set, its evaluation and summary), a
  trained candidate the gate rejected whose embedding_model partition training left, and two strategies added to
  the chunking YAML (RAG_CHUNKING_CONFIG) and synced, which removes the candidate's partition;
- in the catalog: select chunk_sets, bm25_indexes, embedding_collections, retrieval_evaluation and
  evaluation_summary, "Materialize selected", partitions "Missing", "Launch backfill"; then evaluation_summary's
  page shows both new strategies in its summary table;
- a third strategy, and chunking_strategy_sensor turned on from its page, which shows the cursor set as `rag demo`
  sets it: its tick launches one backfill of that strategy alone, which ends with its row in the summary too;
- every run succeeded, none was for the rejected candidate, and no two runs that open the embedded Qdrant folder
  overlapped (the instance config's pool)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from tests.conftest import REPO
from tests.test_rollout_serving import fake_model
from tests.test_strategy_backfill import NEW, STRATEGIES, rag, strategy_env
from tests.test_web_ui import CHROMIUM, free_port

pytestmark = pytest.mark.slow
BACKFILLED = ["bm25_indexes", "chunk_sets", "embedding_collections", "evaluation_summary", "retrieval_evaluation"]
UI_STRATEGIES = {"page": STRATEGIES["page"], **NEW}
SENSOR_STRATEGY = {"fixed-256": {"kind": "sentence-pack", "max_tokens": 256}}
PATIENCE_S = 900  # a loaded two-core machine: the backfill daemon ticks every 30 s, each run loads the code location


def add_strategies(env: dict, strategies: dict) -> None:
    config = Path(env["RAG_CHUNKING_CONFIG"])
    current = yaml.safe_load(config.read_text())["strategies"]
    config.write_text(yaml.safe_dump({"strategies": {**current, **strategies}}))


def rejected_candidate(env: dict, tmp_path: Path) -> str:
    """A registered candidate nothing serves, with the embedding_model partition finetuned_embedder adds."""
    from rag.registry import ModelRegistry

    registry = ModelRegistry(Path(env["RAG_DATA_DIR"]) / "models")
    candidate = registry.register("embedder", fake_model(tmp_path / "candidate"), {"base_model": "minilm"})
    registry.set_alias("embedder", "candidate", candidate.version)
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        instance.add_dynamic_partitions("embedding_model", [candidate.name])
    return candidate.name


def demo_cursor(env: dict) -> None:
    """chunking_strategy_sensor's starting point as `rag demo` sets it: the strategies built so far."""
    from orchestration.demo import set_sensor_cursor
    from rag.chunking import load_strategies, strategy_fingerprint

    built = {n: strategy_fingerprint(c) for n, c in load_strategies(Path(env["RAG_CHUNKING_CONFIG"])).items()}
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        set_sensor_cursor(instance, "chunking_strategy_sensor", json.dumps(built, sort_keys=True))


@pytest.fixture
def dagster_dev(tmp_path, shared_mixed):
    """`dagster dev` on a free port over a data dir with one strategy built and two more synced; yields (base URL,
    env, the rejected candidate's name)."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (make browser installs it)")
    env = strategy_env(tmp_path, shared_mixed, ("paragraph",))
    rag(env, "sync-strategies", "--materialize")
    candidate = rejected_candidate(env, tmp_path)
    demo_cursor(env)
    add_strategies(env, UI_STRATEGIES)
    synced = rag(env, "sync-strategies").stdout
    assert f"removed {candidate}" in synced
    port = free_port()
    log = (tmp_path / "dagster-dev.log").open("w")
    dev = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its webserver, daemon and code servers share this process group
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(f"{base}/server_info"), 180, "dagster dev did not start (see dagster-dev.log)")
        yield base, env, candidate
    finally:
        os.killpg(dev.pid, signal.SIGTERM)
        try:
            dev.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
        log.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def wait_for(condition, timeout_s: float, message: str, every_s: float = 3.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(message() if callable(message) else message)


@pytest.fixture
def page(dagster_dev):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        # tall enough for the catalog's virtualized table to render every asset row
        tab = browser.new_page(viewport={"width": 1600, "height": 2400})
        tab.set_default_timeout(60_000)
        # Dagster's one-time "Join the Dagster community" dialog may cover the page at any moment.
        tab.add_locator_handler(tab.get_by_role("button", name="Skip"), lambda skip: skip.click())
        yield tab
        browser.close()


def launch_missing_backfill(page, base: str) -> None:
    """The catalog's "Materialize selected" on the backfilled assets, their missing partitions."""
    from playwright.sync_api import expect

    page.goto(f"{base}/assets")
    for name in BACKFILLED:
        row = page.locator("div[class*=VirtualizedTable_row_]").filter(has=page.locator(f'a[href="/assets/{name}"]'))
        box = row.first.locator("input[type=checkbox]").first
        expect(box).to_be_attached()
        if not box.is_checked():
            row.first.locator("label").first.click()
        expect(box).to_be_checked()
    button = page.get_by_role("button", name="Materialize selected")
    expect(button).to_be_enabled(timeout=60_000)  # once the selected assets' partitions have loaded
    button.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="Missing", exact=True).click()
    for strategy in UI_STRATEGIES:  # the missing partitions picked (long names shown truncated, kept whole beside)
        dialog.get_by_text(strategy, exact=True).first.wait_for(state="attached")
    dialog.get_by_role("button", name="Launch backfill").click()
    dialog.wait_for(state="hidden")


def summary_shows(page, base: str, strategies) -> bool:
    """Whether evaluation_summary's page lists every strategy in its latest summary table."""
    page.goto(f"{base}/assets/evaluation_summary")
    row = page.locator("tr").filter(has=page.get_by_text("summary", exact=True)).first
    try:
        row.wait_for(timeout=15_000)
    except Exception:  # noqa: BLE001 - never materialized with a summary yet
        return False
    shown = row.get_by_text("Show Markdown")
    if shown.count():
        shown.first.click()
        text = page.get_by_role("dialog").inner_text()
        page.keyboard.press("Escape")
    else:
        text = row.inner_text()
    # the dialog renders the Markdown table: one line per configuration, its strategy first
    return all(re.search(rf"^{re.escape(s)}\s", text, re.MULTILINE) for s in strategies)


def start_sensor(page, base: str, name: str, cursor_shows: str) -> None:
    """The running/stopped switch on the sensor's page, which shows the cursor the demo set."""
    page.goto(f"{base}/locations/orchestration.definitions/sensors/{name}")
    page.get_by_text("Sensor has never run").wait_for()
    page.get_by_text(cursor_shows).first.wait_for()
    switch = page.locator("label[class*=formatSwitch]").first
    switch.click()
    page.wait_for_function("() => document.querySelector('label[class*=formatSwitch] input').checked")


def backfills(env: dict) -> list:
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        return instance.get_backfills()


def backfill_runs(env: dict) -> list:
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        return [r for r in instance.get_run_records() if r.dagster_run.tags.get("dagster/backfill")]


def runs_told(env: dict) -> str:
    return "; ".join(
        f"{r.dagster_run.tags.get('dagster/partition')}: {r.dagster_run.status.value}" for r in backfill_runs(env)
    )


def wait_for_summary(page, base: str, env: dict, strategies) -> None:
    """Until evaluation_summary's page lists `strategies`; fails at once when a backfill ends without them."""

    def shown() -> bool:
        failed = [b for b in backfills(env) if b.status.value in ("FAILED", "COMPLETED_FAILED", "CANCELED")]
        assert not failed, f"backfill {failed[0].backfill_id} {failed[0].status.value}: {runs_told(env)}"
        return summary_shows(page, base, strategies)

    wait_for(
        shown, PATIENCE_S, lambda: f"evaluation_summary never listed {', '.join(strategies)}: {runs_told(env)}", 10
    )


def test_a_new_strategy_backfilled_from_the_ui_and_the_sensor(page, dagster_dev):
    base, env, candidate = dagster_dev
    launch_missing_backfill(page, base)
    wait_for_summary(page, base, env, list(UI_STRATEGIES))

    add_strategies(env, SENSOR_STRATEGY)
    start_sensor(page, base, "chunking_strategy_sensor", cursor_shows='"paragraph"')
    sensor_backfill = wait_for(
        lambda: [b for b in backfills(env) if b.tags.get("trigger") == "chunking_strategy_sensor"],
        300,
        "chunking_strategy_sensor launched no backfill",
    )
    assert len(sensor_backfill) == 1
    targeted = {
        (key.to_user_string(), str(pair.partition_key))
        for pair in sensor_backfill[0].asset_backfill_data.target_subset.iterate_asset_partitions()
        for key in [pair.asset_key]
    }
    assert {p for _, p in targeted} == {"fixed-256", "minilm|fixed-256", "None"}  # that strategy alone
    wait_for_summary(page, base, env, [*UI_STRATEGIES, *SENSOR_STRATEGY])

    runs = wait_for(
        lambda: (r := backfill_runs(env)) and all(x.end_time for x in r) and r,
        120,
        "the backfills' runs did not finish",
    )
    assert all(r.dagster_run.is_success for r in runs), [(r.dagster_run.run_id, r.dagster_run.status) for r in runs]
    partitions = [r.dagster_run.tags.get("dagster/partition") or "" for r in runs]
    assert not [p for p in partitions if candidate in p]
    qdrant = sorted((r.start_time, r.end_time) for r, p in zip(runs, partitions) if "|" in p)
    assert len(qdrant) == 3  # page, sentence-window-6-3 and fixed-256 with minilm
    assert all(start >= end for (_, end), (start, _) in zip(qdrant, qdrant[1:])), qdrant
