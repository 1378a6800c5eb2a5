"""The steps between retrieval and the prompt: filter, add neighbouring chunks, order for a long context.

Each step takes and returns `Hit`s, so a pipeline is a list of steps and any of them can be left out.
"""

from __future__ import annotations

from rag.retrieval import Hit, Index


def filter_hits(hits: list[Hit], *, top_k: int | None = None, min_score: float | None = None) -> list[Hit]:
    """The first `top_k` hits (in the given order) whose score is at least `min_score`; ranks are kept."""
    kept = [h for h in hits if min_score is None or float(h.score) >= min_score]
    return kept[:top_k] if top_k is not None else kept


def augment_prev_next(index: Index, hits: list[Hit]) -> list[Hit]:
    """Each hit preceded by its previous and followed by its next chunk (via prev_chunk_id / next_chunk_id),
    so a passage cut mid-thought reaches the generator whole. A chunk appears once, at its first place;
    a neighbour inherits its hit's score and is marked `neighbour_of`. Ranks are renumbered 1..n."""
    seen: set[str] = set()
    out: list[Hit] = []

    def add(chunk: dict, score: float, neighbour_of: str | None) -> None:
        cid = chunk["chunk_id"]
        if cid in seen:
            return
        seen.add(cid)
        out.append(Hit(len(out) + 1, score, {**chunk, "neighbour_of": neighbour_of} if neighbour_of else chunk))

    hit_ids = {h.chunk["chunk_id"] for h in hits}
    # Every neighbour's record in one read (the chunk records may be the collection's payloads, read per hit).
    wanted = [h.chunk.get(key) for h in hits for key in ("prev_chunk_id", "next_chunk_id")]
    records = index.lookup.get_many([n for n in wanted if isinstance(n, str) and n not in hit_ids])
    for hit in hits:
        prev_id, next_id = hit.chunk.get("prev_chunk_id"), hit.chunk.get("next_chunk_id")
        # A neighbour that is itself a hit keeps its own place (and score) rather than riding along here.
        if isinstance(prev_id, str) and prev_id in records:
            add(records[prev_id], hit.score, hit.chunk["chunk_id"])
        add(hit.chunk, hit.score, None)
        if isinstance(next_id, str) and next_id in records:
            add(records[next_id], hit.score, hit.chunk["chunk_id"])
    return out


def reorder_long_context(hits: list[Hit]) -> list[Hit]:
    """Best passages at both ends, weakest in the middle ("lost in the middle": models read the start and end
    of a long context best). Input is in relevance order; ranks 1..5 come out as 1, 3, 5, 4, 2 and 1..4 as
    1, 3, 4, 2: the best first, the second best last. Ranks stay the relevance ranks, only the order changes."""
    return list(hits[0::2]) + list(reversed(hits[1::2]))
