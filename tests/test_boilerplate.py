"""Page furniture (running headers, footers, page numbers, licence lines) is set aside at parse time: recorded in
the document's metadata, never in its text, so no chunk of any strategy holds it, while every body word stays."""

from collections import Counter
from pathlib import Path

import pytest

from rag.chunking import get_chunker, load_strategies
from rag.parsing import ParseSettings, parse_file
from rag.parsing.boilerplate import line_key, recorded, running_lines
from rag.parsing.pdf_layout import Line

REPO = Path(__file__).resolve().parents[1]
FEDERAL_REGISTER = REPO / "sample_corpus" / "federal-register-2020-17221.pdf"
# Every shipped strategy but the semantic one, which loads an embedder to cut.
STRATEGIES = {name: s for name, s in load_strategies().items() if s.kind != "semantic"}

HEADER = "Acme Quarterly Review, Issue 7"
LICENCE = "Licensed under CC BY 4.0, see acme.example/licence"
# Said in the middle of every page: repetition alone does not make a line furniture, its place on the page does.
REFRAIN = "Remember to water the seedlings every morning."


def _pdf(path: Path, pages: list[list[tuple[float, float, float, str]]]) -> Path:
    """A PDF of the given pages, each a list of (x, y from the bottom, font size, text) in Helvetica."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    objects = ["<< /Type /Catalog /Pages 2 0 R >>", "", "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for lines in pages:
        stream = "".join(f"BT /F1 {size} Tf {x} {y} Td ({escape(t)}) Tj ET\n" for x, y, size, t in lines).encode()
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream.decode()}endstream")
        content = len(objects)
        objects.append(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {content} 0 R >>"
        )
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return path


TOPICS = ["irrigation", "compost", "pruning", "mulch", "seed saving", "pest control"]


def _body(page: int) -> list[str]:
    topic = TOPICS[page - 1]
    return [
        f"This page is about {topic}, and it opens with a plain sentence.",
        f"Gardeners ask about {topic} more than anything else in spring.",
        REFRAIN,
        f"Its closing line mentions the {page * 11} tomato plants in the greenhouse.",
    ]


@pytest.fixture(scope="module")
def magazine(tmp_path_factory) -> Path:
    """Six pages: a running head whose page number swaps ends on facing pages, body lines, a licence footer and a
    page number under it."""
    pages = []
    for page in range(1, 7):
        head = f"{HEADER}    page {page}" if page % 2 else f"{page}    {HEADER}"
        lines = [(72, 750, 9, head)]
        lines += [(72, 690 - 40 * i, 11, text) for i, text in enumerate(_body(page))]
        lines += [(72, 60, 8, LICENCE), (300, 40, 9, f"- {page} -")]
        pages.append(lines)
    return _pdf(tmp_path_factory.mktemp("furniture") / "magazine.pdf", pages)


def _chunk_texts(doc) -> dict[str, list[str]]:
    return {name: [c.text for c in get_chunker(name, STRATEGIES).chunk(doc)] for name in STRATEGIES}


def _words(text: str) -> Counter:
    return Counter(text.split())


def test_a_generated_pdf_s_headers_footers_and_page_numbers_reach_no_chunk(magazine):
    doc = parse_file(magazine)
    for name, texts in _chunk_texts(doc).items():
        joined = "\n".join(texts)
        assert HEADER not in joined and LICENCE not in joined and "- 3 -" not in joined, name
    for page in range(1, 7):
        for sentence in _body(page):
            assert sentence in doc.canonical_text
    assert doc.canonical_text.count(REFRAIN) == 6
    furniture = recorded(doc.metadata)
    assert [f["page"] for f in furniture if f["text"].startswith(HEADER) or f["text"].endswith(HEADER)] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert Counter(f["type"] for f in furniture) == {"header": 6, "footer": 12}
    assert {"page": 4, "type": "footer", "text": "- 4 -"} in furniture


def test_turned_off_the_furniture_stays_in_the_text(magazine):
    settings = ParseSettings(strip_boilerplate=False)
    doc = parse_file(magazine, settings)
    assert doc.canonical_text.count(LICENCE) == 6 and "boilerplate" not in doc.metadata
    assert settings.fingerprint() != ParseSettings().fingerprint()


def test_the_federal_register_keeps_every_body_word_and_no_running_line():
    doc = parse_file(FEDERAL_REGISTER)
    raw = parse_file(FEDERAL_REGISTER, ParseSettings(strip_boilerplate=False))
    for name, texts in _chunk_texts(doc).items():
        joined = "\n".join(texts)
        assert "VerDate" not in joined and "Fmt 4702" not in joined and "06AUP1" not in joined, name
        assert "Federal Register / Vol. 85" not in joined, name
    furniture = recorded(doc.metadata)
    # Exactly the recorded lines left the text: nothing else was lost.
    assert _words(raw.canonical_text) - _words(" ".join(f["text"] for f in furniture)) == _words(doc.canonical_text)
    # The stamp at the foot of all 15 pages and the running head of the 14 after the first.
    assert {f["page"] for f in furniture if f["text"].startswith("VerDate")} == set(range(1, 16))
    assert {f["page"] for f in furniture if "Federal Register / Vol. 85" in f["text"]} == set(range(2, 16))


def test_an_office_file_s_declared_header_and_footer_are_set_aside():
    doc = parse_file(REPO / "sample_corpus" / "misc" / "handbook-1p.docx")
    assert "US Trustee Handbook" not in doc.canonical_text and "chapter 13" in doc.canonical_text
    assert [(f["type"], f["text"]) for f in recorded(doc.metadata)] == [
        ("header", "US Trustee Handbook"),
        ("footer", "Copyright"),
    ]


@pytest.mark.parametrize(
    "text, key",
    [
        ("47700 Federal Register / Vol. 85, Proposed Rules", "federal register / vol. #, proposed rules"),
        ("Federal Register / Vol. 85, Proposed Rules 47701", "federal register / vol. #, proposed rules"),
        ("- 12 -", "#"),
        ("62,500.08", ""),  # an amount is never a page number
        ("$", ""),
    ],
)
def test_line_keys_ignore_numbers_and_where_the_page_number_sits(text, key):
    assert line_key(text) == key


def _line(text: str, top: float) -> Line:
    return Line([{"text": w} for w in text.split()], 72.0, top, 300.0, top + 10.0, 10.0)


def test_furniture_needs_the_top_or_bottom_of_at_least_three_pages():
    def pages(n: int) -> list[list[Line]]:
        return [
            [_line("Draft for review", 30), _line(f"A line about {TOPICS[p]}.", 100), _line(REFRAIN, 300)]
            + [_line(f"More on {TOPICS[-p - 1]}.", 500), _line(f"Page {p + 1}", 750)]
            for p in range(n)
        ]

    assert running_lines(pages(2)) == {}
    found = running_lines(pages(3))
    assert found == {(p, i): pos for p in range(3) for i, pos in ((0, "top"), (4, "bottom"))}
