"""`make demo`: ingest the document folder, build every chunk set and index, search once, print where results are."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

from orchestration.launch import run_job, sync_partitions

DEMO_QUESTION = "Which flight control computer software must be installed on the airplanes?"
OUTSIDE_QUESTION = "Who painted the Mona Lisa?"  # not in the sample corpus: the answer must say so
# synthetic_qa's run config for the demo: the sample corpus is small, so take (nearly) every passage and two
# questions of each, enough questions (100+) for the summary's paired test to mean something; the rest is the
# library's defaults (rag.synthetic.SynthSettings).
DEMO_QA = {"passages_per_document": 60, "questions_per_passage": 2}
# annotation_queue's run config for the demo: the QA set's questions (there is no traffic yet) are ~130, so 100 of
# them give a full queue for a fraction of the time every question's ranking would take.
DEMO_ANNOTATION = {"questions": 100}


def run_demo(instance) -> int:
    from rag.quiet import quiet_known_noise

    quiet_known_noise()  # before the Definitions load: that is when Dagster's preview/beta warnings fire
    from orchestration.partitions import collection_key
    from rag.retrieval.service import search
    from resources.chunking import ChunkingStrategies
    from resources.documents import DocumentSource
    from resources.storage import DataStore

    logging.getLogger("dagster").setLevel(logging.WARNING)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    source, store = DocumentSource(), DataStore()
    print(f"documents: {source.path}\ndata:      {store.data_dir}\ndagster:   {instance.root_directory}\n")
    from orchestration.cli import sync_models

    sync_partitions(instance)
    started = time.perf_counter()
    with _quarantine_printed_below():
        failures = 0 if run_job(instance, "ingest_documents_job", run_config=quiet).success else 1
    tables = store.tables
    docs, quarantine = tables.read("parsed_documents"), tables.read("document_quarantine")
    print(f"parsed {len(docs)} documents, {int(docs['n_pages'].sum())} pages, {int(docs['n_tables'].sum())} tables")
    for row in quarantine.to_dict("records"):
        print(f"  quarantined {row['doc_id']}: {row['reason']} ({row['message'][:80]})")

    models = sync_models(instance)["models"]  # the served embedder (and any listed as active), no rejected candidate
    print(
        f"\n{'strategy':22s} {'chunks':>6s} {'mean chars':>10s} {'check':>5s}  "
        + "  ".join(f"{m} points" for m in models)
    )
    cut = []  # (strategy × model, share of chunks longer than the model's window)
    for name in ChunkingStrategies().strategies():
        result = run_job(instance, "chunk_sets_job", partition_key=name, run_config=quiet)
        evaluations = result.get_asset_check_evaluations()
        passed = bool(evaluations) and all(ev.passed for ev in evaluations)
        chunks = tables.read("chunk_sets", name)
        points = []
        for model in models:
            indexed = passed and run_job(
                instance, "embedding_collections_job", partition_key=collection_key(name, model), run_config=quiet
            )
            mats = (
                indexed.asset_materializations_for_node("embedding_collections") if indexed and indexed.success else []
            )
            points.append(str(mats[0].metadata["points"].value) if mats else "FAILED")
            if mats and (over := mats[0].metadata.get("truncated_chunks")) and over.value:
                cut.append(f"{name} × {model} {mats[0].metadata['truncated_share'].value:.0%}")
        failures += 0 if result.success and passed and "FAILED" not in points else 1
        mean = chunks["text"].str.len().mean() if chunks is not None and len(chunks) else 0
        print(
            f"{name:22s} {0 if chunks is None else len(chunks):6d} {mean:10.0f} {'ok' if passed else 'FAIL':>5s}  "
            + "  ".join(f"{p:>{len(m) + 7}s}" for p, m in zip(points, models))
        )

    if cut:
        print(
            f"\nchunks longer than the model's window (embedded from their start only): {', '.join(cut)}.\n"
            "  Fix: a strategy sized to the window (kind: sentence-pack, max_tokens under the window, tokenizer: "
            "wordpiece) or a model with a longer window; see window_note in the embedding_collections metadata."
        )
    if models:
        failures += _evaluate(instance, quiet, store, models)
        print(f'\nrag search "{DEMO_QUESTION}" --strategy paragraph --model {models[0]} --mode hybrid-rrf --k 3')
        for hit in search(DEMO_QUESTION, strategy="paragraph", model=models[0], mode="hybrid-rrf", k=3):
            j = hit.to_json()
            print(
                f"  {j['rank']}. {j['doc_id']} p{j['page_start']} [{j['char_start']}:{j['char_end']}] "
                f"{j['text'][:90]!r}"
            )
        _ask(models[0])
        failures += build_annotation_queue(instance, quiet, models[0])
    serving = record_serving(instance, store.root)
    print(f"\nmodel loop (model_rollout and the production_* assets): {'; '.join(serving)}")
    print(
        f"\ndone in {time.perf_counter() - started:.1f}s. Tables: {tables.root}/<table>[/<strategy>]/data.parquet; "
        f"BM25: {store.data_dir}/indexes/bm25; Qdrant: {store.data_dir}/qdrant"
    )
    sensors = set_sensor_starts(instance, source, models)
    print(f"sensors start from what the demo built (a first tick redoes none of it): {', '.join(sensors)}")
    print("Browse lineage and runs: make dev  (then open http://127.0.0.1:3000)")
    print(
        "Ask and rate answers in the web page: .venv/bin/rag serve --strategy paragraph  (then open http://127.0.0.1:8000)"
    )
    return 1 if failures else 0


@contextmanager
def _quarantine_printed_below():
    """rag.ingest warns of each file it quarantines; the demo prints the whole quarantine table after the run
    (files quarantined by earlier runs too), so its warnings would print those files twice."""
    logger = logging.getLogger("rag.ingest")

    def not_a_quarantine(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("quarantined ")

    logger.addFilter(not_a_quarantine)
    try:
        yield
    finally:
        logger.removeFilter(not_a_quarantine)


def _ask(indexed: str) -> None:
    """One answer with its sources, and one question the documents cannot answer, with what `rag ask` and
    `rag serve` answer with by default: the production embedder and reranker (the base model and retrieval order
    until a promotion), in the default mode."""
    from rag.qa import Answerer, AnswerSettings
    from rag.retrieval import RetrievalError

    settings = AnswerSettings(strategy="paragraph")
    try:
        answerer = Answerer(settings)
    except RetrievalError as exc:
        # Production is reached through the base model's collection; a demo configured to index other models only
        # answers with the first of them instead.
        print(f"\nproduction cannot answer ({exc}); answering with {indexed}")
        answerer = Answerer(settings.model_copy(update={"model": indexed}))
    served = answerer.served()
    print(f"\nanswering with embedder {served['embedder']}, reranker {served['reranker']}, mode {served['mode']}")
    for question in (DEMO_QUESTION, OUTSIDE_QUESTION):
        result = answerer.ask(question)
        print(f'\nrag ask "{question}"\n  {result.answer}')
        for src in result.sources():
            print(
                f"  - {src['doc_id']} p{src['page_start']} ({' + '.join(k for k in ('cited', 'attributed') if src[k])})"
            )


def build_annotation_queue(instance, quiet, indexed: str, resources: dict | None = None) -> int:
    """The expert queue, so the expert view has items right after the demo: annotation_queue_job, as the daily
    schedule runs it, over what serves (production; `indexed` when production cannot be opened, as in _ask).
    `resources` replace the code location's (tests). Returns the failures (0 or 1)."""
    config = {**quiet, "ops": {"annotation_queue": {"config": DEMO_ANNOTATION}}}
    result = run_job(instance, "annotation_queue_job", run_config=config, resources=resources)
    if not result.success:
        print(f"\nannotation queue: production cannot rank the questions; building it with {indexed}")
        config["ops"]["annotation_queue"]["config"] = {**DEMO_ANNOTATION, "model": indexed}
        result = run_job(instance, "annotation_queue_job", run_config=config, resources=resources)
    if not result.success:
        print("\nannotation queue FAILED (see the Dagster UI)")
        return 1
    meta = {k: v.value for k, v in result.asset_materializations_for_node("annotation_queue")[0].metadata.items()}
    print(
        f"\nannotation queue: {meta['queue_size']} items for experts over {meta['distinct_documents']} documents "
        f"({meta['from_production']} from people's questions, {meta['from_synthetic']} generated; "
        f"{meta['keyword_questions_dropped']} keyword strings left out) in {meta['path']}; label them on the expert "
        "page (rag serve prints its address)"
    )
    return 0


