"""Configuration search: which chunker × embedder × retrieval × post-processing serves a corpus best.

    from rag.tuning.space import load_space
    from rag.tuning.evaluate import PipelineEvaluator, Workspace
    from rag.tuning.runner import run_search
    outcome = run_search("genetic", PipelineEvaluator(Workspace(root), items), load_space(), budget=100)

Pieces: `space` (families, options, feasibility rules as data), `operators` (selection / crossover / mutation
registries), `optimizers` (grid, genetic), `preliminary` (embedder pre-ranking), `evaluate` (index and run
caches, fitness), `fitness` (persistent fitness cache, budget), `report`, `runner`, `active` (the served config).
"""
