"""Training stage: a fine-tuned embedder and a cross-encoder reranker, each registered as `candidate` in the
model registry, gated by a blocking significance check against `production`, and released only when it passes:
promoted directly (for the embedder: collections of the new model built, then the serving alias
`<strategy>__production` swapped), or started as a canary that canary_sensor promotes or rolls back, as the rollout
resource's promotion policy says (rag.lifecycle.rollout.release; by default 'auto': a significant gain is promoted,
a candidate found no worse gets a canary). A candidate whose gate keeps production (worse, unchanged, no verdict)
loses the `candidate` alias; its version and verdict stay in the registry and MLflow.

Lineage: each learner is downstream of `feedback_dataset` (what it learns people's judgements from) and the release
steps upstream of `model_rollout` (what serves), so the loop reads feedback → training → rollout in the graph."""

from pathlib import Path

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    Config,
    Definitions,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
)
from pydantic import Field

from assets.rollout import rollout_observation
from orchestration.partitions import chunking_strategy_partitions
from rag.evaluation.plots import markdown_image
from rag.progress import LogProgress
from rag.registry import ModelRegistry
from rag.registry.tracking import dagster_run, run_url
from rag.store import CHUNKS_TABLE
from rag.training import EmbedderTrainingConfig, GateSettings, RerankerTrainingConfig
from rag.lifecycle.rollout import release
from rag.rollout.ui_state import current_verdict, gate_outcome
from rag.training.configuration import (
    MODES,
    ConfigurationSpace,
    TooFewQuestions,
    gate_configuration,
    train_configuration,
)
from rag.training.gate import TooFewGateQuestions
from rag.lifecycle.verdicts import TRAINING_ASSET, check_promotable, rejected_by_gate
from rag.training.pipeline import IMPLICIT_LABELS, QA_TABLE, gate_candidate, production_label, train_candidate
from rag.training.report import gate_table, loss_curve
from resources.qdrant import QdrantResource, qdrant_pool
from resources.rollout import Rollout
from resources.storage import DataStore


class TrainingRunConfig(Config):
    """Launchpad settings shared by both trainers (see rag.training.config for every field's meaning)."""

    base_model: str = "minilm"
    strategy: str | None = Field(None, description="chunk set whose chunks are the passages (default: first present)")
    epochs: float = 1.0
    max_steps: int | None = None
    max_pairs: int | None = 4000
    max_seq_length: int | None = None
    learning_rate: float | None = None
    seed: int = 42
    feedback_dataset: str | None = Field(
        None,
        description="exported feedback RAG-Dataset folder: its +1 pairs and "
        "-1 hard negatives join the training data, a held-out share of its questions the gate",
    )
    feedback_dev_fraction: float = Field(
        0.3, description="share of rated questions held out of training for selection and the gate"
    )
    # None = rag.training.config's defaults (one place): λ 0.2, 20 expert questions.
    expert_weight: float | None = Field(
        None, description="λ: the expert-labelled pairs' share of the training signal (0 leaves them out; default 0.2)"
    )
    min_expert_gate_questions: int | None = Field(
        None, description="held-out expert-labelled questions needed for the gate to decide on them alone (default 20)"
    )

    def overrides(self) -> dict:
        feedback = self.feedback_dataset if self.feedback_dataset and Path(self.feedback_dataset).exists() else None
        fields = {
            "base_model": self.base_model,
            "strategy": self.strategy,
            "epochs": self.epochs,
            "max_steps": self.max_steps,
            "max_pairs": self.max_pairs,
            "seed": self.seed,
            "feedback_dataset": feedback,
            "feedback_dev_fraction": self.feedback_dev_fraction,
            "max_seq_length": self.max_seq_length,
            "learning_rate": self.learning_rate,
            "expert_weight": self.expert_weight,
            "min_expert_gate_questions": self.min_expert_gate_questions,
        }
        return {k: v for k, v in fields.items() if v is not None}


class EmbedderTrainingRunConfig(TrainingRunConfig):
    loss: str = Field("cached-mnrl", description="mnrl | cached-mnrl")
    batch_size: int = 64
    selection_passages: int | None = Field(
        None,
        description="each checkpoint is scored on at most this many passages (default 10,000): those of the "
        "selection questions and a random sample of the others; a chunk set no larger is scored whole",
    )


