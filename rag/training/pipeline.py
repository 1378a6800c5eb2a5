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
from rag.progress import Progress
from rag.registry import IMPLICIT_PRODUCTION, ModelRegistry, ModelVersion, library_versions
from rag.store import CHUNKS_TABLE, TableStore
from rag.training.config import GateSettings, TrainingConfig
from rag.training.data import COPIED_TYPES, IRSet, TrainingData, split_feedback, training_data
from rag.training.embedder import TrainingRun, base_source, train_embedder
from rag.training.gate import (
    GateResult,
    TooFewGateQuestions,
    embedder_gate,
    reranker_gate,
    veto_by_generated,
)
from rag.training.folds import CrossFitted, fold_dir, people_only, pooled_gate, trained_folds
from rag.training.first_stage import (
    FIRST_STAGE_MODE,
    KnownVectors,
    cut_question,
    first_stage_hits,
    first_stage_index,
    serving_mode,
    without_questions,
)
from rag.training.ltr import train_learned_ranker
from rag.training.reranker import train_reranker
from rag.training.vectors import index_location, index_passages, index_vectors

QA_TABLE = "synthetic_qa"  # written by the synthetic_qa asset
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
    served = served_strategy(Path(tables.root).parent)
    return served if served in present else present[0]


def served_strategy(root: Path) -> str:
    """The chunk set answers are served from: the production configuration's, else the applied configuration's or
    the default (a model trained and gated on another chunk set would be judged on passages nobody is shown)."""
    from rag.registry import ModelRegistry
    from rag.training.configuration import base_settings, served_settings

    return served_settings(base_settings(root), ModelRegistry(Path(root) / "models")).strategy


def load_inputs(tables: TableStore, config: TrainingConfig, fold: int = 0) -> Inputs:
    """The QA set's train split as pairs over one chunk set, its dev split as selection and gate questions; `fold`:
    which share of users' questions is held out (rag.training.folds)."""
    qa = tables.read(QA_TABLE)
    if qa is None or qa.empty:
        raise FileNotFoundError("synthetic_qa is empty: materialize synthetic_qa before training")
    strategy = pick_strategy(tables, config.strategy)
    chunks = tables.read(CHUNKS_TABLE, strategy)
    feedback = None
    if config.feedback_dataset:
        from rag.feedback import judgments

        feedback = split_feedback(judgments(Path(config.feedback_dataset)), config.feedback_dev_fraction, fold=fold)
    data = training_data(
        from_frame(qa),
        chunks,
        extra_positives=config.extra_positives,
        extra_negatives=config.extra_negatives,
        feedback=feedback,
        selection_fraction=config.selection_fraction,
        min_feedback_gate=config.min_feedback_gate_questions,
        min_expert_gate=config.min_expert_gate_questions,
    )
    qa_version = pd.util.hash_pandas_object(qa[["qid", "question", "evidence_json", "split"]], index=False).sum()
    return Inputs(
        strategy,
        chunks,
        data,
        f"{int(qa_version) & 0xFFFFFFFFFFFF:012x}",
        len(config.extra_positives) + (len(feedback.positives) if feedback else 0),
    )


def _manifest(
    kind: Kind, config: TrainingConfig, inputs: Inputs, run: TrainingRun, parent: ModelVersion | None
) -> dict:
    # A learned ranker holds no weights of the base embedder: its versions are named ce-ltr-vN, not ce-minilm-vN.
    family = {"family": "ltr"} if kind == "reranker" and getattr(config, "kind", None) == "lambdamart" else {}
    return {
        **family,
        "base_model": config.base_model,
        "parent_version": parent.version if parent else None,
        "training_data_hash": inputs.data.data_hash,
        "qa_set_version": inputs.qa_version,
        "strategy": inputs.strategy,
        # max_seq_length: the length actually trained at (a None config means the base model's own length).
        "hyperparameters": {
            **config.model_dump(exclude={"extra_positives", "extra_negatives"}),
            "max_seq_length": getattr(run, "max_seq_length", None) or config.max_seq_length,
            "feedback_positives": inputs.feedback_positives,
            "feedback_negatives": len(inputs.data.negatives),
            "expert_pairs": len(inputs.data.expert),
            "expert_questions": len({e.query for e in inputs.data.expert}),
            "expert_gate_questions": sum(
                t == "expert" for t in (inputs.data.gate.types.values() if inputs.data.gate else ())
            ),
        },
        "seed": config.seed,
        "library_versions": library_versions(),
        "metrics": {"dev_selection": run.selection_metrics, "training": run.summary},
    }


