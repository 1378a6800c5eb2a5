"""The chunk record shared by every chunking strategy and everything downstream."""

from __future__ import annotations

from pydantic import BaseModel


class Chunk(BaseModel):
    """A contiguous span of a document's canonical text.

    Invariant: `canonical_text[char_start:char_end] == text`, for every strategy. Overlapping
    strategies simply produce overlapping spans; nothing is prepended to `text` (headings travel in
    `section_path`), so answer spans located in the canonical text score any strategy.
    """

    chunk_id: str
    doc_id: str
    strategy: str
    text: str
    char_start: int
    char_end: int
    page_start: int
    page_end: int
    section_path: list[str]
    prev_chunk_id: str | None
    next_chunk_id: str | None
    n_tokens: int
    content_hash: str
    # HTML of the table rows this chunk contains (several tables are concatenated), None if no table.
    table_html: str | None = None
