"""The web page in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright): ask a question
against the real Answerer over a tiny index, rate the answer and a passage, send a correction, and find the
rows in the feedback store."""
import socket
import threading
import time
from pathlib import Path

import pytest

from rag.feedback import FeedbackStore
from tests.test_api import TOKEN, data_root, real_app  # noqa: F401 - data_root is a fixture

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make test-setup installs it)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(data_root, tmp_path):
    import uvicorn

    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(real_app(data_root, store), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started, "the API did not start"
    yield f"http://127.0.0.1:{port}", store
    srv.should_exit = True
    thread.join(timeout=10)
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