def _evaluate(instance, quiet, store, models) -> int:
    """Synthetic QA set → a report per (strategy, model) → the summary; prints the summary table."""
    from orchestration.partitions import collection_key
    from rag.markdown import markdown_table
    from resources.chunking import ChunkingStrategies
    from resources.llm import LLMResource

    failures = 0
    qa_config = {**quiet, "ops": {"synthetic_qa": {"config": DEMO_QA}}}
    qa = run_job(instance, "synthetic_qa_job", run_config=qa_config)
    failures += 0 if qa.success else 1
    meta = qa.asset_materializations_for_node("synthetic_qa")[0].metadata if qa.success else {}
    generator = meta["generator"].value if meta else "?"
    print(
        f"\nsynthetic QA ({LLMResource().backend} → {generator}): {meta['questions'].value if meta else 0} questions "
        f"({', '.join(f'{k} {v}' for k, v in DEMO_QA.items())})"
    )
    for strategy in ChunkingStrategies().strategies():
        for model in models:
            ok = run_job(
                instance, "retrieval_evaluation_job", partition_key=collection_key(strategy, model), run_config=quiet
            ).success
            failures += 0 if ok else 1
    summary_run = run_job(instance, "evaluation_summary_job", run_config=quiet)
    summary = store.tables.read("evaluation_summary")
    if not summary_run.success or summary is None:
        print("evaluation summary FAILED (see the Dagster UI)")
        return failures + 1
    questions = int(summary["n_questions"].iloc[0])
    print(f"\nevaluation summary on {questions} questions (best first; delta vs recursive-1000-200 + dense):")
    view = summary.head(12).assign(config=lambda d: d["strategy"] + " · " + d["mode"])
    print(markdown_table(view, ["config", "model", "retrieval_score", "recall@5", "ndcg@10", "delta_retrieval_score"]))
    print(summary_run.asset_materializations_for_node("evaluation_summary")[0].metadata["best_vs_baseline"].value)
    return failures


