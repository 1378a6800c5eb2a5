"""Configuration search: which chunker × embedder × retrieval × post-processing serves a corpus best.

    from rag.search.space import load_space
    from rag.search.evaluate import PipelineEvaluator, Workspace
    from rag.search.runner import run_search
    outcome = run_search("genetic", PipelineEvaluator(Workspace(root), items), load_space(), budget=100)

Pieces: `space` (families, options, feasibility rules as data), `operators` (selection / crossover / mutation
registries), `optimizers` (grid, genetic), `preliminary` (embedder pre-ranking), `evaluate` (index and run
caches, fitness), `fitness` (persistent fitness cache, budget), `report`, `runner`, `active` (the served config).

This package is also callable: `rag.search(query, strategy=..., model=..., mode=..., k=...)` is the retrieval
function the README promised before this package existed (see `_CallableModule` below).
"""
from __future__ import annotations

import sys
import types


class _CallableModule(types.ModuleType):
    # `rag.search` was a function before it became this package, and importing a submodule replaces a package
    # attribute of the same name. Making the module itself callable keeps both `import rag.search` (configuration
    # search) and `rag.search("question", strategy=...)` (retrieval) working.
    def __call__(self, query: str, *, strategy: str, model: str | None = "minilm", mode: str = "hybrid-rrf", k: int = 10,
                 **kwargs):
        """Ranked chunks for `query` from the index of (strategy, model); see rag.retrieval.service.search."""
        from rag.retrieval.service import search as _search

        return _search(query, strategy=strategy, model=model, mode=mode, k=k, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
