"""Pure library of the document-QA pipeline. Nothing here imports Dagster.

`rag.search(query, strategy=, model=, mode=, k=)` is the retrieval search (rag.retrieval.service.search); the
configuration search lives in `rag.tuning`.
"""

from __future__ import annotations


def search(query: str, *, strategy: str, model: str | None = "minilm", mode: str = "hybrid-rrf", k: int = 10, **kwargs):
    """Ranked chunks for `query` from the index of (strategy, model); see rag.retrieval.service.search."""
    # Imported on call, so `import rag` stays light (no embedder, index or Qdrant import).
    from rag.retrieval.service import search as _search

    return _search(query, strategy=strategy, model=model, mode=mode, k=k, **kwargs)
