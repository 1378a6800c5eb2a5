"""The Dagster code location (loaded by workspace.yaml).

Each stage module ends with its own `defs = Definitions(...)` (its assets, checks, jobs, sensors, schedules); this
module merges them and adds what they share: the resources (defined once, here) and the executor. A new stage adds
its module to STAGES. Only modules are imported here: Dagster refuses a module with two Definitions objects in scope.
"""

from dagster import Definitions

from assets import (
    annotation,
    answers,
    checks,
    chunking,
    config_search,
    evaluation,
    feedback,
    indexing,
    ingestion,
    rollout,
    training,
)
from orchestration import jobs, nightly
from orchestration import rollout as rollout_jobs
from orchestration import training as training_jobs
from orchestration.executor import executor_from_env
from resources.chunking import ChunkingStrategies
from resources.documents import DocumentSource
from resources.feedback import FeedbackLoop
from resources.llm import LLMResource
from resources.models import EmbeddingModels
from resources.qdrant import QdrantResource
from resources.rollout import Rollout
from resources.storage import DataStore
from sensors import canary, documents, drift, strategies
from sensors import annotation as annotation_sensors
from sensors import feedback as feedback_sensors

STAGES = (
    # core pipeline: parse → chunk → index → synthetic QA → retrieval evaluation, its checks, jobs and sensors
    ingestion,
    chunking,
    indexing,
    evaluation,
    checks,
    jobs,
    nightly,
    documents,
    strategies,
    training,
    training_jobs,  # training: fine-tuned embedder, reranker, blocking promotion gates, retrain_job
    config_search,  # optimization: configuration search and the active configuration (jobs in orchestration/jobs.py)
    feedback,
    feedback_sensors,
    drift,  # feedback loop: dataset, drift observations, retrain sensors, weekly fallback
    answers,  # answer stage: bake-off of answers per mode × strategy (job in orchestration/jobs.py)
    rollout,
    rollout_jobs,
    canary,  # gradual rollout: canary of a gated candidate, promotion and rollback
    annotation,
    annotation_sensors,  # annotation: the expert queue (active learning), rebuilt daily and after retrains
)

# Embedded Qdrant locks its folder to one process, so steps run in the run's own process unless a Qdrant server is
# configured; then in parallel processes. RAG_EXECUTOR=celery sends them to Celery workers (orchestration/executor.py).
executor = executor_from_env()

defs = Definitions.merge(
    *(stage.defs for stage in STAGES),
    Definitions(
        executor=executor,
        resources={
            "document_source": DocumentSource(),
            "data_store": DataStore(),
            "chunking": ChunkingStrategies(),
            "embedding_models": EmbeddingModels(),
            "qdrant": QdrantResource(),
            "llm": LLMResource(),
            "feedback_loop": FeedbackLoop(),
            "rollout": Rollout(),
        },
    ),
)
