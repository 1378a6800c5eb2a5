"""The web page in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright): ask a question
against the real Answerer over a tiny index, rate the answer and a passage, send a correction, and find the
rows in the feedback store; the answer marked in its passage across line breaks, stale answers cleared on a new
question or an error, empty and over-long questions explained; a clicked passage shown in its document with a link
that opens the file at its page; and the expert view: grade queue items from the keyboard and undo, and grade the
queue the demo builds (a person's question first, the grade said back). Plus the API's refusal of blank and
over-long questions, which the page shows as it is."""

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from fastapi.testclient import TestClient

from rag.annotation.queue import AnnotationQueue, write_queue
from rag.feedback import FeedbackStore
from rag.serving.app import create_app
from rag.serving.settings import ServeSettings
from rag.retrieval import MAX_QUERY_CHARS
from tests.test_annotation_queue import ASKED, demo_queue
from tests.test_api import AUTH, TEXTS, TOKEN, FakeAnswerer, build_index, real_app
from tests.test_expert_labels import EXPERT_TOKEN, item
from tests.test_passage_context import PAGES, STRATEGY, index_documents, write_documents

CHROMIUM = Path("/usr/bin/chromium")
# The cats passage wraps its first sentence over two lines, as PDF text does: the extractive answer joins the lines
# with one space, and the page must still find (and mark) it in the passage.
WRAPPED_TEXTS = {
    **TEXTS,
    "cats": "Cats are small domesticated felines\n   that purr and chase mice.\nThey sleep all day.",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running(app):
    """The app served by uvicorn on a free local port, in a thread; yields its base address."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started, "the API did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    root = tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.delenv("RAG_QDRANT_PATH", raising=False)
    build_index(root, WRAPPED_TEXTS)
    return root


@pytest.fixture
def server(data_root, tmp_path):
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    with running(real_app(data_root, store)) as base:
        yield base, store
    store.close()


@pytest.fixture
def document_server(tmp_path, monkeypatch):
    """The real Answerer over a folder indexed as `rag index` does it (a three-page PDF and a note, wordllama)."""
    from rag.serving.server import build_app

    docs, root = write_documents(tmp_path / "docs"), tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.delenv("RAG_QDRANT_PATH", raising=False)
    index_documents(docs, root, models=("wordllama",))
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    settings = ServeSettings(api_token=TOKEN, refresh_seconds=0)
    app = build_app(settings, root=root, store=store, strategy=STRATEGY, model="wordllama", mode="hybrid-rrf")
    with running(app) as base:
        yield base, docs, store
    store.close()


@pytest.fixture
def expert_server(tmp_path):
    """The API with the fake answerer (the expert view needs no index) and a queue of two items; the first
    passage holds HTML, which the page must show as text."""
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    root = tmp_path / "data"
    items = [
        item("which animals purr", "cats", "Cats <b>purr</b> & chase mice; <img src=x onerror=alert(1)>"),
        item("where do dogs sleep", "dogs", "Dogs sleep in kennels."),
    ]
    write_queue(root, AnnotationQueue(strategy="t", selection="active", items=items))
    settings = ServeSettings(api_token=TOKEN, expert_token=EXPERT_TOKEN)
    app = create_app(lambda: FakeAnswerer(), store, settings, root=root)
    with running(app) as base:
        yield base, store, items
    store.close()


@pytest.fixture
def page():
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (make test-setup installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        context = browser.new_context()
        context.route(
            "**/*",
            lambda route: route.continue_() if route.request.url.startswith("http://127.0.0.1") else route.abort(),
        )  # offline: the page must need nothing from elsewhere
        yield context.new_page()
        browser.close()


def test_ask_rate_and_correct_in_chromium(server, page):
    base, store = server
    page.goto(f"{base}/#token={TOKEN}")
    assert "token=" not in page.url  # the token is moved out of the address bar
    page.fill("#question", "which animal does purr and chase mice")
    page.click("#ask-button")
    page.wait_for_selector("#result:not([hidden])")
    assert "purr" in page.inner_text("#answer")
    first = page.locator("#passages li").first
    assert first.get_attribute("data-chunk-id") == "cats"
    assert first.locator(".doc").inner_text() == "cats.md" and first.locator(".pages").inner_text() == "p. 1"
    assert "purr" in first.locator("mark").first.inner_text()  # the quoted answer is highlighted in its passage

    page.click("#answer-up")
    page.wait_for_selector("#answer-up.chosen")
    first.locator(".down").click()
    first.locator(".down.chosen").wait_for()
    page.click("#correction-box summary")
    page.fill("#correction", "Cats purr and chase mice.")
    page.check("#expert")
    page.click("#send-correction")
    page.wait_for_function("document.getElementById('status').textContent.includes('saved (1 rating)')")
    first.locator(".text").click()  # opening a passage is an implicit click event
    deadline = time.monotonic() + 10
    while store.counts()["implicit_events"] < 1 and time.monotonic() < deadline:
        time.sleep(0.1)

    feedback = store.table("feedback").sort_values("event_id")
    assert list(zip(feedback["target"], feedback["score"])) == [("answer", 1), ("passage", -1), ("correction", 1)]
    assert feedback.iloc[1]["chunk_id"] == "cats"
    answers = store.table("answers")
    assert answers[answers["source"] == "expert"]["text"].tolist() == ["Cats purr and chase mice."]
    assert store.table("queries")["text"].tolist() == ["which animal does purr and chase mice"]
    assert store.table("implicit_events")["kind"].tolist() == ["click"]


def test_a_clicked_passage_shows_its_context_and_links_to_its_page(document_server, page):
    base, docs, store = document_server
    page.goto(f"{base}/#token={TOKEN}")
    page.fill("#question", "How many barrels of lamp oil does the supply boat land at the jetty?")
    page.click("#ask-button")
    page.wait_for_selector("#result:not([hidden])")
    passage = page.locator("#passages li", has_text=PAGES[1][1])
    assert passage.locator(".doc").inner_text() == "lighthouse.pdf" and passage.locator(".pages").inner_text() == "p. 2"
    box = passage.locator(".context")
    assert box.is_hidden()

    passage.locator(".text").click()
    link = box.locator(".doc-link")
    link.wait_for()
    assert box.locator(".here").inner_text().startswith(PAGES[1][0])
    assert PAGES[0][-1] in box.locator(".before").inner_text()  # the previous page's end
    assert PAGES[2][0] in box.locator(".after").inner_text()  # the next page's start
    assert link.inner_text() == "Open lighthouse.pdf at page 2" and link.get_attribute("target") == "_blank"
    href = link.evaluate("a => a.href")
    assert href.startswith(f"{base}/documents/lighthouse.pdf?") and href.endswith("#page=2")
    # What the browser fetches when the link is followed: no Authorization header, only the link itself.
    opened = page.request.get(href.split("#")[0])
    assert opened.status == 200 and opened.headers["content-type"] == "application/pdf"
    assert opened.body() == (docs / "lighthouse.pdf").read_bytes()
    wait_until(lambda: store.counts()["implicit_events"] == 1)  # opening the passage is still a click

    passage.locator(".text").click()  # a second click closes it again
    box.wait_for(state="hidden")


def test_missing_token_shows_the_error_and_stores_nothing(server, page):
    base, store = server
    page.goto(base)
    page.fill("#question", "which animal does purr")
    page.click("#ask-button")
    page.wait_for_selector("#status.error")
    assert "bearer token" in page.inner_text("#status")
    assert store.counts()["queries"] == 0


def status_of(page, old: str) -> str:
    """The status line once it has changed from `old` (each ask first says "Searching…")."""
    page.wait_for_function(f"!['', 'Searching…', {old!r}].includes(document.getElementById('status').textContent)")
    return page.inner_text("#status")


def test_page_marks_wrapped_answers_clears_stale_results_and_explains_refusals(server, page):
    """One page session: empty questions are explained, the answer is marked across its passage's line break, the
    rating buttons say what they do in words, and an over-long question or a wrong token takes the old answer, its
    passages and the half-written correction off the page (rating them would rate the old query)."""
    base, store = server
    page.goto(f"{base}/#token={TOKEN}")
    for blank in ("", "   "):
        page.fill("#question", blank)
        page.click("#ask-button")
        page.wait_for_selector("#status.error")
        assert "empty" in page.inner_text("#status")
        page.evaluate("document.getElementById('status').textContent = ''")

    question = "which animal does purr and chase mice"
    page.fill("#question", question)
    page.click("#ask-button")
    page.wait_for_selector("#result:not([hidden])")
    answer = page.inner_text("#answer")
    cats = page.locator('#passages li[data-chunk-id="cats"]')
    marked = cats.locator("mark").all_text_contents()
    assert len(marked) == 1 and "\n" in marked[0]  # one mark, over the passage's own line break
    assert " ".join(marked[0].split()) == " ".join(answer.split())  # ...on exactly the quoted sentence
    assert WRAPPED_TEXTS["cats"].startswith(marked[0])
    labels = [
        page.inner_text("#answer-up"),
        page.inner_text("#answer-down"),
        cats.locator(".up").inner_text(),
        cats.locator(".down").inner_text(),
    ]
    assert labels == ["Helpful", "Not helpful", "Relevant", "Not relevant"]  # words, not emoji a font may lack

    page.click("#answer-up")
    page.wait_for_selector("#answer-up.chosen")
    page.click("#correction-box summary")
    page.fill("#correction", "a correction of the first answer")
    too_long = "w" * 10_000
    page.fill("#question", too_long)
    assert len(page.input_value("#question")) == 10_000  # the paste is not cut
    old = page.inner_text("#status")
    page.click("#ask-button")
    said = status_of(page, old)
    assert f"{len(too_long):,} characters" in said and f"the limit is {MAX_QUERY_CHARS:,}" in said
    assert page.locator("#result").is_hidden() and page.locator("#passages li").count() == 0
    assert page.input_value("#correction") == "" and page.inner_text("#answer") == ""
    huge = "w" * 70_000  # over the server's body limit (64 KiB): refused unread, so the page gives the length itself
    page.fill("#question", huge)
    page.click("#ask-button")
    assert f"{len(huge):,} characters" in status_of(page, said)

    page.fill("#question", question)
    page.click("#ask-button")
    page.wait_for_selector("#result:not([hidden])")
    assert page.locator("#result .rate button.chosen").count() == 0 and page.input_value("#correction") == ""
    page.click("#token-box summary")
    page.fill("#token", "a-wrong-token-0123456789")
    page.click("#ask-button")
    page.wait_for_selector("#status.error")
    assert "bearer token" in page.inner_text("#status")
    assert page.locator("#result").is_hidden() and page.locator("#passages li").count() == 0

    assert store.table("queries")["text"].tolist() == [question, question]  # the refused questions stored nothing
    assert store.table("feedback")["target"].tolist() == ["answer"]


def test_api_refuses_blank_and_over_long_questions_saying_why(tmp_path):
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    app = create_app(lambda: FakeAnswerer(), store, ServeSettings(api_token=TOKEN))
    with TestClient(app) as client:
        refusals = {q: client.post("/ask", json={"question": q}, headers=AUTH) for q in ("", " \n\t ", "q" * 9_000)}
        fits = client.post("/ask", json={"question": "q" * MAX_QUERY_CHARS}, headers=AUTH)
    assert {r.status_code for r in refusals.values()} == {422}
    assert all("empty or only spaces" in refusals[q].json()["error"] for q in ("", " \n\t "))
    assert f"9,000 characters; the limit is {MAX_QUERY_CHARS:,}" in refusals["q" * 9_000].json()["error"]
    assert fits.status_code == 200  # the limit itself is allowed
    assert store.counts()["queries"] == 1
    store.close()


def wait_until(condition, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition()


def test_expert_view_grades_with_the_keyboard_and_undoes(expert_server, page):
    base, store, (cats, dogs) = expert_server
    page.goto(f"{base}/expert#token={TOKEN}")  # the user token: refused, with what to do
    assert "token=" not in page.url
    page.fill("#expert-name", "ann")
    page.click("#start")
    page.wait_for_selector("#status.error")
    assert "expert token" in page.inner_text("#status")
    page.fill("#expert-token", EXPERT_TOKEN)
    page.click("#start")
    page.wait_for_selector("#item:not([hidden])")
    assert page.inner_text("#item-question") == cats.question
    passage = page.locator("#item-passage")
    assert "<b>purr</b>" in passage.inner_text() and passage.locator("b, img").count() == 0  # escaped, not parsed
    assert passage.locator("mark").all_inner_texts() == ["purr"]  # the query's terms are marked
    assert "0 / 2 labelled" in page.inner_text("#progress-text")

    page.keyboard.press("2")
    page.wait_for_function(f"document.getElementById('item-question').textContent === {dogs.question!r}")
    assert "Saved: relevant (2)." in page.inner_text("#status") and "1 / 2 labelled" in page.inner_text(
        "#progress-text"
    )
    page.fill("#expected", "in kennels")
    page.keyboard.press("Enter")  # keeps the answer and leaves the field: the digit keys grade again
    page.keyboard.press("0")
    page.wait_for_function("document.getElementById('status').textContent.includes('Every item')")
    assert page.locator("#item").is_hidden()
    labels = store.current_expert_labels()
    assert {k: (v["grade"], v["expert"], v["expert_answer"]) for k, v in labels.items()} == {
        cats.item_id: (2, "ann", None),
        dogs.item_id: (0, "ann", "in kennels"),
    }

    page.keyboard.press("u")  # undo the last label: its item is back on screen
    page.wait_for_function("document.getElementById('status').textContent.startsWith('Undone')")
    assert page.inner_text("#item-question") == dogs.question and "1 / 2 labelled" in page.inner_text("#progress-text")
    wait_until(lambda: dogs.item_id not in store.current_expert_labels())
    page.keyboard.press("1")
    page.wait_for_function("document.getElementById('status').textContent.includes('partially relevant (1)')")
    assert store.current_expert_labels()[dogs.item_id]["grade"] == 1
    assert store.table("expert_labels")["grade"].isna().sum() == 1  # the undo row


@pytest.fixture
def demo_expert_server(tmp_path):
    """The expert view over the queue the demo's last step builds (tests.test_annotation_queue.demo_queue)."""
    root = tmp_path / "data"
    failures, _meta = demo_queue(root)
    assert failures == 0
    store = FeedbackStore(root=root)  # where the person's question was recorded, and where labels go
    settings = ServeSettings(api_token=TOKEN, expert_token=EXPERT_TOKEN)
    with running(create_app(lambda: FakeAnswerer(), store, settings, root=root)) as base:
        yield base, store
    store.close()


def test_the_queue_the_demo_builds_shows_a_person_s_question_and_says_the_grade_saved(demo_expert_server, page):
    base, store = demo_expert_server
    page.goto(f"{base}/expert#token={EXPERT_TOKEN}")
    page.fill("#expert-name", "ann")
    page.click("#start")
    page.wait_for_selector("#item:not([hidden])")
    assert page.inner_text("#item-question") == ASKED  # the question a person asked comes first
    assert page.inner_text("#item-passage").strip() and page.inner_text("#item-doc").endswith(".txt")
    shown = page.inner_text("#item-passage")
    page.keyboard.press("2")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('Saved:')")
    said = page.inner_text("#status")
    assert said.startswith("Saved: relevant (2).") and "label" not in said  # the grade, not the label's id
    (label,) = store.current_expert_labels().values()
    assert (label["grade"], label["expert"]) == (2, "ann")
    assert (page.inner_text("#item-question"), page.inner_text("#item-passage")) != (ASKED, shown)  # the next item
