"""The answer prompt (the thesis's elements: role; task and output format; context with passage ids in brackets;
the question; the fixed reply when the context lacks the answer) and its inputs, the labelled passages.

Passages are labelled [1], [2], ... in prompt order rather than by chunk id: a 32-hex id is beyond what a small
model copies faithfully, and `parse.parse_answer` maps labels (or full chunk ids) back to chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from rag.llm import Message
from rag.parsing.models import TABLE_CELL_SEPARATOR
from rag.qa.models import NOT_IN_CONTEXT
from rag.retrieval import Hit

ROLE = (
    "You are a careful assistant that answers questions about a collection of documents, using only the passages "
    "given to you."
)
TASK = (
    "Answer the question using only the context passages below. Write a short answer (one to three sentences) and "
    "cite the passages that support it by their ids in square brackets right after the statement, e.g. [1] or [2][3]. "
    f'If the context does not contain the answer, reply exactly: "{NOT_IN_CONTEXT}"'
)
TASK_CLOSED_BOOK = (
    f'Answer the question in one to three sentences. If you do not know the answer, reply exactly: "{NOT_IN_CONTEXT}"'
)


@dataclass(frozen=True)
class Passage:
    label: str  # "1", "2", ... as shown in the prompt
    hit: Hit

    @property
    def chunk(self) -> dict:
        return self.hit.chunk

    @property
    def chunk_id(self) -> str:
        return self.hit.chunk["chunk_id"]


def label_passages(hits: list[Hit]) -> list[Passage]:
    return [Passage(str(i), hit) for i, hit in enumerate(hits, start=1)]


def passage_text(chunk: dict) -> str:
    """The chunk's text with its table rows given as HTML: models read an HTML table better than cells joined by
    " | " (the thesis's finding), so the row lines are replaced by the chunk's `table_html` where they stood."""
    text, html = chunk.get("text") or "", chunk.get("table_html")
    if not isinstance(html, str) or not html:
        return text
    out: list[str] = []
    placed = False
    for line in text.split("\n"):
        if TABLE_CELL_SEPARATOR in line:
            if not placed:
                out.append(html)
                placed = True
        else:
            out.append(line)
    if not placed:
        out.append(html)
    return "\n".join(out)


def pages(chunk: dict) -> str:
    start, end = int(chunk.get("page_start") or 1), int(chunk.get("page_end") or chunk.get("page_start") or 1)
    return f"page {start}" if start == end else f"pages {start}-{end}"


def format_context(passages: list[Passage]) -> str:
    return "\n\n".join(
        f"[{p.label}] ({p.chunk.get('doc_id', '?')}, {pages(p.chunk)})\n{passage_text(p.chunk)}" for p in passages
    )


def fit_context(hits: list[Hit], max_chars: int) -> list[Hit]:
    """Whole passages within the character budget: the lowest-scoring go first (a neighbouring chunk shares its
    hit's score, so a group goes together), the order is kept. The best passage always stays, even alone over
    budget (cut to the budget), so there is something to read."""
    if not hits:
        return []
    kept = sorted(hits, key=lambda h: (-float(h.score), h.rank))
    while len(kept) > 1 and sum(len(passage_text(h.chunk)) for h in kept) > max_chars:
        kept.pop()
    if len(kept) == 1 and len(passage_text(kept[0].chunk)) > max_chars:
        hit = kept[0]
        return [Hit(hit.rank, hit.score, {**hit.chunk, "text": hit.chunk["text"][:max_chars], "table_html": None})]
    ids = {h.chunk["chunk_id"] for h in kept}
    return [h for h in hits if h.chunk["chunk_id"] in ids]


def build_messages(question: str, passages: list[Passage] | None) -> list[Message]:
    """Chat messages for the answer; `passages=None` asks closed-book (the no-retrieval baseline)."""
    if passages is None:
        user = f"{TASK_CLOSED_BOOK}\n\nQuestion: {question}\nAnswer:"
    else:
        context = format_context(passages) if passages else "(no passages were found)"
        user = f"{TASK}\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:"
    return [{"role": "system", "content": ROLE}, {"role": "user", "content": user}]


def build_reflection_messages(question: str, passages: list[Passage], draft: str) -> list[Message]:
    """A critique-and-revise pass: keep a draft the context supports, otherwise rewrite it (same format)."""
    user = (
        f"{TASK}\n\nContext:\n{format_context(passages)}\n\nQuestion: {question}\n\nDraft answer: {draft}\n\n"
        "Check the draft against the context. If every statement is supported and cited, repeat the draft unchanged. "
        "Otherwise write the corrected answer in the same format.\nAnswer:"
    )
    return [{"role": "system", "content": ROLE}, {"role": "user", "content": user}]
