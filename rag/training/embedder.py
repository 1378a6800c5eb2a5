"""Fine-tune a sentence-transformers embedder on (question, passage) pairs.

In-batch negatives (MultipleNegativesRankingLoss, or its cached variant for a large effective batch on a CPU),
no duplicate texts in a batch, one hard negative per pair (feedback -1 first, else mined with the base model
under a margin so unlabeled true positives are not mined, never a known positive of the query), AdamW with linear
warmup and decay, training at the serving sequence length, and the checkpoint with the best nDCG@10 (the gate's
metric) on the selection dev questions (evaluated several times per epoch) kept.

Expert pairs (TrainingData.expert): MNRL has no per-example weight and no graded target, so an expert pair is
*sampled* as often as it weighs: copies of its triplet make the experts λ (TrainingConfig.expert_weight) of the
examples (expert_scale, expert_copies), which in expectation is the loss (1 - λ)·L_other + λ·L_expert, and every
step keeps an ordinary gradient size for AdamW. Grade 1 (partially relevant) is a positive sampled
expert_partial_weight as often as grade 2; grade 0 is the question's preferred hard negative.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rag.progress import Progress
from rag.training.config import EmbedderTrainingConfig, TrainingConfig
from rag.training.data import (
    IRRELEVANT,
    RELEVANT,
    ExpertPair,
    IRSet,
    Pair,
    TrainingData,
    expert_copies,
    expert_scale,
    positives_by_query,
    selection_sample,
    with_negatives,
)
from rag.training.vectors import known_documents

Log = Callable[[str], None]
# The gate's first metric (GateSettings.metrics): a checkpoint chosen on another metric than the one that judges it
# can win selection and lose the gate.
SELECTION_METRIC = "dev_cosine_ndcg@10"


@dataclass
class TrainingRun:
    model_dir: Path
    seconds: float
    steps: int
    examples: int
    selection_metrics: dict[str, float] = field(default_factory=dict)  # of the kept checkpoint
    best_checkpoint: str | None = None
    log_history: list[dict] = field(default_factory=list)
    max_seq_length: int | None = None  # the length it was actually trained at (None: the trainer did not say)
    start_selection_metrics: dict[str, float] = field(default_factory=dict)  # the untrained model's, for comparison
    expert: dict[str, float] = field(default_factory=dict)  # how the expert pairs were weighed (expert_summary)
    selection_passages: int | None = None  # passages checkpoints were scored on, when a sample (selection_sample)
    fold_rankers: int = 0  # rankers trained without another share of users' questions (rag.training.folds)

    @property
    def summary(self) -> dict:
        length = {"max_seq_length": self.max_seq_length} if self.max_seq_length else {}
        if self.selection_passages:
            length["selection_passages"] = self.selection_passages
        return {
            "train_seconds": round(self.seconds, 1),
            "steps": self.steps,
            "examples": self.examples,
            "best_checkpoint": self.best_checkpoint or "final",
            **length,
            **({"gate_fold_rankers": self.fold_rankers} if self.fold_rankers else {}),
            **self.expert,
            **{k: round(v, 4) for k, v in self.selection_metrics.items()},
            **{
                f"untrained_{k}": round(v, 4)
                for k, v in self.start_selection_metrics.items()
                if k == SELECTION_METRIC.removeprefix("dev_")
            },
        }


def base_source(name: str) -> str:
    """The directory (or hub id) holding the weights of embedder `name`, for loading a trainable copy."""
    from rag.embedding import _minilm_dir, embedder_specs
    from rag.registry import registered_embedder

    registered = registered_embedder(name)
    if registered is not None:
        name, source = registered
        if source is not None:
            return source
    spec = embedder_specs().get(name)
    if spec is None:
        return name  # a directory or a hub id
    if spec.source == "builtin:minilm":
        return _minilm_dir()
    if spec.source.startswith("builtin:"):
        raise ValueError(
            f"{name!r} cannot be fine-tuned with sentence-transformers (static embeddings): use minilm "
            "or any sentence-transformers model"
        )
    return spec.source


def expert_pairs(data: TrainingData, config: TrainingConfig) -> tuple[list[ExpertPair], list[Pair]]:
    """The expert pairs that train (none when λ = 0): those graded 1 or 2 (grade 1 only with a partial weight
    above 0), and the (question, passage) pairs graded 0, hard negatives."""
    if config.expert_weight <= 0:
        return [], []
    positives = [
        e for e in data.expert if e.grade == RELEVANT or (e.grade > IRRELEVANT and config.expert_partial_weight > 0)
    ]
    return positives, [(e.query, e.passage) for e in data.expert if e.grade == IRRELEVANT]


def expert_summary(scales: list[float], counted: float, others: float, weight: float) -> dict[str, float]:
    """What a trainer made of the expert pairs (`scales`: expert_scale of each expert pair, row or question):
    how many there were, their share of the training signal (`counted`: their copies, or their summed group
    weights, against `others` for the other pairs), λ, and what one weighs on average against one other example."""
    if not scales:
        return {}
    return {
        "expert_examples": len(scales),
        "expert_share": round(counted / max(counted + others, 1e-12), 4),
        "expert_weight": weight,
        "expert_example_weight": round(sum(scales) / len(scales), 4),
    }


def expert_triplets(
    data: TrainingData,
    config: TrainingConfig,
    others: int,
    mined: dict[Pair, str],
    rejected: list[Pair],
    known: dict[str, set[str]],
) -> tuple[list[tuple[str, str, str]], dict[str, float]]:
    """The expert positives as (query, positive, negative) triplets, each copied as often as it weighs against
    `others` triplets of the other pairs (expert_scale, expert_copies): grade 1 at expert_partial_weight of grade 2.
    Negatives as for any pair (with_negatives): the question's grade-0 passage first (in `rejected`)."""
    positives, _ = expert_pairs(data, config)
    weights = [e.weight * (1.0 if e.grade == RELEVANT else config.expert_partial_weight) for e in positives]
    scales = expert_scale(weights, others, config.expert_weight)
    repeated = [(e.query, e.passage) for e, n in zip(positives, expert_copies(scales, config.seed)) for _ in range(n)]
    triplets = with_negatives(repeated, mined, rejected, config.seed, known_positives=known)
    return triplets, expert_summary(scales, len(triplets), others, config.expert_weight)


