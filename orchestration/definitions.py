"""The Dagster code location (loaded by workspace.yaml)."""
import os

from dagster import Definitions, in_process_executor, multiprocess_executor

from assets.checks import (
    chunk_sets_quality,
    parsed_documents_quality,
    retrieval_evaluation_quality,
    synthetic_qa_quality,
)
from assets.chunking import chunk_sets
from assets.evaluation import evaluation_summary, retrieval_evaluation, synthetic_qa
from assets.indexing import bm25_indexes, embedding_collections
from assets.ingestion import ingest_documents
# Training stage (fine-tuned embedder, reranker, blocking promotion gates, retrain_job)
from assets.training import (
    finetuned_embedder,
    finetuned_embedder_gate,
    production_embedder,
    production_reranker,
    trained_reranker,
    trained_reranker_gate,
)
from orchestration.training import retrain_job
from orchestration.jobs import chunk_job, evaluation_job, index_job, ingest_job, qa_job, summary_job
from assets.config_search import active_configuration, config_search  # optimization stage
from orchestration.jobs import apply_configuration_job, config_search_job  # optimization stage
from orchestration.nightly import nightly_reindex_job, nightly_reindex_schedule
from resources.chunking import ChunkingStrategies
from resources.documents import DocumentSource
from resources.llm import LLMResource
from resources.models import EmbeddingModels
from resources.qdrant import QdrantResource
from resources.storage import DataStore
from sensors.documents import new_documents_sensor
from sensors.strategies import chunking_strategy_sensor, embedding_model_sensor
# Feedback loop (feedback dataset, drift observations, retrain sensors and weekly fallback)
from assets.feedback import feedback_dataset, query_drift
from assets.answers import answer_evaluation  # answer stage (bake-off of answers per mode × strategy)
from orchestration.jobs import answer_evaluation_job  # answer stage
from resources.feedback import FeedbackLoop
from sensors.drift import drift_sensor
from sensors.feedback import feedback_volume_sensor, weekly_retrain
# Gradual rollout (canary of a gated candidate, its sequential decision, promotion and rollback jobs)
from assets.rollout import model_rollout
from orchestration.rollout import promote_canary_job, rollback_canary_job, start_canary_job
from resources.rollout import Rollout
from sensors.canary import canary_sensor

# Embedded Qdrant locks its folder to one process, so steps run in the run's own process unless a
# Qdrant server is configured; then steps may run in parallel (Qdrant writers share the "qdrant" pool).
executor = multiprocess_executor if os.environ.get("QDRANT_URL") else in_process_executor

defs = Definitions(
    assets=[ingest_documents, chunk_sets, bm25_indexes, embedding_collections, synthetic_qa, retrieval_evaluation,
            evaluation_summary]
    + [finetuned_embedder, trained_reranker, production_embedder, production_reranker]  # training stage
    + [config_search, active_configuration]  # optimization stage
    + [feedback_dataset, query_drift]  # feedback loop
    + [answer_evaluation]  # answer stage
    + [model_rollout],  # gradual rollout
    asset_checks=[parsed_documents_quality, chunk_sets_quality, synthetic_qa_quality, retrieval_evaluation_quality]
    + [finetuned_embedder_gate, trained_reranker_gate],  # training stage
    jobs=[ingest_job, chunk_job, index_job, qa_job, evaluation_job, summary_job, nightly_reindex_job]
    + [retrain_job]  # training stage
    + [config_search_job, apply_configuration_job]  # optimization stage
    + [answer_evaluation_job]  # answer stage
    + [start_canary_job, promote_canary_job, rollback_canary_job],  # gradual rollout
    schedules=[nightly_reindex_schedule] + [weekly_retrain],  # feedback loop
    sensors=[chunking_strategy_sensor, embedding_model_sensor, new_documents_sensor]
    + [feedback_volume_sensor, drift_sensor]  # feedback loop
    + [canary_sensor],  # gradual rollout
    executor=executor,
    resources={
        "document_source": DocumentSource(),
        "data_store": DataStore(),
        "chunking": ChunkingStrategies(),
        "embedding_models": EmbeddingModels(),
        "qdrant": QdrantResource(),
        "llm": LLMResource(),
        "feedback_loop": FeedbackLoop(),  # feedback loop
        "rollout": Rollout(),  # gradual rollout
    },
)
