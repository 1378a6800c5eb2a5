"""Overview questions: about the collection or a whole document rather than a fact inside one.

"What is this document collection about?", "Summarize the documents", "What does handbook-1p.docx cover?" retrieve
passages no better than any other question, and the extractive generator rightly finds no sentence answering them.
Such a question is detected by a small explicit rule set and answered from the documents' openings instead:

- detection (`detect_overview`): the question holds a *cue* word (summary/summarize/overview/about/cover/...), and
  every other word is a filler word, a word naming the collection (documents, files, collection, ...) or a word of
  one document's name (its file name or title). Without any such leftover word it asks about the whole collection
  (a weak cue such as "about" or "cover" then also needs a word naming the documents, or "this"/"it"); with
  leftover words it asks about the documents whose names hold all of them. Anything else is an ordinary question:
  "What does the directive say about the flight control computer?" keeps "flight control computer" over.
- extractive answer (`extractive_overview`): each document's title and its first meaningful sentence (the first few
  for a single named document), each citing the chunk it came from.
- LLM answer (`llm_overview`): map-reduce. Map: one call per document summarising its first chunks; reduce: one call
  combining the summaries into the answer. Citations are the passage labels the model gives back.

Documents, titles and opening chunks come from the index's chunk table (`Catalog.from_chunks`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pandas as pd

from rag.llm import LLM, Message
from rag.parsing.models import TABLE_CELL_SEPARATOR
from rag.qa.attribution import passage_sentences
from rag.qa.generators import Generation
from rag.qa.models import NOT_IN_CONTEXT, OverviewSettings
from rag.qa.parse import ParsedAnswer, parse_answer
from rag.qa.prompt import ROLE, Passage, format_context, label_passages, pages
from rag.retrieval import Hit

# --- detection -----------------------------------------------------------------------------------------------------
# A cue that alone asks for an overview ("Summarize.", "Give me an overview").
STRONG_CUES = frozenset(
    "summary summaries summarize summarise summarizes summarises summarizing summarising summarization summarisation "
    "overview overviews gist topics themes outline".split()
)
# A cue that needs the documents named ("What are these files about?", "What does the handbook cover?").
WEAK_CUES = frozenset(
    "about cover covers covered covering contain contains discuss discusses describe describes".split()
)
OVERVIEW_CUES = STRONG_CUES | WEAK_CUES  # a question holding none of these is never an overview question
# Words naming the collection or a document in general.
REFERENCE_WORDS = frozenset(
    "document documents doc docs file files collection collections corpus library pdf pdfs source sources material "
    "materials text texts paper papers report reports book books article articles content contents dataset archive "
    "knowledge base set".split()
)
# "What is this about?": a pronoun stands in for the documents.
POINTERS = frozenset("this these it they".split())
# Words that shape the request without saying what it is about.
FILLER = frozenset(
    "what whats which is are was were be been the a an this these those that of in on for to from me you your my our "
    "i we us it its they their them can could would will please give tell provide show do does did all each every "
    "whole entire main key general brief briefly short quick quickly high level and or with there here available "
    "have has s so far list kind kinds type types sort sorts overall broad big picture let know want like some any "
    "mostly mainly generally".split()
)
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("'", ""))


@dataclass(frozen=True)
class OverviewRequest:
    doc_ids: tuple[str, ...] | None  # None: the whole collection
    rule: str  # which rule decided: "collection" or "named"


def detect_overview(question: str, catalog: Catalog | None = None) -> OverviewRequest | None:
    """The overview `question` asks for, or None for an ordinary question. `catalog` lets a question name a document
    by its file name or title; without one only questions about the whole collection are detected."""
    present = set(words(question))
    strong = present & STRONG_CUES
    if not present & OVERVIEW_CUES:
        return None
    leftover = present - FILLER - REFERENCE_WORDS - OVERVIEW_CUES
    if not leftover:
        if strong or present & (REFERENCE_WORDS | POINTERS):
            return OverviewRequest(None, "collection")
        return None
    if catalog is None:
        return None
    named = tuple(d.doc_id for d in catalog.documents if leftover <= d.name_words)
    return OverviewRequest(named, "named") if named else None


# --- the documents ---------------------------------------------------------------------------------------------
@dataclass
class Document:
    doc_id: str
    title: str
    chunks: Sequence[dict]  # its first chunks, in text order
    name_words: frozenset[str] = field(default_factory=frozenset)

    @property
    def label(self) -> str:
        name = PurePosixPath(self.doc_id).name
        return self.doc_id if self.title in (name, self.doc_id) else f"{self.title} ({self.doc_id})"


def heading(chunk: dict) -> str | None:
    """The first heading of a chunk's section path, None when it names none."""
    path = chunk.get("section_path")
    for name in list(path) if path is not None and not isinstance(path, str) else []:
        if isinstance(name, str) and name.strip():
            return " ".join(name.split())
    return None