def sample_pairs(pairs: list[Pair], limit: int | None, seed: int) -> list[Pair]:
    pairs = list(dict.fromkeys(pairs))  # exact duplicates add nothing but in-batch collisions
    if limit is None or len(pairs) <= limit:
        return pairs
    return random.Random(seed).sample(pairs, limit)


def mine_negatives(
    model,
    pairs: list[Pair],
    corpus: list[str],
    config: TrainingConfig,
    num_negatives: int = 1,
    cache_dir: Path | None = None,
    known_positives: dict[str, set[str]] | None = None,
) -> dict[Pair, list[str]]:
    """Hard negatives per (query, positive) from sentence-transformers' miner: among each query's top
    `negative_range_max` passages, those scoring below (1 - margin) x the positive's score.

    The miner only knows the positives in `pairs`; a positive dropped by `max_pairs` sampling (or any other
    passage in `known_positives[query]`, see positives_by_query) would be mined as a "negative" of its own query
    and train the model away from a right answer. So a few spare negatives are mined and known positives are
    filtered out afterwards; a pair keeps at most `num_negatives` (fewer when the miner found fewer)."""
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    if not pairs:
        return {}
    known = positives_by_query(pairs)
    for q, passages in (known_positives or {}).items():
        if q in known:
            known[q] |= set(passages)
    sampled = positives_by_query(pairs)
    dataset = Dataset.from_dict({"query": [q for q, _ in pairs], "positive": [p for _, p in pairs]})
    corpus = list(dict.fromkeys([p for _, p in pairs] + list(corpus)))
    range_max = min(config.negative_range_max, len(corpus))
    spare = max(len(known[q] - sampled[q]) for q in known)  # at most this many mined negatives can be filtered away
    wanted = max(1, min(num_negatives + spare, range_max))
    # "triplet" keeps every negative found (n-tuple drops a pair short of `wanted`), one row per negative, best first.
    mined = mine_hard_negatives(
        dataset,
        model,
        corpus=corpus,
        range_max=range_max,
        relative_margin=config.negative_relative_margin,
        num_negatives=wanted,
        sampling_strategy="top",
        output_format="triplet",
        batch_size=32,
        verbose=False,
        cache_folder=str(cache_dir) if cache_dir else None,
    )
    wanted_pairs = set(pairs)
    out: dict[Pair, list[str]] = {}
    for row in mined:
        key = (row["query"], row["positive"])
        if key not in wanted_pairs or row["negative"] in known[key[0]]:
            continue
        negatives = out.setdefault(key, [])
        if len(negatives) < num_negatives and row["negative"] not in negatives:
            negatives.append(row["negative"])
    return out


