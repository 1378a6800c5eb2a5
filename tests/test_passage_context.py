"""A served passage in its document (GET /passages/{chunk_id}/context) and the document's file
(GET /documents/{doc_id}): the text around a passage from the document as parsed, or from the neighbouring passages
once the document was re-parsed; a signed link that opens a PDF at the passage's page without the bearer token;
refusals that say why (unknown ids, a file gone, a path leading out of the document folder, a bad or expired link).
The page's side, in Chromium: tests/test_web_ui.py::test_a_clicked_passage_shows_its_context_and_links_to_its_page."""

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from rag.feedback import FeedbackStore
from rag.serving.app import create_app, link_signature
from rag.serving.settings import ServeSettings
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE, TableStore
from tests.test_api import AUTH, TOKEN, FakeAnswerer
from tests.test_boilerplate import _pdf

STRATEGY = "paragraph"
# One topic a page, so that a page's passage has the previous page before it and the next one after it.
PAGES = [
    [
        "The lighthouse keeper climbs the tower at dusk.",
        "He trims the wick and polishes the great lens.",
        "Ships far out at sea steer by its slow beam.",
    ],
    [
        "Every spring the keeper orders fresh lamp oil.",
        "The supply boat lands forty barrels at the jetty.",
        "Each barrel is rolled up the cliff path by hand.",
    ],
    [
        "Storms in winter cut the island off for weeks.",
        "The keeper logs the wind speed every four hours.",
        "His logbooks now fill a whole shelf of the museum.",
    ],
]
CATS = "# Cats\n\nCats are small domesticated felines that purr and chase mice.\n\nThey sleep most of the day.\n"


def write_documents(folder: Path) -> Path:
    """A three-page PDF and a Markdown note in a subfolder (a doc_id with a slash)."""
    (folder / "notes").mkdir(parents=True, exist_ok=True)
    _pdf(folder / "lighthouse.pdf", [[(72, 700 - 20 * i, 11, line) for i, line in enumerate(p)] for p in PAGES])
    (folder / "notes" / "cats.md").write_text(CATS)
    return folder


def index_documents(docs: Path, root: Path, models: tuple[str, ...] = ()) -> pd.DataFrame:
    """What `rag index` leaves for the paragraph chunk set (embedded in root/qdrant with `models`); the chunk table,
    indexed by chunk_id as the served index holds it."""
    from rag.index.qdrant import QdrantSettings, close_client
    from rag.pipeline import index_folder

    qdrant = QdrantSettings(path=str(root / "qdrant"))
    try:
        index_folder(docs, root, strategies=[STRATEGY], models=list(models), qdrant=qdrant)
    finally:
        close_client(qdrant)
    return TableStore(root / "tables").read(CHUNKS_TABLE, STRATEGY).set_index("chunk_id")


def page_chunk(chunks: pd.DataFrame, page: int) -> str:
    """The chunk id of the PDF's passage on `page`."""
    found = chunks[(chunks["doc_id"] == "lighthouse.pdf") & (chunks["page_start"] == page)]
    assert len(found) == 1, found
    return str(found.index[0])


@pytest.fixture
def indexed(tmp_path):
    docs, root = write_documents(tmp_path / "docs"), tmp_path / "data"
    return docs, root, index_documents(docs, root)


@pytest.fixture
def client(indexed, tmp_path):
    """The API over the indexed chunk set, with an answerer that only holds the served index (no dense search)."""
    _docs, root, chunks = indexed
    answerer = SimpleNamespace(index=SimpleNamespace(chunks=chunks), ask=FakeAnswerer().ask)
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    with TestClient(create_app(lambda: answerer, store, ServeSettings(api_token=TOKEN), root=root)) as c:
        yield c
    store.close()


