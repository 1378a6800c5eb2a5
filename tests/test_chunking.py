"""Chunking strategies: shared invariants for every shipped strategy, then per-kind behaviour."""

from __future__ import annotations

import hashlib
import html
import random
from pathlib import Path

import numpy as np
import pytest

from rag.chunking import (
    Chunk,
    ChunkingConfigError,
    available_kinds,
    build_chunks,
    chunk_document,
    get_chunker,
    load_strategies,
    parse_strategy,
    strategy_fingerprint,
)
from rag.chunking.layout import DocLayout
from rag.chunking.recursive import recursive_split
from rag.chunking.sentences import split_sentences
from rag.chunking.tokens import get_tokenizer
from rag.parsing.models import ElementDraft, ParsedDocument, assemble

REPO = Path(__file__).resolve().parents[1]

SHIPPED = load_strategies(REPO / "config" / "chunking.yaml")
SHIPPED_NAMES = list(SHIPPED)

# --------------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------------

_NOUNS = "river engine market teacher garden signal budget harbor village sensor ledger orchard".split()
_VERBS = "moves measures protects feeds shapes records crosses supports".split()
_ADJS = "quiet northern careful ancient rapid modest bright heavy".split()


def _prose(rng: random.Random, n_sentences: int) -> str:
    out = []
    for i in range(n_sentences):
        words = [rng.choice(_ADJS), rng.choice(_NOUNS), rng.choice(_VERBS), "the", rng.choice(_NOUNS)]
        tail = " ".join(rng.choice(_NOUNS + _ADJS) for _ in range(rng.randint(3, 14)))
        s = f"The {' '.join(words)} near the {tail}."
        if i % 7 == 3:
            s = f"Dr. Smith noted that the cost rose 3.5 percent, e.g. for the {rng.choice(_NOUNS)}."
        out.append(s)
    return " ".join(out)


def make_doc(doc_id: str = "doc-1") -> ParsedDocument:
    """Four pages: a heading hierarchy (levels 1-3), short and long paragraphs, list items, a
    61-row table with a header, and a top-level section longer than 4000 chars."""
    rng = random.Random(7)
    D = ElementDraft
    table = [["Year", "Region", "Revenue", "Notes"]] + [
        [str(2000 + i), f"Region {i % 5}", f"{1000 + 37 * i:,}", f"note {i} " + "x" * (i % 13)] for i in range(60)
    ]
    drafts = [
        D(type="title", text="Introduction", heading_level=1, page=1),
        D(type="narrative", text=_prose(rng, 6), page=1),
        D(type="narrative", text="A short paragraph.", page=1),
        D(type="narrative", text=_prose(rng, 30), page=1),  # > 2000 chars
        D(type="title", text="Background", heading_level=2, page=1),
        D(type="narrative", text=_prose(rng, 8), page=1),
        D(type="title", text="Data", heading_level=2, page=2),
        D(type="narrative", text="Table 1 lists revenue by year.", page=2),
        D(type="table", text="", rows=table, has_header=True, page=2),
        D(type="narrative", text=_prose(rng, 5), page=2),
        D(type="title", text="Methods", heading_level=1, page=3),
        D(type="title", text="Setup", heading_level=2, page=3),
        D(type="list_item", text="- first item of the list", page=3),
        D(type="list_item", text="- second item of the list", page=3),
        D(type="title", text="Details", heading_level=3, page=3),
        D(type="narrative", text=_prose(rng, 10), page=3),
        D(type="title", text="Results", heading_level=1, page=4),
        D(type="narrative", text=_prose(rng, 45), page=4),
        D(type="narrative", text=_prose(rng, 20), page=4),
    ]
    return assemble(drafts, doc_id=doc_id, source_path=f"/x/{doc_id}.pdf", content_hash="h", parser="test", n_pages=4)


