"""The code location's layout: each stage module exports its own `defs`, and orchestration/definitions.py merges
them with the resources (defined once) and the executor. The expected sets below were taken from the code location
before it was split by stage: they are the contract, so a piece that moves must not get lost or duplicated."""

import importlib
import os

import pytest
from dagster import in_process_executor, multiprocess_executor

from orchestration.definitions import STAGES, defs

ASSETS = {
    "active_configuration",
    "annotation_queue",
    "answer_evaluation",
    "bm25_indexes",
    "chunk_sets",
    "config_search",
    "document_quarantine",
    "embedding_collections",
    "evaluation_summary",
    "feedback_dataset",
    "finetuned_embedder",
    "model_rollout",
    "parsed_documents",
    "production_embedder",
    "production_configuration",
    "production_reranker",
    "query_drift",
    "retrieval_evaluation",
    "synthetic_qa",
    "trained_configuration",
    "trained_reranker",
}
CHECKS = {
    "chunk_sets:chunk_sets_quality",
    "finetuned_embedder:finetuned_embedder_gate",
    "parsed_documents:parsed_documents_quality",
    "retrieval_evaluation:retrieval_evaluation_quality",
    "synthetic_qa:synthetic_qa_quality",
    "trained_configuration:trained_configuration_gate",
    "trained_reranker:trained_reranker_gate",
}
JOBS = {
    "annotation_queue_job",
    "answer_evaluation_job",
    "apply_configuration_job",
    "chunk_sets_job",
    "config_search_job",
    "embedding_collections_job",
    "evaluation_summary_job",
    "ingest_documents_job",
    "nightly_reindex_job",
    "promote_canary_job",
    "retrain_job",
    "retrieval_evaluation_job",
    "rollback_canary_job",
    "start_canary_job",
    "synthetic_qa_job",
}
SENSORS = {
    "annotation_after_retrain_sensor",
    "canary_sensor",
    "chunking_strategy_sensor",
    "drift_sensor",
    "dynamic_partitions_sensor",
    "embedding_model_sensor",
    "feedback_volume_sensor",
    "new_documents_sensor",
}
SCHEDULES = {"annotation_queue_daily", "nightly_reindex", "weekly_retrain"}
RESOURCES = {
    "chunking",
    "data_store",
    "document_source",
    "embedding_models",
    "feedback_loop",
    "llm",
    "qdrant",
    "rollout",
}

# Which module exports which pieces (its `defs`): (assets, checks, jobs, sensors, schedules).
OWNERS = {
    "assets.ingestion": ({"parsed_documents", "document_quarantine"}, set(), set(), set(), set()),
    "assets.chunking": ({"chunk_sets"}, set(), set(), set(), set()),
    "assets.indexing": ({"bm25_indexes", "embedding_collections"}, set(), set(), set(), set()),
    "assets.evaluation": ({"synthetic_qa", "retrieval_evaluation", "evaluation_summary"}, set(), set(), set(), set()),
    "assets.checks": (
        set(),
        {
            "parsed_documents:parsed_documents_quality",
            "chunk_sets:chunk_sets_quality",
            "synthetic_qa:synthetic_qa_quality",
            "retrieval_evaluation:retrieval_evaluation_quality",
        },
        set(),
        set(),
        set(),
    ),
    "assets.training": (
        {
            "finetuned_embedder",
            "trained_reranker",
            "production_embedder",
            "production_reranker",
            "trained_configuration",
            "production_configuration",
        },
        {
            "finetuned_embedder:finetuned_embedder_gate",
            "trained_reranker:trained_reranker_gate",
            "trained_configuration:trained_configuration_gate",
        },
        set(),
        set(),
        set(),
    ),
    "assets.config_search": ({"config_search", "active_configuration"}, set(), set(), set(), set()),
    "assets.feedback": ({"feedback_dataset", "query_drift"}, set(), set(), set(), set()),
    "assets.answers": ({"answer_evaluation"}, set(), set(), set(), set()),
    "assets.rollout": ({"model_rollout"}, set(), set(), set(), set()),
    "orchestration.jobs": (
        set(),
        set(),
        {
            "ingest_documents_job",
            "chunk_sets_job",
            "embedding_collections_job",
            "synthetic_qa_job",
            "retrieval_evaluation_job",
            "evaluation_summary_job",
            "config_search_job",
            "apply_configuration_job",
            "answer_evaluation_job",
        },
        set(),
        set(),
    ),
    "orchestration.nightly": (set(), set(), {"nightly_reindex_job"}, set(), {"nightly_reindex"}),
    "orchestration.training": (set(), set(), {"retrain_job"}, set(), set()),
    "orchestration.rollout": (
        set(),
        set(),
        {"start_canary_job", "promote_canary_job", "rollback_canary_job"},
        set(),
        set(),
    ),
    "sensors.documents": (set(), set(), set(), {"new_documents_sensor"}, set()),
    "sensors.strategies": (
        set(),
        set(),
        set(),
        {"chunking_strategy_sensor", "embedding_model_sensor", "dynamic_partitions_sensor"},
        set(),
    ),
    "sensors.feedback": (set(), set(), set(), {"feedback_volume_sensor"}, {"weekly_retrain"}),
    "sensors.drift": (set(), set(), set(), {"drift_sensor"}, set()),
    "sensors.canary": (set(), set(), set(), {"canary_sensor"}, set()),
    "assets.annotation": ({"annotation_queue"}, set(), set(), set(), set()),
    "sensors.annotation": (
        set(),
        set(),
        {"annotation_queue_job"},
        {"annotation_after_retrain_sensor"},
        {"annotation_queue_daily"},
    ),
}


