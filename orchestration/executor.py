"""Which executor runs a run's steps (RAG_EXECUTOR), chosen once when the code location loads.

- `auto` (default): in the run's own process while Qdrant is the embedded folder (it takes one process at a time),
  in parallel processes with a Qdrant server (QDRANT_URL).
- `in_process`, `multiprocess`: Dagster's own executors, named explicitly.
- `celery`: dagster-celery's `celery_executor`: each step is a Celery task that a worker started with
  `dagster-celery worker start -A dagster_celery.app -y deploy/celery/celery.yaml` runs, on any host that has this
  code, the instance's storage (Postgres) and the same data dir. Broker and result backend come from
  DAGSTER_CELERY_BROKER_URL and DAGSTER_CELERY_BACKEND_URL (the names Dagster's Helm chart uses), read when a run
  starts. Use it with a Qdrant server: workers on several hosts cannot share an embedded Qdrant folder.
"""

from __future__ import annotations

import os

from dagster import ExecutorDefinition, in_process_executor, multiprocess_executor

EXECUTOR_ENV = "RAG_EXECUTOR"
CELERY_BROKER_ENV = "DAGSTER_CELERY_BROKER_URL"
CELERY_BACKEND_ENV = "DAGSTER_CELERY_BACKEND_URL"
CHOICES = ("auto", "in_process", "multiprocess", "celery")


def celery_executor_from_env() -> ExecutorDefinition:
    """dagster-celery's executor with broker and backend read from the environment of the process that runs the
    run (the same variables the workers read through deploy/celery/celery.yaml)."""
    from dagster_celery import celery_executor

    return celery_executor.configured(
        {"broker": {"env": CELERY_BROKER_ENV}, "backend": {"env": CELERY_BACKEND_ENV}}, name="celery"
    )


def executor_from_env() -> ExecutorDefinition:
    choice = os.environ.get(EXECUTOR_ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{EXECUTOR_ENV}={choice!r} is not an executor; set it to one of {', '.join(CHOICES)}")
    if choice == "celery":
        return celery_executor_from_env()
    if choice == "multiprocess" or (choice == "auto" and os.environ.get("QDRANT_URL")):
        return multiprocess_executor
    return in_process_executor
