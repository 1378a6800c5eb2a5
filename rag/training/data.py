"""Training data from a span-anchored QA set: (question, chunk text) positives for the train split, an IR
dev set (queries, corpus, qrels) for the dev split, and extra pairs from user feedback and expert labels.

Positives are the chunks of one chunk set whose span meets the question's evidence, so the model learns
on exactly the passages it will retrieve. Expert labels (ExpertPair: grade 2 relevant, 1 partially relevant,
0 irrelevant) travel apart from the other pairs, with their grades, so each trainer can weigh them by
TrainingConfig.expert_weight (λ, see expert_scale) and use the grade where its loss has a graded target.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from rag.evaluation.qaset import QAItem, Relevance, qrels_for_chunks
from rag.training.answers import answer_chunks

Pair = tuple[str, str]  # (query, passage text)


@dataclass
class IRSet:
    """What an information-retrieval evaluation needs: queries, the corpus, and which chunks answer what."""

    queries: dict[str, str]
    corpus: dict[str, str]
    qrels: dict[str, dict[str, int]]
    # Questions judged only in part (users rate the passages they were shown): their judged passages (+1 and -1).
    # Scored on condensed lists (unjudged passages removed), a model is not penalised for relevant passages that
    # production never showed, so nobody could rate them.
    judged: dict[str, set[str]] = field(default_factory=dict)
    # qid -> how the question was made (QAItem.qtype: "answer-aware", "keyword", "inverse-cloze", an LLM type) or
    # "feedback" for users' questions: the gate decides on questions that are not copies and reports each type.
    types: dict[str, str] = field(default_factory=dict)
    # Held-out questions people asked that production failed (a down-voted answer, a correction, or passages rated
    # only -1) and that have no answer key: they decide nothing, but the gate's pool asks experts about what the two
    # models rank for them (rag.annotation.pool), the questions a better model would gain on. id -> text, and the
    # passages rated there (what not to ask about again).
    unanswered: dict[str, str] = field(default_factory=dict)
    unanswered_judged: dict[str, set[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.queries)

    def subset(self, qids: list[str]) -> IRSet:
        keep = [q for q in qids if q in self.queries]
        return IRSet(
            {q: self.queries[q] for q in keep},
            self.corpus,
            {q: self.qrels[q] for q in keep},
            {q: self.judged[q] for q in keep if q in self.judged},
            {q: self.types[q] for q in keep if q in self.types},
            self.unanswered,
            self.unanswered_judged,
        )

    def with_unanswered(self) -> IRSet:
        """The questions the models are run on: the deciding ones and the unanswered ones (pooled, never scored),
        every one of them judged in part."""
        return IRSet(
            {**self.unanswered, **self.queries},
            self.corpus,
            self.qrels,
            {**{q: self.unanswered_judged.get(q, set()) for q in self.unanswered}, **self.judged},
            self.types,
        )


# Question types that are document sentences by construction: people do not ask like that, so they neither pick a
# checkpoint nor decide a gate while other questions exist (rag.training.pipeline.decision_questions).
COPIED_TYPES = frozenset({"inverse-cloze"})
# Fewest questions of other types for selection to leave the copied ones out.
MIN_UNCOPIED_SELECTION = 10


# Expert grades (the feedback dataset's qrels/expert_qrels.tsv). LambdaRank and the cross-encoder take them as
# targets; every other known answer (a synthetic question's chunk, a passage a user liked) counts as RELEVANT.
RELEVANT, PARTIAL, IRRELEVANT = 2, 1, 0
EXPERT_GRADES = (IRRELEVANT, PARTIAL, RELEVANT)


@dataclass(frozen=True)
class ExpertPair:
    """An expert's judgment of a (question, passage) pair. `weight`: this pair against the other expert pairs
    (1 by default; e.g. an agreement between annotators); λ (TrainingConfig.expert_weight) sets what all of them
    together weigh against the other training pairs."""

    query: str
    passage: str
    grade: int  # RELEVANT, PARTIAL or IRRELEVANT (a hard negative)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.grade not in EXPERT_GRADES:
            raise ValueError(
                f"expert grade {self.grade!r} for {self.query!r}: use 2 (relevant), 1 (partially relevant) "
                "or 0 (irrelevant)"
            )
        if not self.weight >= 0:
            raise ValueError(f"expert pair weight {self.weight!r} for {self.query!r}: use a weight >= 0")


@dataclass
class TrainingData:
    """What a trainer needs. Built by training_data from a QA set and feedback, or by hand: e.g. to retrain the
    learned ranker with expert labels, `TrainingData(positives, expert=[ExpertPair(q, passage, 2), ...])` and
    rag.training.ltr.train_learned_ranker with RerankerTrainingConfig(expert_weight=λ)."""

    positives: list[Pair]
    negatives: list[Pair] = field(default_factory=list)  # hard negatives from feedback: (query, wrong passage)
    selection: IRSet | None = None  # dev questions that pick the checkpoint
    gate: IRSet | None = None  # held-out dev questions the promotion gate scores
    copied: set[str] = field(default_factory=set)  # training questions (text) of a copied type (COPIED_TYPES)
    expert: list[ExpertPair] = field(default_factory=list)  # training side of the expert labels, graded
    gate_set: str = ""  # which questions the gate decides on, and why (gate_set_line): recorded with the verdict
    # The held-out generated questions people's questions took the gate from: they may veto a direct promotion,
    # never vouch for one (GateSettings.generated_veto). None while they decide themselves.
    guard: IRSet | None = None
    # People's corrected answers located in the chunk set (rag.training.answers): training pairs, and held-out
    # questions production failed that the correction keys
    correction_pairs: int = 0
    correction_gate_questions: int = 0

    @property
    def data_hash(self) -> str:
        """Identifies the training set (QA set version + feedback + expert labels) in the model manifest."""
        digest = hashlib.sha256()
        for tag, pairs in (("+", self.positives), ("-", self.negatives)):
            for q, p in sorted(pairs):
                digest.update(f"{tag}{q}\x1f{p}\x1e".encode())
        for e in sorted(self.expert, key=lambda e: (e.query, e.passage, e.grade, e.weight)):
            digest.update(f"e{e.grade}:{e.weight!r}{e.query}\x1f{e.passage}\x1e".encode())
        return digest.hexdigest()[:16]

    @property
    def summary(self) -> dict[str, int | str]:
        gate = self.gate.queries if self.gate else ()
        users = sum(q.startswith("feedback:") for q in gate)
        grades = Counter(e.grade for e in self.expert)
        return {
            "train_pairs": len(self.positives),
            "feedback_negatives": len(self.negatives),
            "expert_pairs": len(self.expert),
            "expert_questions": len({e.query for e in self.expert}),
            **{f"expert_pairs_grade_{g}": grades[g] for g in EXPERT_GRADES if self.expert},
            "selection_questions": len(self.selection or ()),
            "gate_questions": len(self.gate or ()),
            "gate_questions_from_feedback": users,
            "gate_questions_from_experts": sum(q.startswith("expert:") for q in gate),
            "correction_pairs": self.correction_pairs,
            "gate_questions_keyed_by_corrections": self.correction_gate_questions,
            # held-out questions production failed, with no answer key yet: pooled for the experts, not scored
            "gate_unanswered_questions": len(self.gate.unanswered) if self.gate else 0,
            **({"gate_set": self.gate_set} if self.gate_set else {}),
            "training_data_hash": self.data_hash,
        }


def expert_scale(weights: list[float], others: float, share: float) -> list[float]:
    """How much each expert example counts, relative to an example of the other pairs (1 each, `others` of them),
    so that the experts' total is `share` (λ) of all: Σ = λ / (1 - λ) x others, split in proportion to `weights`.
    Without other examples the experts are all there is: their weights, scaled to a mean of 1. λ = 0: all 0.
    LambdaRank uses these as group weights; the sentence-transformers trainers as expected copies (expert_copies)."""
    total = sum(weights)
    if share <= 0 or total <= 0:
        return [0.0] * len(weights)
    target = share / (1 - share) * others if others > 0 else len(weights)
    return [target * w / total for w in weights]


def expert_copies(scales: list[float], seed: int) -> list[int]:
    """Whole copies of each example with expected count `scales[i]` (expert_scale): the floor, plus one more with
    probability of the fraction (systematic sampling from one seeded offset, so the total is the rounded sum).
    Losses without per-example weights (MNRL, BCE over a sampler) then see each example as often as it weighs."""
    offset = random.Random(seed).random()
    copies, cumulative = [], 0.0
    for scale in scales:
        before = math.floor(cumulative + offset)
        cumulative += scale
        copies.append(math.floor(cumulative + offset) - before)
    return copies


# Training pairs and its gate live within one chunk set, so the evaluation's guard against favouring chunk sizes
# does not apply here: every chunk the evidence overlaps is a positive, as the trained models were measured with.
TRAINING_RELEVANCE = Relevance(mode="any")


def ir_set(items: list[QAItem], chunks: pd.DataFrame, relevance: Relevance | None = None) -> IRSet:
    qrels = qrels_for_chunks(items, chunks, relevance or TRAINING_RELEVANCE)
    return IRSet(
        {i.qid: i.question for i in items if i.qid in qrels},
        dict(zip(chunks["chunk_id"], chunks["text"])),
        qrels,
        types={i.qid: i.qtype for i in items if i.qid in qrels},
    )


def selection_sample(selection: IRSet | None, limit: int | None, seed: int) -> IRSet | None:
    """The selection questions over at most `limit` passages of their corpus (all of them when it has no more, or
    `limit` is None): every passage relevant to or judged for a question, then a seeded random sample of the others.
    Each checkpoint has new weights, so each evaluation encodes every passage it scores: this bounds what it costs on
    a large chunk set. The untrained start is scored on the same passages, so checkpoints and start compare alike."""
    if selection is None or limit is None or len(selection.corpus) <= limit:
        return selection
    kept = {c for rel in selection.qrels.values() for c in rel} | {c for j in selection.judged.values() for c in j}
    kept &= selection.corpus.keys()
    others = sorted(c for c in selection.corpus if c not in kept)
    kept |= set(random.Random(seed).sample(others, max(0, min(len(others), limit - len(kept)))))
    corpus = {c: text for c, text in selection.corpus.items() if c in kept}
    return IRSet(selection.queries, corpus, selection.qrels, selection.judged, selection.types)


# Fewer selection questions than this picks a checkpoint on noise: training then keeps the last step instead.
MIN_SELECTION_QUESTIONS = 2


def normalized_question(text: str) -> str:
    """What makes two questions the same question: case and whitespace do not count."""
    return " ".join(text.lower().split())


def split_dev(queries: dict[str, str], selection_fraction: float) -> tuple[list[str], list[str]]:
    """Checkpoint selection and the gate must not score the same questions, or the gate would reward the
    checkpoint picked on them. Split by normalized question text (the same question under two ids stays on one
    side), deterministically by a hash of that text. Always disjoint: with few questions one side may be small or
    empty, which training (no selection: keep the last step) and the gate (too few: an error) handle."""
    groups: dict[str, list[str]] = {}
    for qid in sorted(queries):
        groups.setdefault(normalized_question(queries[qid]), []).append(qid)
    ordered = sorted(groups, key=lambda text: hashlib.sha256(text.encode()).hexdigest())
    cut = round(len(ordered) * selection_fraction)
    return [q for text in ordered[:cut] for q in groups[text]], [q for text in ordered[cut:] for q in groups[text]]


def positives_by_query(pairs: list[Pair]) -> dict[str, set[str]]:
    """query -> every passage known to answer it. Built from all positives, before any sampling, so a positive
    dropped by `max_pairs` is still known and never used as that query's negative."""
    out: dict[str, set[str]] = {}
    for q, p in pairs:
        out.setdefault(q, set()).add(p)
    return out


