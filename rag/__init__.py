"""Pure library of the document-QA pipeline. Nothing here imports Dagster."""


def search(query: str, *, strategy: str, model: str | None = "minilm", mode: str = "hybrid-rrf", k: int = 10, **kwargs):
    """Ranked chunks for `query` from the index of (strategy, model); see rag.retrieval.service.search."""
    from rag.retrieval.service import search as _search

    return _search(query, strategy=strategy, model=model, mode=mode, k=k, **kwargs)
