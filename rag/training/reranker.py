"""Train a CrossEncoder reranker from the base embedder's transformer weights (no pretrained cross-encoder
is available offline; kind "cross-encoder". The default reranker is the learned ranker of rag.training.ltr: this
one, started from a mean-pooling bi-encoder whose [CLS] token carries little signal, does not learn to rank in a
CPU budget) on (query, positive, mined negatives): binary cross-entropy on labeled pairs, or
LambdaLoss over one list per query. The checkpoint with the best MRR@10 on the selection dev questions
(re-ranking each question's dense top candidates) is kept.

Expert pairs (TrainingData.expert) are graded targets, grade / 2: 1, 0.5 (partially relevant), 0 (BCE takes soft
targets, LambdaLoss graded labels), with their question's mined negatives at 0. Neither loss takes per-example
weights, so expert rows (BCE) or lists (LambdaLoss) are copied as often as they weigh: λ
(TrainingConfig.expert_weight) of the examples, as for the embedder (rag.training.embedder.expert_triplets)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from rag.progress import Progress
from rag.training.config import RerankerTrainingConfig
from rag.training.data import RELEVANT, IRSet, Pair, TrainingData, expert_copies, expert_scale, positives_by_query
from rag.training.embedder import (
    Log,
    TrainingRun,
    base_source,
    expert_pairs,
    expert_summary,
    mine_negatives,
    progress_callback,
    run_trainer,
    sample_pairs,
    trainer_schedule,
)

SELECTION_METRIC = "dev_mrr@10"


def _grouped(
    pairs: list[Pair], mined: dict[Pair, list[str]], feedback: list[Pair], known: dict[str, set[str]] | None = None
) -> dict[str, tuple[set[str], list[str]]]:
    """query -> (its positives, its negatives): feedback negatives first, then mined ones; a passage known to
    answer the query (`known`, including positives dropped by sampling) is never one of its negatives."""
    groups: dict[str, tuple[set[str], list[str]]] = {}
    for q, p in pairs:
        groups.setdefault(q, (set(), []))[0].add(p)
    for q, n in feedback:
        if q in groups:
            groups[q][1].append(n)
    for (q, _), negatives in mined.items():
        if q in groups:  # an expert question's mined negatives go to its own list (expert_lists)
            groups[q][1].extend(negatives)
    known = known or {}
    return {
        q: (pos, [n for n in dict.fromkeys(neg) if n not in pos and n not in known.get(q, ())])
        for q, (pos, neg) in groups.items()
    }


def expert_lists(
    data: TrainingData, config: RerankerTrainingConfig, mined: dict[Pair, list[str]]
) -> list[tuple[str, dict[str, float], float]]:
    """One list per expert question: (question, {passage: target}, weight). Targets are grade / RELEVANT (1, 0.5,
    0) for the passages experts graded, 0 for their positives' mined negatives they did not grade; the weight is
    the mean of its pairs' weights. A question with nothing graded above 0 has nothing to rank and is left out."""
    if config.expert_weight <= 0:
        return []
    targets: dict[str, dict[str, float]] = {}
    weights: dict[str, list[float]] = {}
    for e in data.expert:
        targets.setdefault(e.query, {})[e.passage] = e.grade / RELEVANT
        weights.setdefault(e.query, []).append(e.weight)
    for e in data.expert:
        for negative in mined.get((e.query, e.passage), ()):
            targets[e.query].setdefault(negative, 0.0)
    return [(q, t, sum(weights[q]) / len(weights[q])) for q, t in targets.items() if any(t.values())]


def expert_examples(
    lists: list[tuple[str, dict[str, float], float]], others: int, config: RerankerTrainingConfig, rows: bool
) -> tuple[list[tuple], dict[str, float]]:
    """The expert lists as BCE rows (query, passage, target) when `rows`, else as (query, passages, targets) lists,
    each copied as often as it weighs against `others` examples of the other pairs (expert_scale)."""
    units = (
        [[(q, p, t) for p, t in targets.items()] for q, targets, _ in lists]
        if rows
        else [[(q, list(targets), list(targets.values()))] for q, targets, _ in lists]
    )
    weights = [w for (_, _, w), unit in zip(lists, units) for _ in unit]
    flat = [x for unit in units for x in unit]
    scales = expert_scale(weights, others, config.expert_weight)
    out = [x for x, n in zip(flat, expert_copies(scales, config.seed)) for _ in range(n)]
    return out, expert_summary(scales, len(out), others, config.expert_weight)