@dataclass
class FeedbackSplit:
    """Passage ratings divided by question: training pairs, and held-out questions with their +1 chunks."""

    positives: list[Pair]
    negatives: list[Pair]
    dev_queries: dict[str, str]
    dev_qrels: dict[str, dict[str, int]]
    dev_passages: dict[str, str] = field(default_factory=dict)  # passage id -> the text the user (or expert) rated
    dev_judged: dict[str, dict[str, int]] = field(default_factory=dict)  # held-out question -> every rated passage, ±1
    expert: list[ExpertPair] = field(default_factory=list)  # training side of the expert labels
    expert_dev_queries: dict[str, str] = field(
        default_factory=dict
    )  # held-out expert question ("expert:<hash>") -> text
    expert_dev_qrels: dict[str, dict[str, int]] = field(default_factory=dict)  # -> its passages graded 1 or 2
    expert_dev_judged: dict[str, dict[str, int]] = field(default_factory=dict)  # -> every passage it labelled, 0-2
    # People's corrected answers (an answer key to find in the documents): training side as (question, answer),
    # held-out side by dev key with the question's text (a held-out question may have only these, no rated passage:
    # such a one is not among dev_queries, which the model gates score on rated passages)
    corrections: list[Pair] = field(default_factory=list)
    dev_corrections: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    # Questions production failed (a down-voted answer, a correction, or passages only rated -1), per side: people
    # label where the answer was only for the few they correct, so each located correction stands for the failures
    # of its side when questions are weighted (rag.training.configuration)
    failed_questions: int = 0
    dev_failed_questions: int = 0
    # Held-out failed questions with no answer key yet, by the id an expert's grades will give them
    # ("expert:<hash>"): text, and the passages rated there (-1, or graded 0 by an expert)
    dev_unanswered: dict[str, str] = field(default_factory=dict)
    dev_unanswered_judged: dict[str, dict[str, int]] = field(default_factory=dict)


