"""How the CLI (`rag demo`, `rag retrain`, `rag sync-strategies`) drives Dagster: the persistent instance under the
data dir, the dynamic partitions it adds, and jobs of the code location run in this process so that the Dagster UI
lists each run on its job's page.

The UI's job page asks for the runs of the job tagged with its code location (`.dagster/repository` =
`<repository>@<location>`). Dagster adds that tag to the runs it launches from the workspace, from their job origin;
`execute_in_process` creates runs without an origin, so /runs listed the CLI's runs while the job page said "No runs
found". The tag is added here, with the code location named as workspace.yaml names it for `dagster dev`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.store import data_dir

if TYPE_CHECKING:
    from dagster import DagsterInstance, ExecuteInProcessResult

WORKSPACE = Path(__file__).resolve().parents[1] / "workspace.yaml"
CODE_LOCATION_MODULE = "orchestration.definitions"


def cli_instance():
    """The persistent Dagster instance under the data dir, so `dagster dev` shows what the CLI ran."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(data_dir() / "dagster")))
    home.mkdir(parents=True, exist_ok=True)
    disable_telemetry(home / "dagster.yaml")
    from dagster import DagsterInstance

    return DagsterInstance.get()


def disable_telemetry(config: Path) -> None:
    """Telemetry off in the instance's dagster.yaml (which also drops Dagster's telemetry banner), unless the file
    already says either way."""
    import yaml

    text = config.read_text() if config.exists() else ""
    if "telemetry" not in (yaml.safe_load(text) or {}):
        config.write_text(text + ("" if not text or text.endswith("\n") else "\n") + "telemetry:\n  enabled: false\n")


def sync_partitions(instance) -> dict[str, list[str]]:
    """Add partitions for strategies in the chunking YAML and active models that have none yet."""
    from orchestration.partitions import chunking_strategy_partitions, embedding_model_partitions
    from resources.chunking import ChunkingStrategies
    from resources.models import EmbeddingModels

    added = {}
    for partitions, wanted in (
        (chunking_strategy_partitions, list(ChunkingStrategies().strategies())),
        (embedding_model_partitions, EmbeddingModels().active()),
    ):
        existing = set(instance.get_dynamic_partitions(partitions.name))
        new = [name for name in wanted if name not in existing]
        if new:
            instance.add_dynamic_partitions(partitions.name, new)
        added[partitions.name] = new
    return added


@cache
def code_location_label() -> str:
    """`<repository>@<location>` of this code location, as Dagster derives it from workspace.yaml."""
    from dagster._core.remote_origin import RemoteRepositoryOrigin
    from dagster._core.workspace.load import location_origins_from_yaml_paths

    from orchestration.definitions import defs

    origins = [
        origin
        for origin in location_origins_from_yaml_paths([str(WORKSPACE)])
        if getattr(origin, "loadable_target_origin", None)
        and origin.loadable_target_origin.module_name == CODE_LOCATION_MODULE
    ]
    if len(origins) != 1:
        raise ValueError(f"{WORKSPACE} must load the module {CODE_LOCATION_MODULE} once (found {len(origins)} entries)")
    return RemoteRepositoryOrigin(origins[0], defs.get_repository_def().name).get_label()


def run_job(
    instance: DagsterInstance,
    name: str,
    *,
    partition_key: str | None = None,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    resources: Mapping[str, object] | None = None,
) -> ExecuteInProcessResult:
    """Execute the code location's job `name` here, on `instance`, as a run of that job in the UI. Failures are in
    the result (`success`), not raised. `resources` replace the code location's (tests)."""
    from dagster._core.storage.tags import REPOSITORY_LABEL_TAG

    from orchestration.definitions import defs

    return defs.resolve_job_def(name).execute_in_process(
        instance=instance,
        partition_key=partition_key,
        run_config=run_config,
        resources=resources,
        tags={**(tags or {}), REPOSITORY_LABEL_TAG: code_location_label()},
        raise_on_error=False,
    )
