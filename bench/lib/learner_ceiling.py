"""How far the reranker learner can go when its labels are perfect: the ceiling beside the loop's served figure.

The loop's people label only what they were shown and clicked (position bias, noise, a share never rated). Here the
same learner (rag.training.ltr.train_learned_ranker, RerankerTrainingConfig's defaults, the base embedder's first
stage) is trained on complete labels instead: every chunk of the served chunk set that holds a question's answer
(bench.lib.loop_data.relevance, the loop's own judge). Each arm is then served as a reranker canary arm is
(production's untrained answerer with it in place) and scored on the test split, paired against the untrained
default, as the loop scores its rounds. Arms:
- `users-<n>`: the first n users-split questions (the loop's people's questions, in the order they ask them);
- `test-in-sample`: the test split's own questions and labels, scored on themselves: an oracle no learner of this
  kind reaches from other questions (what the issue calls "an oracle that trains on the test split's own labels").
A share of each arm's questions picks the checkpoint (early stopping), as the pipeline's selection questions do.
With generated questions (`users-<n>+generated`), the synthetic QA set the loop warm-starts from (rule-based, no
LLM, as the synthetic_qa asset makes it) joins each arm as rag.training.data.training_data mixes it in the loop:
its training questions as training pairs, its dev questions beside the people's in checkpoint selection. Whether
generated questions help the learner once people's labels exist is what those arms measure.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from bench.lib.results import log

SELECTION_SHARE = 0.15


def labelled_data(questions, qrels: dict, chunks, seed: int):
    """TrainingData of complete labels: (question, chunk text) for every relevant chunk; a seeded share of the
    questions as the selection set."""
    from rag.training.data import IRSet, TrainingData

    text = dict(zip(chunks["chunk_id"], chunks["text"]))
    labelled = [q for q in questions if qrels.get(q.qid)]
    order = list(labelled)
    random.Random(seed).shuffle(order)
    selected = {q.qid for q in order[: max(1, int(len(order) * SELECTION_SHARE))]}
    positives = [(q.text, text[c]) for q in labelled if q.qid not in selected for c in qrels[q.qid] if c in text]
    chosen = [q for q in labelled if q.qid in selected]
    selection = IRSet(
        {q.qid: q.text for q in chosen},
        text,
        {q.qid: {c: 1 for c in qrels[q.qid] if c in text} for q in chosen},
    )
    return TrainingData(positives, selection=selection), {
        "questions": len(questions),
        "labelled": len(labelled),
        "training_questions": len(labelled) - len(chosen),
        "selection_questions": len(chosen),
        "training_pairs": len(positives),
    }


def clicked_data(people, store, questions, qrels: dict, chunks, work: Path, asked_before: int = 0):
    """What people give the learner against complete labels. `people` (bench.lib.loop.People on the served app over
    `store`, the loop's click model) ask `questions[asked_before:]` of the untrained default (the others were asked in
    an earlier call); the store's feedback is exported and split as a retrain splits it, and two TrainingData are
    built, each with (liked, disliked) pairs for its feedback priors:
    - `clicks`: as the loop's retrain builds it (rag.training.data.training_data over the split, no generated
      questions): what people liked, corrections located in the chunks, held-out people's questions choosing the round;
    - `liked-complete`: the same, but every question people liked labelled completely (every chunk holding its
      answer): what the clicks miss on the questions people did answer. The rest of the gap to a `users-<n>` arm is
      the questions nobody liked."""
    from rag.feedback.dataset import export_rag_dataset, judgments
    from rag.training.config import RerankerTrainingConfig
    from rag.training.data import TrainingData, split_feedback, training_data

    for question in questions[asked_before:]:
        people.ask(question, person=f"ceiling-{question.qid}")
    dataset = export_rag_dataset(store, work / f"feedback-{len(questions)}")
    split = split_feedback(judgments(dataset), RerankerTrainingConfig().feedback_dev_fraction)
    clicks = training_data([], chunks, feedback=split)
    text = dict(zip(chunks["chunk_id"], chunks["text"]))
    asked = {q.text: q for q in questions}
    liked = {q for q, _ in split.positives}
    completed = [(q, text[c]) for q in sorted(liked) if q in asked for c in qrels.get(asked[q].qid, {}) if c in text]
    complete = TrainingData([p for p in clicks.positives if p[0] not in liked] + completed, selection=clicks.selection)

    def counts(data) -> dict:
        return {
            "questions": len(questions),
            "liked": len(liked),
            "training_questions": len({q for q, _ in data.positives}),
            "selection_questions": len(data.selection or ()),
            "training_pairs": len(data.positives),
            "people": dict(people.stats),
        }

    return {
        "clicks": (clicks, (list(split.positives), list(split.negatives)), counts(clicks)),
        "liked-complete": (complete, (completed, list(split.negatives)), counts(complete)),
    }


def generated_data(tables, chunks, passages_per_document: int, seed: int):
    """The synthetic QA set of the loop's warm start as TrainingData (training pairs, selection questions), and its
    summary."""
    from rag.ingest import document_from_row
    from rag.store import DOCUMENTS_TABLE
    from rag.synthetic import SynthSettings, generate_qa
    from rag.training.data import training_data

    docs = [document_from_row(row) for _, row in tables.read(DOCUMENTS_TABLE).iterrows()]
    settings = SynthSettings(passages_per_document=passages_per_document, questions_per_passage=1, seed=seed)
    qa = generate_qa(docs, None, settings)
    return training_data(qa.items, chunks), qa.summary


def with_generated(people, generated):
    """People's complete labels with the generated questions mixed in, as the loop's training data mixes them."""
    from rag.training.data import IRSet, TrainingData

    a, b = people.selection, generated.selection
    selection = IRSet(
        {**(b.queries if b else {}), **a.queries},
        {**(b.corpus if b else {}), **a.corpus},
        {**(b.qrels if b else {}), **a.qrels},
        types={**(b.types if b else {}), **dict.fromkeys(a.queries, "feedback")},
    )
    return TrainingData(people.positives + generated.positives, selection=selection, copied=generated.copied)


def train_arm(
    name: str,
    data,
    chunks,
    embedder,
    known_vectors,
    work: Path,
    seed: int,
    options: dict | None = None,
    liked: list | None = None,
    disliked: list | None = None,
) -> tuple[Path, dict]:
    """`options`: RerankerTrainingConfig fields that differ from its defaults (an ablation arm's); `liked`: the
    people's (question, passage) pairs the ranker's feedback priors count, as the loop's retrain counts its training
    side's likes (rag.training.pipeline._rated_pairs): complete labels here, never generated questions; `disliked`: the
    passages people rated down (the clicks arms)."""
    from rag.training.config import RerankerTrainingConfig
    from rag.training.ltr import train_learned_ranker

    out = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    t = time.perf_counter()
    run = train_learned_ranker(
        data,
        RerankerTrainingConfig(seed=seed, **(options or {})),
        out,
        chunks=chunks,
        embedder=embedder,
        known_vectors=known_vectors,
        feedback=(liked or [], disliked or []),
        log=lambda line: log(f"    {line}"),
    )
    return out, {
        "seconds": round(time.perf_counter() - t, 1),
        "rounds": run.steps,
        "candidates": run.examples,
        "selection_metrics": {k: round(float(v), 4) for k, v in run.selection_metrics.items()},
    }