def ir_evaluator(selection: IRSet | None):
    if selection is None or not len(selection):
        return None
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from rag.embedding import weights_digest

    class ScoredOnce(InformationRetrievalEvaluator):
        """Scores each set of weights once. Weights scored already get their figures again instead of encoding every
        passage again: the untrained start at a first checkpoint whose steps left it unchanged (linear warmup starts
        at a learning rate of 0), the best checkpoint reloaded at the end."""

        def __call__(self, model, *args, **kwargs):
            key = (weights_digest(model), model.max_seq_length)
            scored = self.__dict__.setdefault("scored", {})
            if key not in scored:
                scored[key] = super().__call__(model, *args, **kwargs)
            return dict(scored[key])

    return ScoredOnce(
        selection.queries,
        selection.corpus,
        {q: set(r) for q, r in selection.qrels.items()},
        mrr_at_k=[5, 10],
        ndcg_at_k=[10],
        accuracy_at_k=[1, 5],
        precision_recall_at_k=[5, 20],
        map_at_k=[10],
        name="dev",
        write_csv=False,
        batch_size=32,
    )


def progress_callback(log: Log, progress: Progress | None = None, task: str = "training"):
    """Logs the trainer's loss and metrics lines; `progress` also hears every optimizer step (step, max_steps)."""
    from transformers import TrainerCallback

    class _Progress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in (logs or {}).items()}
            log(f"step {state.global_step}/{state.max_steps}: {shown}")

        def on_train_begin(self, args, state, control, **kwargs):
            if progress:
                progress(task, state.global_step, state.max_steps, "steps")

        def on_step_end(self, args, state, control, **kwargs):
            if progress:
                progress(task, state.global_step, state.max_steps, "steps")

    return _Progress()