def train_candidate(
    kind: Kind,
    tables: TableStore,
    registry: ModelRegistry,
    config: TrainingConfig,
    *,
    log: Log = print,
    mining_cache: Path | None = None,
    progress: Progress | None = None,
) -> tuple[ModelVersion, TrainingRun, Inputs]:
    """Train, register as a new version and point `candidate` at it. Production is untouched.
    `mining_cache`: a folder where hard-negative mining keeps corpus embeddings between runs; `progress` hears the
    training steps of the sentence-transformers trainers."""
    inputs = load_inputs(tables, config)
    root = Path(tables.root).parent
    log(f"{kind}: {inputs.data.summary} on chunk set {inputs.strategy!r}")
    trainer = train_embedder if kind == "embedder" else train_reranker
    if mining_cache is not None:  # cached corpus embeddings are only valid for the same base weights
        mining_cache = Path(mining_cache) / hashlib.sha256(base_source(config.base_model).encode()).hexdigest()[:12]
    from rag.registry.tracking import log_training, training_run

    registry.root.mkdir(parents=True, exist_ok=True)
    # The MLflow run opens before training: a training that fails is recorded too (FAILED), with what went in.
    with (
        tempfile.TemporaryDirectory(dir=registry.root, prefix=".train-") as scratch,
        training_run(
            registry,
            kind,
            seed=config.seed,
            training_data_hash=inputs.data.data_hash,
            qa_set_version=inputs.qa_version,
            strategy=inputs.strategy,
            base_model=config.base_model,
        ) as run_id,
    ):
        if kind == "reranker" and getattr(config, "kind", "cross-encoder") == "lambdamart":
            # One table of passage vectors for the candidate and its fold rankers: the chunk set is embedded once.
            embedder = KnownVectors(aliased_embedder(registry, "production"), {})
            mode = serving_mode(Path(tables.root).parent)
            run = train_learned_ranker(
                inputs.data,
                config,
                Path(scratch) / "model",
                chunks=inputs.chunks,
                embedder=embedder,
                feedback=_rated_pairs(config),
                log=log,
                mode=mode,
            )
            if config.feedback_dataset:
                run.fold_rankers = train_fold_rankers(
                    tables, config, run.model_dir, chunks=inputs.chunks, embedder=embedder, log=log, mode=mode
                )
        else:
            # The embedder reads the base weights' passage vectors from the index instead of encoding them again.
            stored = {"stored_passages": index_passages(index_location(root), inputs.strategy, config.base_model)}
            run = trainer(
                inputs.data,
                config,
                Path(scratch) / "model",
                corpus=inputs.chunks["text"].tolist(),
                log=log,
                mining_cache=mining_cache,
                progress=progress,
                **(stored if kind == "embedder" else {}),
            )
        manifest = _manifest(kind, config, inputs, run, registry.resolve(kind, "production"))
        log_training(registry, run_id, run, manifest["hyperparameters"], inputs.data.summary)
        mv = registry.register(kind, run.model_dir, manifest, move=True, run_id=run_id)
    registry.set_alias(kind, "candidate", mv.version)
    log(f"registered {kind} {mv.name} ({mv.path}) as candidate")
    return mv, run, inputs


def _rated_pairs(config: TrainingConfig, fold: int = 0) -> tuple[list, list]:
    """Users' training-side ratings as (question, passage) pairs, +1 and -1: the learned ranker's feedback priors.
    Held-out feedback questions stay out, like their pairs stay out of training."""
    positives, negatives = list(config.extra_positives), list(config.extra_negatives)
    if config.feedback_dataset:
        from rag.feedback import judgments

        split = split_feedback(judgments(Path(config.feedback_dataset)), config.feedback_dev_fraction, fold=fold)
        positives, negatives = positives + split.positives, negatives + split.negatives
    return positives, negatives