def record_serving(instance, root) -> list[str]:
    """What serves now, recorded as materializations of model_rollout and of each release step (production_embedder,
    production_reranker, production_configuration): before the first retrain, the base embedder, no reranker and the
    server's own settings, which the UI would otherwise show as "Never materialized". Reported without a run (the
    demo moved nothing). MLflow shows the same from the first minute: the training experiments and, on each
    registered model, a `rag.production` tag naming what serves ("v0 · minilm ..." before any promotion); an MLflow
    server that cannot be reached is reported, not fatal. Returns one line per release step, then one for MLflow."""
    from assets.rollout import serving_events
    from rag.registry import ModelRegistry

    registry = ModelRegistry(root / "models")
    try:
        tags = registry.record_serving()
        mlflow = f"MLflow ({registry.tracking_uri}) tags what serves: " + "; ".join(
            f"{kind} {tag.split(' (')[0]}" for kind, tag in tags.items()
        )
    except Exception as exc:  # noqa: BLE001 - the demo's work is done; MLflow's view of it can be recorded later
        mlflow = f"MLflow not updated ({type(exc).__name__}: {exc}); `make demo` again records it"
    events = serving_events(registry, "recorded by rag demo")
    for event in events:
        instance.report_runless_asset_event(event)
    lines = [event.description for event in events if event.asset_key.to_user_string().startswith("production_")]
    return [*lines, mlflow]


