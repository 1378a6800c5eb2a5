"""The training steps every entry point shares (Dagster assets, the retrain job, benchmarks, tests):
train → register as candidate → gate against production → promote (registry alias + serving collections)."""
from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from rag.embedding import load_embedder
from rag.evaluation.qaset import from_frame
from rag.index.qdrant import CollectionName, point_alias_to
from rag.index.sync import sync_collection
from rag.registry import IMPLICIT_PRODUCTION, ModelRegistry, ModelVersion, library_versions
from rag.store import CHUNKS_TABLE, TableStore
from rag.training.config import EmbedderTrainingConfig, GateSettings, RerankerTrainingConfig, TrainingConfig
from rag.training.data import TrainingData, split_feedback, training_data
from rag.training.embedder import TrainingRun, base_source, train_embedder
from rag.training.gate import GateResult, embedder_gate, reranker_gate
from rag.training.reranker import train_reranker

QA_TABLE = "synthetic_qa"  # written by the synthetic_qa asset
SERVING = "production"  # the model name (and Qdrant alias suffix) searches use to reach the production embedder
Kind = Literal["embedder", "reranker"]
Log = Callable[[str], None]


@dataclass
class Inputs:
    strategy: str
    chunks: pd.DataFrame
    data: TrainingData
    qa_version: str
    feedback_positives: int = 0


def pick_strategy(tables: TableStore, requested: str | None) -> str:
    if requested:
        if not tables.exists(CHUNKS_TABLE, requested):
            raise FileNotFoundError(f"no chunk set for strategy {requested!r}: materialize chunk_sets for it first")
        return requested
    folder = tables.root / CHUNKS_TABLE
    present = sorted(p.parent.name for p in folder.glob("*/data.parquet")) if folder.exists() else []
    if not present:
        raise FileNotFoundError("no chunk set yet: materialize chunk_sets before training")
    return present[0]


def load_inputs(tables: TableStore, config: TrainingConfig) -> Inputs:
    """The QA set's train split as pairs over one chunk set, its dev split as selection and gate questions."""
    qa = tables.read(QA_TABLE)
    if qa is None or qa.empty:
        raise FileNotFoundError("synthetic_qa is empty: materialize synthetic_qa before training")
    strategy = pick_strategy(tables, config.strategy)
    chunks = tables.read(CHUNKS_TABLE, strategy)
    feedback = None
    if config.feedback_dataset:
        from rag.feedback import judgments

        feedback = split_feedback(judgments(Path(config.feedback_dataset)), config.feedback_dev_fraction)
    data = training_data(from_frame(qa), chunks, extra_positives=config.extra_positives, extra_negatives=config.extra_negatives,
                         feedback=feedback, selection_fraction=config.selection_fraction,
                         min_feedback_gate=config.min_feedback_gate_questions)
    qa_version = pd.util.hash_pandas_object(qa[["qid", "question", "evidence_json", "split"]], index=False).sum()
    return Inputs(strategy, chunks, data, f"{int(qa_version) & 0xFFFFFFFFFFFF:012x}",
                  len(config.extra_positives) + (len(feedback.positives) if feedback else 0))


def _manifest(kind: Kind, config: TrainingConfig, inputs: Inputs, run: TrainingRun, parent: ModelVersion | None) -> dict:
    return {"base_model": config.base_model, "parent_version": parent.version if parent else None,
            "training_data_hash": inputs.data.data_hash, "qa_set_version": inputs.qa_version, "strategy": inputs.strategy,
            "hyperparameters": {**config.model_dump(exclude={"extra_positives", "extra_negatives"}),
                                "feedback_positives": inputs.feedback_positives, "feedback_negatives": len(inputs.data.negatives)},
            "seed": config.seed, "library_versions": library_versions(),
            "metrics": {"dev_selection": run.selection_metrics, "training": run.summary}}


def train_candidate(kind: Kind, tables: TableStore, registry: ModelRegistry, config: TrainingConfig, *, log: Log = print,
                    mining_cache: Path | None = None) -> tuple[ModelVersion, TrainingRun, Inputs]:
    """Train, register as a new version and point `candidate` at it. Production is untouched.
    `mining_cache`: a folder where hard-negative mining keeps corpus embeddings between runs."""
    inputs = load_inputs(tables, config)
    log(f"{kind}: {inputs.data.summary} on chunk set {inputs.strategy!r}")
    trainer = train_embedder if kind == "embedder" else train_reranker
    if mining_cache is not None:  # cached corpus embeddings are only valid for the same base weights
        mining_cache = Path(mining_cache) / hashlib.sha256(base_source(config.base_model).encode()).hexdigest()[:12]
    registry.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=registry.root, prefix=".train-") as scratch:
        run = trainer(inputs.data, config, Path(scratch) / "model", corpus=inputs.chunks["text"].tolist(), log=log,
                      mining_cache=mining_cache)
        mv = registry.register(kind, run.model_dir, _manifest(kind, config, inputs, run, registry.resolve(kind, "production")),
                               move=True)
    registry.set_alias(kind, "candidate", mv.version)
    log(f"registered {kind} {mv.name} ({mv.path}) as candidate")
    return mv, run, inputs