def _asset_keys(definitions) -> set[str]:
    keys = set()
    for a in definitions.assets or ():
        keys |= {k.to_user_string() for k in (a.keys if hasattr(a, "keys") else [a.key])}
    return keys


def _pieces(definitions) -> tuple[set[str], ...]:
    """The declared (unresolved) pieces of a Definitions, by name: what its module put in it."""
    checks = {k.to_user_string() for c in definitions.asset_checks or () for k in c.check_keys}
    names = lambda items: {i.name for i in items or ()}  # noqa: E731
    return (
        _asset_keys(definitions),
        checks,
        names(definitions.jobs),
        names(definitions.sensors),
        names(definitions.schedules),
    )


def test_code_location_holds_exactly_the_contracted_pieces():
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == ASSETS
    assert {k.to_user_string() for k in graph.asset_check_keys} == CHECKS
    assert {j.name for j in repo.get_all_jobs() if not j.name.startswith("__")} == JOBS
    assert {s.name for s in repo.sensor_defs} == SENSORS
    assert {s.name for s in repo.schedule_defs} == SCHEDULES
    assert set(defs.resources) == set(repo.get_top_level_resources()) == RESOURCES
    assert defs.executor is (multiprocess_executor if os.environ.get("QDRANT_URL") else in_process_executor)


@pytest.mark.parametrize("module", sorted(OWNERS))
def test_each_stage_module_exports_its_own_pieces(module):
    stage = importlib.import_module(module)
    assert stage in STAGES, f"{module} is not merged by orchestration/definitions.py"
    assert _pieces(stage.defs) == OWNERS[module]
    assert not stage.defs.resources and stage.defs.executor is None  # resources and executor are defined once


def test_stages_add_up_to_the_code_location_with_nothing_declared_twice():
    assert {s.__name__ for s in STAGES} == set(OWNERS)
    totals = [set(), set(), set(), set(), set()]
    for stage in STAGES:
        for total, part in zip(totals, _pieces(stage.defs)):
            assert not total & part, f"{stage.__name__} declares {total & part} again"
            total |= part
    assert totals == [ASSETS, CHECKS, JOBS, SENSORS, SCHEDULES]


def test_the_library_imports_no_dagster_layer():
    """rag/ is the pure library: Dagster and the thin layers over it (orchestration, sensors, resources, assets)
    import rag, never the other way round."""
    import re
    from pathlib import Path

    layer = re.compile(r"^\s*(import|from)\s+(dagster|orchestration|sensors|resources|assets)\b", re.M)
    root = Path(__file__).resolve().parents[1] / "rag"
    offenders = sorted(str(p.relative_to(root.parent)) for p in root.rglob("*.py") if layer.search(p.read_text()))
    assert offenders == []


def test_descriptions_keep_their_placeholders_when_rendered():
    """The UI renders descriptions as Markdown, which drops a bare `<data dir>` as an HTML tag: placeholders sit in
    code spans (or are said in words)."""
    import re

    repo = defs.get_repository_def()
    graph = repo.asset_graph
    described = {f"asset {node.key.to_user_string()}": node.description for node in graph.asset_nodes}
    described |= {
        f"check {key.to_user_string()}": graph.get_check_spec(key).description for key in graph.asset_check_keys
    }
    described |= {f"job {job.name}": job.description for job in repo.get_all_jobs()}
    described |= {f"sensor {s.name}": s.description for s in repo.sensor_defs}
    described |= {f"schedule {s.name}": s.description for s in repo.schedule_defs}
    assert sum(bool(text) for text in described.values()) > len(ASSETS)  # the descriptions are really read
    tag = re.compile(r"<[A-Za-z/!][^<>\n]*>")
    raw = {name: tag.findall(re.sub(r"`[^`]*`", "", text)) for name, text in described.items() if text}
    assert {name: found for name, found in raw.items() if found} == {}