class RerankerTrainingRunConfig(TrainingRunConfig):
    kind: str = Field(
        "lambdamart",
        description="lambdamart (LightGBM LambdaRank over first-stage, lexical and feedback "
        "features; seconds) | cross-encoder (from the base model's weights; learns little on a CPU)",
    )
    rerank_depth: int = Field(50, description="first-stage candidates per question the reranker re-orders")
    loss: str = Field("bce", description="cross-encoder only: bce | lambda")
    batch_size: int = 16


class GateConfig(Config):
    p_value: float = 0.05
    test: str = Field("permutation", description="permutation | bootstrap")
    recall_tolerance: float = 0.01
    min_questions: int = Field(
        5,
        description="fewest held-out gate questions to decide on; fewer fails the check "
        "with 'generate a larger QA set'",
    )
    max_drop: float = Field(
        0.02,
        description="promotion policy 'canary' (the gate asks 'no worse'): largest allowed drop "
        "of nDCG@10 / MRR@10, significant or not (on a gate set of users' questions alone, only a significant drop)",
    )
    generated_gain: str = Field(
        "canary",
        description="canary | promote: does a candidate trained on generated questions get promoted directly by a "
        "gain on generated questions alone (no users' or experts' questions among those that decide)? canary: no, "
        "it counts as no worse and only a canary or people's questions can promote it "
        "(GateSettings.generated_embedder_gain / generated_reranker_gain)",
    )


# Lineage only: each learner reads the exported feedback folder its run config names (the feedback sensors export it
# and pass it on), so the graph shows the loop's edge from people's feedback to training. retrain_job selects its
# assets by name, so this dep never adds feedback_dataset to a run.
FEEDBACK = AssetKey("feedback_dataset")


def _registry(data_store: DataStore) -> ModelRegistry:
    return ModelRegistry(data_store.root / "models")


def _train(kind: str, settings, context: AssetExecutionContext, data_store: DataStore):
    """Train, register as candidate; the materialization shows the data, the run (with its MLflow link), the
    manifest and the loss curve."""
    registry = _registry(data_store)
    with dagster_run(context.run_id):
        mv, run, inputs = train_candidate(
            kind,
            data_store.tables,
            registry,
            settings,
            log=context.log.info,
            mining_cache=data_store.root / "training" / "mining-cache",
            progress=LogProgress(context.log.info),
        )
    url = run_url(registry, mv)
    return mv, {
        **({"mlflow_run": MetadataValue.url(url)} if url else {}),
        "version": mv.version,
        "name": mv.name,
        "path": MetadataValue.path(str(mv.path)),
        "strategy": inputs.strategy,
        **inputs.data.summary,
        **run.summary,
        "manifest": MetadataValue.json(mv.manifest()),
        "loss_curve": MetadataValue.md(markdown_image(loss_curve(run.log_history, f"{kind} {mv.name}"), "loss")),
    }


@asset(
    deps=[AssetKey(QA_TABLE), AssetKey(CHUNKS_TABLE), FEEDBACK],
    group_name="training",
    kinds={"python", "pytorch"},
    description="Fine-tuned embedder (sentence-transformers, MNRL / cached MNRL with hard negatives, no-duplicate "
    "batches, AdamW with linear warmup/decay, checkpoint by nDCG@10 on synth-dev) on the QA set's train split plus "
    "feedback pairs; registered as `candidate` (its collections are built when it is promoted or canaried, and the "
    "embedding_model sensor adds its partition once it serves).",
)
def finetuned_embedder(
    context: AssetExecutionContext, config: EmbedderTrainingRunConfig, data_store: DataStore
) -> MaterializeResult:
    sample = {"selection_passages": config.selection_passages} if config.selection_passages else {}
    settings = EmbedderTrainingConfig(**config.overrides(), loss=config.loss, batch_size=config.batch_size, **sample)
    _mv, metadata = _train("embedder", settings, context, data_store)
    return MaterializeResult(metadata=metadata)


