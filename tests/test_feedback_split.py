"""The feedback split keeps a question's paraphrases on one side: queries tied by a reformulation (the store's
implicit event, chains through queries nobody rated included), by one session within the reformulation window,
or by the same normalised text are all training or all held out, so the gate never scores a rephrasing of a
question the model was trained on."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from rag.feedback import FeedbackStore, FeedbackSubmission, export_rag_dataset
from rag.feedback.dataset import Judgments, QueryContext, judgments
from rag.feedback.store import REFORMULATION_SECONDS
from rag.training.data import normalized_question, split_feedback

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc)


def sides(split) -> tuple[set[str], set[str]]:
    """(normalised texts held out, normalised texts trained on)."""
    held = {normalized_question(t) for t in split.dev_queries.values()}
    trained = {normalized_question(q) for q, _ in split.positives + split.negatives}
    return held, trained


def linked_judgments(seed: int, pairs: int = 60) -> tuple[Judgments, list[tuple[str, ...]]]:
    """Groups of paraphrases (each with a liked passage and a rejected one), tied in the three ways a store ties
    them: a direct reformulation, a chain through an unrated query (not exported), and a session within the window
    whose first answer was liked (no reformulation event). Random words, so each seed places groups anew."""
    rng = random.Random(seed)
    words = [f"w{rng.randrange(10**6)}" for _ in range(8 * pairs)]
    queries, asked, qrels, corpus, groups = {}, {}, [], {"good": "a good passage", "bad": "a bad passage"}, []
    for i in range(pairs):
        texts = (
            f"how to {words[8 * i]} {words[8 * i + 1]}",
            f"{words[8 * i + 2]} {words[8 * i]} steps",
            f"{words[8 * i + 3]} {words[8 * i + 4]} again",
        )
        at = T0 + timedelta(hours=i)
        ids = [f"q{i}a", f"q{i}b", f"q{i}c"]
        kind = i % 3
        if kind == 0:  # b rephrased a
            asked[ids[0]] = QueryContext(f"s{i}", at, None)
            asked[ids[1]] = QueryContext(f"s{i}", at + timedelta(seconds=30), ids[0])
            members = ids[:2]
        elif kind == 1:  # c rephrased an unrated rephrasing of a: a chain, a and c too far apart for the window
            asked[ids[0]] = QueryContext(f"s{i}", at, None)
            asked[ids[2]] = QueryContext(f"s{i}", at + timedelta(seconds=2 * REFORMULATION_SECONDS), ids[0])
            members = [ids[0], ids[2]]
        else:  # the same session moments later, no reformulation event (the first answer was liked)
            asked[ids[0]] = QueryContext(f"s{i}", at, None)
            asked[ids[1]] = QueryContext(f"s{i}", at + timedelta(seconds=REFORMULATION_SECONDS - 1), None)
            members = ids[:2]
        for qid in members:
            queries[qid] = texts[ids.index(qid)]
            qrels += [(qid, "good", 1), (qid, "bad", -1)]
        groups.append(tuple(normalized_question(queries[q]) for q in members))
    return Judgments(queries, corpus, qrels, asked), groups


@pytest.mark.parametrize("seed", range(5))
def test_linked_paraphrases_never_land_on_both_sides(seed):
    judged, groups = linked_judgments(seed)
    for fraction in (0.1, 0.25, 0.5, 0.75, 0.9):
        held, trained = sides(split_feedback(judged, fraction))
        assert not held & trained
        for group in groups:
            assert set(group) <= held or set(group) <= trained, (fraction, group)
        assert held and trained  # the groups are split, only never within one


def test_unrelated_questions_of_one_session_are_split_on_their_own():
    # Asked an hour apart, with no reformulation between them: two questions, not a paraphrase.
    queries = {f"q{i}": f"question number {i}" for i in range(200)}
    asked = {f"q{i}": QueryContext("one-long-session", T0 + timedelta(hours=i), None) for i in range(200)}
    judged = Judgments(queries, {"c": "passage"}, [(q, "c", 1) for q in queries], asked)
    held, trained = sides(split_feedback(judged, 0.5))
    assert 60 <= len(held) <= 140 and len(held) + len(trained) == 200


def test_the_export_carries_the_links_the_split_needs(tmp_path, monkeypatch):
    from rag.feedback import store as store_module

    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    clock = [T0]
    monkeypatch.setattr(store_module, "_now", lambda: clock[0])
    chunk = [
        {"chunk_id": "c1", "doc_id": "d", "page_start": 1, "page_end": 1, "text": "reset it in settings", "rank": 1}
    ]

    def ask(text: str, seconds: float):
        clock[0] = T0 + timedelta(seconds=seconds)
        return store.record_query(text, answer="a", chunks=chunk, session_id="s1")

    first = ask("how do I reset my password", 0)
    middle = ask("password reset", 100)  # nobody rates it
    last = ask("where are the password settings", 200)  # 200 s after the first: beyond the session window
    other = ask("what is the refund policy", 5 * 3600)
    for i, q in enumerate((first, last, other)):
        store.submit_feedback(
            FeedbackSubmission(query_id=q.query_id, idempotency_key=f"k{i}", passages=[{"chunk_id": "c1", "score": 1}])
        )
    assert last.reformulation_of == middle.query_id and middle.reformulation_of == first.query_id
    judged = judgments(export_rag_dataset(store, tmp_path / "ds"))
    store.close()
    assert (
        judged.asked[last.query_id].reformulation_of == first.query_id
    )  # the chain's first query, not the unrated one
    assert (
        judged.asked[first.query_id].reformulation_of is None and judged.asked[other.query_id].reformulation_of is None
    )
    assert judged.asked[first.query_id].session_id == "s1" and judged.asked[first.query_id].created_at == T0
    for fraction in (i / 20 for i in range(21)):
        held, trained = sides(split_feedback(judged, fraction))
        pair = {"how do i reset my password", "where are the password settings"}
        assert pair <= held or pair <= trained
