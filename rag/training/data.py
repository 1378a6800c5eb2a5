"""Training data from a span-anchored QA set: (question, chunk text) positives for the train split, an IR
dev set (queries, corpus, qrels) for the dev split, and extra pairs from user feedback.

Positives are the chunks of one chunk set whose span meets the question's evidence, so the model learns
on exactly the passages it will retrieve.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

import pandas as pd

from rag.evaluation.qaset import QAItem, Relevance, qrels_for_chunks

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

    def __len__(self) -> int:
        return len(self.queries)

    def subset(self, qids: list[str]) -> IRSet:
        keep = [q for q in qids if q in self.queries]
        return IRSet({q: self.queries[q] for q in keep}, self.corpus, {q: self.qrels[q] for q in keep},
                     {q: self.judged[q] for q in keep if q in self.judged},
                     {q: self.types[q] for q in keep if q in self.types})


# Question types that are document sentences by construction: people do not ask like that, so they neither pick a
# checkpoint nor decide a gate while other questions exist (rag.training.pipeline.decision_questions).
COPIED_TYPES = frozenset({"inverse-cloze"})
# Fewest questions of other types for selection to leave the copied ones out.
MIN_UNCOPIED_SELECTION = 10


@dataclass
class TrainingData:
    positives: list[Pair]
    negatives: list[Pair] = field(default_factory=list)  # hard negatives from feedback: (query, wrong passage)
    selection: IRSet | None = None  # dev questions that pick the checkpoint
    gate: IRSet | None = None  # held-out dev questions the promotion gate scores
    copied: set[str] = field(default_factory=set)  # training questions (text) of a copied type (COPIED_TYPES)

    @property
    def data_hash(self) -> str:
        """Identifies the training set (QA set version + feedback) in the model manifest."""
        digest = hashlib.sha256()
        for tag, pairs in (("+", self.positives), ("-", self.negatives)):
            for q, p in sorted(pairs):
                digest.update(f"{tag}{q}\x1f{p}\x1e".encode())
        return digest.hexdigest()[:16]

    @property
    def summary(self) -> dict[str, int | str]:
        users = sum(q.startswith("feedback:") for q in (self.gate.queries if self.gate else ()))
        return {"train_pairs": len(self.positives), "feedback_negatives": len(self.negatives),
                "selection_questions": len(self.selection or ()), "gate_questions": len(self.gate or ()),
                "gate_questions_from_feedback": users,
                "training_data_hash": self.data_hash}


# Training pairs and its gate live within one chunk set, so the evaluation's guard against favouring chunk sizes
# does not apply here: every chunk the evidence overlaps is a positive, as the trained models were measured with.
TRAINING_RELEVANCE = Relevance(mode="any")


def ir_set(items: list[QAItem], chunks: pd.DataFrame, relevance: Relevance | None = None) -> IRSet:
    qrels = qrels_for_chunks(items, chunks, relevance or TRAINING_RELEVANCE)
    return IRSet({i.qid: i.question for i in items if i.qid in qrels}, dict(zip(chunks["chunk_id"], chunks["text"])), qrels,
                 types={i.qid: i.qtype for i in items if i.qid in qrels})


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
    dev_passages: dict[str, str] = field(default_factory=dict)  # passage id -> the text the user rated
    dev_judged: dict[str, dict[str, int]] = field(default_factory=dict)  # held-out question -> every rated passage, ±1


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


def split_feedback(judged, dev_fraction: float, *, window_seconds: float | None = None) -> FeedbackSplit:
    """`judged`: queries {id: text}, corpus {chunk id: text}, chunk_qrels [(query id, chunk id, ±1)] and, optionally,
    asked {id: rag.feedback.dataset.QueryContext} (a feedback RAG-Dataset, rag.feedback.judgments).

    Questions go to dev by paraphrase group (paraphrase_groups: same normalized text, a reformulation, one session
    within `window_seconds`, by default the store's REFORMULATION_SECONDS), by a hash of the group's key, so a
    rephrasing never sits in training while the gate scores the question it rephrases. A held-out group gives
    one dev question per normalized text, with the passages liked in any of its askings (repeats would count as
    independent samples in the gate's paired test). Only questions with a +1 passage can be dev questions (they
    need an answer key), so only a group with one is held out; its other questions are then left out of
    training rather than trained on beside their paraphrase."""
    if window_seconds is None:
        from rag.feedback.store import REFORMULATION_SECONDS

        window_seconds = REFORMULATION_SECONDS

    def digest(text: str) -> str:
        return hashlib.sha256(normalized_question(text).encode()).hexdigest()

    group = paraphrase_groups(judged, window_seconds)
    liked = {normalized_question(judged.queries[q]) for q, _, score in judged.chunk_qrels if score > 0}
    groups_liked = {group[q] for q, _, score in judged.chunk_qrels if score > 0}
    held_out = {key for key in groups_liked if int(digest(key)[:16], 16) / 2**64 < dev_fraction}
    split = FeedbackSplit([], [], {}, {}, {}, {})
    for qid, cid, score in judged.chunk_qrels:
        text = judged.queries[qid]
        if group[qid] not in held_out:
            (split.positives if score > 0 else split.negatives).append((text, judged.corpus[cid]))
        elif normalized_question(text) in liked:
            key = f"feedback:{digest(text)[:16]}"
            split.dev_judged.setdefault(key, {})[cid] = score
            split.dev_passages[cid] = judged.corpus[cid]
            if score > 0:
                split.dev_queries[key] = text
                split.dev_qrels.setdefault(key, {})[cid] = 1
    return split


def training_data(items: list[QAItem], chunks: pd.DataFrame, *, extra_positives: list[Pair] | None = None,
                  extra_negatives: list[Pair] | None = None, feedback: FeedbackSplit | None = None,
                  selection_fraction: float = 0.5, min_feedback_gate: int = 20, relevance: Relevance | None = None) -> TrainingData:
    """Train-split questions paired with each relevant chunk (+ feedback pairs); dev-split questions and held-out
    feedback questions become the selection and gate sets. Once enough held-out feedback questions exist the gate
    scores only them: what users ask is what a promotion must improve; synthetic questions stand in until then.
    A dev question whose text is also a training question (another id, a feedback pair) is dropped: the gate would
    otherwise score the model on a question it was trained on."""
    train = [i for i in items if i.split == "train"]
    text = dict(zip(chunks["chunk_id"], chunks["text"]))
    question = {i.qid: i.question for i in train}
    positives = [(question[q], text[c]) for q, rel in qrels_for_chunks(train, chunks, relevance or TRAINING_RELEVANCE).items() for c in sorted(rel)]
    positives += [tuple(p) for p in extra_positives or []]
    negatives = [tuple(n) for n in extra_negatives or []]
    if feedback is not None:
        positives += feedback.positives
        negatives += feedback.negatives
    if not positives:
        raise ValueError("no training pairs: the QA set has no train-split question with a relevant chunk in this chunk set "
                         "(generate more questions with synthetic_qa, or pass feedback pairs)")
    trained = {normalized_question(q) for q, _ in positives + negatives} | {normalized_question(i.question) for i in train}
    users: dict[str, dict[str, int]] = {}  # held-out feedback question -> its liked chunks in this chunk set
    if feedback is not None:
        # A rating applies to the text the user saw: a chunk of another chunk set, or one whose text was edited
        # since (same id, other text), cannot be scored with it.
        def still_shown(c: str) -> bool:
            return c in text and text[c] == feedback.dev_passages.get(c, text[c])

        users = {q: {c: 1 for c in rel if still_shown(c)}
                 for q, rel in feedback.dev_qrels.items() if normalized_question(feedback.dev_queries[q]) not in trained}
        users = {q: rel for q, rel in users.items() if rel}
        users_judged = {q: {c for c in feedback.dev_judged.get(q, rel) if still_shown(c)} for q, rel in users.items()}
    # A synthetic question a user also asked is kept once, as the user's: it would otherwise sit on both sides.
    asked = trained | {normalized_question(feedback.dev_queries[q]) for q in users}
    dev = [i for i in items if i.split != "train" and normalized_question(i.question) not in asked]
    dev_set = ir_set(dev, chunks, relevance)
    selection, gate = split_dev(dev_set.queries, selection_fraction)
    if users:
        dev_set = IRSet({**dev_set.queries, **{q: feedback.dev_queries[q] for q in users}}, dev_set.corpus, {**dev_set.qrels, **users},
                        users_judged, {**dev_set.types, **dict.fromkeys(users, "feedback")})
        users_selection, users_gate = split_dev({q: feedback.dev_queries[q] for q in users}, selection_fraction)
        selection += users_selection
        gate = users_gate if len(users_gate) >= min_feedback_gate else gate + users_gate
    uncopied = [q for q in selection if dev_set.types.get(q) not in COPIED_TYPES]
    if len(uncopied) >= MIN_UNCOPIED_SELECTION:
        selection = uncopied  # the checkpoint is picked on questions like people's, as the gate decides on them
    if len(selection) < MIN_SELECTION_QUESTIONS:
        selection = []
    return TrainingData(positives, negatives, dev_set.subset(selection), dev_set.subset(gate),
                        {i.question for i in train if i.qtype in COPIED_TYPES})


def with_negatives(positives: list[Pair], mined: dict[Pair, str], feedback: list[Pair], seed: int,
                   known_positives: dict[str, set[str]] | None = None) -> list[tuple[str, str, str]]:
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
