"""The web page in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright): ask a question
against the real Answerer over a tiny index, rate the answer and a passage, send a correction, and find the
rows in the feedback store; and the expert view: grade queue items from the keyboard and undo."""
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from rag.annotation.queue import AnnotationQueue, write_queue
from rag.feedback import FeedbackStore
from rag.serving.app import create_app
from rag.serving.settings import ServeSettings
from tests.test_api import TOKEN, FakeAnswerer, data_root, real_app  # noqa: F401 - data_root is a fixture
from tests.test_expert_labels import EXPERT_TOKEN, item

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make test-setup installs it)")


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
def server(data_root, tmp_path):  # noqa: F811 - pytest passes the fixture imported above
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    with running(real_app(data_root, store)) as base:
        yield base, store
    store.close()


@pytest.fixture
def expert_server(tmp_path):
    """The API with the fake answerer (the expert view needs no index) and a queue of two items; the first
    passage holds HTML, which the page must show as text."""
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    root = tmp_path / "data"
    items = [item("which animals purr", "cats", "Cats <b>purr</b> & chase mice; <img src=x onerror=alert(1)>"),
             item("where do dogs sleep", "dogs", "Dogs sleep in kennels.")]
    write_queue(root, AnnotationQueue(strategy="t", selection="active", items=items))
    app = create_app(lambda: FakeAnswerer(), store, ServeSettings(api_token=TOKEN, expert_token=EXPERT_TOKEN), root=root)
    with running(app) as base:
        yield base, store, items
    store.close()


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        context = browser.new_context()
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("http://127.0.0.1")
                      else route.abort())  # offline: the page must need nothing from elsewhere
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


def test_missing_token_shows_the_error_and_stores_nothing(server, page):
    base, store = server
    page.goto(base)
    page.fill("#question", "which animal does purr")
    page.click("#ask-button")
    page.wait_for_selector("#status.error")
    assert "bearer token" in page.inner_text("#status")
    assert store.counts()["queries"] == 0


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
    assert "Saved: relevant" in page.inner_text("#status") and "1 / 2 labelled" in page.inner_text("#progress-text")
    page.fill("#expected", "in kennels")
    page.keyboard.press("Enter")  # keeps the answer and leaves the field: the digit keys grade again
    page.keyboard.press("0")
    page.wait_for_function("document.getElementById('status').textContent.includes('Every item')")
    assert page.locator("#item").is_hidden()
    labels = store.current_expert_labels()
    assert {k: (v["grade"], v["expert"], v["expert_answer"]) for k, v in labels.items()} == \
        {cats.item_id: (2, "ann", None), dogs.item_id: (0, "ann", "in kennels")}

    page.keyboard.press("u")  # undo the last label: its item is back on screen
    page.wait_for_function("document.getElementById('status').textContent.startsWith('Undone')")
    assert page.inner_text("#item-question") == dogs.question and "1 / 2 labelled" in page.inner_text("#progress-text")
    wait_until(lambda: dogs.item_id not in store.current_expert_labels())
    page.keyboard.press("1")
    page.wait_for_function("document.getElementById('status').textContent.includes('partially relevant')")
    assert store.current_expert_labels()[dogs.item_id]["grade"] == 1
    assert store.table("expert_labels")["grade"].isna().sum() == 1  # the undo row