@asset(
    deps=[AssetKey(QA_TABLE), AssetKey(CHUNKS_TABLE), FEEDBACK],
    group_name="training",
    kinds={"python", "pytorch"},
    description="Reranker trained on the QA set's train split (+ feedback): by default a LightGBM LambdaRank model "
    "over the first stage's candidates (top 50 of the serving mode, hybrid-cc by default: dense and BM25 scores and "
    "ranks, query-term coverage, phrase matches, length, position, feedback priors), early-stopped on selection "
    "nDCG@10 and calibrated to a relevance probability; kind=cross-encoder trains a CrossEncoder instead. Registered "
    "as `candidate`.",
)
def trained_reranker(
    context: AssetExecutionContext, config: RerankerTrainingRunConfig, data_store: DataStore
) -> MaterializeResult:
    settings = RerankerTrainingConfig(
        **config.overrides(),
        kind=config.kind,
        rerank_depth=config.rerank_depth,
        loss=config.loss,
        batch_size=config.batch_size,
    )
    return MaterializeResult(metadata=_train("reranker", settings, context, data_store)[1])


def _gate(
    kind: str, config: GateConfig, data_store: DataStore, rollout: Rollout, run_id: str | None = None
) -> AssetCheckResult:
    registry = _registry(data_store)
    candidate = registry.resolve(kind, "candidate")
    if candidate is None:  # ERROR: the blocking check stops the release step, which would have nothing to release
        return AssetCheckResult(
            passed=False,
            severity=AssetCheckSeverity.ERROR,
            description=f"no {kind} candidate in the registry: materialize the training asset first",
            metadata={"verdict": f"no verdict: no {kind} candidate in the registry to gate"},
        )
    against = production_label(registry, kind)
    settings = _gate_settings(config, rollout, **{f"generated_{kind}_gain": config.generated_gain})
    try:
        with dagster_run(run_id):
            result = gate_candidate(kind, data_store.tables, registry, candidate, settings)
    except TooFewGateQuestions as exc:  # no verdict, recorded as such: production stays, the run goes on
        withdrawn = _withdrawn(registry, kind, candidate)
        return AssetCheckResult(
            passed=False,
            severity=AssetCheckSeverity.WARN,
            description=f"{candidate.name} vs {against}: no verdict, keep production. {exc}{_said(withdrawn)}",
            metadata={
                "verdict": f"no verdict: {exc}",
                "outcome": "no verdict",
                "candidate": candidate.name,
                "production": against,
                **withdrawn,
            },
        )
    verdict = _verdict_words(result, rollout)
    withdrawn = _withdrawn(registry, kind, candidate)
    # A rejected candidate is a normal outcome of retraining, not a broken run: WARN lets the run succeed, and the
    # production asset downstream reads the recorded verdict and keeps production (it never promotes without one).
    return AssetCheckResult(
        passed=result.passed,
        severity=AssetCheckSeverity.WARN,
        description=f"{candidate.name} vs {against} on {result.questions} held-out dev questions "
        f"({result.copied_questions} copied ones set aside): {verdict}{_said(withdrawn)}",
        metadata={
            "verdict": verdict,
            **result.metadata,
            "candidate": candidate.name,
            "production": against,
            "comparison": MetadataValue.md(gate_table(result)),
            **withdrawn,
        },
    )


def _withdrawn(registry: ModelRegistry, kind: str, candidate) -> dict:
    """The check's metadata when the gate took the `candidate` alias from a version it rejected
    (rag.training.pipeline.withdraw_rejected); empty while the version keeps it."""
    if registry.aliases()[kind].get("candidate") is not None:  # still this version's, or a newer training's
        return {}
    return {"candidate_alias": f"removed from {candidate.name}: the gate keeps production"}


def _said(withdrawn: dict) -> str:
    return f" The `candidate` alias was {withdrawn['candidate_alias']}." if withdrawn else ""


def _gate_settings(config: GateConfig, rollout: Rollout, **extra) -> GateSettings:
    return GateSettings(
        p_value=config.p_value,
        test=config.test,
        recall_tolerance=config.recall_tolerance,
        min_questions=config.min_questions,
        criterion=rollout.gate_criterion,
        max_drop=config.max_drop,
        **extra,
    )


def _verdict_words(result, rollout: Rollout) -> str:
    """What the release step will do with a gate result, in words, under the rollout resource's policy."""
    if rollout.promotion == "auto":
        return (
            "significantly better: promote"
            if result.better
            else "no worse, not shown better: start its canary (the online test decides)"
            if result.passed
            else f"keep production ({result.outcome})"
        )
    if rollout.gate_criterion == "not_worse":
        words = "no worse: start its canary (the online test decides)" if result.passed else None
        return (words or f"{result.outcome}: keep production") + ("; significantly better too" if result.better else "")
    return "promote" if result.passed else f"keep production ({result.outcome})"