def train_fold_rankers(
    tables: TableStore, config, model_dir: Path, *, chunks: pd.DataFrame, embedder, log: Log, mode: str
) -> int:
    """Fold i's ranker for i = 1 .. gate_folds - 1 in `model_dir`/folds/i (rag.training.folds): trained as the
    candidate was, with that share of users' questions held out instead of the candidate's own. Trained whether or
    not the shares hold enough people's questions to gate on yet: once this candidate serves, its successors are
    compared with it share by share, each side by a ranker that never trained on the share. A fold with nothing to
    train on is skipped. Returns how many were trained."""
    trained, share = 0, config.feedback_dev_fraction
    for fold in range(1, min(getattr(config, "gate_folds", 1), int(1 / share + 1e-9) if share > 0 else 1)):
        inputs = load_inputs(tables, config, fold)
        try:
            train_learned_ranker(
                inputs.data,
                config,
                fold_dir(model_dir, fold),
                chunks=chunks,
                embedder=embedder,
                feedback=_rated_pairs(config, fold),
                log=lambda line, fold=fold: log(f"fold {fold}: {line}"),
                mode=mode,
            )
        except ValueError as exc:
            log(f"fold {fold}: not trained ({exc}); its questions are not pooled")
            continue
        trained += 1
    return trained


def cross_fitted_gate(
    tables: TableStore,
    config: TrainingConfig,
    candidate: ModelVersion,
    production: ModelVersion | None,
    gate: IRSet | None,
    scored,
    current,
    settings: GateSettings,
) -> tuple[IRSet | None, object, object, dict[int, int]]:
    """The gate set and the two rankers that score it, cross-fitted where the candidate holds fold rankers and its own
    gate set is people's questions alone: each other share's people's questions join, scored by the candidate's
    ranker trained without them (rag.training.folds). Production must not have trained on them either: the untrained
    default never did; a learned ranker, trained on every share but its own, scores each other share with its own
    fold ranker for it, and one without such rankers keeps the gate to the candidate's own share. Also how many
    questions each share gives ({} when nothing is pooled)."""
    from rag.rerank.ltr import LearnedRanker

    folds = trained_folds(candidate.path)
    if production is not None:
        # Its shares are the candidate's only if it split the feedback into shares of the same size.
        same = production.hyperparameters.get("feedback_dev_fraction") == config.feedback_dev_fraction
        folds = [f for f in folds if same and f in trained_folds(production.path)]
    if not folds or not people_only(gate) or settings.copied_questions != "exclude":
        return gate, scored, current, {}
    others = {}
    for fold in folds:
        inputs = load_inputs(tables, config, fold)
        if people_only(inputs.data.gate):
            others[fold], _, _ = decision_questions(inputs.data.gate, inputs.chunks, settings)
    pooled, by_fold = pooled_gate(gate, others)

    def fitted(mv: ModelVersion, ranker) -> CrossFitted:
        rankers = {f: LearnedRanker(fold_dir(mv.path, f), name=f"{mv.name} fold {f}") for f in others}
        return CrossFitted(ranker, rankers, by_fold, pooled.queries)

    current = current if production is None else fitted(production, current)
    return pooled, fitted(candidate, scored), current, {f: len(q) for f, q in by_fold.items()}


def aliased_embedder(registry: ModelRegistry, alias: str):
    """The embedder an alias of this registry points at (the base model for an unset production), loaded by
    directory so it does not depend on which data dir the process's default registry reads."""
    mv = registry.resolve("embedder", alias)
    if mv is not None or alias == "production":
        return _production_embedder(mv)
    raise ValueError(f"no {alias} embedder in {registry.root}: train one first")


def production_label(registry: ModelRegistry, kind: Kind) -> str:
    return model_label(kind, registry.resolve(kind, "production"))


