"""bench/edge_latency.py's data helpers: N rows of noise copies with unique ids and the real texts, unit vectors,
and the numpy exact top-k that recall is measured against."""
import numpy as np
import pandas as pd

from bench.edge_latency import chunk_table, exact_top, points_matrix


def test_copies_have_unique_ids_real_texts_and_unit_vectors():
    corpus = pd.DataFrame({"chunk_id": ["a", "b", "c"], "doc_id": ["a", "b", "c"], "text": ["x", "y", "z"]})
    table = chunk_table(corpus, 8)
    assert len(table) == 8 and table["chunk_id"].is_unique and table["doc_id"].is_unique
    assert table["chunk_id"].tolist()[:4] == ["a", "b", "c", "a~c1"]
    assert table["text"].tolist() == ["x", "y", "z"] * 2 + ["x", "y"]
    base = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    points = points_matrix(base, 8, sigma=0.5, seed=0)
    assert points.shape == (8, 16) and np.allclose(np.linalg.norm(points, axis=1), 1, atol=1e-5)
    assert np.array_equal(points[:3], base) and not np.allclose(points[3], base[0])
    assert 0.5 < float(points[3] @ base[0]) < 1.0  # a copy is near its document, not on it


def test_exact_top_is_best_first():
    rng = np.random.default_rng(2)
    points, queries = rng.normal(size=(50, 8)).astype(np.float32), rng.normal(size=(5, 8)).astype(np.float32)
    top = exact_top(points, queries, 10)
    assert np.array_equal(top, np.argsort(-(queries @ points.T), axis=1)[:, :10])