def _gate_observed(
    context: AssetCheckExecutionContext, result: AssetCheckResult, data_store: DataStore
) -> AssetCheckResult:
    """The check's result, after observing model_rollout: the loop's last gate verdict changed."""
    verdict = result.metadata.get("verdict") if result.metadata else None
    context.op_execution_context.log_event(
        rollout_observation(_registry(data_store), f"gate: {getattr(verdict, 'value', verdict) or result.description}")
    )
    return result


def _run_id(context: AssetCheckExecutionContext) -> str:
    return context.op_execution_context.run_id


_POLICY = (
    "By the rollout resource's promotion policy: 'direct' needs a significant gain; 'canary' and 'auto' (default) "
    "need only 'no worse' (neither metric significantly lower nor lower by more than max_drop, recall kept), and the "
    "canary's online test then decides, except that 'auto' promotes a significant gain directly. Both verdicts are "
    "in the metadata."
)


@asset_check(
    asset=finetuned_embedder,
    blocking=True,
    description="Promotion gate: nDCG@10 and MRR@10 significantly better "
    "than production (paired test, p < 0.05) and recall@20 not lower by more than the tolerance, on held-out dev "
    "questions. " + _POLICY,
)
def finetuned_embedder_gate(
    context: AssetCheckExecutionContext, config: GateConfig, data_store: DataStore, rollout: Rollout
) -> AssetCheckResult:
    return _gate_observed(context, _gate("embedder", config, data_store, rollout, _run_id(context)), data_store)


@asset_check(
    asset=trained_reranker,
    blocking=True,
    description="Promotion gate: re-ranking the serving mode's top 50 with the candidate "
    "beats production (or no reranker) on nDCG@10 and MRR@10 (paired test) without losing recall@20. " + _POLICY,
)
def trained_reranker_gate(
    context: AssetCheckExecutionContext, config: GateConfig, data_store: DataStore, rollout: Rollout
) -> AssetCheckResult:
    return _gate_observed(context, _gate("reranker", config, data_store, rollout, _run_id(context)), data_store)


GATE_CHECKS = {
    "embedder": AssetCheckKey(AssetKey("finetuned_embedder"), "finetuned_embedder_gate"),
    "reranker": AssetCheckKey(AssetKey("trained_reranker"), "trained_reranker_gate"),
}


def _recorded_gate(
    context: AssetExecutionContext, kind: str, registry: ModelRegistry, candidate, rollout: Rollout
) -> None:
    """When the gate check did not run in this run (this asset materialized alone), report the candidate's recorded
    verdict as the check's result, so the training asset's card shows the verdict this step acts on, or says that
    there is none, instead of a check that never ran."""
    key = GATE_CHECKS[kind]
    latest = context.instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)
    if latest is not None and latest.run_id == context.run_id:
        return  # the check ran in this run: its own result stands
    against = production_label(registry, kind)
    gate = current_verdict(registry, kind, candidate.version)
    metadata = {
        "candidate": candidate.name,
        "production": against,
        "reported_by": f"production_{kind}: the check did not run in this run; this is the verdict recorded in "
        "the candidate's manifest",
    }
    if gate is None:
        recorded = candidate.metrics.get("gate")
        why = (
            f"gated against {recorded.get('against') or recorded.get('production_version')} "
            f"({recorded.get('gated_at', '?')}), not today's production {against}"
            if isinstance(recorded, dict) and recorded.get("candidate_version") == candidate.version
            else "the gate never ran on it"
        )
        passed, verdict = (
            False,
            (
                f"no verdict: {candidate.name} vs {against}: {why}; run {key.name} (Execute check "
                f"on {key.asset_key.to_user_string()}) or retrain_job"
            ),
        )
    else:
        refusal = rejected_by_gate(kind, registry, candidate, rollout.gate_criterion)
        passed = refusal is None
        verdict = f"{gate_outcome(gate)}: " + (f"passes ({rollout.gate_criterion})" if passed else refusal)
        metadata |= {
            "outcome": gate_outcome(gate),
            "gated_at": gate.get("gated_at", "?"),
            **{
                k: gate[k]
                for k in ("delta_ndcg@10", "p_value_ndcg@10", "questions")
                if isinstance(gate.get(k), (int, float))
            },
        }
    context.log_event(
        AssetCheckEvaluation(
            asset_key=key.asset_key,
            check_name=key.name,
            passed=passed,
            severity=AssetCheckSeverity.WARN,
            description=verdict,
            metadata={"verdict": verdict, **metadata},
        )
    )


