"""The annotation queue: (question, passage) pairs chosen for experts to label, most useful first.

One JSON file per data dir (`<data>/annotation/queue.json`), replaced atomically on every refresh so the expert
view never reads a torn queue. An item's id is stable for the same (question, chunk), so a label given before a
refresh still marks the item as done after it.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from rag.store import atomic_write


def item_id(question: str, chunk_id: str) -> str:
    """Stable id of a (question, chunk) pair: the same pair keeps its id across refreshes."""
    normalized = " ".join(question.lower().split())
    return hashlib.sha256(f"{normalized}\x1f{chunk_id}".encode()).hexdigest()[:16]


class QueueItem(BaseModel):
    item_id: str
    question: str
    query_id: str | None = Field(None, description="the production query it came from; None for a synthetic question")
    source: Literal["production", "synthetic", "gate"] = Field(
        description="production: a question people asked; synthetic: a generated one; gate: a held-out question "
        "people asked, with a passage the gate could not judge (rag.annotation.pool)"
    )
    chunk_id: str
    doc_id: str
    text: str = Field(description="the passage text as the pipeline serves it")
    page_start: int | None = None
    page_end: int | None = None
    uncertainty: float = Field(description="how unsure the pipeline is about this pair (higher first); see signals")
    signals: dict[str, float] = Field(default_factory=dict, description="the uncertainty signals that made the score")


class AnnotationQueue(BaseModel):
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    strategy: str = Field(description="chunking strategy whose passages the items are")
    selection: str = Field(description="how items were chosen: active (uncertainty + diversity), uncertainty, random")
    config: dict = Field(default_factory=dict, description="the run config that built it (size, weights, quotas)")
    items: list[QueueItem] = Field(default_factory=list)


def queue_path(root: Path) -> Path:
    return Path(root) / "annotation" / "queue.json"


def write_queue(root: Path, queue: AnnotationQueue) -> Path:
    path = queue_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: fh.write(queue.model_dump_json(indent=1)), mode="w")
    return path


def read_queue(root: Path) -> AnnotationQueue | None:
    """The current queue, or None when none was built yet (materialize `annotation_queue`)."""
    path = queue_path(root)
    if not path.exists():
        return None
    return AnnotationQueue.model_validate(json.loads(path.read_text(encoding="utf-8")))