def _title(doc_id: str, chunks: Sequence[dict]) -> str:
    """The first heading of the document (its chunks' section path), else its file name."""
    for c in chunks:
        if (title := heading(c)) is not None:
            return title
    return PurePosixPath(doc_id).name


class OpeningChunks(Sequence):
    """A document's opening chunks read when used (each time: an answer shows a few documents of many), so a catalog
    of every document holds no chunk text (rag.retrieval.chunks.PayloadChunks.catalog)."""

    def __init__(self, load: Callable[[], list[dict]]):
        self._load = load

    def __getitem__(self, i):
        return self._load()[i]

    def __iter__(self) -> Iterator[dict]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


@dataclass
class Catalog:
    documents: list[Document]

    @classmethod
    def from_chunks(cls, chunks: pd.DataFrame, per_document: int = 8) -> Catalog:
        """From a chunk table indexed by chunk_id (rag.retrieval.Index.chunks): each document with its first
        `per_document` chunks, documents in doc_id order."""
        if chunks is None or chunks.empty:
            return cls([])
        table = chunks.reset_index().rename(columns={"index": "chunk_id"})
        table = table.sort_values(["doc_id", "char_start", "char_end"], kind="stable")
        # One to_dict over every kept row, grouped in Python: a to_dict per document took 14 s on SciFact's 5,183
        # documents, paid by the first overview question an API process answered.
        by_doc: dict[str, list[dict]] = {}
        for record in table.groupby("doc_id", sort=True).head(per_document).to_dict("records"):
            by_doc.setdefault(str(record["doc_id"]), []).append(record)
        documents = []
        for doc_id in sorted(by_doc):
            records = by_doc[doc_id]
            title = _title(doc_id, records)
            documents.append(Document(doc_id, title, records, frozenset(words(doc_id) + words(title))))
        return cls(documents)

    @classmethod
    def from_openings(
        cls, documents: dict[str, tuple[str | None, str]], opening: Callable[[str], list[dict]]
    ) -> Catalog:
        """From each document's (title or None, first chunk id), documents in doc_id order; `opening(first chunk id)`
        reads a document's first chunks when an answer shows it. A document without a title gets its file name."""
        out = []
        for doc_id in sorted(documents):
            title, first = documents[doc_id]
            title = title or _title(doc_id, [])
            chunks = OpeningChunks(lambda first=first: opening(first))
            out.append(Document(doc_id, title, chunks, frozenset(words(doc_id) + words(title))))
        return cls(out)

    def select(self, request: OverviewRequest) -> list[Document]:
        if request.doc_ids is None:
            return list(self.documents)
        wanted = set(request.doc_ids)
        return [d for d in self.documents if d.doc_id in wanted]


def _meaningful(sentence: str, title: str) -> bool:
    """A sentence that says something: not a table row, a heading, the title or a line of page furniture."""
    s = sentence.strip()
    if TABLE_CELL_SEPARATOR in s or len(s.split()) < 5 or s.rstrip(".:") == title.rstrip(".:"):
        return False
    letters = [ch for ch in s if ch.isalpha()]
    if len(letters) < 0.6 * len(s.replace(" ", "")):
        return False
    return sum(ch.isupper() for ch in letters) < 0.7 * len(letters)  # an all-caps line is a header


def opening(document: Document, n: int = 1) -> list[tuple[dict, str]]:
    """The document's first `n` meaningful sentences with their chunks; its first sentence when none is."""
    sentences = [(chunk, s.strip()) for chunk in document.chunks for s in passage_sentences(chunk.get("text") or "")]
    return [(c, s) for c, s in sentences if _meaningful(s, document.title)][:n] or sentences[:1]


# --- answers ---------------------------------------------------------------------------------------------------
def _passages(chunks: list[dict]) -> list[Passage]:
    """Each chunk once, labelled [1], [2], ... in order (the rank is its place in the answer)."""
    unique = list({c["chunk_id"]: c for c in chunks}.values())
    return label_passages([Hit(i, 1.0, c) for i, c in enumerate(unique, start=1)])


def _not_found() -> tuple[list[Passage], Generation]:
    return [], Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True))


