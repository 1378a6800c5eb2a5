"""The code location end to end: jobs in-process on a temporary instance, checks, sensors, CLI."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

from orchestration.definitions import defs
from orchestration.launch import run_job
from resources.chunking import ChunkingStrategies
from resources.documents import DocumentSource
from resources.llm import LLMResource
from resources.models import EmbeddingModels
from resources.qdrant import QdrantResource
from resources.storage import DataStore
from rag.store import TableStore
from tests.conftest import REPO

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


@pytest.fixture
def env(tmp_path, shared_pdfs, shared_mixed):
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(shared_pdfs / "senate-expenditures.pdf", docs)
    shutil.copy(shared_mixed / "book-war-and-peace-1p.txt", docs)
    (docs / "broken.pdf").write_bytes(b"not a pdf at all")
    config = tmp_path / "chunking.yaml"
    config.write_text(yaml.safe_dump({"strategies": {"paragraph": {"kind": "paragraph"}, "page": {"kind": "page"}}}))
    resources = {
        "document_source": DocumentSource(path=str(docs), passwords_file=str(tmp_path / "none.yaml")),
        "data_store": DataStore(data_dir=str(tmp_path / "data")),
        "chunking": ChunkingStrategies(config_path=str(config)),
        "embedding_models": EmbeddingModels(config_path=str(tmp_path / "embedders.yaml")),
        "qdrant": QdrantResource(path=str(tmp_path / "qdrant")),
        "llm": LLMResource(backend="none"),
    }
    (tmp_path / "embedders.yaml").write_text("active: [wordllama]\n")
    instance = DagsterInstance.ephemeral()
    return {
        "docs": docs,
        "config": config,
        "resources": resources,
        "instance": instance,
        "tables": TableStore(tmp_path / "data" / "tables"),
    }


def run(env, job_name, partition=None, config=None):
    """The job run as the CLI and `rag demo` run it (orchestration.launch). config: the run config of the job's one
    asset, e.g. {"synthetic_qa": {"passages_per_document": 2}}."""
    run_config = {**QUIET, "ops": {op: {"config": c} for op, c in config.items()}} if config else QUIET
    return run_job(
        env["instance"], job_name, partition_key=partition, run_config=run_config, resources=env["resources"]
    )


def test_definitions_have_groups_and_checks():
    graph = defs.resolve_asset_graph()
    groups = {key.to_user_string(): graph.get(key).group_name for key in graph.get_all_asset_keys()}
    assert groups == {
        "parsed_documents": "ingestion",
        "document_quarantine": "ingestion",
        "chunk_sets": "chunking",
        "bm25_indexes": "indexing",
        "embedding_collections": "indexing",
        "synthetic_qa": "evaluation",
        "retrieval_evaluation": "evaluation",
        "evaluation_summary": "evaluation",
        "answer_evaluation": "evaluation",
        "finetuned_embedder": "training",
        "trained_reranker": "training",
        "production_embedder": "training",
        "production_reranker": "training",
        "trained_configuration": "training",
        "production_configuration": "training",
        "feedback_dataset": "feedback",
        "query_drift": "feedback",
        "model_rollout": "training",
        "config_search": "optimization",
        "active_configuration": "optimization",
        "annotation_queue": "annotation",
    }
    assert defs.resolve_schedule_def("nightly_reindex").cron_schedule == "0 2 * * *"
    assert {k.name for k in graph.asset_check_keys} == {
        "parsed_documents_quality",
        "chunk_sets_quality",
        "synthetic_qa_quality",
        "retrieval_evaluation_quality",
        "finetuned_embedder_gate",
        "trained_reranker_gate",
        "trained_configuration_gate",
    }
    # The promotion gates must stop the promotion assets downstream of them.
    gates = {k.name: graph.get_check_spec(k) for k in graph.asset_check_keys if k.name.endswith("_gate")}
    assert all(spec.blocking for spec in gates.values())
    assert {s.name for s in defs.sensors} >= {
        "feedback_volume_sensor",
        "drift_sensor",
        "new_documents_sensor",
        "canary_sensor",
    }
    assert {s.name for s in defs.schedules} == {"nightly_reindex", "weekly_retrain", "annotation_queue_daily"}


def test_ingest_then_chunk_partition_with_passing_checks(env):
    env["instance"].add_dynamic_partitions("chunking_strategy", ["paragraph"])
    ingest = run(env, "ingest_documents_job")
    assert ingest.success
    mats = {
        m.asset_key.to_user_string(): m.metadata for m in ingest.asset_materializations_for_node("ingest_documents")
    }
    assert mats["parsed_documents"]["parsed"].value == 2
    assert mats["document_quarantine"]["quarantine_malformed"].value == 1
    assert all(e.passed for e in ingest.get_asset_check_evaluations())

    chunked = run(env, "chunk_sets_job", "paragraph")
    assert chunked.success and [e.passed for e in chunked.get_asset_check_evaluations()] == [True]
    chunks = env["tables"].read("chunk_sets", "paragraph")
    assert set(chunks.doc_id) == {"senate-expenditures.pdf", "book-war-and-peace-1p.txt"}

    again = run(env, "chunk_sets_job", "paragraph")
    meta = again.asset_materializations_for_node("chunk_sets")[0].metadata
    assert meta["rechunked_documents"].value == 0 and meta["unchanged_documents"].value == 2

    # The UI's job page asks for the job's runs tagged with its code location, named as workspace.yaml names it.
    from dagster import RunsFilter
    from dagster._core.remote_origin import RemoteRepositoryOrigin
    from dagster._core.storage.tags import REPOSITORY_LABEL_TAG
    from dagster._core.workspace.load import location_origins_from_yaml_paths

    (location,) = location_origins_from_yaml_paths([str(REPO / "workspace.yaml")])
    label = RemoteRepositoryOrigin(location, defs.get_repository_def().name).get_label()

    def job_page(job_name):
        runs = env["instance"].get_runs(RunsFilter(job_name=job_name, tags={REPOSITORY_LABEL_TAG: label}))
        return [r.run_id for r in runs]

    assert job_page("chunk_sets_job") == [again.run_id, chunked.run_id]
    assert job_page("ingest_documents_job") == [ingest.run_id]


def test_blocking_check_fails_the_run_on_corrupted_chunks(env, monkeypatch):
    import rag.pipeline
    from rag.chunk_sets import update_chunk_set

    def corrupting(previous, documents, chunker, progress=None, **options):
        out = update_chunk_set(previous, documents, chunker, progress, **options)
        out.chunks.loc[0, "char_end"] = out.chunks.loc[0, "char_end"] - 1
        return out

    env["instance"].add_dynamic_partitions("chunking_strategy", ["page"])
    assert run(env, "ingest_documents_job").success
    monkeypatch.setattr(rag.pipeline, "update_chunk_set", corrupting)
    result = run(env, "chunk_sets_job", "page")
    evaluations = result.get_asset_check_evaluations()
    assert not result.success and [e.passed for e in evaluations] == [False]
    assert "expect_column_values_to_be_in_set[span_consistent]" in evaluations[0].metadata["failed_expectations"].value


def test_a_chunking_failure_keeps_previous_chunks_and_fails_the_blocking_check(env, monkeypatch):
    import rag.chunking

    env["instance"].add_dynamic_partitions("chunking_strategy", ["paragraph"])
    assert run(env, "ingest_documents_job").success
    assert run(env, "chunk_sets_job", "paragraph").success
    before = env["tables"].read("chunk_sets", "paragraph")

    real_chunk = rag.chunking.Chunker.chunk

    def model_failed_to_load(self, doc):
        if doc.doc_id == "senate-expenditures.pdf":
            raise OSError("embedding model failed to load")
        return real_chunk(self, doc)

    monkeypatch.setattr(rag.chunking.Chunker, "chunk", model_failed_to_load)
    monkeypatch.setattr(rag.chunking.Chunker, "fingerprint", property(lambda self: "params-changed"))
    result = run(env, "chunk_sets_job", "paragraph")
    after = env["tables"].read("chunk_sets", "paragraph")
    kept = before[before.doc_id == "senate-expenditures.pdf"]
    assert set(kept.chunk_id) <= set(after.chunk_id)  # the document stays searchable
    meta = result.asset_materializations_for_node("chunk_sets")[0].metadata
    assert meta["failed_documents"].value == 1 and meta["chunks_kept_after_failure"].value == len(kept)
    assert "senate-expenditures.pdf" in meta["failures"].value
    [evaluation] = result.get_asset_check_evaluations()
    assert not evaluation.passed and not result.success  # blocking: downstream indexing must not run on it
    assert "chunking failed for 1 document" in evaluation.description


def backfilled(result) -> dict[str, set]:
    """{asset: partitions} of the one backfill a sensor result requests."""
    (request,) = result.run_requests
    out: dict[str, set] = {}
    for pair in request.asset_graph_subset.iterate_asset_partitions():
        out.setdefault(pair.asset_key.to_user_string(), set()).add(pair.partition_key)
    return out


def test_strategy_sensor_adds_a_partition_for_a_new_yaml_entry(env):
    from sensors.strategies import chunking_strategy_sensor

    instance = env["instance"]
    names = ("chunking", "embedding_models", "data_store")
    resources = {k: env["resources"][k] for k in names}

    def tick(cursor=None):
        return chunking_strategy_sensor(
            build_sensor_context(instance=instance, cursor=cursor, resources=resources, definitions=defs)
        )

    first = tick()
    assert isinstance(first, SensorResult)
    assert sorted(first.dynamic_partitions_requests[0].partition_keys) == ["page", "paragraph"]
    # Nothing built yet: one backfill of both strategies, with ingestion and the QA set they need.
    planned = backfilled(first)
    assert planned["chunk_sets"] == {"page", "paragraph"} and planned["bm25_indexes"] == {"page", "paragraph"}
    assert {"parsed_documents", "synthetic_qa", "evaluation_summary"} <= set(planned)
    assert {k.keys_by_dimension["model"] for k in planned["embedding_collections"]} == {"minilm", "wordllama"}
    instance.add_dynamic_partitions("chunking_strategy", ["page", "paragraph"])

    assert tick(first.cursor).skip_reason is not None  # requested already: not again while the backfill runs

    raw = yaml.safe_load(env["config"].read_text())
    raw["strategies"]["sentence-window-6-3"] = {"kind": "sentence-window", "window": 6, "stride": 3}
    env["config"].write_text(yaml.safe_dump(raw))
    third = tick(first.cursor)
    assert third.dynamic_partitions_requests[0].partition_keys == ["sentence-window-6-3"]
    assert backfilled(third)["chunk_sets"] == {"sentence-window-6-3"}
    instance.add_dynamic_partitions("chunking_strategy", ["sentence-window-6-3"])
    assert run(env, "ingest_documents_job").success
    assert run(env, "chunk_sets_job", "sentence-window-6-3").success


def test_new_documents_sensor_requests_reindex_only_on_change(env):
    from dagster import MultiPartitionKey

    from sensors.documents import new_documents_sensor

    def tick(cursor=None):
        context = build_sensor_context(cursor=cursor, instance=env["instance"], resources=env["resources"])
        return new_documents_sensor(context)

    first = tick()
    # one run per chunk set × model that serves (the base model before any promotion) or is listed as active
    assert {r.partition_key for r in first.run_requests} == {
        MultiPartitionKey({"strategy": s, "model": m}) for s in ("paragraph", "page") for m in ("minilm", "wordllama")
    }
    same = tick(first.cursor)
    assert isinstance(same, SkipReason)
    (env["docs"] / "new.txt").write_text("A new document arrived.")
    changed = tick(first.cursor)
    assert not {r.run_key for r in changed.run_requests} & {r.run_key for r in first.run_requests}
    assert new_documents_sensor.job_name == "nightly_reindex_job"  # parse, chunk and index: the file becomes searchable


def test_cli_parse_and_chunk_json(shared_mixed):
    # A Markdown file, read without unstructured (whose HTML partitioner took 7.5 s to import in each process here);
    # HTML goes through the same parse_file in tests/test_ingest.py.
    rag = [sys.executable, "-m", "orchestration.cli"]
    parsed = json.loads(
        subprocess.run(
            rag + ["parse", str(shared_mixed / "codeblock.md"), "--json"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout
    )
    assert parsed["elements"] and parsed["canonical_text"]
    chunks = json.loads(
        subprocess.run(
            rag + ["chunk", str(shared_mixed / "codeblock.md"), "--strategy", "paragraph", "--json"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout
    )
    assert len(chunks) > 1
    assert all(parsed["canonical_text"][c["char_start"] : c["char_end"]] == c["text"] for c in chunks)
    bad = subprocess.run(rag + ["parse", "/dev/null"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "empty" in bad.stderr


def test_collection_partition_and_nightly_reindex(env):
    from dagster import MultiPartitionKey

    from orchestration.nightly import TICK_TAG
    from rag.retrieval.service import search

    instance = env["instance"]
    instance.add_dynamic_partitions("chunking_strategy", ["paragraph"])
    instance.add_dynamic_partitions("embedding_model", ["wordllama"])
    assert run(env, "ingest_documents_job").success
    assert run(env, "chunk_sets_job", "paragraph").success
    built = run(env, "embedding_collections_job", MultiPartitionKey({"strategy": "paragraph", "model": "wordllama"}))
    meta = built.asset_materializations_for_node("embedding_collections")[0].metadata
    assert (
        built.success
        and meta["rebuilt"].value
        and meta["points"].value == len(env["tables"].read("chunk_sets", "paragraph"))
    )

    (env["docs"] / "new-note.txt").write_text("The nightly job indexes this brand new note about lighthouses.")
    key = MultiPartitionKey({"strategy": "paragraph", "model": "wordllama"})

    def nightly_run(tick: str) -> dict:
        """One of the runs a nightly tick requests (orchestration.nightly.run_requests): its materializations."""
        run = defs.resolve_job_def("nightly_reindex_job").execute_in_process(
            instance=instance, resources=env["resources"], run_config=QUIET, partition_key=key, tags={TICK_TAG: tick}
        )
        assert run.success
        events = [e.event_specific_data.materialization for e in run.get_asset_materialization_events()]
        return {(m.asset_key.to_user_string(), m.partition): m.metadata for m in events}

    mats = nightly_run("tick-1")
    collection = mats[("embedding_collections", key)]
    assert collection["added"].value >= 1 and collection["deleted"].value == 0 and not collection["rebuilt"].value
    assert mats[("chunk_sets", "paragraph")]["rechunked_documents"].value == 1
    # Another partition's run of the same tick finds parsing, chunking and BM25 done and only embeds.
    assert set(nightly_run("tick-1")) == {("embedding_collections", key)}

    qdrant = env["resources"]["qdrant"].settings()
    hits = search(
        "lighthouses",
        strategy="paragraph",
        model="wordllama",
        mode="hybrid-rrf",
        k=1,
        root=env["tables"].root.parent,
        qdrant=qdrant,
    )
    assert hits[0].chunk["doc_id"] == "new-note.txt"


def test_run_config_defaults_are_the_library_settings(monkeypatch):
    import importlib.util

    from assets.evaluation import RetrievalEvaluationConfig, SyntheticQAConfig
    from rag.evaluation.retrieval_eval import EvaluationSettings
    from rag.synthetic import SynthSettings

    assert (
        SyntheticQAConfig().settings() == SynthSettings()
        and RetrievalEvaluationConfig().settings() == EvaluationSettings()
    )
    # One place: another library default becomes the run config's default and the launchpad's.
    monkeypatch.setattr(SynthSettings.model_fields["passages_per_document"], "default", 9)
    monkeypatch.setattr(EvaluationSettings.model_fields["ks"], "default_factory", lambda: [5, 10])
    spec = importlib.util.spec_from_file_location("evaluation_copy", REPO / "assets" / "evaluation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SyntheticQAConfig().passages_per_document == 9 and module.RetrievalEvaluationConfig().ks == [5, 10]
    launchpad = module.synthetic_qa.op.config_schema.as_field().config_type.fields
    assert launchpad["passages_per_document"].default_value == 9
    assert "passages sampled per document" in launchpad["passages_per_document"].description


def test_synthetic_qa_llm_override_goes_through_the_registry():
    from assets.evaluation import SyntheticQAConfig
    from rag.llm import load_llm

    resource = LLMResource(backend="none", model="smollm2")
    assert SyntheticQAConfig().llm_settings(resource) == resource.settings()
    chosen = SyntheticQAConfig(llm_backend="openai", llm_model="qwen2.5").llm_settings(resource)
    assert (chosen.backend, chosen.model, chosen.max_new_tokens) == ("openai", "qwen2.5", resource.max_new_tokens)
    with pytest.raises(ValueError, match="known backends"):
        load_llm(SyntheticQAConfig(llm_backend="gpt-from-nowhere").llm_settings(resource))


def test_evaluation_stage_reports_and_summary(env, shared_mixed):
    from dagster import MultiPartitionKey

    for name in ["fake-html.html", "handbook-1p.docx", "norwich-city.txt"]:
        shutil.copy(shared_mixed / name, env["docs"])
    # paragraph against the naive baseline, so the summary has a best-vs-baseline test to report
    env["config"].write_text(
        yaml.safe_dump(
            {
                "strategies": {
                    "paragraph": {"kind": "paragraph"},
                    "recursive-1000-200": {"kind": "recursive", "chunk_size": 1000, "chunk_overlap": 200},
                }
            }
        )
    )
    instance = env["instance"]
    instance.add_dynamic_partitions("chunking_strategy", ["paragraph", "recursive-1000-200"])
    instance.add_dynamic_partitions("embedding_model", ["wordllama"])
    assert run(env, "ingest_documents_job").success
    # The run config reaches the generator: more passages per document, more questions.
    sizes = {}
    for passages in (2, 6):
        qa = run(
            env,
            "synthetic_qa_job",
            config={"synthetic_qa": {"passages_per_document": passages, "questions_per_passage": 2}},
        )
        meta = qa.asset_materializations_for_node("synthetic_qa")[0].metadata
        assert meta["settings"].value["passages_per_document"] == passages and meta["llm_backend"].value == "none"
        sizes[passages] = meta["questions"].value
    assert sizes[2] < sizes[6] == len(env["tables"].read("synthetic_qa"))
    assert qa.success and all(e.passed for e in qa.get_asset_check_evaluations())
    # Without an LLM the default mix: answer-aware, keyword and inverse-cloze questions, each recorded by type.
    assert meta["generator"].value == "answer-aware+keyword+inverse-cloze" and meta["questions"].value > 5
    assert set(env["tables"].read("synthetic_qa")["qtype"]) > {"inverse-cloze"}
    for strategy in ["paragraph", "recursive-1000-200"]:
        assert run(env, "chunk_sets_job", strategy).success
        key = MultiPartitionKey({"strategy": strategy, "model": "wordllama"})
        assert run(env, "embedding_collections_job", key).success
        evaluated = run(env, "retrieval_evaluation_job", key)
        assert evaluated.success and [e.passed for e in evaluated.get_asset_check_evaluations()] == [True]
        report_md = evaluated.asset_materializations_for_node("retrieval_evaluation")[0].metadata["recall_at_k"].value
        assert report_md.startswith("![recall@k](data:image/png;base64,")
    summary_run = run(env, "evaluation_summary_job")
    assert summary_run.success
    summary = env["tables"].read("evaluation_summary")
    assert len(summary) == 8 and summary["best"].sum() == 1
    assert set(summary["mode"]) == {"bm25", "dense", "hybrid-rrf", "hybrid-cc"}
    # BM25 uses no embedding model: its rows name none, the others name the model that embedded them.
    assert set(summary.loc[summary["mode"] == "bm25", "model"]) == {""}
    assert set(summary.loc[summary["mode"] != "bm25", "model"]) == {"wordllama"}
    table = summary_run.asset_materializations_for_node("evaluation_summary")[0].metadata["summary"].value
    assert not [line for line in table.splitlines() if "| bm25 |" in line and "wordllama" in line]
    assert summary["retrieval_score"].between(0, 1).all() and summary["retrieval_score"].is_monotonic_decreasing
    meta = summary_run.asset_materializations_for_node("evaluation_summary")[0].metadata
    comparison = meta["best_vs_baseline_json"].value
    assert meta["questions"].value == sizes[6] == comparison["n_questions"]
    assert comparison["baseline"] == "recursive-1000-200 · wordllama · dense" and "note" not in comparison
    assert (
        comparison["n"] == sizes[6] and 0 < comparison["p_value"] <= 1 and comparison["ci_low"] <= comparison["delta"]
    )
    assert comparison["better"] + comparison["tied"] + comparison["worse"] == sizes[6]
    assert f"on {sizes[6]} paired questions" in meta["best_vs_baseline"].value
    # The evaluation's run config reaches the report and its blocking check: other cutoffs, another relevance rule.
    key = MultiPartitionKey({"strategy": "paragraph", "model": "wordllama"})
    narrow = run(
        env, "retrieval_evaluation_job", key, config={"retrieval_evaluation": {"ks": [5, 10], "relevance": "any"}}
    )
    assert narrow.success and [e.passed for e in narrow.get_asset_check_evaluations()] == [True]
    report = env["tables"].read("retrieval_evaluation", "paragraph__wordllama")
    assert set(report["relevance"]) == {"any"} and "recall@5" in report and "recall@20" not in report


def test_summary_lists_bm25_once_per_strategy_without_a_model():
    """Every model's report of a strategy holds the same BM25 scores: the summary keeps one such row, with no model,
    and compares it with the strongest baseline; the other modes keep their model and their own model's baseline."""
    import pandas as pd

    from rag.evaluation.retrieval_eval import BASELINE, best_vs_baseline, config_label, summarize

    scores = {("paragraph", "bm25"): 0.7, ("paragraph", "dense"): 0.5, (BASELINE[0], "bm25"): 0.3, BASELINE: 0.4}
    reports = pd.DataFrame(
        [
            {
                "strategy": s,
                "model": model,
                "mode": mode,
                "n_questions": 4,
                "recall@5": 0.0,
                "ndcg@10": 0.0,
                "retrieval_score": score + (shift if mode != "bm25" else 0),
            }
            for model, shift in (("small", 0.0), ("large", 0.2))
            for (s, mode), score in scores.items()
        ]
    )
    summary = summarize(reports)
    bm25 = summary[summary["mode"] == "bm25"]
    assert sorted(bm25["strategy"]) == sorted({s for s, _ in scores}) and set(bm25["model"]) == {""}
    assert len(summary) == len(reports) - len(bm25)
    baselines = reports[(reports["strategy"] == BASELINE[0]) & (reports["mode"] == BASELINE[1])]
    strongest = baselines["retrieval_score"].max()
    assert bm25["delta_retrieval_score"].tolist() == pytest.approx((bm25["retrieval_score"] - strongest).tolist())
    dense = summary[(summary["mode"] == "dense") & (summary["strategy"] == "paragraph")].set_index("model")
    assert dense.loc["small", "delta_retrieval_score"] == pytest.approx(
        scores[("paragraph", "dense")] - scores[BASELINE]
    )
    assert config_label(bm25.iloc[0]) == f"{bm25.iloc[0]['strategy']} · bm25"
    # A BM25 winner is labelled without a model and compared on the strongest baseline's per-question tables.
    winner = summarize(reports[(reports["mode"] == "bm25") | (reports["strategy"] == BASELINE[0])])
    asked = []
    comparison = best_vs_baseline(winner, lambda strategy, model: asked.append((strategy, model)))
    assert comparison["best"] == "paragraph · bm25"
    assert comparison["baseline"] == f"{BASELINE[0]} · large · {BASELINE[1]}"
    assert asked == [("paragraph", "large"), (BASELINE[0], "large")]