def _kept(context: AssetExecutionContext, kind: str, registry: ModelRegistry, candidate, rollout: Rollout) -> bool:
    """True when the candidate's own current gate verdict (for this version, against today's production) rejected
    it: production stays, and this asset is not materialized, a normal end of the run. A candidate with no verdict
    or a stale one is not "kept" here: releasing it raises and says what to run."""
    refusal = rejected_by_gate(kind, registry, candidate, rollout.gate_criterion)
    if refusal is not None:
        context.log.info(f"kept production {production_label(registry, kind)}: {refusal}")
    return refusal is not None


def _to_release(kind: str, registry: ModelRegistry, rollout: Rollout):
    """The version a release step acts on: the `candidate` alias's, else the newest version when its gate verdict
    against today's production rejected it (the gate took its alias away: the step reports that verdict and keeps
    production, as it did while rejected candidates kept the alias). Raises, saying what to run, when neither."""
    candidate = registry.resolve(kind, "candidate")
    if candidate is not None:
        return candidate
    versions = registry.versions(kind)
    if versions and rejected_by_gate(kind, registry, versions[-1], rollout.gate_criterion) is not None:
        return versions[-1]
    raise ValueError(f"no {kind} candidate to promote: materialize {TRAINING_ASSET[kind]} first")


def _released(kind: str, outcome: dict, extra: dict) -> MaterializeResult:
    """The release step's metadata: what it did (promoted, or a canary started) in `action` and `summary`."""
    metadata = {
        "action": outcome["action"],
        "summary": outcome["summary"],
        "production": outcome["production"],
        **extra,
    }
    if outcome["action"] == "promoted":
        metadata["previous"] = outcome["previous"] or IMPLICIT_LABELS[kind]
        if kind == "embedder":
            metadata["serving_aliases"] = MetadataValue.json(outcome["serving_aliases"])
    elif outcome["action"] == "waiting":
        metadata["waiting_behind"] = outcome["behind"]
    else:
        metadata.update(
            canary=outcome["summary"], traffic_share=outcome["traffic_share"], started_at=outcome["started_at"]
        )
    return MaterializeResult(metadata=metadata)


@asset(
    deps=[finetuned_embedder],
    group_name="training",
    kinds={"python", "qdrant"},
    pool=qdrant_pool(),
    output_required=False,  # not materialized when the gate kept production
    description="Runs only when the gate passed (the candidate's manifest must hold a passing verdict against the "
    "current production, even when materialized alone). The rollout resource's `promotion` policy decides what "
    "happens: 'direct' builds (incrementally) the candidate's collection for every chunk set, moves the "
    "registry's `production` alias, then swaps each serving alias `<strategy>__production` onto the new collection "
    "(refused while a canary runs); 'canary' builds the collections and starts the candidate's canary on the "
    "resource's traffic share, leaving production untouched: canary_sensor then promotes or rolls it back; 'auto' "
    "(default) does the first for a candidate the gate found significantly better, the second for one it found no "
    "worse.",
)
def production_embedder(
    context: AssetExecutionContext, data_store: DataStore, qdrant: QdrantResource, rollout: Rollout
):
    registry = _registry(data_store)
    candidate = _to_release("embedder", registry, rollout)
    _recorded_gate(context, "embedder", registry, candidate, rollout)
    if _kept(context, "embedder", registry, candidate, rollout):
        return
    # The gate verdict is checked here, not only by the blocking check upstream: materializing this asset alone
    # must not promote an ungated or rejected model. Before the Qdrant client opens: a refusal changes nothing.
    check_promotable("embedder", registry, candidate, rollout.gate_criterion)
    strategies = [
        s
        for s in context.instance.get_dynamic_partitions(chunking_strategy_partitions.name)
        if data_store.tables.exists(CHUNKS_TABLE, s)
    ]
    outcome = release(
        "embedder",
        registry,
        candidate,
        policy=rollout.promotion,
        traffic_share=rollout.traffic_share,
        target=qdrant.serving_target(data_store.tables, strategies),
        approved_by=f"dagster run {context.run_id}",
        log=context.log.info,
    )
    context.log.info(outcome["summary"])
    context.log_event(rollout_observation(registry, f"production_embedder: {outcome['summary']}", context.log.warning))
    yield _released(
        "embedder", outcome, {"strategies": len(strategies), "path": MetadataValue.path(str(Path(candidate.path)))}
    )