def selection_samples(selection: IRSet | None, embedder_model, depth: int = 30) -> list[dict]:
    """Each selection question with its dense top `depth` passages (as a reranker will see them) and its positives."""
    if selection is None or not len(selection):
        return []
    ids = list(selection.corpus)
    passages = embedder_model.encode(
        [selection.corpus[c] for c in ids],
        normalize_embeddings=True,
        batch_size=32,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    qids = list(selection.queries)
    queries = embedder_model.encode(
        [selection.queries[q] for q in qids], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    top = np.argsort(-(queries @ passages.T), axis=1)[:, :depth]
    return [
        {
            "query": selection.queries[q],
            "positive": [selection.corpus[c] for c in selection.qrels[q]],
            "documents": [selection.corpus[ids[j]] for j in row],
        }
        for q, row in zip(qids, top)
    ]


def train_reranker(
    data: TrainingData,
    config: RerankerTrainingConfig,
    output_dir: Path,
    *,
    corpus: list[str] = (),
    log: Log = print,
    mining_cache: Path | None = None,
    progress: Progress | None = None,
) -> TrainingRun:
    import torch
    from datasets import Dataset
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments, losses
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator
    from transformers import set_seed

    started = time.perf_counter()
    set_seed(config.seed)
    source = base_source(config.base_model)
    local = Path(source).is_dir()
    embedder = SentenceTransformer(source, device="cpu", local_files_only=local)
    embedder.max_seq_length = min(config.max_seq_length, 128)  # mining only needs a coarse ranking
    pairs = sample_pairs(data.positives, config.max_pairs, config.seed)
    experts, expert_negatives = expert_pairs(data, config)
    expert_positives = list(dict.fromkeys((e.query, e.passage) for e in experts))
    log(
        f"mining {config.negatives_per_positive} negatives per pair for {len(pairs) + len(expert_positives)} pairs "
        f"over {len(corpus)} passages"
    )
    known = positives_by_query(data.positives + expert_positives)
    mined = mine_negatives(
        embedder,
        pairs + expert_positives,
        corpus,
        config,
        config.negatives_per_positive,
        mining_cache,
        known_positives=known,
    )
    groups = _grouped(pairs, mined, data.negatives + expert_negatives, known)
    lists = expert_lists(data, config, mined)
    samples = selection_samples(data.selection, embedder)
    del embedder
    # A fresh classification head on the base encoder: num_labels=1 gives one relevance logit per pair.
    model = CrossEncoder(source, num_labels=1, max_length=config.max_seq_length, device="cpu", local_files_only=local)
    if config.loss == "bce":
        rows = [(q, p, 1.0) for q, (pos, _) in groups.items() for p in sorted(pos)]
        rows += [(q, n, 0.0) for q, (_, neg) in groups.items() for n in neg]
        expert, weighed = expert_examples(lists, len(rows), config, rows=True)
        rows += expert
        dataset = Dataset.from_dict(
            {"query": [r[0] for r in rows], "passage": [r[1] for r in rows], "label": [r[2] for r in rows]}
        )
        positives = sum(1 for r in rows if r[2] > 0)
        # Weighting positives by the negative:positive ratio keeps a short run from settling on "always irrelevant".
        loss = losses.BinaryCrossEntropyLoss(
            model, pos_weight=torch.tensor(max(1.0, (len(rows) - positives) / max(positives, 1)))
        )
    else:
        ranked = [(q, sorted(pos) + neg, [1.0] * len(pos) + [0.0] * len(neg)) for q, (pos, neg) in groups.items()]
        expert, weighed = expert_examples(lists, len(ranked), config, rows=False)
        ranked += expert
        dataset = Dataset.from_dict(
            {"query": [x[0] for x in ranked], "docs": [x[1] for x in ranked], "labels": [x[2] for x in ranked]}
        )
        loss = losses.LambdaLoss(model)
    evaluator = (
        CrossEncoderRerankingEvaluator(samples, at_k=10, name="dev", write_csv=False, batch_size=32)
        if samples
        else None
    )
    batch_size = min(config.batch_size, len(dataset))
    log(
        f"training a cross-encoder from {config.base_model} on {len(dataset)} examples, "
        f"loss {config.loss}, batch {batch_size}"
    )
    with tempfile.TemporaryDirectory(prefix="rag-rerank-") as scratch:
        schedule = trainer_schedule(config, len(dataset), batch_size)
        if evaluator is None:
            schedule.update(eval_strategy="no", save_strategy="no")
        args = CrossEncoderTrainingArguments(
            output_dir=scratch,
            load_best_model_at_end=evaluator is not None,
            metric_for_best_model=f"eval_{SELECTION_METRIC}" if evaluator else None,
            greater_is_better=True,
            **schedule,
        )
        trainer = CrossEncoderTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            loss=loss,
            evaluator=evaluator,
            callbacks=[progress_callback(log, progress, "training cross-encoder")],
        )
        run = run_trainer(trainer, model, evaluator, output_dir, started, len(dataset))
    run.expert = weighed
    return run