def aliased_embedder(registry: ModelRegistry, alias: str):
    """The embedder an alias of this registry points at (the base model for an unset production), loaded by
    directory so it does not depend on which data dir the process's default registry reads."""
    mv = registry.resolve("embedder", alias)
    if mv is not None:
        return load_embedder(str(mv.path))
    if alias == "production":
        return load_embedder(IMPLICIT_PRODUCTION["embedder"])
    raise ValueError(f"no {alias} embedder in {registry.root}: train one first")


def production_label(registry: ModelRegistry, kind: Kind) -> str:
    mv = registry.resolve(kind, "production")
    if mv is not None:
        return mv.name
    return "minilm (base, implicit v0)" if kind == "embedder" else "no reranker (hybrid order, implicit v0)"


def gate_candidate(kind: Kind, tables: TableStore, registry: ModelRegistry, candidate: ModelVersion,
                   settings: GateSettings | None = None) -> GateResult:
    """Candidate vs production on the held-out dev questions of the candidate's own QA set and chunk set."""
    from rag.rerank import load_reranker

    settings = settings or GateSettings()
    trained = candidate.hyperparameters  # the same dev questions the candidate was held out from
    config = TrainingConfig(strategy=candidate.model_extra.get("strategy"),
                            **{k: trained[k] for k in ("feedback_dataset", "feedback_dev_fraction", "min_feedback_gate_questions",
                                                       "selection_fraction") if trained.get(k) is not None})
    inputs = load_inputs(tables, config)
    gate = inputs.data.gate
    if kind == "embedder":
        result = embedder_gate(aliased_embedder(registry, "production"), load_embedder(str(candidate.path)), gate, settings)
    else:
        first = hybrid_candidates(inputs.chunks, gate, aliased_embedder(registry, "production"), settings.rerank_depth)
        result = reranker_gate(first, load_reranker("production", registry=registry), load_reranker(candidate.name, registry=registry),
                               gate, settings)
    registry.update_metrics(kind, candidate.version, {"gate": {**result.metadata, "against": production_label(registry, kind)}})
    return result


def hybrid_candidates(chunks: pd.DataFrame, ir, embedder, depth: int) -> dict[str, list[str]]:
    """Hybrid (RRF of BM25 and dense) top-`depth` ids per question, from an in-memory index of the chunk set."""
    from qdrant_client import QdrantClient

    from rag.index.bm25 import BM25Index
    from rag.retrieval import Index, RetrievalParams, retrieve

    client = QdrantClient(location=":memory:")
    try:
        run = sync_collection(client, chunks, embedder, strategy="gate", model="first-stage")
        index = Index(chunks.set_index("chunk_id"), BM25Index.build(chunks["chunk_id"].tolist(), chunks["text"].tolist()),
                      client, run.alias, embedder)
        params = RetrievalParams(k=depth, candidates=max(depth, 100))
        return {q: [h.chunk["chunk_id"] for h in retrieve(index, text, "hybrid-rrf", params)] for q, text in ir.queries.items()}
    finally:
        client.close()


def serving_alias(strategy: str) -> str:
    return CollectionName(strategy, SERVING).alias


def promote(kind: Kind, registry: ModelRegistry, candidate: ModelVersion, *, tables: TableStore | None = None,
            client=None, strategies: list[str] = (), distance: str = "cosine", log: Log = print) -> dict:
    """Move `production` to the candidate. For an embedder, first make sure every chunk set has a complete
    collection of the new model (incremental: nothing is embedded twice), then move the registry alias, then
    swap each strategy's serving alias `<strategy>__production` onto that collection in one Qdrant request."""
    collections = {}
    if kind == "embedder" and strategies:
        embedder = load_embedder(str(candidate.path))
        for strategy in strategies:
            run = sync_collection(client, tables.read(CHUNKS_TABLE, strategy), embedder, strategy=strategy, model=candidate.name,
                                  distance=distance)
            collections[strategy] = run.collection
            log(f"{strategy}: collection {run.collection} ready ({run.points} points, {run.added} embedded)")
    previous = registry.resolve(kind, "production")
    registry.set_alias(kind, "production", candidate.version)
    for strategy, collection in collections.items():
        point_alias_to(client, serving_alias(strategy), collection)
    registry.set_alias(kind, "candidate", None)
    return {"promoted": candidate.name, "previous": previous.name if previous else None,
            "serving_aliases": {serving_alias(s): c for s, c in collections.items()}}