def gate_candidate(
    kind: Kind,
    tables: TableStore,
    registry: ModelRegistry,
    candidate: ModelVersion,
    settings: GateSettings | None = None,
) -> GateResult:
    """Candidate vs production on the held-out dev questions of the candidate's own QA set and chunk set. The
    verdict goes into the candidate's manifest with what it was computed against (candidate and production
    versions, QA-set version, time): promote() accepts only a passing verdict against today's production."""
    from rag.registry.tracking import record_gate
    from rag.rerank import load_reranker

    settings = settings or GateSettings()
    trained = candidate.hyperparameters  # the same dev questions the candidate was held out from
    config = TrainingConfig(
        strategy=candidate.model_extra.get("strategy"),
        **{
            k: trained[k]
            for k in (
                "feedback_dataset",
                "feedback_dev_fraction",
                "min_feedback_gate_questions",
                "min_expert_gate_questions",
                "selection_fraction",
            )
            if trained.get(k) is not None
        },
    )
    inputs = load_inputs(tables, config)
    recorded = candidate.model_extra.get("qa_set_version")
    if recorded and recorded != inputs.qa_version:
        # Another QA set has other train/dev splits: its "held-out" questions may be ones the candidate trained on.
        raise ValueError(
            f"the QA set changed since {kind} {candidate.name} was trained (qa_set_version {recorded} in its "
            f"manifest, {inputs.qa_version} now): its gate questions are no longer held out. Retrain "
            "(materialize the training asset / run retrain_job) and gate the new candidate"
        )
    gate, chunks, copied = decision_questions(inputs.data.gate, inputs.chunks, settings)
    production = registry.resolve(kind, "production")  # resolved once: the verdict names what it was compared with
    recorded = {
        "against": model_label(kind, production),
        "candidate_version": candidate.version,
        "production_version": production.version if production else None,
        "qa_set_version": inputs.qa_version,
        "strategy": inputs.strategy,
        "settings": settings.model_dump(),
        "gate_set": inputs.data.gate_set,
        "gate_questions_keyed_by_corrections": inputs.data.correction_gate_questions,
    }  # which questions decide (expert-labelled first when enough), and why
    if kind == "reranker":  # what it re-ranked: a verdict over another embedder's candidates does not carry over
        first_stage = registry.resolve("embedder", "production")
        recorded["first_stage_embedder"] = first_stage.version if first_stage else None
    # Trained by this pipeline, it learned from the QA set's generated questions (hold_generated_gain).
    trained = bool(candidate.training_data_hash)
    guard = guard_questions(inputs.data.guard, inputs.chunks, settings)
    root = Path(tables.root).parent
    try:
        if kind == "embedder":
            # Production's passage vectors are in the index already (its own weights): read, not encoded again.
            with index_vectors(root, _production_embedder(production), load_embedder(str(candidate.path))) as pair:
                result = embedder_gate(
                    *pair,
                    gate,
                    settings,
                    copied=copied,
                    trained_on_generated=trained,
                )
                if result.better and guard is not None:
                    veto_by_generated(result, embedder_gate(*pair, guard, settings, trained_on_generated=False))
        else:
            current = load_reranker(production.name, registry=registry) if production is not None else None
            scored = load_reranker(candidate.name, registry=registry)
            gate, scored, current, folds = cross_fitted_gate(
                tables, config, candidate, production, gate, scored, current, settings
            )
            if gate is None:  # no questions: reranker_gate says what to generate
                result = reranker_gate({}, current, scored, gate, settings, copied=copied)
            else:  # the first stage's passage vectors: the index's, for production's weights
                embedder = _production_embedder(registry.resolve("embedder", "production"))
                with index_vectors(root, embedder) as (current_embedder,):
                    mode = serving_mode(root)

                    def first_stage(ir: IRSet) -> dict:
                        return hybrid_candidates(chunks, ir, current_embedder, settings.rerank_depth, mode)

                    pooled = gate.with_unanswered() if settings.pool_depth else gate
                    ranked = first_stage(pooled)
                    result = reranker_gate(
                        ranked, current, scored, gate, settings, copied=copied, trained_on_generated=trained
                    )
                    result.by_fold = folds
                    if result.better and guard is not None:  # the generated questions' first stage only when asked
                        guarded = reranker_gate(
                            first_stage(guard), current, scored, guard, settings, trained_on_generated=False
                        )
                        veto_by_generated(result, guarded)
    except TooFewGateQuestions as exc:
        # No verdict either way, recorded as such: production stays, and the message says what to generate.
        verdict = {
            **recorded,
            "passed": False,
            "better": False,
            "not_worse": False,
            "outcome": "no verdict",
            "reasons": str(exc),
            "questions": len(gate) if gate is not None else 0,
            "copied_questions": copied,
            "copied_questions_set_aside": copied,
            "gated_at": _now(),
        }
        registry.update_metrics(kind, candidate.version, {"gate": verdict})
        record_gate(registry, candidate, verdict)
        withdraw_rejected(registry, kind, candidate, verdict)
        raise
    verdict = {
        **result.metadata,
        **recorded,
        "copied_questions": copied,
        "passed": bool(result.passed),
        "gated_at": _now(),
    }
    registry.update_metrics(kind, candidate.version, {"gate": verdict})
    record_gate(registry, candidate, verdict, result)  # into its MLflow run, with the per-question scores
    withdraw_rejected(registry, kind, candidate, verdict)
    pool_unjudged(Path(tables.root).parent, kind, candidate, result, gate, chunks, recorded)
    return result