def extractive_overview(
    request: OverviewRequest, catalog: Catalog, settings: OverviewSettings
) -> tuple[list[Passage], Generation]:
    """Titles and opening sentences, each citing its chunk. The answer text carries no citation marks (like every
    answer of the pipeline); each line names its document and pages, and the cited chunks come back as passages."""
    documents = catalog.select(request)
    shown = documents[: settings.max_documents]
    n = settings.sentences if request.rule == "named" and len(shown) == 1 else 1
    lines: list[tuple[Document, list[tuple[dict, str]]]] = [(d, opening(d, n)) for d in shown]
    lines = [(d, quoted) for d, quoted in lines if quoted]
    if not lines:
        return _not_found()
    passages = _passages([chunk for _, quoted in lines for chunk, _ in quoted])
    label_of = {p.chunk_id: p.label for p in passages}
    if request.rule == "named" and len(lines) == 1:
        document, quoted = lines[0]
        text = f"{document.label} begins: " + " ".join(s for _, s in quoted) + f" ({pages(quoted[0][0])})"
        raw = text + "".join(f" [{label_of[c['chunk_id']]}]" for c in {c["chunk_id"]: c for c, _ in quoted}.values())
    else:
        plural = "s" if len(documents) != 1 else ""
        head = (
            (
                f"The collection holds {len(documents)} document{plural}"
                if request.rule == "collection"
                else f"{len(documents)} document{plural} match"
            )
            + (f" ({len(shown)} listed)" if len(shown) < len(documents) else "")
            + ":"
        )
        body = [
            (f"- {d.label}, {pages(quoted[0][0])}: {quoted[0][1]}", label_of[quoted[0][0]["chunk_id"]])
            for d, quoted in lines
        ]
        text = "\n".join([head] + [line for line, _ in body])
        raw = "\n".join([head] + [f"{line} [{label}]" for line, label in body])
    cited = list(label_of)
    return passages, Generation(raw, ParsedAnswer(text, cited, False))


MAP_TASK = (
    "Summarise what the document below is about in one to three sentences, using only its passages. Cite the "
    "passages you use by their ids in square brackets, e.g. [1] or [2][3]."
)
REDUCE_TASK = (
    "Below are summaries of documents from a collection, with passage ids in square brackets. Answer the "
    "question with an overview of the documents using only these summaries, keeping the passage ids of "
    "every statement in square brackets."
)


def map_messages(document: Document, passages: list[Passage]) -> list[Message]:
    user = f"{MAP_TASK}\n\nDocument: {document.label}\n\nPassages:\n{format_context(passages)}\n\nSummary:"
    return [{"role": "system", "content": ROLE}, {"role": "user", "content": user}]


def reduce_messages(question: str, summaries: list[tuple[Document, str]]) -> list[Message]:
    listed = "\n\n".join(f"Document: {d.label}\nSummary: {summary}" for d, summary in summaries)
    user = f"{REDUCE_TASK}\n\n{listed}\n\nQuestion: {question}\nAnswer:"
    return [{"role": "system", "content": ROLE}, {"role": "user", "content": user}]


def llm_overview(
    question: str,
    request: OverviewRequest,
    catalog: Catalog,
    settings: OverviewSettings,
    llm: LLM,
    max_new_tokens: int = 128,
) -> tuple[list[Passage], Generation]:
    """Map: one LLM call per document on its first `map_chunks` chunks; reduce: one call combining the summaries.
    Passages are labelled across all documents, so the reduce step's citations resolve to chunks. A map reply that
    says the passages hold nothing is left out of the reduce step; when the reduce reply cites nothing, the answer
    cites the chunks the kept summaries cited (or were made from)."""
    documents = catalog.select(request)[: settings.max_documents]
    passages = _passages([c for d in documents for c in d.chunks[: settings.map_chunks]])
    by_doc: dict[str, list[Passage]] = {}
    for p in passages:
        by_doc.setdefault(p.chunk["doc_id"], []).append(p)
    labels = {p.label: p.chunk_id for p in passages}
    label_of = {cid: label for label, cid in labels.items()}
    stop = ["\nQuestion:", "\nDocument:"]
    messages: list[Message] = []
    summaries: list[tuple[Document, str]] = []
    used: list[str] = []
    for document in documents:
        own = by_doc.get(document.doc_id, [])
        if not own:
            continue
        sent = map_messages(document, own)
        messages += sent
        parsed = parse_answer(
            llm.chat(sent, max_new_tokens=max_new_tokens, stop=stop), {p.label: p.chunk_id for p in own}
        )
        if parsed.not_in_context:
            continue
        cited = parsed.cited_chunk_ids or [p.chunk_id for p in own]
        used += [c for c in cited if c not in used]
        summaries.append((document, parsed.answer + " " + "".join(f"[{label_of[c]}]" for c in cited)))
    if not summaries:
        return passages, Generation("", ParsedAnswer(NOT_IN_CONTEXT, [], True), messages)
    sent = reduce_messages(question, summaries)
    messages += sent
    raw = llm.chat(sent, max_new_tokens=2 * max_new_tokens, stop=["\nQuestion:"])
    parsed = parse_answer(raw, labels)
    if not parsed.not_in_context and not parsed.cited_chunk_ids:
        parsed = ParsedAnswer(parsed.answer, used, False)
    return passages, Generation(raw, parsed, messages)
