"""Indexes over chunk sets: a BM25 index per strategy and a Qdrant collection per (strategy, model)."""
