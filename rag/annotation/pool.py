"""The gate's pool: (held-out question, passage) pairs that would tell a candidate from production but that nobody
rated, for experts to grade first.

People rate what production showed them, so a gate on their held-out questions sees a candidate's new passages as
unjudged. After a verdict short of better, the pipeline writes the pairs either model ranks high and the other does
not (rag.training.gate.unjudged_pairs) to `<data dir>/annotation/gate_pool/<kind>.json`, replaced by each gate of
that kind; the annotation queue puts them first, and the experts' grades join those questions' judgments
(rag.training.data.split_feedback) for the next verdict.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field

from rag.store import atomic_write


class PoolItem(BaseModel):
    question: str = Field(description="the held-out question as people asked it")
    chunk_id: str
    doc_id: str
    text: str
    page_start: int | None = None
    page_end: int | None = None
    side: str = Field(description="whose top it is in: candidate or production")
    rank: int = Field(description="its rank there, from 1")


class GatePool(BaseModel):
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    kind: str
    candidate: str = Field(description="the candidate version the gate compared")
    against: str = Field(description="what it was compared with (production)")
    outcome: str = Field(description="the verdict the pairs could change")
    strategy: str | None = None
    items: list[PoolItem] = Field(default_factory=list)


def pool_dir(root: Path) -> Path:
    return Path(root) / "annotation" / "gate_pool"


def write_pool(root: Path, pool: GatePool) -> Path:
    path = pool_dir(root) / f"{pool.kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: fh.write(pool.model_dump_json(indent=1)), mode="w")
    return path


def clear_pool(root: Path, kind: str) -> None:
    """A verdict of better settles the kind's pool: its candidate is promoted, the pairs decide nothing now."""
    (pool_dir(root) / f"{kind}.json").unlink(missing_ok=True)


def read_pools(root: Path) -> list[GatePool]:
    """Every kind's pool, newest first. A file that does not parse is skipped: a pool only orders the queue."""
    pools = []
    for path in sorted(pool_dir(root).glob("*.json")):
        try:
            pools.append(GatePool.model_validate(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue
    return sorted(pools, key=lambda p: p.created_at, reverse=True)


def _page(value) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def pool_of(pairs: list, queries: dict[str, str], chunks: pd.DataFrame, **about) -> GatePool:
    """`pairs`: rag.training.gate.UnjudgedPair rows; `queries`: gate question id -> text; `chunks`: the chunk set
    they were ranked from (a pair whose chunk it lacks is left out). `about`: kind, candidate, against, outcome,
    strategy."""
    rows = chunks.set_index("chunk_id")
    items = []
    for pair in pairs:
        if pair.passage not in rows.index or pair.qid not in queries:
            continue
        chunk = rows.loc[pair.passage]
        items.append(
            PoolItem(
                question=queries[pair.qid],
                chunk_id=str(pair.passage),
                doc_id=str(chunk["doc_id"]),
                text=str(chunk["text"]),
                page_start=_page(chunk.get("page_start")),
                page_end=_page(chunk.get("page_end")),
                side=pair.side,
                rank=pair.rank,
            )
        )
    return GatePool(items=items, **about)


__all__ = ["GatePool", "PoolItem", "clear_pool", "pool_dir", "pool_of", "read_pools", "write_pool"]