@asset(
    deps=[trained_reranker],
    group_name="training",
    kinds={"python"},
    output_required=False,  # not materialized when the gate kept production
    description="Runs only when the reranker gate passed (checked again from the candidate's manifest). By the rollout "
    "resource's `promotion` policy: 'direct' moves the registry's `production` reranker alias (what "
    "load_reranker('production') serves; refused while a canary runs), 'canary' starts the candidate's canary "
    "(one canary at a time: while the embedder's runs, the candidate waits and canary_sensor starts it afterwards), "
    "'auto' (default) promotes a significant gain directly and starts a canary for a candidate found no worse.",
)
def production_reranker(context: AssetExecutionContext, data_store: DataStore, rollout: Rollout):
    yield from _release_in_registry("reranker", context, data_store, rollout)


def _release_in_registry(kind: str, context: AssetExecutionContext, data_store: DataStore, rollout: Rollout):
    """The release step of a kind whose promotion only moves registry aliases (a reranker, a configuration): the
    recorded gate verdict reported, a rejected candidate kept out, else release() under the policy."""
    registry = _registry(data_store)
    candidate = _to_release(kind, registry, rollout)
    _recorded_gate(context, kind, registry, candidate, rollout)
    if _kept(context, kind, registry, candidate, rollout):
        return
    # release() refuses without a passing gate verdict
    outcome = release(
        kind,
        registry,
        candidate,
        policy=rollout.promotion,
        traffic_share=rollout.traffic_share,
        approved_by=f"dagster run {context.run_id}",
        log=context.log.info,
    )
    context.log.info(outcome["summary"])
    context.log_event(rollout_observation(registry, f"production_{kind}: {outcome['summary']}", context.log.warning))
    extra = {"configuration": candidate.model_extra.get("configuration")} if kind == "configuration" else {}
    yield _released(kind, outcome, extra)


# --- the serving configuration people's questions choose (rag.training.configuration) -----------------------------


class ConfigurationRunConfig(TrainingRunConfig):
    """The trainers' shared settings (only feedback_dataset and feedback_dev_fraction matter here: the held-out
    questions are the ones the other learners hold out) and the grid searched."""

    strategies: list[str] | None = Field(
        None, description="chunk sets to try; None: every chunk set with a BM25 index and a production collection"
    )
    modes: list[str] = Field(list(MODES), description="retrieval modes to try")
    alphas: list[float] = Field([0.2, 0.35, 0.5, 0.65, 0.8], description="hybrid-cc weights of the dense score")
    min_questions: int = Field(20, description="fewest rated training questions to search on")


@asset(
    deps=[FEEDBACK],
    group_name="training",
    kinds={"python"},
    pool=qdrant_pool(),
    output_required=False,  # not materialized when people have rated too few questions
    description="The serving configuration people's questions choose: every chunk set × retrieval mode (bm25, "
    "dense, hybrid-rrf, hybrid-cc with 5 weights) scored on the rated questions of the exported feedback dataset "
    "(those not held out), a passage people rated +1 counting in any chunk set through its place in the document; "
    "the best registered as a `configuration` candidate with its MLflow run and the whole search (search.csv). "
    "Skipped, with the reason, when fewer than 20 rated questions can be located.",
)
def trained_configuration(
    context: AssetExecutionContext, config: ConfigurationRunConfig, data_store: DataStore, qdrant: QdrantResource
):
    registry = _registry(data_store)
    space = ConfigurationSpace(
        strategies=config.strategies, modes=config.modes, alphas=config.alphas, min_questions=config.min_questions
    )
    overrides = config.overrides()
    try:
        with dagster_run(context.run_id):
            learned = train_configuration(
                data_store.tables,
                registry,
                root=data_store.root,
                space=space,
                feedback_dataset=overrides.get("feedback_dataset"),
                dev_fraction=config.feedback_dev_fraction,
                qdrant=qdrant.settings(),
                log=context.log.info,
            )
    except TooFewQuestions as exc:
        context.log.info(f"no configuration candidate: {exc}")
        return
    url = run_url(registry, learned.version)
    yield MaterializeResult(
        metadata={
            **({"mlflow_run": MetadataValue.url(url)} if url else {}),
            "version": learned.version.version,
            "name": learned.version.name,
            **learned.summary,
            "search": MetadataValue.md(learned.search.head(15).to_markdown(index=False)),
        }
    )


