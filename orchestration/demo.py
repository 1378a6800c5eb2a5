"""`make demo`: ingest the document folder, build every chunk set, print where results are."""
from __future__ import annotations

import logging
import time

from orchestration.cli import sync_strategy_partitions


def run_demo(instance) -> int:
    from orchestration.definitions import defs
    from resources.chunking import ChunkingStrategies
    from resources.documents import DocumentSource
    from resources.storage import DataStore

    for noisy in ("alembic", "great_expectations", "dagster"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    source, store = DocumentSource(), DataStore()
    print(f"documents: {source.path}\ndata:      {store.data_dir}\ndagster:   {instance.root_directory}\n")
    sync_strategy_partitions(instance)
    started = time.perf_counter()
    ingest = defs.resolve_job_def("ingest_documents_job").execute_in_process(instance=instance, run_config=quiet, raise_on_error=False)
    failures = 0 if ingest.success else 1
    tables = store.tables
    docs, quarantine = tables.read("parsed_documents"), tables.read("document_quarantine")
    print(f"parsed {len(docs)} documents, {int(docs['n_pages'].sum())} pages, {int(docs['n_tables'].sum())} tables")
    for row in quarantine.to_dict("records"):
        print(f"  quarantined {row['doc_id']}: {row['reason']} ({row['message'][:80]})")
    print(f"\n{'strategy':24s} {'chunks':>7s} {'mean chars':>10s} {'check':>6s}")
    chunk_job = defs.resolve_job_def("chunk_sets_job")
    for name in ChunkingStrategies().strategies():
        result = chunk_job.execute_in_process(instance=instance, partition_key=name, run_config=quiet, raise_on_error=False)
        chunks = tables.read("chunk_sets", name)
        evaluations = result.get_asset_check_evaluations()
        passed = all(ev.passed for ev in evaluations) if evaluations else None
        failures += 0 if result.success and passed is not False else 1
        mean = chunks["text"].str.len().mean() if chunks is not None and len(chunks) else 0
        print(f"{name:24s} {0 if chunks is None else len(chunks):7d} {mean:10.0f} {'ok' if passed else 'FAIL' if passed is False else '-':>6s}")
    print(f"\ndone in {time.perf_counter() - started:.1f}s. Tables: {tables.root}/<table>[/<strategy>]/data.parquet")
    print("Browse lineage and runs: make dev  (then open http://127.0.0.1:3000)")
    return 1 if failures else 0
