"""bench.lib.edge's data helpers: N rows of noise copies with unique ids and the real texts, unit vectors,
and the numpy exact top-k that recall is measured against."""

import numpy as np
import pandas as pd

from bench.lib.edge import chunk_table, exact_top, points_matrix


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


def test_mixture_copies_lie_between_their_document_and_another():
    base = np.random.default_rng(3).normal(size=(20, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    points = points_matrix(base, 400, sigma=0.0, seed=0, kind="mixture", mix_max=0.5)
    assert np.array_equal(points[:20], base) and np.allclose(np.linalg.norm(points, axis=1), 1, atol=1e-5)
    cos = points[20:] @ base.T
    own = cos[np.arange(380), np.arange(20, 400) % 20]
    assert np.all(own >= cos.max(axis=1) - 1e-5)  # t <= 0.5: its own document stays the nearest
    assert float(np.mean(own < 0.999)) > 0.7  # and most copies moved off it (a partner can be the document itself)
    # without a share of another document, a mixture copy is its document
    assert np.allclose(
        points_matrix(base, 60, sigma=0.0, seed=0, kind="mixture", mix_max=0.0), base[np.arange(60) % 20]
    )


def test_isotropic_copies_are_nearer_their_document_than_each_other():
    """The star that caps HNSW recall (points_matrix's docstring): every copy's nearest point is its document."""
    base = np.random.default_rng(4).normal(size=(5, 384)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    points = points_matrix(base, 5 * 40, sigma=0.5, seed=0)
    copies = points[5::5]  # copies of document 0
    to_document = copies @ base[0]
    between = copies @ copies.T
    np.fill_diagonal(between, -1)
    assert np.all(to_document > between.max(axis=1))


def test_unknown_copy_kind_is_refused():
    import pytest

    with pytest.raises(ValueError, match="isotropic, mixture"):
        points_matrix(np.eye(3, dtype=np.float32), 6, sigma=0.1, seed=0, kind="gaussian")


def test_hnsw_recall_counts_every_miss_and_matches_ids_to_rows(tmp_path):
    """bench/hnsw_recall.py's build and recall over a small collection, which Edge searches exactly: recall 1 means
    point ids and exact-top rows agree; a shuffled truth must show up as misses, each counted once."""
    from bench.hnsw_recall import build, recall_by_ef

    rng = np.random.default_rng(5)
    points = rng.normal(size=(600, 16)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    queries = rng.normal(size=(12, 16)).astype(np.float32)
    truth = exact_top(points, queries, 10)
    client, built = build(tmp_path / "edge", points, m=8, ef_construct=32, batch=128)
    try:
        assert built["upsert_s"] >= 0 and built["disk_mb"] > 0
        exact = recall_by_ef(client, queries, truth, documents=60, efs=[100])["100"]
        assert exact["recall@10"] == 1.0 and exact["misses_document_found_through_another_copy"] == 0
        wrong = recall_by_ef(client, queries, truth[::-1], documents=60, efs=[100])["100"]
        misses = exact["dense_limit100"]["n"] * 10 * (1 - wrong["recall@10"])
        assert wrong["recall@10"] < 0.5
        assert round(misses) == wrong["misses_document_found_through_another_copy"] + wrong["misses_document_not_found"]
    finally:
        client.close()


def test_the_gc_clock_counts_full_collections_only_while_installed():
    import gc

    from bench.edge_latency import GcClock

    with GcClock() as clock:
        gc.collect(0)
        assert clock.full == 0 and clock.ms > 0
        gc.collect()
        assert clock.full == 1
    gc.collect()
    assert clock.full == 1 and clock not in gc.callbacks
