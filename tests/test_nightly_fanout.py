"""A new Dagster instance over a data dir that was running (issue 51): it had lost its dynamic partitions, so every
chunk set was rebuilt and nightly_reindex indexed a gate-rejected candidate (the only model partition training had
added) instead of production. Now the code location gives the partitions back from what the product knows, rebuilds
nothing that is on disk, and the nightly schedule requests one run per partition that serves.

The instance is Postgres-backed with RAG_TEST_POSTGRES_URL (a scratch database), and SQLite-backed in any case: the
logic is the same, the Postgres case shows it on the storage the issue was seen on."""

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
import yaml
from dagster import MultiPartitionKey, build_schedule_context, build_sensor_context
from dagster._core.test_utils import instance_for_test

from orchestration.definitions import defs
from orchestration.nightly import TICK_TAG, nightly_reindex_schedule
from orchestration.partitions import apply_partition_requests, collection_partitions
from rag.chunking import get_chunker
from rag.parsing import ParseSettings
from rag.pipeline import chunk_step, ingest_step
from rag.registry import ModelRegistry
from rag.source import scan_folder
from resources.chunking import ChunkingStrategies
from resources.models import EmbeddingModels
from resources.storage import DataStore
from sensors.strategies import chunking_strategy_sensor, dynamic_partitions_sensor, embedding_model_sensor
from tests.state_backends import POSTGRES, SKIP_REASON
from tests.test_rollout_serving import fake_model, verdict

BUILT = {"paragraph": {"kind": "paragraph"}, "page": {"kind": "page"}}


@pytest.fixture
def running_data_dir(tmp_path):
    """Two documents parsed, their chunk sets of two strategies built with today's parameters; the registry holds
    ft-minilm-v1, a candidate its gate rejected, and production is the base model (nothing promoted); the embedders
    YAML lists the base model as active, as shipped."""
    root, docs = tmp_path / "data", tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Lighthouses guide ships.\n\nThey stand on rocky coasts.")
    (docs / "b.txt").write_text("Keepers lived in lighthouses.\n\nMost are automated now.")
    data_store = DataStore(data_dir=str(root))
    ingest_step(data_store.tables, scan_folder(docs), ParseSettings())
    config = tmp_path / "chunking.yaml"
    config.write_text(yaml.safe_dump({"strategies": BUILT}))
    for name in BUILT:
        chunk_step(data_store.tables, get_chunker(name, config))
    registry = ModelRegistry(root / "models")
    rejected = registry.register("embedder", fake_model(tmp_path / "v1"), {"base_model": "minilm"})
    registry.set_alias("embedder", "candidate", rejected.version)
    verdict(registry, "embedder", rejected, passed=False)
    (tmp_path / "embedders.yaml").write_text("active: [minilm]\n")
    resources = {
        "chunking": ChunkingStrategies(config_path=str(config)),
        "embedding_models": EmbeddingModels(config_path=str(tmp_path / "embedders.yaml")),
        "data_store": data_store,
    }
    return {"config": config, "rejected": rejected.name, "resources": resources}


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_instance(request):
    """A new, empty Dagster instance: SQLite storage in a temporary DAGSTER_HOME, or Postgres storage in a scratch
    database (skipped without RAG_TEST_POSTGRES_URL)."""
    if request.param == "sqlite":
        with instance_for_test() as instance:
            yield instance
        return
    if not POSTGRES:
        pytest.skip(SKIP_REASON)
    from tests.test_feedback_store import scratch_postgres

    with scratch_postgres(POSTGRES) as url:
        # dagster-postgres speaks psycopg2 (its NOTIFY placeholders are refused by psycopg 3)
        dagster_url = sa.engine.make_url(url).set(drivername="postgresql+psycopg2").render_as_string(False)
        with instance_for_test(overrides={"storage": {"postgres": {"postgres_url": dagster_url}}}) as instance:
            yield instance


def partitions(instance) -> dict[str, set[str]]:
    return {name: set(instance.get_dynamic_partitions(name)) for name in ("chunking_strategy", "embedding_model")}


def test_a_fresh_instance_gets_its_partitions_back_rebuilds_nothing_and_indexes_only_what_serves(
    running_data_dir, fresh_instance
):
    instance, resources, rejected = fresh_instance, running_data_dir["resources"], running_data_dir["rejected"]
    instance.add_dynamic_partitions("embedding_model", [rejected])  # training adds one per candidate it registers
    assert partitions(instance) == {"chunking_strategy": set(), "embedding_model": {rejected}}

    def tick(sensor):
        return sensor(build_sensor_context(instance=instance, resources=resources, definitions=defs))

    # The code location's own sensor (running by default) gives the partitions back; the daemon applies them.
    restored = tick(dynamic_partitions_sensor)
    assert not restored.run_requests
    apply_partition_requests(instance, restored.dynamic_partitions_requests)
    assert partitions(instance) == {"chunking_strategy": set(BUILT), "embedding_model": {"minilm"}}

    # Without cursors (a new instance) the strategy sensors rebuild nothing: the chunk sets on disk were made with
    # today's parameters. A strategy new in the YAML is still built, alone.
    assert not tick(chunking_strategy_sensor).run_requests and not tick(embedding_model_sensor).run_requests
    added = {**BUILT, "sentence-window-6-3": {"kind": "sentence-window", "window": 6, "stride": 3}}
    running_data_dir["config"].write_text(yaml.safe_dump({"strategies": added}))
    (backfill,) = tick(chunking_strategy_sensor).run_requests
    chunked = {
        key.partition_key
        for key in backfill.asset_graph_subset.iterate_asset_partitions()
        if key.asset_key.to_user_string() == "chunk_sets"
    }
    assert chunked == {"sentence-window-6-3"}

    # The nightly schedule: one run per strategy × model that serves (production: the base model), keyed by the tick
    # and the partition; never the rejected candidate.
    at = datetime(2026, 1, 2, 2, 0, tzinfo=UTC)

    def nightly_tick():
        # A schedule context opens its own instance from the ref; `with` closes it here, as the daemon does. Left to
        # the garbage collector, its exit reset Dagster's current-instance context variable in a later test, to this
        # fixture's disposed instance, and the next materialize() in that worker failed ("undefined DagsterInstance
        # weakref").
        with build_schedule_context(instance=instance, scheduled_execution_time=at, resources=resources) as context:
            return nightly_reindex_schedule(context)

    requests = nightly_tick()
    wanted = {MultiPartitionKey({"strategy": s, "model": "minilm"}) for s in added}
    assert {r.partition_key for r in requests} == wanted
    assert all(rejected not in r.partition_key and r.tags[TICK_TAG].endswith(at.isoformat()) for r in requests)
    assert len({r.run_key for r in requests}) == len(requests)
    assert set(collection_partitions.get_partition_keys(dynamic_partitions_store=instance)) >= wanted  # launchable
    again = nightly_tick()
    assert [r.run_key for r in again] == [r.run_key for r in requests]  # the same tick requests nothing new
