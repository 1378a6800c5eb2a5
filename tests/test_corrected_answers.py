"""A correction is an answer example for the answer stage: the question asked again is answered with the corrected
answer, cited from the retrieved passage that holds it, once different clients agree on it; one client, however
many sessions it opens or whatever source it claims, changes nothing anybody else reads."""

import pytest
from fastapi.testclient import TestClient

from rag.feedback import FeedbackStore
from rag.serving.app import create_app
from rag.serving.corrected import GENERATOR, AgreedAnswer, agreed_answers, answer_with_correction
from rag.serving.settings import ServeSettings
from tests.test_api import AUTH, TEXTS, TOKEN, FakeAnswerer

QUESTION = "which animal does purr"
CORRECTION = "small domesticated felines"  # stands in the "cats" passage, which the fake answerer ranks first


@pytest.fixture
def store(tmp_path):
    st = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    yield st
    st.close()


def serve(store, **settings):
    defaults = {"api_token": TOKEN, "client_header": "X-User", "corrections_cache_seconds": 0}
    return TestClient(create_app(lambda: FakeAnswerer(), store, ServeSettings(**{**defaults, **settings})))


def ask(client, user: str, question: str = QUESTION) -> dict:
    response = client.post("/ask", json={"question": question}, headers={**AUTH, "X-User": user})
    assert response.status_code == 200, response.text
    return response.json()


def correct(client, user: str, answer: str, key: str, **extra) -> None:
    asked = ask(client, user)
    body = {"query_id": asked["query_id"], "idempotency_key": key, "correction": answer, **extra}
    response = client.post("/feedback", json=body, headers={**AUTH, "X-User": user})
    assert response.status_code == 201, response.text


def test_agreement_counts_clients_not_sessions_and_the_most_agreed_answer_wins():
    rows = [
        ("Which animal purrs?", "Cats", "a"),
        ("which  animal PURRS?", "cats", "a"),  # the same client again: still one
        ("which animal purrs?", "Lions", "b"),
        ("which animal purrs?", "Lions ", "c"),
        ("which animal purrs?", "cats", "d"),
        ("which animal purrs?", "cats", "e"),
        ("which animal purrs?", "dogs", "f"),
    ]
    assert agreed_answers(rows[:2], min_clients=2) == {}
    agreed = agreed_answers(rows, min_clients=2)
    assert agreed == {"which animal purrs?": AgreedAnswer("cats", 3)}  # cats: a, d, e; lions: b, c; dogs: f
    assert agreed_answers(rows[:4], min_clients=2)["which animal purrs?"] == AgreedAnswer("Lions", 2)


def test_a_correction_serves_only_from_a_shown_passage_that_holds_it():
    result = FakeAnswerer().ask(QUESTION)
    served = answer_with_correction(result, AgreedAnswer("Small domesticated\nFELINES", 2))
    assert served.answer == "Small domesticated\nFELINES" and served.cited_chunk_ids == ["cats"]
    assert served.generator == GENERATOR and "the answer stage said" in served.warnings[-1]
    assert [c["chunk_id"] for c in served.chunks if c["cited"]] == ["cats"]
    # Not in any shown passage, or too short to name a passage: the answer stage's own answer stands.
    assert answer_with_correction(result, AgreedAnswer("tigers roar at night", 2)) is None
    assert answer_with_correction(result, AgreedAnswer("and", 2)) is None


def test_two_clients_agreeing_change_the_answer_one_client_does_not(store):
    with serve(store) as client:
        before = ask(client, "carol")["answer"]
        assert before == TEXTS["cats"]
        correct(client, "alice", CORRECTION, "a1")
        correct(client, "alice", CORRECTION.upper(), "a2")  # alice again, in other words' case
        correct(client, "alice", CORRECTION, "a3", correction_source="expert")  # a claim, not a credential
        assert ask(client, "carol")["answer"] == before
        correct(client, "bob", CORRECTION, "b1")
        after = ask(client, "carol", QUESTION.upper() + "  ")
        assert after["answer"] == CORRECTION and after["cited_chunk_ids"] == ["cats"]
        assert [p["chunk_id"] for p in after["passages"] if p["cited"]] == ["cats"]
        assert any("2 people agreed" in w for w in after["warnings"])
        # Another question keeps its own answer.
        assert ask(client, "carol", "which animal does bark")["answer"] == TEXTS["dogs"]
        # What was served is stored as served: the next correction or rating is about it.
        answers = store.table("answers")
        assert CORRECTION in set(answers[answers["source"] == "system"]["text"])


def test_corrections_sent_on_other_peoples_questions_count_for_nobody(store):
    """One client with the API token posts corrections on queries two other people asked: were the asker's identity
    what counts, that one client would make an agreement. Only a correction sent under the session that asked the
    question counts."""
    with serve(store) as alice, serve(store) as bob, serve(store) as mallory, serve(store) as carol:
        for key, (person, user) in enumerate(((alice, "alice"), (bob, "bob"))):
            asked = ask(person, user)
            body = {"query_id": asked["query_id"], "idempotency_key": f"m{key}", "correction": CORRECTION}
            response = mallory.post("/feedback", json=body, headers={**AUTH, "X-User": "mallory"})
            assert response.status_code == 201, response.text  # stored for training, as any rating is
        assert len(store.corrections()) == 0
        assert ask(carol, "carol")["answer"] == TEXTS["cats"]
        correct(alice, "alice", CORRECTION, "a1")
        correct(bob, "bob", CORRECTION, "b1")
        assert ask(carol, "carol")["answer"] == CORRECTION


def test_serving_corrections_can_be_turned_off(store):
    with serve(store, corrected_answers_min_clients=0) as client:
        correct(client, "alice", CORRECTION, "a1")
        correct(client, "bob", CORRECTION, "b1")
        assert ask(client, "carol")["answer"] == TEXTS["cats"]
