"""Plain text and Markdown read natively (rag.parsing.text, rag.parsing.markdown): headings with levels, paragraph
boundaries, list items, code, pipe tables with their rows and HTML, encodings; the same canonical text, headings and
tables as the unstructured path gave on the shared files; documents the chunkers cut at their headings."""

from __future__ import annotations

import codecs

import pytest

from rag.parsing import ELEMENT_SEPARATOR, ParseError, parse_file
from rag.parsing.models import assemble
from tests.fuzzed import write_invalid_utf8

REPORT = """# Annual report 2019

Revenue by segment

| | 2019 | 2018 |
|---|---:|---|
| Fixed Price | $ 1,452.4 | **$ 1,146.2** |
| Other \\| misc | 44.1 | 56.7 |

Sales by *contract type*: substantially all of our contracts are [fixed-price](http://x.example) type contracts,
and `cost plus` ones are rare.

## Notes

- First item with **bold**
- Second item
  continued on a new line
    - nested item
1. numbered one
2. numbered two

Setext heading
--------------

```python
def f():

    return 1
```

Revenue grew in
2019. Costs fell.
"""


def elements(tmp_path, name: str, text: str | bytes):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    doc = parse_file(path)
    assert doc.canonical_text == ELEMENT_SEPARATOR.join(e.text for e in doc.elements)
    return doc, [(e.type, e.heading_level, e.text) for e in doc.elements]


def test_markdown_blocks_become_typed_elements(tmp_path):
    doc, got = elements(tmp_path, "report.md", REPORT)
    assert doc.parser == "markdown" and doc.n_pages == 1
    assert [g for g in got if g[0] == "title"] == [
        ("title", 1, "Annual report 2019"),
        ("title", 2, "Notes"),
        ("title", 2, "Setext heading"),
    ]
    assert [t for kind, _, t in got if kind == "list_item"] == [
        "First item with bold",
        "Second item continued on a new line",
        "nested item",
        "numbered one",
        "numbered two",
    ]
    assert ("code", None, "def f():\n    return 1") in got  # the blank line inside is dropped, as for every element
    assert got[1] == ("text", None, "Revenue by segment")  # a short paragraph is no heading in Markdown
    assert got[3][2].startswith("Sales by contract type: substantially all of our contracts are fixed-price type")
    assert got[3][2].endswith("and cost plus ones are rare.")
    assert got[-1][2] == "Revenue grew in 2019. Costs fell."  # "2019." inside a paragraph starts no list


def test_a_pipe_table_is_a_table_element_with_rows_and_html(tmp_path):
    doc, _ = elements(tmp_path, "report.md", REPORT)
    (table,) = [e for e in doc.elements if e.type == "table"]
    assert table.rows == [
        ["", "2019", "2018"],
        ["Fixed Price", "$ 1,452.4", "$ 1,146.2"],
        ["Other | misc", "44.1", "56.7"],
    ]
    assert table.has_header and table.html.startswith("<table><tr><th></th><th>2019</th>")
    assert table.text.split("\n")[1] == "Fixed Price | $ 1,452.4 | $ 1,146.2"


def test_a_tatqa_table_with_an_empty_header_row_has_no_header(tmp_path):
    text = "| | | |\n|---|---|---|\n| Years Ended | 2019 | 2018 |\n| Sales | 10 | 9 |\n\nSales rose."
    doc, got = elements(tmp_path, "tat.md", text)
    table = doc.elements[0]
    assert table.rows == [["Years Ended", "2019", "2018"], ["Sales", "10", "9"]] and not table.has_header
    assert got[1] == ("narrative", None, "Sales rose.")


def test_raw_html_tables_and_comments_in_markdown(tmp_path):
    text = "Intro line.\n\n<table>\n<tr><th>A</th><th>B</th></tr>\n<tr><td>1 &amp; 2</td><td>3</td></tr>\n</table>\n\n"
    text += "<!-- a note for editors -->\n\nAfter."
    doc, got = elements(tmp_path, "raw.md", text)
    assert doc.elements[1].rows == [["A", "B"], ["1 & 2", "3"]] and doc.elements[1].has_header
    assert [t for _, _, t in got] == ["Intro line.", "A | B\n1 & 2 | 3", "After."]


def test_plain_text_paragraphs_headings_and_lists(tmp_path):
    text = (
        "CHAPTER I\n\n"
        "It was in July, 1805, and the speaker was the well-known\nAnna Pavlovna Scherer, maid of honor.\n\n"
        "All her invitations ran as follows:\n\n"
        "• eggs and flour\n• water, salt\n  and yeast\n\n"
        "Shopping list for the week ahead of us:\n- milk from the farm shop down the road\n- bread\n\n"
        "1. First step\n2. Second step\n\n"
        "Iwan Wyn Roberts\n6480 Cameron Street\nLas Vegas, NV 89118\n"
    )
    doc, got = elements(tmp_path, "book.txt", text)
    assert doc.parser == "text"
    assert got == [
        ("title", 1, "CHAPTER I"),
        (
            "narrative",
            None,
            "It was in July, 1805, and the speaker was the well-known Anna Pavlovna Scherer, maid of honor.",
        ),
        ("narrative", None, "All her invitations ran as follows:"),
        ("list_item", None, "eggs and flour"),
        ("list_item", None, "water, salt and yeast"),
        ("narrative", None, "Shopping list for the week ahead of us:"),
        ("list_item", None, "milk from the farm shop down the road"),
        ("list_item", None, "bread"),
        ("list_item", None, "1. First step"),
        ("list_item", None, "2. Second step"),
        ("title", 1, "Iwan Wyn Roberts"),  # a block of short lines: a paragraph per line
        ("title", 1, "6480 Cameron Street"),
        ("title", 1, "Las Vegas, NV 89118"),
    ]


