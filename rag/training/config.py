"""Training and gate settings (pydantic). Defaults are CPU-friendly: a few thousand pairs train in minutes on
2 cores (one epoch, a large effective batch through the cached loss)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Pair = tuple[str, str]


class TrainingConfig(BaseModel):
    """What both trainers share."""

    model_config = ConfigDict(extra="forbid")
    base_model: str = Field("minilm", description="embedder name (built-in, registry name or directory) to start from")
    strategy: str | None = Field(
        None, description="chunk set whose chunks are the passages; None = the first one present"
    )
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps (overrides epochs)")
    batch_size: int = Field(32, ge=2)
    learning_rate: float = Field(5e-5, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, le=1)  # linear warmup, then linear decay (AdamW)
    weight_decay: float = Field(0.01, ge=0)
    # None trains at the length the model serves at (MiniLM: 256). Training at 128 cut positives short: for half the
    # inverse-cloze pairs the passage lost the very sentence its query was taken from, so the model learned to match
    # questions to text that no longer contained the answer. An int is an explicit override (e.g. for speed).
    max_seq_length: int | None = Field(
        None,
        ge=16,
        description="tokens per text in training; None = the base model's own max_seq_length (what it serves at)",
    )
    seed: int = 42
    eval_steps: int | None = Field(
        None, ge=1, description="evaluate (and checkpoint) every N steps; None = evaluations_per_epoch times per epoch"
    )
    # One evaluation per epoch could only keep the end of an epoch; with a short CPU budget the best weights are often
    # reached (and then lost again) within the first epoch.
    evaluations_per_epoch: int = Field(
        4, ge=1, description="checkpoint-selection evaluations per epoch when eval_steps is None"
    )
    selection_fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="share of dev questions that select the checkpoint; the rest are held out for the gate",
    )
    hard_negatives: bool = Field(
        True, description="mine hard negatives with the base model (margin keeps true positives out)"
    )
    negative_relative_margin: float = Field(
        0.05, ge=0, lt=1, description="a mined negative scores below (1 - margin) x its positive"
    )
    negative_range_max: int = Field(30, ge=1, description="mine among the top N passages of each query")
    extra_positives: list[Pair] = Field(default_factory=list, description="(query, passage) from feedback (+1)")
    extra_negatives: list[Pair] = Field(default_factory=list, description="(query, passage) from feedback (-1)")
    max_pairs: int | None = Field(None, ge=1, description="cap on training pairs (seeded sample)")
    feedback_dataset: str | None = Field(
        None,
        description="exported feedback RAG-Dataset folder: its +1 passages are "
        "positives, its -1 retrieved passages hard negatives, and a held-out share of its "
        "questions joins checkpoint selection and the gate",
    )
    feedback_dev_fraction: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="share of rated questions (by question text) held out of training for selection and the gate",
    )
    min_feedback_gate_questions: int = Field(
        20,
        ge=1,
        description="with at least this many held-out feedback questions "
        "the gate scores users' questions only; below it, synthetic dev questions join them",
    )
    # Expert labels (the feedback dataset's qrels/expert_qrels.tsv: 2 relevant, 1 partially relevant, 0 irrelevant) are
    # few and costly. λ as a share, not a per-pair multiplier, keeps its meaning whatever the number of synthetic
    # questions a QA set happens to have: λ = 0.2 is the mixture (1 - λ)·L_other + λ·L_expert of the design this
    # follows, where 0.1-0.2 helped most on hard queries. How each trainer applies it: rag.training.data.expert_scale.
    expert_weight: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="λ: the expert-labelled pairs' share of the training "
        "signal against synthetic and users' pairs (0 leaves them out). LambdaRank: expert "
        "questions' group weights sum to λ of all weights; sentence-transformers losses (no "
        "per-example weights): expert examples are sampled to λ of the examples",
    )
    expert_partial_weight: float = Field(
        0.5,
        ge=0,
        le=1,
        description="weight of a partially relevant (grade 1) expert "
        "pair, relative to a relevant one, in losses without a graded target (MNRL: it "
        "is a positive sampled this much less often; 0 leaves it out). LambdaRank and "
        "the cross-encoder take the grade itself as the target",
    )
    min_expert_gate_questions: int = Field(
        20,
        ge=1,
        description="with at least this many held-out expert-labelled "
        "questions the gate scores them only (graded relevance) and says so; below "
        "it they join the users' or synthetic gate questions",
    )


class EmbedderTrainingConfig(TrainingConfig):
    loss: Literal["mnrl", "cached-mnrl"] = Field(
        "cached-mnrl",
        description="MultipleNegativesRankingLoss, or its cached "
        "variant (GradCache): a large in-batch-negative batch at small-batch memory",
    )
    mini_batch_size: int = Field(16, ge=1, description="cached-mnrl: texts per forward pass")
    batch_size: int = Field(64, ge=2)
    # Each checkpoint's weights are new, so each evaluation encodes every passage it scores (the untrained start and
    # mining read theirs from the index). 10,000 is above the chunk sets trained on so far (SciFact: 5,183 abstracts,
    # SQuAD dev: 2,067 passages, a folder of 98 papers: 3,422 chunks), which select as before; a chunk set of 100,000
    # costs a tenth per evaluation.
    selection_passages: int | None = Field(
        10_000,
        ge=1,
        description="checkpoint selection scores each checkpoint (and the untrained start) on at most this many "
        "passages: those relevant to or judged for a selection question, then a seeded random sample of the others; "
        "None = the whole chunk set",
    )


class RerankerTrainingConfig(TrainingConfig):
    # LambdaRank over features is the default: measured on SciFact, a cross-encoder started from the bi-encoder's
    # weights orders candidates at random after a CPU-sized run (its head reads a [CLS] token MiniLM never trained).
    kind: Literal["lambdamart", "cross-encoder"] = Field(
        "lambdamart",
        description="lambdamart: LightGBM LambdaRank over "
        "first-stage, lexical and feedback features (seconds on a CPU); "
        "cross-encoder: a CrossEncoder from the base model's weights",
    )
    rerank_depth: int = Field(
        50, ge=2, description="lambdamart: first-stage candidates per question, as the gate reranks them"
    )
    trees: int = Field(400, ge=1, description="lambdamart: most boosting rounds (early stopping on selection nDCG@10)")
    boosting_learning_rate: float = Field(0.05, gt=0, le=1)
    num_leaves: int = Field(15, ge=2)
    min_child_samples: int = Field(20, ge=1)
    # The selection questions' nDCG@10 rises and falls along the rounds: with a patience of 50, the SciFact ranker
    # trained on all 809 claims stopped at a local peak after 2 rounds (a few trees sorting 50 candidates into coarse
    # buckets) and served 0.7006 nDCG@10 by document, below the untrained default
    # (bench/results/reranker-ceiling-scifact-9dbf44f.json; docs/training.md). So every round is trained by default
    # and the best of all is kept.
    early_stopping_rounds: int = Field(
        400,
        ge=1,
        description="lambdamart: rounds without a better selection nDCG@10 before boosting stops (the default, as many "
        "as `trees`: the best round of all is kept)",
    )
    # A copied question's sentence is cut out of its chunk for the first stage, so the right chunk has lost exactly
    # the question's words and lexical features learn to count against it; people's questions share words with
    # their answer (BM25 is strong on them). Measured on a corpus of papers with human questions: a ranker trained
    # with them leaned away from BM25 and the gate (on the same kind of questions) rejected it at -8.1 nDCG@10.
    copied_questions: Literal["exclude", "cut"] = Field(
        "exclude",
        description="lambdamart: exclude training questions copied from the documents (inverse cloze) when "
        "at least min_uncopied_questions others have a positive among their candidates; cut: train on them too, their "
        "sentence cut out of its chunk",
    )
    min_uncopied_questions: int = Field(
        50, ge=1, description="lambdamart: fewest questions of other types for copied_questions=exclude to apply"
    )
    question_overlap_features: bool = Field(
        True,
        description="lambdamart: learn from the question-overlap features (term, IDF-weighted and bigram coverage, "
        "longest run of question terms); false: they are left out of training, so the ranker never splits on them "
        "(an ablation: measured worse on people's questions, docs/training.md)",
    )
    document_features: bool = Field(
        True,
        description="lambdamart: learn from where each candidate's document stands among the question's candidates "
        "(rag.rerank.features.DOCUMENT); false leaves them out (the ablation of bench/reranker_ceiling.py)",
    )
    # Trained on generated questions only, a ranker grown from nothing re-learns the first stage's order from a few
    # hundred of them and reorders what it never saw: every such ranker measured worse than its first stage on
    # people's questions. Boosting from the first stage's order keeps that order until the data overturns it. Off by
    # default: on the calibration bench it shrank the losses on one corpus, not the other, and gained on neither.
    first_stage_prior: float = Field(
        0.0,
        ge=0,
        description="lambdamart: boost from the first stage's order: each candidate starts at this weight times "
        "-ln(first-stage rank) (LightGBM init_score, added again when serving), and the trees learn corrections to it; "
        "0 grows the ranker from nothing",
    )
    # Measured on complete labels (bench/results/reranker-ceiling-{tatqa,scifact}-clicks.json): half the questions
    # unrated took TAT-QA's 1,668-question ranker from -21.2 to -5.0 points of recall@5 on reports nobody rated, and
    # SciFact's 809-claim one from 0.7748 to 0.7879 nDCG@10 by document, where people ask again about what they rated.
    feedback_dropout: float = Field(
        0.5,
        ge=0,
        le=1,
        description="lambdamart: share of training questions seen as if none of their candidates had been rated (no "
        "likes or dislikes), so the ranker also learns to rank passages nobody has rated yet, such as a new document's",
    )
    # The gate scores users' held-out questions that production answered, so a better ranker changes a few of them
    # (2 to 5 of 39 to 86 in a TAT-QA loop) and is seldom shown better however good it is. Trained once more with
    # each other share of users' questions held out in turn, the learner is judged on every held-out share at once.
    gate_folds: int = Field(
        3,
        ge=1,
        description="lambdamart with a feedback dataset: the gate scores users' held-out questions of this many "
        "disjoint shares of feedback_dev_fraction each (the candidate's own, then each other share with a ranker "
        "trained the same way without it: cross-fitting), so it judges the learner on more of people's questions; "
        "1: the candidate's own share alone. At most as many as fit (1 / feedback_dev_fraction) are used",
    )
    loss: Literal["bce", "lambda"] = Field(
        "bce",
        description="cross-encoder: binary cross-entropy on (query, passage, label), or "
        "LambdaLoss over (query, [positive, negatives...]) lists",
    )
    negatives_per_positive: int = Field(3, ge=1, description="mined negatives per positive")
    learning_rate: float = Field(5e-5, gt=0)
    batch_size: int = Field(16, ge=2)
    max_seq_length: int = Field(256, ge=16)


class GateSettings(BaseModel):
    """When a candidate replaces production."""

    model_config = ConfigDict(extra="forbid")
    metrics: list[str] = Field(
        default_factory=lambda: ["ndcg@10", "mrr@10"], description="each must improve significantly"
    )
    # Floors (le/ge below): a gate run with p 0.99 or on 1 question "passes" anything. The promotion check re-validates
    # the settings a verdict was computed with, so a verdict below these floors promotes nothing.
    p_value: float = Field(
        0.05, gt=0, le=0.10, description="one-sided significance level of the paired test (at most 0.10)"
    )
    test: Literal["permutation", "bootstrap"] = "permutation"
    resamples: int = Field(10_000, ge=500)
    recall_metric: str = "recall@20"
    recall_tolerance: float = Field(
        0.01,
        ge=0,
        le=0.2,
        description="largest allowed drop of the recall metric (where every gate question is a user's, only a "
        "significant drop beyond it: rag.training.gate.labels_from_production)",
    )
    seed: int = 0
    rerank_depth: int = Field(50, ge=1, description="reranker gate: candidates of hybrid retrieval that get re-scored")
    # Questions copied out of the documents (inverse cloze) decide nothing, for embedders and rerankers alike. On
    # SciFact, whose queries are sentence-like claims, they flattered copied-sentence training; on a corpus with
    # human questions a reranker gated on them (with the sentence cut from its chunk, so lexical features count
    # against the right chunk) read -8.1 nDCG@10 while it helped people. They are counted and set aside.
    copied_questions: Literal["exclude", "include"] = Field(
        "exclude",
        description="exclude: gate questions copied word for word from the documents (inverse cloze) are "
        "reported but do not decide; include: they decide too (their sentence cut out of its chunk)",
    )
    # A candidate trained on generated questions and gated on more of them (held out, but from the same generator)
    # is judged on the quirks it learned. A learned reranker's features read the lexical cues those questions are made
    # of (their terms stand in the passage: 94-100% against 72% for SQuAD's human questions,
    # bench/results/question-style-squad.json): on bench/results/gate-calibration.json SciFact's reranker passed as
    # better while it lost 3.9 recall@5 points on the claims, and on a corpus outside the repository one read worse
    # while it helped people. None of the fine-tuned embedders found better on generated questions had a true gain on
    # the human questions (bench/results/gate-calibration*.json, SciFact: 4 of 4, one ranking the claims worse, nDCG@10
    # -0.019, p 0.042; SQuAD: none found better, while one read inconclusive and helped people).
    # A model that never trained on them (a pretrained one registered as it is) is not flattered by them: the rule
    # leaves its gain standing (rag.training.gate.hold_generated_gain).
    generated_reranker_gain: Literal["canary", "promote"] = Field(
        "canary",
        description="canary: a reranker trained on generated questions that the gate found better on generated "
        "questions alone (no users' or experts' questions among those that decided) is not promoted directly: the "
        "verdict counts it no worse, and only a canary's online test (promotion policy 'canary') can promote it; "
        "promote: such a gain promotes directly",
    )
    generated_embedder_gain: Literal["canary", "promote"] = Field(
        "canary",
        description="canary: an embedder trained on generated questions that the gate found better on generated "
        "questions alone is not promoted directly (as generated_reranker_gain); promote: such a gain promotes directly",
    )
    # Generated questions never vouch for people, but a candidate that ranks them significantly worse has unlearned
    # something the documents say: feedback that was corrupted (a broken click logger, a poisoned collection) is
    # consistent with itself, so held-out judgements of the same kind call the model it trains better.
    generated_veto: bool = Field(
        True,
        description="when people's questions decide and find the candidate better, its held-out generated "
        "questions are scored too: significantly worse there, it is not promoted directly; a canary (people's "
        "online judgement) decides instead. False: generated questions play no part once people's decide",
    )
    confidence: float = Field(
        0.95,
        gt=0.5,
        lt=1,
        description="level of the paired bootstrap interval reported for every metric's mean difference",
    )
    target_effect: float = Field(
        0.02,
        gt=0,
        le=1,
        description="the smallest nDCG@10 gain worth detecting: the verdict "
        "reports how many questions a test with 80% power would need for it",
    )
    feedback_lists: Literal["condensed", "plain"] = Field(
        "condensed",
        description="how gate questions from user feedback and expert labels are scored: condensed lists keep "
        "only the passages someone rated (a candidate is not penalised for relevant passages nobody judged); "
        "plain counts every unrated passage as irrelevant. Both are reported; this one decides",
    )
    # Under the canary policy the gate only decides whether users may see the candidate: held-out feedback questions
    # favour production (users could rate only what it showed), and on SciFact a candidate +2.4 nDCG@10 better on
    # the test queries was +0.0 (p=1.0) on them (bench/results/canary-scifact-sparse-negatives.json). The canary's
    # interleaving test then carries the burden of proof.
    criterion: Literal["better", "not_worse"] = Field(
        "better",
        description="better: every metric significantly better (direct promotion); not_worse: no metric "
        "significantly worse (one-sided paired test at p_value) nor lower by more than max_drop (entry to a canary, "
        "whose online test must then show it is better). Both verdicts are computed and recorded; this one decides",
    )
    max_drop: float = Field(
        0.02,
        ge=0,
        le=0.05,
        description="not_worse: largest allowed drop of a metric's mean, significant or not; not applied where every "
        "gate question is a user's (keyed by what people liked in production's lists, which favour production: "
        "rag.training.gate.labels_from_production), where only a significant drop says worse",
    )
    # A held-out question people asked is judged only where they looked: a passage a candidate brings up that
    # production never showed counts as irrelevant on plain lists and drops out of condensed ones, so a gain there is
    # invisible. On TAT-QA, rerankers trained on 500-1,000 people's questions were +2.6 to +2.8 recall@5 on the
    # test split (p < 0.001) and only "no worse" on 40-83 held-out ones
    # (bench/results/loop-tatqa-reranker+configuration.json).
    pool_depth: int = Field(
        5,
        ge=0,
        le=20,
        description="after a verdict short of better on people's questions, the passages either model ranks in its "
        "top pool_depth for a held-out people's question, the other does not, and nobody rated go to the experts' "
        "queue first (the gate's pool, as in TREC pooling); their grades join that question's judgments for the "
        "next verdict. 0: no pool",
    )
    min_questions: int = Field(
        5,
        ge=5,
        description="fewest held-out gate questions the gate decides on; fewer is an error "
        "(generate a larger QA set) rather than a verdict from a handful of questions",
    )
