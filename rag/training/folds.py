"""The cross-fitted gate of the learned ranker (RerankerTrainingConfig.gate_folds).

The gate scores a candidate on users' questions held out of its training, and those are questions production
answered (they need a liked passage for a key): a better ranker changes only a few of them, so one held-out share
seldom shows it better. The learner is trained once more with each other share of users' questions held out in
turn (rag.training.data.split_feedback's `fold`), and the gate scores each share with the ranker that never saw it:
the candidate on its own share, fold i's ranker on share i. Every question is still scored by a model that did not
train on it, and the verdict is about the learner on all of them; the served model is the candidate itself, one
of the rankers so judged. The fold rankers live in the candidate's directory (folds/<i>), beside its own files."""

from __future__ import annotations

from pathlib import Path

from rag.training.data import PEOPLE_TYPES, IRSet, normalized_question

FOLDS_DIR = "folds"


def fold_dir(model_dir: str | Path, fold: int) -> Path:
    return Path(model_dir) / FOLDS_DIR / str(fold)


def trained_folds(model_dir: str | Path) -> list[int]:
    """The folds (1, 2, ...) whose rankers the candidate's directory holds."""
    folder = Path(model_dir) / FOLDS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def people_only(ir: IRSet | None) -> bool:
    """Whether every question of a gate set was asked by a person (users' or experts'): only then does the gate
    pool other folds, whose generated dev questions are the same ones again."""
    return ir is not None and len(ir) > 0 and all(ir.types.get(q) in PEOPLE_TYPES for q in ir.queries)


def pooled_gate(own: IRSet, others: dict[int, IRSet]) -> tuple[IRSet, dict[int, list[str]]]:
    """The candidate's gate set with each other fold's people's questions added, and which questions each fold
    scores (0: the candidate's own). A question already in an earlier fold's set stays there. Every share's set is of
    the same chunk set, so the candidate's corpus serves them all."""
    queries, qrels = dict(own.queries), dict(own.qrels)
    judged, types = dict(own.judged), dict(own.types)
    unanswered, unanswered_judged = dict(own.unanswered), dict(own.unanswered_judged)
    by_fold = {0: list(own.queries)}
    seen = {normalized_question(t) for t in own.queries.values()}
    for fold, ir in sorted(others.items()):
        added = [
            q
            for q in ir.queries
            if q not in queries and ir.types.get(q) in PEOPLE_TYPES and normalized_question(ir.queries[q]) not in seen
        ]
        for q in added:
            queries[q], qrels[q], types[q] = ir.queries[q], ir.qrels[q], ir.types[q]
            if q in ir.judged:
                judged[q] = ir.judged[q]
            seen.add(normalized_question(ir.queries[q]))
        for q, text in ir.unanswered.items():
            if q not in unanswered and q not in queries:
                unanswered[q], unanswered_judged[q] = text, ir.unanswered_judged.get(q, set())
        by_fold[fold] = added
    return IRSet(queries, own.corpus, qrels, judged, types, unanswered, unanswered_judged), by_fold


class CrossFitted:
    """A learned ranker that scores each question with the ranker trained without it: the fold ranker whose share
    held the question out, else the candidate (its own share, and any question no fold names)."""

    needs_hits = True

    def __init__(self, candidate, fold_rankers: dict[int, object], by_fold: dict[int, list[str]], queries: dict):
        self.name = getattr(candidate, "name", "candidate")
        self.scale = getattr(candidate, "scale", "probability")
        self._candidate = candidate
        self._by_text = {
            normalized_question(queries[q]): fold_rankers[fold]
            for fold, qids in by_fold.items()
            if fold in fold_rankers
            for q in qids
            if q in queries
        }

    def ranker_for(self, query: str):
        return self._by_text.get(normalized_question(query), self._candidate)

    def score_hits(self, query: str, hits):
        return self.ranker_for(query).score_hits(query, hits)