def test_text_without_blank_lines_is_a_paragraph_per_line_and_wrapped_lines_are_no_headings(tmp_path):
    lines = ["Iwan Roberts", "Roberts celebrating after scoring a goal", "in 2004", "Early life"]
    lines += [f"He was born in Bangor in the year {1968 + i}." for i in range(8)]  # under a tenth of lines blank
    _, got = elements(tmp_path, "wiki.txt", "\n".join(lines) + "\n")
    assert got[:5] == [
        ("title", 1, "Iwan Roberts"),
        ("narrative", None, "Roberts celebrating after scoring a goal"),  # "in 2004" continues it
        ("text", None, "in 2004"),
        ("title", 1, "Early life"),
        ("narrative", None, "He was born in Bangor in the year 1968."),
    ]
    assert len(got) == len(lines)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("utf16.txt", codecs.BOM_UTF16_LE + "Café menu.\r\n\r\nNaïve coffee.".encode("utf-16-le")),
        ("utf8-bom.md", codecs.BOM_UTF8 + "# Café\n\nNaïve coffee.".encode()),
        ("utf32.txt", "Café menu.\n\nNaïve coffee.".encode("utf-32")),
    ],
)
def test_encodings_with_a_byte_order_mark(tmp_path, name, data):
    doc, got = elements(tmp_path, name, data)
    assert [t for _, _, t in got][-1] == "Naïve coffee." and "Café" in doc.canonical_text
    assert "\ufeff" not in doc.canonical_text and "\r" not in doc.canonical_text


def test_text_that_is_not_utf8_is_read_by_the_detector_unstructured_uses(tmp_path):
    for name in ("latin1.md", "latin1.txt"):
        path = tmp_path / name
        write_invalid_utf8(path)  # Latin-1: the detector picks an 8-bit encoding, not always Latin-1 itself
        doc = parse_file(path)
        assert "menu" in doc.canonical_text and doc.canonical_text == unstructured_document(path).canonical_text


def test_a_text_file_no_encoding_reads_is_quarantined(tmp_path):
    path = tmp_path / "binary.txt"
    path.write_bytes(bytes(range(256)) * 8)  # NUL bytes and every other byte: no text encoding reads it as text
    try:
        doc = parse_file(path)
    except ParseError as exc:
        assert exc.reason.value in ("malformed", "empty") and exc.message
    else:  # the detector may still find an 8-bit reading: then it is text like any other
        assert doc.canonical_text.strip()


def test_section_chunks_follow_markdown_headings(tmp_path):
    from rag.chunking import get_chunker

    path = tmp_path / "report.md"
    path.write_text(REPORT)
    chunks = get_chunker("section-low").chunk(parse_file(path))
    assert [c.section_path for c in chunks][:3] == [
        ["Annual report 2019"],
        ["Annual report 2019", "Notes"],
        ["Annual report 2019", "Setext heading"],
    ]
    assert any(c.table_html and "<th>2019</th>" in c.table_html for c in chunks)


# --- the same documents as the unstructured path -------------------------------------------------------------------


def unstructured_document(path):
    from rag.parsing.office import parse_with_unstructured

    drafts, n_pages = parse_with_unstructured(path)
    return assemble(drafts, doc_id=path.name, source_path=str(path), content_hash="", parser="u", n_pages=n_pages)


def headings_and_tables(doc):
    return [
        (e.type, e.heading_level, e.text, e.rows, e.has_header) for e in doc.elements if e.type in ("title", "table")
    ]


TATQA_LIKE = """| Years Ended December 31 |  |  |  |
|---|---|---|---|
| Black-Scholes Assumptions | 2019 | 2018 | 2017 |
| Dividend yield | 4.5% | 4.6% | 4.1% |
| Expected volatility | 28.3% | 28.7% | 27.1% |

8. Stock option and award plan: (Continued)

The accounting for equity-based compensation expense requires the Company to make estimates.

Expected Dividend Yield—The Company uses an expected dividend yield based upon expected annual dividends.

– Free cash flow facilitates comparability of results with other companies; and

## Fair value

The weighted-average per share grant date fair value of options was $8.92 in 2019,\u00a0$8.45 in 2018.
"""


def test_markdown_matches_the_unstructured_path(tmp_path, shared_mixed):
    (tmp_path / "tatqa.md").write_text(TATQA_LIKE)
    for path in [*sorted(shared_mixed.glob("*.md")), tmp_path / "tatqa.md"]:
        old, new = unstructured_document(path), parse_file(path)
        assert new.canonical_text == old.canonical_text, path.name
        assert headings_and_tables(new) == headings_and_tables(old), path.name
        assert [e.type for e in new.elements if e.type in ("list_item", "code")] == [
            e.type for e in old.elements if e.type in ("list_item", "code")
        ], path.name


def test_plain_text_has_the_unstructured_path_s_text_and_paragraphs(shared_mixed):
    """Headings may differ: unstructured told a heading from a sentence by tagging verbs (see rag.parsing.text)."""
    for path in sorted(shared_mixed.glob("*.txt")):
        old, new = unstructured_document(path), parse_file(path)
        assert new.canonical_text == old.canonical_text, path.name
        assert [(e.char_start, e.char_end) for e in new.elements] == [
            (e.char_start, e.char_end) for e in old.elements
        ], path.name