@asset_check(
    asset=trained_configuration,
    blocking=True,
    description="Promotion gate: the candidate configuration's rankings (through the full serving path, production "
    "embedder and reranker) beat production's on the held-out questions people rated: nDCG@10 and MRR@10 "
    "(paired test) without losing recall@20. People could rate only what production showed, so a lower mean there is "
    "'worse' only when significant; the canary decides the rest. " + _POLICY,
)
def trained_configuration_gate(
    context: AssetCheckExecutionContext, config: GateConfig, data_store: DataStore, rollout: Rollout
) -> AssetCheckResult:
    registry = _registry(data_store)
    candidate = registry.resolve("configuration", "candidate")
    if candidate is None:
        return AssetCheckResult(
            passed=False,
            severity=AssetCheckSeverity.ERROR,
            description="no configuration candidate in the registry: materialize trained_configuration first",
            metadata={"verdict": "no verdict: no configuration candidate"},
        )
    settings = _gate_settings(config, rollout)
    against = production_label(registry, "configuration")
    try:
        with dagster_run(_run_id(context)):
            result = gate_configuration(
                data_store.tables, registry, candidate, settings, root=data_store.root, log=context.log.info
            )
    except TooFewGateQuestions as exc:
        withdrawn = _withdrawn(registry, "configuration", candidate)
        outcome = AssetCheckResult(
            passed=False,
            severity=AssetCheckSeverity.WARN,
            description=f"{candidate.name} vs {against}: no verdict, keep production. {exc}{_said(withdrawn)}",
            metadata={
                "verdict": f"no verdict: {exc}",
                "outcome": "no verdict",
                "candidate": candidate.name,
                **withdrawn,
            },
        )
        return _gate_observed(context, outcome, data_store)
    verdict = _verdict_words(result, rollout)
    withdrawn = _withdrawn(registry, "configuration", candidate)
    outcome = AssetCheckResult(
        passed=result.passed,
        severity=AssetCheckSeverity.WARN,
        description=f"{candidate.name} vs {against} on {result.questions} held-out questions people rated: "
        f"{verdict}{_said(withdrawn)}",
        metadata={
            "verdict": verdict,
            **result.metadata,
            "candidate": candidate.name,
            "production": against,
            "comparison": MetadataValue.md(gate_table(result)),
            **withdrawn,
        },
    )
    return _gate_observed(context, outcome, data_store)


GATE_CHECKS["configuration"] = AssetCheckKey(AssetKey("trained_configuration"), "trained_configuration_gate")


@asset(
    deps=[trained_configuration],
    group_name="training",
    kinds={"python"},
    output_required=False,  # not materialized when the gate kept production
    description="Runs only when the configuration gate passed (checked again from the candidate's manifest). By the "
    "rollout resource's `promotion` policy: 'direct' moves the registry's `production` configuration alias (rag "
    "serve follows it on its next refresh: the chunk set's index and the retrieval settings), 'canary' starts its "
    "canary, 'auto' (default) promotes a significant gain on people's held-out questions directly and starts a "
    "canary for a candidate found no worse.",
)
def production_configuration(context: AssetExecutionContext, data_store: DataStore, rollout: Rollout):
    yield from _release_in_registry("configuration", context, data_store, rollout)


defs = Definitions(
    assets=[
        finetuned_embedder,
        trained_reranker,
        production_embedder,
        production_reranker,
        trained_configuration,
        production_configuration,
    ],
    asset_checks=[finetuned_embedder_gate, trained_reranker_gate, trained_configuration_gate],
)