def trainer_schedule(config: TrainingConfig, examples: int, batch_size: int) -> dict:
    """Arguments the two trainers share: schedule, optimizer, evaluation and checkpoint selection."""
    steps_per_epoch = max(1, -(-examples // batch_size))
    total = config.max_steps or max(1, round(steps_per_epoch * config.epochs))
    # Several evaluations per epoch (floor: at least evaluations_per_epoch of them), at least one in the run.
    eval_steps = config.eval_steps or max(1, min(total, steps_per_epoch // config.evaluations_per_epoch))
    return dict(
        num_train_epochs=config.epochs,
        max_steps=config.max_steps or -1,
        per_device_train_batch_size=batch_size,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_ratio,
        lr_scheduler_type="linear",
        weight_decay=config.weight_decay,
        optim="adamw_torch",
        seed=config.seed,
        data_seed=config.seed,
        eval_strategy="steps",
        eval_steps=eval_steps,
        save_strategy="steps",
        save_steps=eval_steps,
        # With load_best_model_at_end the trainer never deletes the best checkpoint: 2 = the best + the latest.
        save_total_limit=2,
        logging_steps=max(1, min(10, eval_steps)),
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        save_only_model=True,
    )


def train_embedder(
    data: TrainingData,
    config: EmbedderTrainingConfig,
    output_dir: Path,
    *,
    corpus: list[str] = (),
    log: Log = print,
    mining_cache: Path | None = None,
    progress: Progress | None = None,
    stored_passages: Callable | None = None,
) -> TrainingRun:
    """`stored_passages` (rag.training.vectors.index_passages): the index's vectors of passages under the base
    weights, so that mining and the untrained start's score encode none of those again."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from sentence_transformers.base.sampler import BatchSamplers
    from transformers import set_seed

    from rag.training.first_stage import cut_question

    started = time.perf_counter()
    set_seed(config.seed)
    source = base_source(config.base_model)
    model = SentenceTransformer(source, device="cpu", local_files_only=Path(source).is_dir())
    serving_length = model.max_seq_length
    # Default: train at the serving length (see TrainingConfig.max_seq_length); the saved model keeps the base's length.
    model.max_seq_length = config.max_seq_length or serving_length
    trained_length = model.max_seq_length
    # The model card's usage example encodes a few training texts at every save: nothing reads it, and they would be
    # encoded again by weights that already encoded them (checkpoint scores, the index).
    model.model_card_data.generate_widget_examples = False
    limit = getattr(config, "selection_passages", None)
    selection = selection_sample(data.selection, limit, config.seed)
    if selection is not data.selection:
        log(
            f"checkpoints are scored on {len(selection.corpus)} of the {len(data.selection.corpus)} passages "
            f"(selection_passages {limit}): those of the selection questions and a random sample of the others"
        )
    evaluator = ir_evaluator(selection)
    base_vectors: dict = {}  # passage vectors of the base weights, by text: from the index, or encoded once here
    if stored_passages is not None and trained_length == serving_length and (config.hard_negatives or evaluator):
        texts = list(corpus) + (list(selection.corpus.values()) if evaluator else [])
        base_vectors = stored_passages(model, list(dict.fromkeys(texts)), log)
    pairs = sample_pairs(data.positives, config.max_pairs, config.seed)
    experts, expert_negatives = expert_pairs(data, config)
    expert_positives = list(dict.fromkeys((e.query, e.passage) for e in experts))
    # Before sampling: a dropped positive is still no negative. An expert's grade 1 is no negative either.
    known = positives_by_query(data.positives + expert_positives)
    mined = {}
    if config.hard_negatives:
        log(f"mining hard negatives for {len(pairs) + len(expert_positives)} pairs over {len(corpus)} passages")
        with known_documents(model, base_vectors):
            mined = mine_negatives(
                model, pairs + expert_positives, corpus, config, 1, mining_cache, known_positives=known
            )
        mined = {k: v[0] for k, v in mined.items() if v}
    rejected = data.negatives + expert_negatives
    triplets = with_negatives(pairs, mined, rejected, config.seed, known_positives=known)
    expert, weighed = expert_triplets(data, config, len(triplets), mined, rejected, known)
    if expert:
        log(
            f"{len(expert)} expert triplets from {len(experts)} pairs: {weighed['expert_share']:.0%} of the examples "
            f"(expert_weight {config.expert_weight})"
        )
    triplets += expert
    # A question copied out of its passage (inverse cloze without an LLM) is cut from the positive, or the model
    # learns to match a sentence with the text that repeats it, which real questions never do.
    triplets = [(q, cut_question(p, q), n) for q, p, n in triplets]
    dataset = Dataset.from_dict(
        {"anchor": [t[0] for t in triplets], "positive": [t[1] for t in triplets], "negative": [t[2] for t in triplets]}
    )
    batch_size = min(config.batch_size, len(dataset))
    if config.loss == "cached-mnrl":
        loss = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=min(config.mini_batch_size, batch_size))
    else:
        loss = losses.MultipleNegativesRankingLoss(model)
    log(
        f"training {config.base_model} on {len(dataset)} triplets ({len(mined)} mined, {len(data.negatives)} feedback "
        f"negatives), loss {config.loss}, batch {batch_size}"
    )
    with tempfile.TemporaryDirectory(prefix="rag-train-") as scratch:
        schedule = trainer_schedule(config, len(dataset), batch_size)
        if evaluator is None:  # nothing to select on: keep the last step
            schedule.update(eval_strategy="no", save_strategy="no")
        args = SentenceTransformerTrainingArguments(
            output_dir=scratch,
            batch_sampler=BatchSamplers.NO_DUPLICATES,
            load_best_model_at_end=evaluator is not None,
            metric_for_best_model=f"eval_{SELECTION_METRIC}" if evaluator else None,
            greater_is_better=True,
            **schedule,
        )
        trainer = SentenceTransformerTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            loss=loss,
            evaluator=evaluator,
            callbacks=[progress_callback(log, progress, f"training {config.base_model}")],
        )
        # The untrained start is a checkpoint too: when no trained step scores above it on the selection questions,
        # the base weights are kept (the gate then sees no change) instead of the least bad step.
        start = {}
        if evaluator:
            with known_documents(model, base_vectors):
                start = {k.removeprefix("dev_"): float(v) for k, v in evaluator(model).items()}
        run = run_trainer(trainer, model, evaluator, output_dir, started, len(dataset), serving_length)
    key = SELECTION_METRIC.removeprefix("dev_")
    if start and run.selection_metrics.get(key, -1.0) <= start.get(key, -1.0):
        log(f"no checkpoint beat the untrained start on selection {key} ({start[key]:.4f}): keeping the base weights")
        shutil.rmtree(output_dir, ignore_errors=True)
        base = SentenceTransformer(source, device="cpu", local_files_only=Path(source).is_dir())
        base.model_card_data.generate_widget_examples = False
        base.save(str(output_dir))
        run.selection_metrics, run.best_checkpoint = start, "untrained start"
    run.start_selection_metrics = start
    run.max_seq_length = trained_length
    run.expert = weighed
    if selection is not data.selection:
        run.selection_passages = len(selection.corpus)
    return run


def _evaluated_at(log_history: list[dict], checkpoint: str) -> dict[str, float]:
    """The selection metrics logged at a checkpoint's step: the reloaded best weights need no second evaluation."""
    step = int(Path(checkpoint).name.rsplit("-", 1)[-1])
    for entry in log_history:
        if entry.get("step") == step and any(k.startswith("eval_dev_") for k in entry):
            return {k.removeprefix("eval_dev_"): float(v) for k, v in entry.items() if k.startswith("eval_dev_")}
    return {}


def run_trainer(
    trainer, model, evaluator, output_dir: Path, started: float, examples: int, serving_length: int | None = None
) -> TrainingRun:
    """Train (the best checkpoint is reloaded at the end), score it on the selection set, save it to output_dir."""
    trainer.train()
    best = trainer.state.best_model_checkpoint
    output_dir = Path(output_dir)
    shutil.rmtree(output_dir, ignore_errors=True)
    selection = _evaluated_at(trainer.state.log_history, best) if best else {}
    if evaluator is not None and not selection:  # the kept weights were never scored (no checkpoint reloaded)
        selection = {k.removeprefix("dev_"): float(v) for k, v in evaluator(model).items()}
    if serving_length is not None:
        model.max_seq_length = serving_length
    model.save(str(output_dir))
    return TrainingRun(
        output_dir,
        time.perf_counter() - started,
        trainer.state.global_step,
        examples,
        selection,
        Path(best).name if best else None,
        list(trainer.state.log_history),
    )