def sensor_starts(instance, source, models: list[str]) -> dict[str, str]:
    """Each sensor's cursor as if it had ticked right after the demo: what the demo built is not built again.
    feedback_volume_sensor, drift_sensor and canary_sensor need none: they count from the last retrain or promotion
    (runs and the registry), which the demo does not touch."""
    import json

    from orchestration.partitions import built_fingerprints
    from rag.chunking import strategy_fingerprint
    from resources.chunking import ChunkingStrategies
    from sensors.annotation import newest_training_event
    from sensors.documents import _state_digest

    fingerprints = {name: strategy_fingerprint(cfg) for name, cfg in ChunkingStrategies().strategies().items()}
    built = built_fingerprints(instance, fingerprints)
    return {
        # only strategies built with their current parameters: one that failed is retried by the sensor
        "chunking_strategy_sensor": json.dumps(
            {name: fp for name, fp in fingerprints.items() if built[name] == fp}, sort_keys=True
        ),
        "embedding_model_sensor": json.dumps(models),
        "new_documents_sensor": _state_digest(source.scan(with_hashes=False)),
        "annotation_after_retrain_sensor": str(newest_training_event(instance)[0]),
    }


def _repository_origin():
    """The code location's repository as `dagster dev` loads it from workspace.yaml (sensor states are keyed by it)."""
    from dagster._core.remote_origin import RemoteRepositoryOrigin
    from dagster._core.workspace.load import location_origins_from_yaml_paths

    from orchestration.definitions import defs
    from orchestration.launch import WORKSPACE

    (location,) = location_origins_from_yaml_paths([str(WORKSPACE)])
    return RemoteRepositoryOrigin(location, defs.get_repository_def().name)


def set_sensor_cursor(instance, name: str, cursor: str) -> None:
    """What `dagster sensor cursor --set` does, without loading the workspace: a stopped sensor keeps its status (the
    UI's toggle starts it from this cursor), a running one ticks on from it."""
    from dagster._core.definitions.run_request import InstigatorType
    from dagster._core.definitions.sensor_definition import SensorType
    from dagster._core.remote_origin import RemoteInstigatorOrigin
    from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, SensorInstigatorData

    from orchestration.definitions import defs

    origin = RemoteInstigatorOrigin(_repository_origin(), name)
    interval = defs.resolve_sensor_def(name).minimum_interval_seconds
    state = instance.get_instigator_state(origin.get_id(), origin.get_selector().get_id())
    if state is None:
        data = SensorInstigatorData(min_interval=interval, cursor=cursor, sensor_type=SensorType.STANDARD)
        instance.add_instigator_state(InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.STOPPED, data))
        return
    old = state.instigator_data
    data = SensorInstigatorData(
        last_tick_timestamp=getattr(old, "last_tick_timestamp", None),
        last_run_key=getattr(old, "last_run_key", None),
        min_interval=interval,
        cursor=cursor,
        last_tick_start_timestamp=getattr(old, "last_tick_start_timestamp", None),
        last_sensor_start_timestamp=getattr(old, "last_sensor_start_timestamp", None),
        sensor_type=SensorType.STANDARD,
    )
    instance.update_instigator_state(state.with_data(data))


def set_sensor_starts(instance, source, models: list[str]) -> list[str]:
    """Every sensor's starting point set to what the demo built; returns their names."""
    starts = sensor_starts(instance, source, models)
    for name, cursor in starts.items():
        set_sensor_cursor(instance, name, cursor)
    return list(starts)