def paraphrase_groups(judged, window_seconds: float) -> dict[str, str]:
    """query id -> its group's key: the smallest normalized text among the group's queries. Queries are one group
    when tied by the same normalized text, a reformulation (`judged.asked[q].reformulation_of`, the store's
    implicit event), or one session asking again within `window_seconds`: the store records a reformulation only
    when the first answer was not rated up, yet a user who liked an answer and asks again at once is as likely to
    be rephrasing. Datasets exported without `asked` group by text alone."""
    parent: dict[str, str] = {}

    def find(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    asked = getattr(judged, "asked", None) or {}
    sessions: dict[str, list] = {}
    for qid, text in judged.queries.items():
        union(f"q:{qid}", f"text:{normalized_question(text)}")
        context = asked.get(qid)
        if context is None:
            continue
        if context.reformulation_of:  # the chain's first query: ties rephrasings of one question across unrated ones
            union(f"q:{qid}", f"q:{context.reformulation_of}")
        if context.session_id and context.created_at is not None:
            sessions.setdefault(context.session_id, []).append((context.created_at, qid))
    for asked_in in sessions.values():
        asked_in.sort()
        for (before, a), (after, b) in zip(asked_in, asked_in[1:]):
            if (after - before).total_seconds() <= window_seconds:
                union(f"q:{a}", f"q:{b}")
    keys: dict[str, str] = {}
    for qid, text in judged.queries.items():
        root = find(f"q:{qid}")
        keys[root] = min(keys.get(root, normalized_question(text)), normalized_question(text))
    return {qid: keys[find(f"q:{qid}")] for qid in judged.queries}


def expert_labels(judged) -> list[tuple[str, str, int]]:
    """The dataset's expert (query id, passage id, grade) rows (`judged.expert_qrels`, empty for a dataset exported
    before expert labels existed), checked against its queries and passages."""
    rows = list(getattr(judged, "expert_qrels", None) or ())
    for qid, cid, grade in rows:
        if qid not in judged.queries or cid not in judged.corpus:
            raise ValueError(
                f"expert label ({qid}, {cid}) names a query or passage the dataset does not hold: "
                "re-export the feedback dataset (rag.feedback.export_rag_dataset)"
            )
        if grade not in EXPERT_GRADES:
            raise ValueError(f"expert label ({qid}, {cid}) has grade {grade!r}: expert_qrels.tsv holds 0, 1 or 2")
    return rows


def _agreed(grades: list[int]) -> int:
    """Experts who graded one pair differently: the mean grade, rounded half up (2 and 0 make a partial 1)."""
    return math.floor(sum(grades) / len(grades) + 0.5)


def split_feedback(judged, dev_fraction: float, *, window_seconds: float | None = None, fold: int = 0) -> FeedbackSplit:
    """`judged`: queries {id: text}, corpus {chunk id: text}, chunk_qrels [(query id, chunk id, ±1)] and, optionally,
    asked {id: rag.feedback.dataset.QueryContext} and expert_qrels [(query id, chunk id, 0/1/2)] (a feedback
    RAG-Dataset, rag.feedback.judgments).

    Questions go to dev by paraphrase group (paraphrase_groups: same normalized text, a reformulation, one session
    within `window_seconds`, by default the store's REFORMULATION_SECONDS), by a hash of the group's key, so a
    rephrasing never sits in training while the gate scores the question it rephrases. A held-out group gives
    one dev question per normalized text, with the passages liked in any of its askings (repeats would count as
    independent samples in the gate's paired test). Only questions with a +1 passage (or an expert's grade 1 or 2)
    can be dev questions (they need an answer key), so only a group with one is held out; its other questions are
    then left out of training rather than trained on beside their paraphrase. A group production failed (a down-voted
    answer, a correction, passages rated only -1) is held out the same way: with no answer key it scores nothing, but
    the gate's pool asks experts about it (dev_unanswered), and it is where a better model gains.

    Expert labels follow the same groups and the same `dev_fraction` (one decision per group: a question cannot
    train through its expert labels while the gate scores it through users' ratings). Where an expert graded a
    pair, the grade replaces users' ratings of that pair. A held-out question experts graded is scored on their
    grades alone (one dev question, graded), unless people liked a passage of it that no expert graded: then it
    stays people's question and the experts' grades join its judgments (graded 1 or 2: relevant; 0: not).

    `fold` holds out another share of the same size: the groups whose hash position lies in [fold x dev_fraction,
    (fold + 1) x dev_fraction), disjoint from every other fold's (fold 0 is the candidate's own; the gate's others
    are scored with rankers trained without them, RerankerTrainingConfig.gate_folds)."""
    if fold < 0 or (fold + 1) * dev_fraction > 1 + 1e-9:
        raise ValueError(f"fold {fold} of feedback_dev_fraction {dev_fraction} lies outside the feedback")
    if window_seconds is None:
        from rag.feedback.store import REFORMULATION_SECONDS

        window_seconds = REFORMULATION_SECONDS

    def digest(text: str) -> str:
        return hashlib.sha256(normalized_question(text).encode()).hexdigest()

    def in_fold(key: str) -> bool:
        return 0 <= int(digest(key)[:16], 16) / 2**64 - fold * dev_fraction < dev_fraction

    group = paraphrase_groups(judged, window_seconds)
    experts = expert_labels(judged)
    corrected = getattr(judged, "corrections", {}) or {}
    down_voted = {q for q, vote in (getattr(judged, "answer_votes", {}) or {}).items() if vote < 0}
    failed = down_voted | set(corrected) | {q for q, _, score in judged.chunk_qrels if score < 0}
    # A question production failed is held out or trained on as a whole too: held out, it has no answer key yet,
    # but the gate's pool asks experts about it (dev_unanswered)
    keyed = (
        {group[q] for q, _, score in judged.chunk_qrels if score > 0}
        | {group[q] for q, _, g in experts if g > 0}
        | {group[q] for q in corrected if q in group}
        | {group[q] for q in failed if q in group}
    )
    held_out = {key for key in keyed if in_fold(key)}
    split = FeedbackSplit([], [], {}, {}, {}, {})
    trained: dict[tuple[str, str], list[int]] = {}  # (question text, passage id) -> every expert's grade
    dev: dict[str, dict[str, list[int]]] = {}
    asked_as: dict[str, str] = {}  # normalized text -> its first asking's text: one question, however often asked
    for qid, cid, grade in experts:
        text = asked_as.setdefault(normalized_question(judged.queries[qid]), judged.queries[qid])
        if group[qid] not in held_out:
            trained.setdefault((text, cid), []).append(grade)
        else:
            dev.setdefault(f"expert:{digest(text)[:16]}", {}).setdefault(cid, []).append(grade)
            split.expert_dev_queries[f"expert:{digest(text)[:16]}"] = text
    split.expert = [ExpertPair(text, judged.corpus[cid], _agreed(g)) for (text, cid), g in trained.items()]
    said = {(normalized_question(judged.queries[q]), cid) for q, cid, _ in experts}
    # A held-out question people rated, with a passage they liked that no expert graded, stays their question: the
    # experts' grades complete its judgments (the gate's pool asks them about the passages a candidate ranks that
    # nobody rated) rather than replace the answer key people gave.
    users_keyed = {
        normalized_question(judged.queries[q])
        for q, cid, score in judged.chunk_qrels
        if score > 0 and group[q] in held_out and (normalized_question(judged.queries[q]), cid) not in said
    }
    completing: dict[str, dict[str, int]] = {}  # normalized text -> passage -> the experts' agreed grade
    for key, labelled in dev.items():
        grades = {cid: _agreed(g) for cid, g in labelled.items()}
        if normalized_question(split.expert_dev_queries[key]) in users_keyed:
            completing[normalized_question(split.expert_dev_queries.pop(key))] = grades
            split.dev_passages.update({cid: judged.corpus[cid] for cid in grades})
            continue
        if any(grades.values()):  # an answer key: at least one passage graded 1 or 2
            split.expert_dev_judged[key] = grades
            split.expert_dev_qrels[key] = {cid: g for cid, g in grades.items() if g > 0}
            split.dev_passages.update({cid: judged.corpus[cid] for cid in grades})
        else:
            del split.expert_dev_queries[key]
    graded = {normalized_question(text) for text in split.expert_dev_queries.values()}
    liked = {normalized_question(judged.queries[q]) for q, _, score in judged.chunk_qrels if score > 0}
    for qid, cid, score in judged.chunk_qrels:
        text = judged.queries[qid]
        if (normalized_question(text), cid) in said:
            continue  # an expert graded this pair: their grade is its label
        if group[qid] not in held_out:
            (split.positives if score > 0 else split.negatives).append((text, judged.corpus[cid]))
        elif normalized_question(text) in liked and normalized_question(text) not in graded:
            key = f"feedback:{digest(text)[:16]}"
            split.dev_judged.setdefault(key, {})[cid] = score
            split.dev_passages[cid] = judged.corpus[cid]
            if score > 0:
                split.dev_queries[key] = text
                split.dev_qrels.setdefault(key, {})[cid] = 1
    for key, text in split.dev_queries.items():
        for cid, grade in completing.get(normalized_question(text), {}).items():
            split.dev_judged[key][cid] = 1 if grade > 0 else -1  # people's scale: a partial answer is an answer
            if grade > 0:
                split.dev_qrels[key][cid] = 1
    answered = {normalized_question(judged.queries[q]) for q, _, score in judged.chunk_qrels if score > 0}
    sides: dict[str, bool] = {}
    for qid in failed:
        text = normalized_question(judged.queries.get(qid, ""))
        if qid in group and text and text not in answered:
            sides[text] = in_fold(group[qid])
    split.dev_failed_questions = sum(sides.values())
    split.failed_questions = len(sides) - split.dev_failed_questions
    keyed_texts = graded | {normalized_question(t) for t in split.dev_queries.values()}
    first_asked: dict[str, str] = {}
    for qid in sorted(failed & set(judged.queries)):
        first_asked.setdefault(normalized_question(judged.queries[qid]), judged.queries[qid])
    rated_by_text: dict[str, dict[str, int]] = {}
    for qid, cid, _ in [*judged.chunk_qrels, *experts]:  # -1 ratings, and experts' grades of 0 (no answer key)
        rated_by_text.setdefault(normalized_question(judged.queries[qid]), {})[cid] = -1
    for text, held in sorted(sides.items()):
        if held and text not in keyed_texts and text in first_asked:
            key = f"expert:{digest(text)[:16]}"
            split.dev_unanswered[key] = first_asked[text]
            split.dev_unanswered_judged[key] = rated_by_text.get(text, {})
    for qid, answers in sorted(corrected.items()):
        if qid not in group:
            continue
        text = judged.queries[qid]
        if group[qid] not in held_out:
            split.corrections += [(text, a) for a in answers]
        elif normalized_question(text) not in graded:
            key = f"feedback:{digest(text)[:16]}"
            split.dev_corrections.setdefault(key, (text, []))[1].extend(answers)
    return split


def training_data(
    items: list[QAItem],
    chunks: pd.DataFrame,
    *,
    extra_positives: list[Pair] | None = None,
    extra_negatives: list[Pair] | None = None,
    feedback: FeedbackSplit | None = None,
    selection_fraction: float = 0.5,
    min_feedback_gate: int = 20,
    min_expert_gate: int = 20,
    relevance: Relevance | None = None,
) -> TrainingData:
    """Train-split questions paired with each relevant chunk (+ feedback pairs, + expert pairs apart, graded);
    dev-split questions and held-out feedback and expert questions become the selection and gate sets. Once enough
    held-out expert-labelled questions exist (`min_expert_gate`) the gate scores only them, on their grades; else
    once enough held-out feedback questions exist (`min_feedback_gate`) only users' questions (with any expert
    ones): what users ask is what a promotion must improve; synthetic questions stand in until then.
    A dev question whose text is also a training question (another id, a feedback or expert pair) is dropped: the
    gate would otherwise score the model on a question it was trained on. A pair an expert graded keeps only the
    expert's label: a synthetic or user label of the same (question, passage) leaves training."""
    train = [i for i in items if i.split == "train"]
    text = dict(zip(chunks["chunk_id"], chunks["text"]))
    question = {i.qid: i.question for i in train}
    positives = [
        (question[q], text[c])
        for q, rel in qrels_for_chunks(train, chunks, relevance or TRAINING_RELEVANCE).items()
        for c in sorted(rel)
    ]
    positives += [tuple(p) for p in extra_positives or []]
    negatives = [tuple(n) for n in extra_negatives or []]
    expert = list(feedback.expert) if feedback is not None else []
    corrected_pairs: list[Pair] = []
    if feedback is not None:
        positives += feedback.positives
        negatives += feedback.negatives
        # A corrected answer says where the answer was when no passage shown held it: the chunks holding it answer
        corrected_pairs = [(q, text[c]) for q, answer in feedback.corrections for c in answer_chunks(answer, text)]
        positives += corrected_pairs
    if expert:
        said = {(normalized_question(e.query), e.passage) for e in expert}
        positives = [(q, p) for q, p in positives if (normalized_question(q), p) not in said]
        negatives = [(q, p) for q, p in negatives if (normalized_question(q), p) not in said]
    if not positives and not any(e.grade > IRRELEVANT for e in expert):
        raise ValueError(
            "no training pairs: the QA set has no train-split question with a relevant chunk in this chunk set "
            "(generate more questions with synthetic_qa, or pass feedback pairs)"
        )
    trained = (
        {normalized_question(q) for q, _ in positives + negatives}
        | {normalized_question(i.question) for i in train}
        | {normalized_question(e.query) for e in expert}
    )
    users: dict[str, dict[str, int]] = {}  # held-out feedback question -> its liked chunks in this chunk set
    user_queries: dict[str, str] = dict(feedback.dev_queries) if feedback is not None else {}
    correction_keys: set[str] = set()
    experts: dict[str, dict[str, int]] = {}  # held-out expert question -> its chunks graded 1 or 2 in this chunk set
    judged: dict[str, set[str]] = {}  # held-out feedback and expert question -> every chunk rated in this chunk set
    if feedback is not None:
        # A rating applies to the text the user (or expert) saw: a chunk of another chunk set, or one whose text was
        # edited since (same id, other text), cannot be scored with it.
        def still_shown(c: str) -> bool:
            return c in text and text[c] == feedback.dev_passages.get(c, text[c])

        def held_out(queries: dict[str, str], qrels: dict[str, dict[str, int]], rated: dict[str, dict[str, int]]):
            kept = {
                q: {c: g for c, g in rel.items() if still_shown(c)}
                for q, rel in qrels.items()
                if normalized_question(queries[q]) not in trained
            }
            kept = {q: rel for q, rel in kept.items() if rel}
            judged.update({q: {c for c in rated.get(q, rel) if still_shown(c)} for q, rel in kept.items()})
            return kept

        users = held_out(feedback.dev_queries, feedback.dev_qrels, feedback.dev_judged)
        experts = held_out(feedback.expert_dev_queries, feedback.expert_dev_qrels, feedback.expert_dev_judged)
        # A held-out question people corrected is keyed by the chunks that hold their answer, found without looking
        # at what either model ranks: scored on plain lists, it is the key a failed question lacked. One that also
        # has a liked passage keeps its judged (condensed) view, with the answer's chunks judged too.
        for key, (asked_text, answers) in sorted(feedback.dev_corrections.items()):
            if normalized_question(asked_text) in trained:
                continue
            found = {c: 1 for a in answers for c in answer_chunks(a, text)}
            if not found:
                continue
            correction_keys.add(key)
            user_queries.setdefault(key, asked_text)
            users.setdefault(key, {}).update(found)
            if key in judged:
                judged[key] |= set(found)
    # A synthetic question a user or an expert also asked is kept once, as theirs: it would otherwise sit on both sides.
    asked = (
        trained
        | {normalized_question(user_queries[q]) for q in users}
        | {normalized_question(feedback.expert_dev_queries[q]) for q in experts}
    )
    dev = [i for i in items if i.split != "train" and normalized_question(i.question) not in asked]
    dev_set = ir_set(dev, chunks, relevance)
    selection, gate = split_dev(dev_set.queries, selection_fraction)
    generated_gate = list(gate)
    users_decide = False
    for kind, held, enough in (("feedback", users, min_feedback_gate), ("expert", experts, min_expert_gate)):
        if not held:
            continue
        queries = user_queries if kind == "feedback" else feedback.expert_dev_queries
        dev_set = IRSet(
            {**dev_set.queries, **{q: queries[q] for q in held}},
            dev_set.corpus,
            {**dev_set.qrels, **held},
            judged,
            {**dev_set.types, **dict.fromkeys(held, kind)},
        )
        held_selection, held_gate = split_dev({q: queries[q] for q in held}, selection_fraction)
        selection += held_selection
        if kind == "expert" and users_decide:
            # Both are people's questions: experts' grades replace what generated questions stand in for, not what
            # people asked (the gate's pool makes expert questions of the ones production failed, and those alone
            # would favour any candidate).
            gate += held_gate
        else:
            gate = held_gate if len(held_gate) >= enough else gate + held_gate
        users_decide = users_decide or (kind == "feedback" and len(held_gate) >= enough)
    uncopied = [q for q in selection if dev_set.types.get(q) not in COPIED_TYPES]
    if len(uncopied) >= MIN_UNCOPIED_SELECTION:
        selection = uncopied  # the checkpoint is picked on questions like people's, as the gate decides on them
    if len(selection) < MIN_SELECTION_QUESTIONS:
        selection = []
    gate_set = dev_set.subset(gate)
    guard = dev_set.subset(generated_gate) if generated_gate and not set(generated_gate) & set(gate) else None
    if feedback is not None and feedback.dev_unanswered:
        unanswered = {q: t for q, t in feedback.dev_unanswered.items() if normalized_question(t) not in asked}
        _, pooled = split_dev(unanswered, selection_fraction)  # the side the gate's would be once they have a key
        gate_set.unanswered = {q: unanswered[q] for q in pooled}
        gate_set.unanswered_judged = {
            q: {c for c in feedback.dev_unanswered_judged.get(q, {}) if c in text} for q in pooled
        }
    return TrainingData(
        positives,
        negatives,
        dev_set.subset(selection),
        gate_set,
        {i.question for i in train if i.qtype in COPIED_TYPES},
        expert,
        gate_set_line(gate_set.types, min_expert_gate),
        guard,
        correction_pairs=len(corrected_pairs),
        correction_gate_questions=len(correction_keys & set(gate_set.queries)),
    )


PEOPLE_TYPES = ("expert", "feedback")  # question types asked by people; every other type was generated


def generated_only(types: dict[str, str]) -> bool:
    """Whether no question of these (a gate set's types) was asked by a person."""
    return bool(types) and not any(t in PEOPLE_TYPES for t in types.values())


def gate_set_line(types: dict[str, str], min_expert_gate: int) -> str:
    """What the gate decides on, in a line for the verdict: its first word is the kind of question that decides
    (expert, feedback, synthetic, or mixed)."""
    kinds = Counter(t if t in PEOPLE_TYPES else "synthetic" for t in types.values())
    if not kinds:
        return "none: no held-out gate questions"
    if set(kinds) == {"expert"} and kinds["expert"] >= min_expert_gate:
        return (
            f"expert: the {kinds['expert']} held-out expert-labelled questions decide alone (at least "
            f"min_expert_gate_questions={min_expert_gate}), on graded relevance (2 relevant, 1 partial)"
        )
    label = next(iter(kinds)) if len(kinds) == 1 else "mixed"
    names = {"expert": "expert-labelled", "feedback": "users'", "synthetic": "synthetic"}
    line = f"{label}: " + ", ".join(f"{kinds[k]} {names[k]}" for k in ("expert", "feedback", "synthetic") if kinds[k])
    if kinds["expert"] and kinds["feedback"] >= 1 and kinds["expert"] >= min_expert_gate:
        line += " questions (expert-labelled ones join users' questions: both are people's)"
    elif kinds["expert"]:
        line += (
            f" questions (expert-labelled ones are fewer than min_expert_gate_questions={min_expert_gate}, so "
            "they join the others)"
        )
    return line + ("" if kinds["expert"] else " questions")


def with_negatives(
    positives: list[Pair],
    mined: dict[Pair, str],
    feedback: list[Pair],
    seed: int,
    known_positives: dict[str, set[str]] | None = None,
) -> list[tuple[str, str, str]]:
    """(query, positive, negative) triplets: the feedback negative of the query when there is one (what a user
    rejected is the most informative negative), else the mined one, else a random other passage, so every
    positive stays in training. No negative is ever a known positive of its query (`known_positives`: all
    positives before sampling, see positives_by_query), nor a passage the same user question also liked."""
    rng = random.Random(seed)
    answers = positives_by_query(positives)
    for q, known in (known_positives or {}).items():
        answers.setdefault(q, set()).update(known)
    rejected: dict[str, list[str]] = {}
    for q, p in feedback:
        if p not in answers.get(q, ()):
            rejected.setdefault(q, []).append(p)
    passages = sorted({p for _, p in positives})
    out = []
    for q, p in positives:
        negative = rng.choice(rejected[q]) if q in rejected else mined.get((q, p))
        if negative is None or negative in answers[q]:
            others = [x for x in passages if x not in answers[q]]
            if not others:
                continue
            negative = rng.choice(others)
        out.append((q, p, negative))
    return out
