"""Pure library of the document-QA pipeline. Nothing here imports Dagster."""


def __getattr__(name: str):
    # `rag.search` is the configuration-search package, and calling it is the retrieval search promised in the
    # README (`rag.search(query, strategy=, model=, mode=, k=)`; see rag/search/__init__.py). Importing it on first
    # access keeps `import rag; rag.search(...)` working without an explicit `import rag.search`.
    if name == "search":
        import importlib

        return importlib.import_module("rag.search")
    raise AttributeError(f"module 'rag' has no attribute {name!r}")
