"""Train the learning-to-rank reranker (rag.rerank.ltr): LightGBM LambdaRank on the first stage's candidates.

Each training question is retrieved with the first stage (the serving mode over the chunk set, production embedder;
a question copied word for word out of a chunk is first cut out of it, see rag.training.first_stage);
its candidates that are known positives get label 1, the rest 0 (so every retrieved non-answer is a negative,
the way the reranker will meet them). Questions whose positives the first stage missed teach nothing and are
dropped; with enough questions of other types, so are training questions copied from the documents
(RerankerTrainingConfig.copied_questions). With RerankerTrainingConfig.first_stage_prior, boosting starts from the
first stage's order (init_score) instead of from nothing, and the trees learn corrections to it. Boosting stops at
the round with the best nDCG@10 on the selection questions (early stopping: the checkpoint; what is logged for them
is that maximum, not a held-out gain), and the raw margin is calibrated to a probability on those questions. No
selection questions: a fixed number of rounds and a calibration on the training candidates.

Features from feedback (up/down counts per passage text) use the training questions' ratings with each
question's own ratings left out, and the model keeps the counts it was trained with (a version is immutable).

Expert labels (TrainingData.expert) are graded: LambdaRank takes the grade as the label (2 relevant, 1 partially
relevant, 0 irrelevant; every other known answer is 2, so an expert's "relevant" and a synthetic answer gain
alike), and each expert question is a group whose weight makes the expert groups λ
(RerankerTrainingConfig.expert_weight) of all group weights (rag.training.data.expert_scale; LightGBM multiplies
each candidate's gradient by its weight, the same for a whole group here). Where an expert graded a candidate,
the grade is its label. To retrain with expert pairs outside Dagster (e.g. a benchmark):

    data = TrainingData(positives, expert=[ExpertPair(question, passage_text, grade), ...], selection=...)
    train_learned_ranker(data, RerankerTrainingConfig(expert_weight=0.2), out_dir, chunks=chunks, embedder=embedder)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from rag.rerank.features import (
    DOCUMENT,
    FEATURES,
    FEEDBACK,
    QUESTION_OVERLAP,
    CorpusStats,
    FeedbackPriors,
    feedback_columns,
    feature_matrix,
    text_key,
)
from rag.rerank.ltr import first_stage_margin, margins, save_ltr
from rag.training.data import RELEVANT, Pair, TrainingData, expert_scale
from rag.training.embedder import TrainingRun, expert_summary, sample_pairs
from rag.training.first_stage import FIRST_STAGE_MODE, first_stage_hits, first_stage_index, without_questions

Log = Callable[[str], None]


def _labeled(
    hits_by_query: dict[str, list],
    grades: dict[str, dict[str, int]],
    query_text: dict[str, str],
    stats: CorpusStats,
    prior: Callable,
) -> tuple[np.ndarray, np.ndarray, list[int], list[str]]:
    """Feature rows, labels (each candidate's grade, 0 when unknown) and group sizes of the questions with at least
    one candidate graded above 0."""
    rows, labels, groups, kept = [], [], [], []
    for q, hits in hits_by_query.items():
        if not hits:
            continue
        y = np.array([float(grades.get(q, {}).get(h.chunk.get("chunk_id"), 0)) for h in hits])
        if not y.any():
            continue
        rows.append(feature_matrix(query_text[q], hits, stats, prior))
        labels.append(y)
        groups.append(len(hits))
        kept.append(q)
    if not rows:
        return np.zeros((0, 0)), np.zeros(0), [], []
    return np.vstack(rows), np.concatenate(labels), groups, kept


def unrated(X: np.ndarray, groups: list[int], share: float, seed: int) -> np.ndarray:
    """X with a seeded `share` of the training questions seen as if nobody had rated any of their candidates (the
    FEEDBACK columns at 0 likes, 0 dislikes, prior 1/2), as every passage of a document added after the ratings is
    seen. Trained where likes are dense (many questions sharing their answers), a ranker learns to trust them alone
    and ranks unrated passages badly: on TAT-QA, complete labels of 1,668 questions counted as likes served recall@5
    0.28 on other reports, 0.44 with half the questions unrated, against 0.49 untrained and 0.59 with no likes counted
    (bench/results/reranker-ceiling-tatqa-clicks.json). Half by default (RerankerTrainingConfig.feedback_dropout)."""
    if share <= 0 or not groups:
        return X
    rng = np.random.default_rng(seed)
    hidden = np.repeat(rng.random(len(groups)) < share, groups)
    X = X.copy()
    X[np.ix_(hidden, [FEATURES.index(name) for name in FEEDBACK])] = feedback_columns(0.0, 0.0)
    return X


def _without(X: np.ndarray, features: list[str]) -> np.ndarray:
    """X with `features` missing (NaN) in every row: LightGBM never splits on a feature it has not seen, so the
    saved ranker ignores whatever values serving computes for it."""
    if not features or not X.size:
        return X
    X = X.copy()
    X[:, [FEATURES.index(f) for f in features]] = np.nan
    return X


def _selection_metrics(
    selection,
    hits_by_query: dict[str, list],
    stats: CorpusStats,
    priors: FeedbackPriors,
    booster,
    rounds: int,
    prior: float,
) -> dict[str, float]:
    """nDCG@10 and MRR@10 of the first-stage order and of the reranked order over every selection question (ranx;
    a question whose answer the first stage missed scores 0 in both)."""
    from rag.evaluation.metrics import evaluate_run

    first, reranked = {}, {}
    for q, hits in hits_by_query.items():
        ids = [h.chunk.get("chunk_id") for h in hits]
        if not ids:
            continue
        first[q] = {c: float(len(ids) - r) for r, c in enumerate(ids)}
        scores = margins(booster, feature_matrix(selection.queries[q], hits, stats, priors.serving), prior, rounds)
        order = sorted(range(len(ids)), key=lambda i: (-scores[i], i))
        reranked[q] = {ids[i]: float(len(ids) - r) for r, i in enumerate(order)}
    metrics = ["ndcg@10", "mrr@10"]
    before, after = (
        evaluate_run(selection.qrels, first, metrics)[0],
        evaluate_run(selection.qrels, reranked, metrics)[0],
    )
    return {**{f"first_stage_{m}": before[m] for m in metrics}, **after}


def _calibration(raw: np.ndarray, labels: np.ndarray, seed: int) -> dict:
    """Platt scaling: P(relevant) = sigmoid(slope * margin + intercept), fitted on held-out candidates."""
    from sklearn.linear_model import LogisticRegression

    if len(set((labels > 0).tolist())) < 2:
        return {"slope": 1.0, "intercept": 0.0, "fitted_on": 0}
    fit = LogisticRegression(C=1e4, random_state=seed).fit(raw.reshape(-1, 1), (labels > 0).astype(int))
    return {"slope": float(fit.coef_[0][0]), "intercept": float(fit.intercept_[0]), "fitted_on": int(len(labels))}


def train_learned_ranker(
    data: TrainingData,
    config,
    output_dir: Path,
    *,
    chunks: pd.DataFrame,
    embedder,
    feedback: tuple[list[Pair], list[Pair]] = ((), ()),
    log: Log = print,
    known_vectors: dict[str, np.ndarray] | None = None,
    mode: str = FIRST_STAGE_MODE,
) -> TrainingRun:
    """`config`: rag.training.config.RerankerTrainingConfig; `embedder`: the first stage's (production) embedder;
    `feedback`: the training side's rated (question, passage) pairs, +1 and -1, for the priors; `known_vectors`:
    passage text -> vector of `embedder` already computed (e.g. rag.training.first_stage.vectors_by_text of a
    built index), so only changed texts are embedded again."""
    import lightgbm as lgb

    started = time.perf_counter()
    ids_by_text: dict[str, list[str]] = {}
    for cid, text in zip(chunks["chunk_id"], chunks["text"]):
        ids_by_text.setdefault(text_key(text), []).append(cid)
    pairs = sample_pairs(data.positives, config.max_pairs, config.seed)
    grades, experts = training_grades(pairs, data.expert if config.expert_weight > 0 else [], ids_by_text)
    train_queries = {f"t{i}": q for i, q in enumerate(sorted(q for q, g in grades.items() if any(g.values())))}
    train_grades = {qid: grades[q] for qid, q in train_queries.items()}
    selection = data.selection if data.selection is not None and len(data.selection) else None
    sel_grades = {q: {c: r for c, r in rel.items() if r > 0} for q, rel in selection.qrels.items()} if selection else {}
    copied = [(train_queries[q], c) for q, g in train_grades.items() for c, grade in g.items() if grade > 0]
    copied += [(selection.queries[q], c) for q, g in sel_grades.items() for c in g] if selection else []
    cloze, found = without_questions(chunks, copied)
    if found:
        log(
            f"{found} questions were copied word for word from their chunks: "
            "cut out for the first stage (inverse cloze)"
        )
    stats = CorpusStats.build(chunks["text"].tolist())
    priors = FeedbackPriors.from_pairs(*feedback)
    depth = config.rerank_depth
    log(
        f"first stage ({mode}, top {depth}) for {len(train_queries)} training and "
        f"{len(selection or ())} selection questions over {len(chunks)} chunks"
    )
    with first_stage_index(cloze, embedder, known_vectors) as first:
        train_hits = first_stage_hits(first, train_queries, depth, mode)
        selection_hits = first_stage_hits(first, selection.queries, depth, mode) if selection else {}
    if getattr(config, "copied_questions", "cut") == "exclude" and data.copied:
        uncopied = {
            q
            for q in train_hits
            if train_queries[q] not in data.copied
            and any(train_grades[q].get(h.chunk.get("chunk_id"), 0) > 0 for h in train_hits[q])
        }
        if len(uncopied) >= config.min_uncopied_questions:
            log(
                f"{len(train_hits) - len(uncopied)} training questions copied from the documents (or with no positive "
                f"retrieved) left out: {len(uncopied)} others teach how people's questions meet their answers"
            )
            train_hits = {q: h for q, h in train_hits.items() if q in uncopied}
    X, y, groups, kept = _labeled(train_hits, train_grades, train_queries, stats, priors.leave_one_out)
    X = unrated(X, groups, config.feedback_dropout, config.seed)
    left_out = [] if config.question_overlap_features else list(QUESTION_OVERLAP)
    left_out += [] if config.document_features else list(DOCUMENT)
    X = _without(X, left_out)
    if not groups:
        raise ValueError(
            "no training question has a positive among its first-stage candidates: the reranker has nothing "
            "to learn from (generate more questions with synthetic_qa, or check the chunk set)"
        )
    log(
        f"{len(kept)} of {len(train_queries)} training questions have a positive in the top {depth}; "
        f"{len(y)} candidates"
    )
    weights, weighed = group_weights([experts.get(train_queries[q]) for q in kept], config.expert_weight)
    if weighed:
        log(
            f"{weighed['expert_examples']} expert-labelled questions weigh {weighed['expert_example_weight']:.3g} each "
            f"against 1 for the others: {config.expert_weight:.0%} of the training weight (expert_weight)"
        )
    prior = config.first_stage_prior
    eval_args, sel = {}, None
    if selection:
        sel = _labeled(selection_hits, sel_grades, selection.queries, stats, priors.serving)
        sel = (_without(sel[0], left_out), *sel[1:])
        if sel[2]:
            eval_args = dict(eval_X=(sel[0],), eval_y=(sel[1],), eval_group=[sel[2]], eval_at=[10])
            if prior:
                eval_args["eval_init_score"] = [first_stage_margin(sel[0], prior)]
    model = lgb.LGBMRanker(
        objective="lambdarank",
        n_estimators=config.trees,
        learning_rate=config.boosting_learning_rate,
        num_leaves=config.num_leaves,
        min_child_samples=config.min_child_samples,
        subsample=0.8,
        subsample_freq=1,
        colsample_bytree=0.8,
        reg_lambda=1.0,
        random_state=config.seed,
        deterministic=True,
        force_row_wise=True,
        n_jobs=1,
        verbose=-1,
    )
    history: dict = {}
    callbacks = [lgb.record_evaluation(history)]
    if eval_args:
        callbacks.append(lgb.early_stopping(config.early_stopping_rounds, first_metric_only=True, verbose=False))
    # Per-candidate weights, constant within a group: a group weight (None without experts: the unweighted objective).
    sample_weight = np.repeat(weights, groups) if weighed else None
    model.fit(
        X,
        y,
        group=groups,
        sample_weight=sample_weight,
        init_score=first_stage_margin(X, prior) if prior else None,
        callbacks=callbacks,
        feature_name=list(FEATURES),
        **eval_args,
    )
    best = int(model.best_iteration_ or config.trees) if eval_args else config.trees
    booster = model.booster_
    log_history = [
        {"step": i + 1, "eval_dev_ndcg@10": float(v)}
        for i, v in enumerate(history.get("valid_0", {}).get("ndcg@10", []))
    ]
    metrics: dict[str, float] = {}
    if eval_args:
        raw = margins(booster, sel[0], prior, best)
        # Scored like the gate (ranx, every selection question, misses included), and named for what it is: these
        # questions chose the round, so the reranked figure is an optimistic maximum, never a held-out gain.
        metrics = _selection_metrics(selection, selection_hits, stats, priors, booster, best, prior)
        calibration = _calibration(raw, sel[1], config.seed)
        log(
            f"selection ({len(selection)} questions, {len(sel[2])} with a positive in the top {depth}; they chose the "
            f"round, so this is not a held-out gain): nDCG@10 {metrics['first_stage_ndcg@10']:.4f} first stage, "
            f"{metrics['ndcg@10']:.4f} reranked at the best round {best}"
        )
    else:
        calibration = _calibration(margins(booster, X, prior, best), y, config.seed)
    # Keep exactly the selected rounds in the saved model.
    final = lgb.Booster(model_str=booster.model_to_string(num_iteration=best))
    output_dir = Path(output_dir)
    save_ltr(
        output_dir,
        final,
        stats,
        priors,
        calibration,
        {
            "first_stage_mode": mode,
            "rerank_depth": depth,
            "rounds": best,
            "trees": config.trees,
            "embedder": getattr(embedder, "name", str(embedder)),
            "training_questions": len(kept),
            "candidates": int(len(y)),
            "seed": config.seed,
            "first_stage_prior": prior,
            **weighed,
        },
    )
    return TrainingRun(
        output_dir,
        time.perf_counter() - started,
        best,
        int(len(y)),
        metrics,
        f"round-{best}",
        log_history,
        expert=weighed,
    )


def training_grades(
    pairs: list[Pair], expert: list, ids_by_text: dict[str, list[str]]
) -> tuple[dict[str, dict[str, int]], dict[str, float]]:
    """question text -> {chunk id: grade}: RELEVANT for the chunks of known answers (`pairs`), the expert's grade
    where an expert graded the chunk (it replaces any other label); and the expert-labelled questions -> the mean
    weight of their pairs. A passage whose text is in no chunk of this chunk set (edited, another chunk set) drops
    out."""
    grades: dict[str, dict[str, int]] = {}
    for q, p in pairs:
        grades.setdefault(q, {}).update(dict.fromkeys(ids_by_text.get(text_key(p), ()), RELEVANT))
    weights: dict[str, list[float]] = {}
    for e in expert:
        ids = ids_by_text.get(text_key(e.passage), ())
        grades.setdefault(e.query, {}).update(dict.fromkeys(ids, e.grade))
        if ids:
            weights.setdefault(e.query, []).append(e.weight)
    return grades, {q: sum(w) / len(w) for q, w in weights.items()}


def group_weights(expert: list[float | None], share: float) -> tuple[np.ndarray, dict[str, float]]:
    """One weight per training group, in order: 1 for a group of synthetic or users' pairs, and for an expert
    question (its pairs' mean weight in `expert`, None for the others) the weight that makes the expert groups
    `share` (λ) of the total (expert_scale); what the experts weighed, for the run summary."""
    relative = [w for w in expert if w is not None]
    scales = iter(expert_scale(relative, len(expert) - len(relative), share))
    weights = np.array([1.0 if w is None else next(scales) for w in expert])
    scaled = weights[[w is not None for w in expert]].tolist()
    return weights, expert_summary(scaled, sum(scaled), len(expert) - len(scaled), share)


__all__ = ["train_learned_ranker"]