def pool_unjudged(root: Path, kind: str, candidate: ModelVersion, result: GateResult, gate, chunks, recorded) -> None:
    """The gate's pool for the experts (rag.annotation.pool): after a verdict short of better, the pairs nobody rated
    that would tell the two models apart; a verdict of better settles the kind's pool."""
    from rag.annotation.pool import clear_pool, pool_of, write_pool

    if result.better or not result.unjudged or gate is None:
        clear_pool(root, kind)
        return
    about = {"against": recorded["against"], "outcome": result.outcome, "strategy": recorded["strategy"]}
    questions = {**gate.unanswered, **gate.queries}
    write_pool(root, pool_of(result.unjudged, questions, chunks, kind=kind, candidate=candidate.name, **about))


def withdraw_rejected(registry: ModelRegistry, kind: str, candidate: ModelVersion, verdict: dict) -> bool:
    """Take the `candidate` alias from a version whose gate verdict keeps production (worse, unchanged, no verdict),
    so MLflow's alias editor never offers a refused model as the one to promote. A candidate found no worse keeps
    it: a canary may still serve it, now or queued behind another. Only while the alias still names this version (a
    newer training may hold it). True when the alias was removed; the verdict stays in the version's manifest."""
    if verdict.get("better") is True or verdict.get("not_worse") is True:
        return False
    if registry.aliases()[kind].get("candidate") != candidate.version:
        return False
    registry.set_alias(kind, "candidate", None)
    return True


def decision_questions(
    gate: IRSet | None, chunks: pd.DataFrame, settings: GateSettings
) -> tuple[IRSet | None, pd.DataFrame, int]:
    """The gate questions that decide, the chunk set they are scored on, and how many copied questions were set
    aside (0 when they are included). A question is copied when its type is a document sentence (inverse cloze) or
    its text stands word for word in a relevant chunk (an LLM that copied). Excluded by default
    (GateSettings.copied_questions): people do not ask in the documents' sentences. Included, they are cut out of
    their chunks, as in training: scored against the copy, every model "finds" them and the gate measures string
    matching."""
    if gate is None:
        return None, chunks, 0
    texts = dict(zip(chunks["chunk_id"], chunks["text"]))
    copied = {
        q
        for q, rel in gate.qrels.items()
        if gate.types.get(q) in COPIED_TYPES
        or any(c in texts and cut_question(texts[c], gate.queries[q]) != texts[c] for c in rel)
    }
    if settings.copied_questions == "include":
        cut, _ = without_questions(chunks, [(gate.queries[q], c) for q, rel in gate.qrels.items() for c in rel])
        corpus = dict(zip(cut["chunk_id"], cut["text"]))
        ir = IRSet(gate.queries, corpus, gate.qrels, gate.judged, gate.types, gate.unanswered, gate.unanswered_judged)
        return ir, cut, 0
    return gate.subset([q for q in gate.queries if q not in copied]), chunks, len(copied)


def guard_questions(guard: IRSet | None, chunks: pd.DataFrame, settings: GateSettings) -> IRSet | None:
    """The held-out generated questions that may veto a direct promotion (GateSettings.generated_veto), without the
    copied ones (decision_questions) and only as many as could show a loss; None when there are too few or the veto
    is off. They are scored on the chunk set the people's questions are, so copied ones are set aside, not cut."""
    if not settings.generated_veto or guard is None:
        return None
    kept, _, _ = decision_questions(guard, chunks, settings.model_copy(update={"copied_questions": "exclude"}))
    return kept if kept is not None and len(kept) >= settings.min_questions else None


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="seconds")


def _production_embedder(production: ModelVersion | None):
    """A resolved embedder version, loaded by directory; None is the base model (production before any promotion:
    the implicit v0)."""
    return load_embedder(str(production.path) if production is not None else IMPLICIT_PRODUCTION["embedder"])


# What serves before any version of a kind was promoted (the implicit v0 every first candidate is gated against).
IMPLICIT_LABELS = {
    "embedder": "minilm (base, implicit v0)",
    "reranker": "no reranker (hybrid order, implicit v0)",
    "configuration": "the server's own settings (implicit v0)",
}


def model_label(kind: str, production: ModelVersion | None) -> str:
    """A production version's served name, or what serves without one (the implicit v0)."""
    if production is not None:
        return production.name
    return IMPLICIT_LABELS[kind]


def hybrid_candidates(chunks: pd.DataFrame, ir, embedder, depth: int, mode: str = FIRST_STAGE_MODE) -> dict[str, list]:
    """The first stage's top-`depth` hits per question (`mode`: the serving mode, hybrid by default), with their
    first-stage signals, from an in-memory index of the chunk set."""
    with first_stage_index(chunks, embedder) as index:
        return first_stage_hits(index, ir.queries, depth, mode)