def context(client, chunk_id: str) -> dict:
    response = client.get(f"/passages/{chunk_id}/context", headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_passage_s_context_is_the_text_around_it_with_a_link_that_opens_its_page(client, indexed):
    docs, _root, chunks = indexed
    middle = context(client, page_chunk(chunks, 2))
    assert middle["doc_id"] == "lighthouse.pdf" and (middle["page_start"], middle["page_end"]) == (2, 2)
    assert middle["text"].startswith(PAGES[1][0]) and middle["exact"]
    assert middle["before"].rstrip().endswith(PAGES[0][-1])  # the previous page's end, up to the passage
    assert middle["after"].lstrip().startswith(PAGES[2][0])  # and the next page's start after it
    url = middle["document_url"]
    assert url.startswith("/documents/lighthouse.pdf?") and url.endswith("#page=2")

    opened = client.get(url.split("#")[0])  # no bearer token: a link the browser follows sends none
    assert opened.status_code == 200 and opened.content == (docs / "lighthouse.pdf").read_bytes()
    assert opened.headers["content-type"] == "application/pdf"
    assert "inline" in opened.headers["content-disposition"]
    first = context(client, page_chunk(chunks, 1))
    assert first["before"] == "" and first["document_url"].endswith("#page=1")


def test_the_document_route_takes_the_token_or_a_signed_link_and_nothing_else(client, indexed):
    docs, _root, chunks = indexed
    note = client.get("/documents/notes/cats.md", headers=AUTH)  # a doc_id in a subfolder
    assert note.status_code == 200 and note.text == CATS
    # Not a PDF: the file is sandboxed (an HTML file in the corpus must not run in the page's origin) and opens at
    # its start (no #page).
    assert note.headers["content-security-policy"] == "sandbox" and note.headers["x-content-type-options"] == "nosniff"
    cats = chunks.index[chunks["doc_id"] == "notes/cats.md"][0]
    assert "#page=" not in context(client, cats)["document_url"]

    link = context(client, page_chunk(chunks, 2))["document_url"].split("#")[0]
    expires = int(link.split("expires=")[1].split("&")[0])

    def signed(key: str, expiry: int) -> str:
        return f"/documents/lighthouse.pdf?expires={expiry}&signature={link_signature(key, 'lighthouse.pdf', expiry)}"

    refused = {
        "no token": client.get("/documents/lighthouse.pdf"),
        "wrong token": client.get("/documents/lighthouse.pdf", headers={"Authorization": "Bearer wrong-0123456789"}),
        "tampered": client.get(link[:-4] + "0000"),
        "other document": client.get(link.replace("lighthouse.pdf", "notes/cats.md")),
        "moved expiry": client.get(link.replace(f"expires={expires}", f"expires={expires + 60}")),
        "expired": client.get(signed(TOKEN, 1000)),
        "another key's link": client.get(signed("another-token-0123456789", expires)),
    }
    assert {why: r.status_code for why, r in refused.items()} == dict.fromkeys(refused, 401)
    assert "bearer token" in refused["no token"].json()["error"]
    assert "signature is wrong" in refused["tampered"].json()["error"]
    assert "expired" in refused["expired"].json()["error"] and "click the passage" in refused["expired"].json()["error"]
    assert client.get(link).status_code == 200


def test_unknown_gone_and_escaping_documents_are_refused_saying_why(client, indexed, tmp_path):
    docs, _root, chunks = indexed
    unknown = client.get("/documents/nowhere.pdf", headers=AUTH)
    assert unknown.status_code == 404 and "no parsed document 'nowhere.pdf'" in unknown.json()["error"]
    climbing = client.get("/documents/..%2F..%2Fetc%2Fpasswd", headers=AUTH)
    assert climbing.status_code == 404 and "no parsed document" in climbing.json()["error"]

    (docs / "notes" / "cats.md").unlink()
    gone = client.get("/documents/notes/cats.md", headers=AUTH)
    assert gone.status_code == 404 and "no longer there: re-index" in gone.json()["error"]
    cats = chunks.index[chunks["doc_id"] == "notes/cats.md"][0]
    assert context(client, cats)["document_url"] is None  # the page says the file is not available

    secret = tmp_path / "secret.pdf"
    secret.write_bytes(b"%PDF-1.4 not for readers")
    (docs / "lighthouse.pdf").unlink()
    (docs / "lighthouse.pdf").symlink_to(secret)  # a link out of the document folder put in the file's place
    escaping = client.get("/documents/lighthouse.pdf", headers=AUTH)
    assert escaping.status_code == 403 and "outside the document folder" in escaping.json()["error"]
    assert b"not for readers" not in escaping.content
    assert context(client, page_chunk(chunks, 2))["document_url"] is None


def test_bad_passage_ids_get_a_clear_4xx(client, tmp_path):
    missing = client.get("/passages/0123abcd/context", headers=AUTH)
    assert missing.status_code == 404 and "not in the chunk set that serves now" in missing.json()["error"]
    for bad in ("no spaces allowed", "x" * 129):
        response = client.get(f"/passages/{bad}/context", headers=AUTH)
        assert response.status_code == 422 and "chunk_id" in response.json()["error"]
    assert client.get("/passages/0123abcd/context").status_code == 401
    store = FeedbackStore(f"sqlite:///{tmp_path / 'other.sqlite'}")
    with TestClient(create_app(lambda: FakeAnswerer(), store, ServeSettings(api_token=TOKEN))) as plain:
        no_index = plain.get("/passages/cats/context", headers=AUTH)
    store.close()
    assert no_index.status_code == 404 and "without a passage index" in no_index.json()["error"]


def test_a_re_parsed_document_s_context_comes_from_the_neighbouring_passages(client, indexed):
    """The document was parsed again (its text changed) while the served chunk set is still the old one: the stored
    text no longer holds the passage at its offsets, so the served neighbours give its context."""
    _docs, root, chunks = indexed
    tables = TableStore(root / "tables")
    documents = tables.read(DOCUMENTS_TABLE)
    documents["canonical_text"] = "A new first line.\n\n" + documents["canonical_text"]
    tables.write(documents, DOCUMENTS_TABLE)
    middle = context(client, page_chunk(chunks, 2))
    assert not middle["exact"]
    assert middle["before"] == chunks.loc[page_chunk(chunks, 1), "text"]
    assert middle["after"] == chunks.loc[page_chunk(chunks, 3), "text"]