def make_prose_doc(n_paragraphs: int = 12, sentences: int = 25) -> ParsedDocument:
    rng = random.Random(3)
    drafts = [ElementDraft(type="narrative", text=_prose(rng, sentences), page=1 + i // 4) for i in range(n_paragraphs)]
    return assemble(
        drafts,
        doc_id="prose",
        source_path="/x/prose.pdf",
        content_hash="h",
        parser="test",
        n_pages=1 + (n_paragraphs - 1) // 4,
    )


def doc_from(*texts: str, doc_id: str = "small") -> ParsedDocument:
    drafts = [ElementDraft(type="narrative", text=t) for t in texts]
    return assemble(drafts, doc_id=doc_id, source_path="/x", content_hash="h", parser="test", n_pages=1)


@pytest.fixture(scope="module")
def doc() -> ParsedDocument:
    return make_doc()


@pytest.fixture(scope="module")
def chunks_by_strategy(doc) -> dict[str, list[Chunk]]:
    return {name: chunk_document(doc, name, SHIPPED) for name in SHIPPED_NAMES}


def row_spans(doc: ParsedDocument) -> list[tuple[int, int, int, int]]:
    """(start, end, element index, row number) of every table row's text (a row with an empty last
    cell ends in " | ", and a chunk legitimately stops before that whitespace)."""
    out = []
    for el in doc.elements:
        if el.type != "table":
            continue
        pos = el.char_start
        for n, line in enumerate(el.text.split("\n")):
            lead = len(line) - len(line.lstrip())
            out.append((pos + lead, pos + len(line.rstrip()), el.index, n))
            pos += len(line) + 1
    return out


def check_invariants(doc: ParsedDocument, chunks: list[Chunk], strategy: str) -> None:
    text = doc.canonical_text
    rows = row_spans(doc)
    ids = [c.chunk_id for c in chunks]
    assert len(set(ids)) == len(ids), "chunk ids must be unique"
    assert [(c.char_start, c.char_end) for c in chunks] == sorted((c.char_start, c.char_end) for c in chunks)
    for k, c in enumerate(chunks):
        assert c.strategy == strategy and c.doc_id == doc.doc_id
        assert text[c.char_start : c.char_end] == c.text
        assert c.text and c.text == c.text.strip()
        assert c.content_hash == hashlib.sha256(c.text.encode()).hexdigest()
        assert c.n_tokens > 0
        assert 1 <= c.page_start <= c.page_end <= doc.n_pages
        assert c.prev_chunk_id == (ids[k - 1] if k else None)
        assert c.next_chunk_id == (ids[k + 1] if k + 1 < len(ids) else None)
        inside = [r for r in rows if r[0] < c.char_end and r[1] > c.char_start]
        for s, e, _, _ in rows:
            assert not s < c.char_start < e, f"{strategy}: chunk starts inside a table row"
            assert not s < c.char_end < e, f"{strategy}: chunk ends inside a table row"
        if inside:
            assert c.table_html is not None
            for s, e, el_index, n in inside:
                first_cell = doc.elements[el_index].rows[n][0]
                assert html.escape(first_cell) in c.table_html
        else:
            assert c.table_html is None


# --------------------------------------------------------------------------------------------------
# Every shipped strategy
# --------------------------------------------------------------------------------------------------


def test_shipped_config_has_required_strategies():
    required = {
        "fixed-512": "sentence-pack",
        "recursive-1000-200": "recursive",
        "sentence-window-4-2": "sentence-window",
        "sliding-1024": "sliding-window",
        "paragraph": "paragraph",
        "section-low": "section",
        "section-high": "section",
        "page": "page",
        "semantic": "semantic",
        "whole-document": "whole-document",
    }
    assert {n: SHIPPED[n].kind for n in required} == required
    p = {n: SHIPPED[n].params for n in required}
    assert p["fixed-512"].max_tokens == 512
    assert (p["recursive-1000-200"].chunk_size, p["recursive-1000-200"].chunk_overlap) == (1000, 200)
    assert p["recursive-1000-200"].separators == ["\n\n", "\n", " ", ""]
    sw = p["sentence-window-4-2"]
    assert (sw.window, sw.stride, sw.min_chars, sw.max_chars, sw.dedup) == (4, 2, 150, 2048, True)
    assert (p["sliding-1024"].window_tokens, p["sliding-1024"].overlap) == (1024, 0.5)
    assert (p["paragraph"].min_chars, p["paragraph"].max_chars, p["paragraph"].overlap) == (100, 2000, 200)
    assert (p["section-low"].headings, p["section-high"].headings) == ("all", "top")
    assert p["semantic"].embedder == "wordllama" and p["semantic"].group_size == 3
    assert set(available_kinds()) >= set(required.values())


@pytest.mark.parametrize("name", SHIPPED_NAMES)
def test_invariants_every_strategy(doc, chunks_by_strategy, name):
    chunks = chunks_by_strategy[name]
    assert chunks
    check_invariants(doc, chunks, name)


@pytest.mark.parametrize("name", SHIPPED_NAMES)
def test_deterministic_ids(doc, chunks_by_strategy, name):
    again = chunk_document(make_doc(), name, SHIPPED)
    assert again == chunks_by_strategy[name]
    other = chunk_document(make_doc("doc-2"), name, SHIPPED)
    assert not {c.chunk_id for c in other} & {c.chunk_id for c in again}


@pytest.mark.parametrize("name", SHIPPED_NAMES)
def test_empty_and_tiny_documents(name):
    empty = assemble([], doc_id="e", source_path="/x", content_hash="h", parser="t", n_pages=1)
    assert chunk_document(empty, name, SHIPPED) == []
    tiny = doc_from("Just one line.")
    check_invariants(tiny, chunk_document(tiny, name, SHIPPED), name)


def test_chunks_cover_the_document(doc, chunks_by_strategy):
    # Every non-dropping strategy covers each non-whitespace character of the document.
    for name in SHIPPED_NAMES:
        if SHIPPED[name].kind == "sentence-window":
            continue  # drops windows by design
        covered = np.zeros(len(doc.canonical_text), dtype=bool)
        for c in chunks_by_strategy[name]:
            covered[c.char_start : c.char_end] = True
        missing = [i for i, ch in enumerate(doc.canonical_text) if not covered[i] and not ch.isspace()]
        assert not missing, f"{name} leaves text uncovered"


_TINY = {
    "sentence-pack": {"max_tokens": 9},
    "recursive": {"chunk_size": 40, "chunk_overlap": 10},
    "sentence-window": {"window": 2, "stride": 1, "min_chars": 0, "max_chars": 10_000},
    "sliding-window": {"window_tokens": 7, "overlap": 0.5},
    "paragraph": {"min_chars": 30, "max_chars": 60, "overlap": 20},
    "section": {"max_chars": 50, "overlap": 10},
}


@pytest.mark.parametrize("kind", sorted(_TINY))
def test_tiny_sizes_never_cut_table_rows(doc, kind):
    # Budgets far smaller than a table row force every cut decision near rows.
    config = parse_strategy(f"tiny-{kind}", {"kind": kind, **_TINY[kind]})
    chunks = get_chunker(config.name, {config.name: config}).chunk(doc)
    check_invariants(doc, chunks, config.name)


# --------------------------------------------------------------------------------------------------
# Per-kind behaviour
# --------------------------------------------------------------------------------------------------


def test_fixed_512_packs_whole_sentences(doc, chunks_by_strategy):
    chunks = chunks_by_strategy["fixed-512"]
    assert len(chunks) > 3
    assert all(c.n_tokens <= 512 for c in chunks)
    assert max(c.n_tokens for c in chunks) > 400  # packed, not one sentence per chunk
    table = next(el for el in doc.elements if el.type == "table")
    ends = {e for _, e in DocLayout(doc).table_rows(table.index)} | {
        e for el in doc.elements if el.type != "table" for _, e in split_sentences(el.text, el.char_start)
    }
    assert all(c.char_end in ends for c in chunks)


def test_recursive_sizes_and_overlap(chunks_by_strategy):
    chunks = chunks_by_strategy["recursive-1000-200"]
    assert all(len(c.text) <= 1000 for c in chunks)
    overlaps = [a.char_end - b.char_start for a, b in zip(chunks, chunks[1:])]
    assert all(o <= 200 for o in overlaps)
    assert sum(o > 0 for o in overlaps) >= 3  # long paragraphs are split with overlap
    assert max(len(c.text) for c in chunks) > 800


def test_recursive_split_prefers_coarse_separators():
    text = "aaaa bbbb\n\ncccc dddd\neeee"
    spans = recursive_split(text, 0, len(text), chunk_size=12, chunk_overlap=0)
    assert [text[s:e].strip() for s, e in spans] == ["aaaa bbbb", "cccc dddd", "eeee"]
    long_word = "x" * 25
    spans = recursive_split(long_word, 0, 25, chunk_size=10, chunk_overlap=4)
    assert all(e - s <= 10 for s, e in spans) and spans[0][0] == 0 and spans[-1][1] == 25
    assert all(a[1] > b[0] for a, b in zip(spans, spans[1:]))  # character fallback keeps overlap


def test_sentence_window_bounds_and_dedup(chunks_by_strategy):
    chunks = chunks_by_strategy["sentence-window-4-2"]
    assert all(150 <= len(c.text) <= 2048 for c in chunks)
    assert len({c.text for c in chunks}) == len(chunks)

    block = " ".join(f"Sentence number {i} talks about the weather in some detail today." for i in range(4))
    repeated = doc_from(block, block, block, "Tiny one. Tiny two. Tiny three. Tiny four.")
    cfg = SHIPPED["sentence-window-4-2"]
    no_dedup = parse_strategy("nd", {"kind": "sentence-window", **cfg.params.model_dump(), "dedup": False})
    with_dups = get_chunker("nd", {"nd": no_dedup}).chunk(repeated)
    deduped = chunk_document(repeated, "sentence-window-4-2", SHIPPED)
    assert len({c.text for c in with_dups}) < len(with_dups)
    assert len({c.text for c in deduped}) == len(deduped) < len(with_dups)
    # Windows over the short tail are under 150 chars and dropped.
    assert not any("Tiny four" in c.text and "weather" not in c.text for c in deduped)

    too_long = doc_from(" ".join(f"Word{i} " * 120 + "end." for i in range(4)))
    assert chunk_document(too_long, "sentence-window-4-2", SHIPPED) == []


def test_sliding_window_overlap_is_half():
    prose = make_prose_doc()
    chunks = chunk_document(prose, "sliding-1024", SHIPPED)
    tok = get_tokenizer("regex")
    assert len(chunks) >= 4
    assert all(c.n_tokens <= 1024 for c in chunks)
    assert all(c.n_tokens == 1024 for c in chunks[:-1])
    for a, b in zip(chunks, chunks[1:]):
        shared = tok.count(prose.canonical_text[b.char_start : a.char_end])
        assert 0.45 <= shared / a.n_tokens <= 0.55


def test_paragraph_merges_short_and_splits_long(doc, chunks_by_strategy):
    chunks = chunks_by_strategy["paragraph"]
    assert all(len(c.text) <= 2000 for c in chunks)
    assert any("A short paragraph." in c.text and len(c.text) > 100 for c in chunks)
    # Titles (short) travel with the paragraph after them.
    assert not any(c.text in {"Introduction", "Background", "Results"} for c in chunks)
    assert all(len(c.text) >= 100 for c in chunks)


def test_section_low_vs_high(doc, chunks_by_strategy):
    low, high = chunks_by_strategy["section-low"], chunks_by_strategy["section-high"]
    titles = {el.char_start: el for el in doc.elements if el.type == "title"}
    low_title_starts = {c.char_start for c in low} & set(titles)
    high_title_starts = {c.char_start for c in high} & set(titles)
    assert low_title_starts == set(titles)
    top = sorted(s for s, el in titles.items() if el.heading_level == 1) + [len(doc.canonical_text)]
    assert high_title_starts >= set(top[:-1])
    # A lower title starts a high chunk only where its top-level section had to be sub-split.
    for s in high_title_starts - set(top):
        section_start, section_end = max(t for t in top if t < s), min(t for t in top if t > s)
        assert section_end - section_start > 4000
    assert len(low) > len(high)
    assert all(len(c.text) <= 4000 for c in low + high)
    # The >4000-char "Results" section is sub-split in both.
    assert sum(c.section_path == ["Results"] for c in high) >= 2
    details = next(c for c in low if c.text.startswith("Details"))
    assert details.section_path == ["Methods", "Setup", "Details"]
    data = next(c for c in low if c.text.startswith("Data"))
    assert data.section_path == ["Introduction", "Data"]


def test_section_high_uses_smallest_level_present():
    D = ElementDraft
    drafts = [
        D(type="title", text="A", heading_level=2),
        D(type="narrative", text="Alpha text here."),
        D(type="title", text="A.1", heading_level=3),
        D(type="narrative", text="Sub text here."),
        D(type="title", text="B", heading_level=2),
        D(type="narrative", text="Beta text here."),
    ]
    d = assemble(drafts, doc_id="lv", source_path="/x", content_hash="h", parser="t", n_pages=1)
    assert [c.text.split("\n")[0] for c in chunk_document(d, "section-high", SHIPPED)] == ["A", "B"]
    assert len(chunk_document(d, "section-low", SHIPPED)) == 3


def test_page_one_chunk_per_page(doc, chunks_by_strategy):
    chunks = chunks_by_strategy["page"]
    assert [(c.page_start, c.page_end) for c in chunks] == [(p, p) for p in range(1, 5)]


def test_whole_document(doc, chunks_by_strategy):
    (chunk,) = chunks_by_strategy["whole-document"]
    assert chunk.text == doc.canonical_text.strip()
    assert (chunk.page_start, chunk.page_end) == (1, 4)


_COOKING = [
    "Knead the bread dough on a floured board for ten minutes.",
    "The yeast needs warm water and a pinch of sugar to rise.",
    "Bake the loaf in a hot oven until the crust turns golden brown.",
    "Butter and flour make a simple roux for the creamy sauce.",
    "Slice the onions and garlic before frying them in olive oil.",
    "Season the soup with salt, pepper and fresh basil leaves.",
    "Let the cake cool before spreading the chocolate frosting.",
    "A sharp kitchen knife makes chopping vegetables much easier.",
]
_SPACE = [
    "The telescope observed distant galaxies beyond the Milky Way.",
    "Astronauts aboard the space station orbit Earth every ninety minutes.",
    "Jupiter is the largest planet and has dozens of moons.",
    "A rocket must reach orbital velocity to escape the atmosphere.",
    "Black holes bend light with their enormous gravitational pull.",
    "The Mars rover collected rock samples from an ancient crater.",
    "Solar flares send charged particles toward the planets.",
    "Astronomers measure the distance to stars in light years.",
]


def test_semantic_splits_at_topic_change():
    topic_doc = doc_from(" ".join(_COOKING) + " " + " ".join(_SPACE), doc_id="topics")
    chunks = chunk_document(topic_doc, "semantic", SHIPPED)  # real wordllama embedder
    check_invariants(topic_doc, chunks, "semantic")
    assert len(chunks) >= 2
    change = topic_doc.canonical_text.index(_SPACE[0])
    assert change in {c.char_start for c in chunks}
    for c in chunks:
        assert not (any(s in c.text for s in _COOKING) and any(s in c.text for s in _SPACE))
        assert len(c.text) >= 200  # the shipped min_chars


class _FakeEmbedder:
    """Topic vectors by keyword: proves injection is honoured and no model is loaded."""

    name = "fake"

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return np.array([[t.count("apple") + 0.01, t.count("comet") + 0.01] for t in texts], dtype=np.float32)


def test_semantic_uses_injected_embedder():
    d = doc_from(" ".join(["I ate an apple."] * 6 + ["I saw a comet."] * 6))
    fake = _FakeEmbedder()
    # The sentences are tiny, so the minimum chunk size is lifted to let the topic cut happen.
    tiny = {"semantic-tiny": parse_strategy("semantic-tiny", {"kind": "semantic", "min_chars": 0})}
    chunks = get_chunker("semantic-tiny", tiny, embedder=fake).chunk(d)
    assert fake.calls == 1
    assert d.canonical_text.index("I saw a comet.") in {c.char_start for c in chunks}


# --------------------------------------------------------------------------------------------------
# Shared builder, sentences, tokens
# --------------------------------------------------------------------------------------------------


def test_build_chunks_ids_tables_and_headers(doc):
    table = next(el for el in doc.elements if el.type == "table")
    rows = row_spans(doc)
    # A span inside row 10 .. inside row 20: snapped to whole rows, header added to the HTML.
    r10, r20 = rows[10], rows[20]
    tok = get_tokenizer()
    (chunk,) = build_chunks(doc, "t", [(r10[0] + 3, r20[1] - 2)], tok)
    assert chunk.char_start == r10[0] and chunk.char_end == r20[1]
    assert chunk.chunk_id == hashlib.sha256(f"{doc.doc_id}|t|{r10[0]}|{r20[1]}".encode()).hexdigest()[:32]
    assert chunk.table_html.startswith("<table><tr><th>Year</th>")
    assert chunk.table_html.count("<tr>") == 1 + 11
    assert chunk.section_path == ["Introduction", "Data"]
    assert chunk.page_start == chunk.page_end == table.page
    # Whitespace-only and out-of-range spans vanish; duplicates collapse.
    sep = doc.elements[0].char_end
    assert build_chunks(doc, "t", [(sep, sep + 2), (5, 5)], tok) == []
    assert len(build_chunks(doc, "t", [(0, 12), (0, 12), (0, 14)], tok)) == 1


def test_split_sentences():
    text = "Dr. Smith paid $3.50 today. It rained! Did it? Yes, e.g. twice. 2020 was odd. the end"
    got = [text[s:e] for s, e in split_sentences(text)]
    assert got == ["Dr. Smith paid $3.50 today.", "It rained!", "Did it?", "Yes, e.g. twice.", "2020 was odd. the end"]
    assert split_sentences("  Hello world.  ", offset=10) == [(12, 24)]
    text = "See No. 5 and Fig. 2 here. The answer was no. Then:\n\u2022 first item\n\u2022 second."
    got = [text[s:e] for s, e in split_sentences(text)]
    assert got == ["See No. 5 and Fig. 2 here.", "The answer was no.", "Then:", "\u2022 first item", "\u2022 second."]
    assert split_sentences("\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4. \ub2e4\uc74c \ubb38\uc7a5.") == [
        (0, 10),
        (11, 17),
    ]


def test_tokenizers():
    regex = get_tokenizer("regex")
    assert regex.count("Hello, world!") == 4
    assert regex.spans("ab cd") == [(0, 2), (3, 5)]
    wp = get_tokenizer("wordpiece")
    text = "Tokenization of unbelievable words " * 100  # longer than the model's 128 limit
    spans = wp.spans(text)
    assert wp.count(text) == len(spans) > 128
    assert text[spans[0][0] : spans[0][1]].lower() == "token"


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "chunking.yaml"
    path.write_text(body)
    return path


def test_unknown_strategy_name_is_clear():
    with pytest.raises(ChunkingConfigError, match="unknown chunking strategy 'nope'.*fixed-512"):
        get_chunker("nope", SHIPPED)


@pytest.mark.parametrize(
    "body, pattern",
    [
        ("strategies:\n  s1:\n    kind: bogus\n", r"strategy 's1': unknown kind 'bogus' \(known: .*sentence-pack"),
        (
            "strategies:\n  s2:\n    kind: sentence-pack\n    max_tokenz: 5\n",
            r"strategy 's2'.*max_tokenz: Extra inputs",
        ),
        (
            "strategies:\n  s3:\n    kind: recursive\n    chunk_size: 100\n    chunk_overlap: 100\n",
            r"'s3'.*chunk_overlap \(100\) must be smaller",
        ),
        ("strategies:\n  s4:\n    kind: sliding-window\n    window_tokens: lots\n", r"'s4'.*window_tokens"),
        ("strategies:\n  s5:\n    max_tokens: 5\n", r"'s5': missing 'kind'"),
        ("strategies:\n  s6:\n    kind: semantic\n    embedder: gpt\n", r"'s6'.*unknown embedder 'gpt'"),
        ("strategies:\n  s7:\n    kind: page\n    tokenizer: bpe\n", r"'s7'.*unknown tokenizer 'bpe'"),
        ("strategies:\n  Bad Name:\n    kind: page\n", r"strategy 'Bad Name'"),
        ("not_strategies: {}\n", r"top-level 'strategies:'"),
        ("strategies: [\n", r"invalid YAML"),
        ("strategies:\n  p:\n    kind: page\n  p:\n    kind: whole-document\n", r"duplicate key 'p'"),
    ],
)
def test_bad_config_errors_name_file_and_strategy(tmp_path, body, pattern):
    path = _write(tmp_path, body)
    with pytest.raises(ChunkingConfigError, match=pattern) as err:
        load_strategies(path)
    assert str(path) in str(err.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ChunkingConfigError, match="not found"):
        load_strategies(tmp_path / "absent.yaml")


def test_env_var_selects_config(tmp_path, monkeypatch, doc):
    path = _write(tmp_path, "strategies:\n  only-pages:\n    kind: page\n")
    monkeypatch.setenv("RAG_CHUNKING_CONFIG", str(path))
    assert list(load_strategies()) == ["only-pages"]
    assert len(chunk_document(doc, "only-pages")) == 4


def test_fingerprint_tracks_kind_and_params():
    a = parse_strategy("a", {"kind": "sentence-pack", "max_tokens": 512})
    same_renamed = parse_strategy("b", {"kind": "sentence-pack", "max_tokens": 512})
    explicit_default = parse_strategy("c", {"kind": "sentence-pack", "max_tokens": 512, "tokenizer": "regex"})
    changed = parse_strategy("a", {"kind": "sentence-pack", "max_tokens": 256})
    assert strategy_fingerprint(a) == strategy_fingerprint(same_renamed) == strategy_fingerprint(explicit_default)
    assert strategy_fingerprint(a) != strategy_fingerprint(changed)
    assert strategy_fingerprint(SHIPPED["section-low"]) != strategy_fingerprint(SHIPPED["section-high"])
    assert len({strategy_fingerprint(c) for c in SHIPPED.values()}) == len(SHIPPED)
    assert get_chunker("fixed-512", SHIPPED).fingerprint == strategy_fingerprint(SHIPPED["fixed-512"])
    for name, config in SHIPPED.items():
        assert parse_strategy(name, config.to_mapping()) == config


def test_rag_never_imports_dagster():
    import re

    pattern = re.compile(r"^\s*(import|from)\s+dagster", re.M)
    for package in ("chunking", "embedding"):
        for path in (REPO / "rag" / package).rglob("*.py"):
            assert not pattern.search(path.read_text()), path


# --------------------------------------------------------------------------------------------------
# Real documents (the shared PDF set, parsed by rag.parsing)
# --------------------------------------------------------------------------------------------------

SHARED_PDFS = Path(__file__).resolve().parents[2] / "shared/datasets/pdfs"


@pytest.fixture(scope="module")
def real_docs() -> list[ParsedDocument]:
    from rag.parsing import parse_file
    from rag.parsing.errors import ParseError

    docs = []
    for path in sorted(SHARED_PDFS.glob("*.pdf")):
        try:
            docs.append(parse_file(path))
        except ParseError:
            continue  # encrypted, scanned, ...: quarantined by the parser, nothing to chunk
    assert docs
    return docs


@pytest.mark.slow  # parsing the 20 shared PDFs takes about 35 s: the invariant tests above check every strategy
@pytest.mark.skipif(not SHARED_PDFS.is_dir(), reason="shared PDF dataset not present")
@pytest.mark.parametrize("name", SHIPPED_NAMES)
def test_every_strategy_on_shared_pdfs(real_docs, name):
    chunker = get_chunker(name, SHIPPED)
    for d in real_docs:
        check_invariants(d, chunker.chunk(d), name)
