"""The learning-to-rank reranker: features by hand, feedback priors without leakage, and a trained model that
must beat its untrained self (the first-stage order) on held-out questions, through the same train -> gate path
the retrain job uses."""

import hashlib
from pathlib import Path
import random

import numpy as np
import pandas as pd
import pytest

from rag.evaluation.qaset import Evidence, QAItem, to_frame
from rag.registry import ModelRegistry
from rag.rerank import features as features_module
from rag.rerank.features import FEATURES, CorpusStats, FeedbackPriors, PassageTerms, feature_matrix, text_key
from rag.retrieval import Hit
from rag.store import CHUNKS_TABLE, TableStore

STRATEGY = "ltr"


def _hit(rank, text, **signals):
    return Hit(rank, 0.0, {"chunk_id": f"c{rank}", "text": text, "char_start": 0, "page_start": 1}, signals)


def test_features_by_hand():
    stats = CorpusStats.build(["glacier valley ice", "glacier ice sheet", "desert sand dune", "river delta"])
    assert stats.documents == 4 and stats.document_frequency["glacier"] == 2
    hits = [
        _hit(1, "Ice sheets cover the glacier valley.", dense_score=0.8, dense_rank=1, bm25_score=2.0, bm25_rank=2),
        _hit(2, "Desert dunes move with the wind.", bm25_score=4.0, bm25_rank=1),
    ]
    rows = feature_matrix("glacier valley formation", hits, stats)
    col = {n: i for i, n in enumerate(FEATURES)}
    assert rows.shape == (2, len(FEATURES))
    assert rows[0, col["term_coverage"]] == pytest.approx(2 / 3)  # glacier, valley of glacier/valley/format
    assert rows[0, col["bigram_coverage"]] == pytest.approx(0.5)  # (glacier, valley) of two query bigrams
    assert rows[0, col["longest_term_run"]] == pytest.approx(2 / 3)
    assert rows[1, col["term_coverage"]] == 0.0 and rows[1, col["bm25_corpus_stats"]] == 0.0
    assert rows[0, col["bm25_corpus_stats"]] > 0
    assert np.isnan(rows[1, col["dense_score"]]) and np.isnan(rows[1, col["dense_rank"]])  # not in the dense list
    assert rows[0, col["bm25_share_of_best"]] == pytest.approx(0.5) and rows[0, col["dense_gap_to_best"]] == 0.0
    assert rows[1, col["first_stage_rank"]] == 2 and rows[0, col["feedback_prior"]] == 0.5  # no ratings: (0+1)/(0+2)


def test_passage_terms_are_tokenized_once_and_the_cache_is_bounded(monkeypatch):
    calls = []
    real = features_module.terms
    monkeypatch.setattr(features_module, "terms", lambda texts: calls.append(list(texts)) or real(texts))
    cache = PassageTerms(max_entries=3)
    texts = ["Cats purr when content.", "Dogs bark at night.", "Cats purr when content."]
    assert cache(texts) == real(texts)
    assert calls == [["Cats purr when content.", "Dogs bark at night."]]  # a repeated text tokenized once
    assert cache(texts[:2]) == real(texts[:2]) and len(calls) == 1  # the next question's passages: no tokenizing
    assert cache(["Birds sing.", "Fish swim."]) == real(["Birds sing.", "Fish swim."])  # 4 > 3: emptied, then filled
    assert len(cache._terms) == 2 and calls[-1] == ["Birds sing.", "Fish swim."]


def test_warming_tokenizes_passages_ahead_only_when_they_all_fit(monkeypatch):
    calls = []
    real = features_module.terms
    monkeypatch.setattr(features_module, "terms", lambda texts: calls.append(list(texts)) or real(texts))
    cache = PassageTerms(max_entries=3)
    passages = ["Cats purr when content.", "Dogs bark at night.", "Cats purr when content.", "Birds sing."]
    assert cache.warm(passages, batch=2) == 3  # a repeat counted once
    assert calls == [passages[:2], ["Birds sing."]] and set(cache._terms) == set(passages)
    calls.clear()
    assert cache(passages[:2]) == real(passages[:2]) and calls == []  # warmed: the question tokenizes nothing
    # A corpus larger than the cache: the first unseen passage would empty it, so nothing is warmed or dropped.
    assert cache.warm(["Fish swim."]) == 0 and set(cache._terms) == set(passages) and calls == []
    assert PassageTerms(max_entries=2).warm(passages) == 0


def test_feedback_priors_leave_each_question_out():
    priors = FeedbackPriors.from_pairs([("q1", "Passage A"), ("q2", " Passage   A ")], [("q3", "Passage B")])
    key_a = text_key("Passage A")
    assert priors.serving("anyone", key_a) == (2.0, 0.0)
    assert priors.leave_one_out("q1", key_a) == (1.0, 0.0)  # q1's own rating is not its feature
    assert priors.leave_one_out("q3", text_key("Passage B")) == (0.0, 0.0)
    assert FeedbackPriors.from_json(priors.to_json()).serving("x", key_a) == (2.0, 0.0)


def test_retrieval_hits_carry_first_stage_signals(tmp_path):
    from rag.embedding import load_embedder
    from rag.training.first_stage import first_stage_hits, first_stage_index

    chunks = _chunks({f"d{i}": f"document {i} about topic {'alpha' if i % 2 else 'beta'} number {i}" for i in range(8)})
    with first_stage_index(chunks, load_embedder("wordllama")) as index:
        hits = first_stage_hits(index, {"q": "topic alpha"}, depth=5)["q"]
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert all(h.signals["first_stage_rank"] == h.rank for h in hits)
    assert all("dense_rank" in h.signals or "bm25_rank" in h.signals for h in hits)
    assert any("bm25_score" in h.signals and "dense_score" in h.signals for h in hits)


# --- a task only the features can solve: the answer holds the question's exact phrase, a distractor repeats its words
def _word(rng):
    return "".join(rng.choice("bcdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3))


def _chunks(texts: dict[str, str]) -> pd.DataFrame:
    rows = [
        {
            "chunk_id": cid,
            "doc_id": cid,
            "strategy": STRATEGY,
            "text": t,
            "char_start": 0,
            "char_end": len(t),
            "page_start": 1,
            "page_end": 1,
            "section_path": [],
            "prev_chunk_id": None,
            "next_chunk_id": None,
            "n_tokens": len(t.split()),
            "content_hash": hashlib.sha256(t.encode()).hexdigest(),
            "table_html": None,
        }
        for cid, t in texts.items()
    ]
    return pd.DataFrame(rows)


def phrase_task(topics: int = 60, seed: int = 3):
    rng = random.Random(seed)
    texts, items = {}, []
    for i in range(topics):
        w1, w2 = _word(rng), _word(rng)
        texts[f"a{i}"] = f"Field notes say the {w1} {w2} was seen near the river and recorded over several seasons."
        texts[f"x{i}"] = f"{w1} {w1} tags, {w2} {w2} tags: {w1} lists, {w2} lists."
        items.append(
            QAItem(
                qid=f"q{i}",
                question=f"what about the {w1} {w2}?",
                qtype="dataset",
                doc_id=f"a{i}",
                evidence=[Evidence(doc_id=f"a{i}", start=0, end=len(texts[f"a{i}"]))],
                split="train" if i % 2 else "dev",
            )
        )
    return _chunks(texts), items


@pytest.fixture
def phrase_tables(tmp_path):
    chunks, items = phrase_task()
    tables = TableStore(tmp_path / "tables")
    tables.write(chunks, CHUNKS_TABLE, STRATEGY)
    tables.write(to_frame(items), "synthetic_qa")
    return tmp_path, tables


def test_trained_ranker_beats_its_untrained_self_on_held_out_questions(phrase_tables, monkeypatch):
    """Fails if training does nothing: untrained, the reranker is the first-stage order."""
    from rag.rerank import load_reranker, rerank
    from rag.training import GateSettings, RerankerTrainingConfig
    from rag.training.pipeline import gate_candidate, train_candidate

    root, tables = phrase_tables
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    registry = ModelRegistry(root / "models")
    lines = []
    config = RerankerTrainingConfig(trees=60, min_child_samples=5, rerank_depth=10, early_stopping_rounds=20)
    mv, run, inputs = train_candidate("reranker", tables, registry, config, log=lines.append)
    assert mv.name == "ce-ltr-v1" and registry.resolve("reranker", "candidate").version == mv.version
    sel = run.selection_metrics
    assert sel["ndcg@10"] > sel["first_stage_ndcg@10"] + 0.1, (
        sel
    )  # the distractor outranks the answer in the first stage

    # The gate's questions were neither trained nor used for selection; the untrained self (no reranker) is production.
    # Its gain on generated questions alone is recorded but does not promote it: a canary's online test must.
    held = gate_candidate("reranker", tables, registry, mv, GateSettings(resamples=2000))
    assert held.better_on_generated and held.outcome == "inconclusive" and not held.passed
    assert "trained on generated questions is not promoted by a gain on more of them" in "; ".join(held.reasons)
    assert registry.resolve("reranker", mv.version).metrics["gate"]["better_on_generated"] is True
    result = gate_candidate(
        "reranker", tables, registry, mv, GateSettings(resamples=2000, generated_reranker_gain="promote")
    )
    assert result.passed and result.outcome == "better", result.reasons
    assert result.metadata["delta_ndcg@10"] > 0.1 and result.metadata["p_value_ndcg@10"] < 0.05

    # Serving path: the first stage's hits (with their signals) through rag.rerank.rerank.
    from rag.embedding import load_embedder
    from rag.training.pipeline import hybrid_candidates

    reranker = load_reranker(mv.name, registry=registry)
    gate = inputs.data.gate
    first = hybrid_candidates(tables.read(CHUNKS_TABLE, STRATEGY), gate, load_embedder("minilm"), 10)
    moved = 0
    for q, hits in first.items():
        answer = next(iter(gate.qrels[q]))
        out = rerank(reranker, gate.queries[q], hits, k=10)
        assert all(0.0 <= h.score <= 1.0 for h in out)  # calibrated probabilities
        moved += out[0].chunk["chunk_id"] == answer and hits[0].chunk["chunk_id"] != answer
    assert moved >= len(first) // 2  # answers the first stage put second now come first
    # Warmed with every chunk ahead of the questions (as a served answerer does), it scores what it scored cold.
    texts = tables.read(CHUNKS_TABLE, STRATEGY)["text"].astype(str).tolist()
    warmed = type(reranker)(reranker.path)
    assert warmed.warm(texts) == len(set(texts))
    q, hits = next(iter(first.items()))
    assert np.allclose(warmed.score_hits(gate.queries[q], hits), reranker.score_hits(gate.queries[q], hits))


def test_a_ranker_trained_without_a_feature_group_never_reads_it(phrase_tables, monkeypatch):
    """question_overlap_features=False and document_features=False: the training and selection rows LightGBM sees
    hold nothing in those columns (so the booster cannot split on them, whatever serving computes there), and every
    other column is untouched."""
    import lightgbm as lgb

    from rag.rerank.features import DOCUMENT, FEATURES, QUESTION_OVERLAP
    from rag.rerank.ltr import BOOSTER_FILE
    from rag.training import RerankerTrainingConfig
    from rag.training.pipeline import train_candidate

    root, tables = phrase_tables
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    registry = ModelRegistry(root / "models")
    seen, fit = [], lgb.LGBMRanker.fit

    def recording_fit(self, X, y, **kwargs):
        seen.append([X, *kwargs.get("eval_X", ())])
        return fit(self, X, y, **kwargs)

    monkeypatch.setattr(lgb.LGBMRanker, "fit", recording_fit)
    config = RerankerTrainingConfig(trees=60, min_child_samples=5, rerank_depth=10, early_stopping_rounds=20)
    settings = [
        ({}, []),
        ({"question_overlap_features": False}, QUESTION_OVERLAP),
        ({"document_features": False}, DOCUMENT),
    ]
    for setting, group in settings:
        mv, _, _ = train_candidate("reranker", tables, registry, config.model_copy(update=setting), log=lambda m: None)
        booster = lgb.Booster(model_file=str(Path(mv.path) / BOOSTER_FILE))
        used = dict(zip(booster.feature_name(), booster.feature_importance("split")))
        assert len(seen[-1]) == 2  # the training rows and the selection rows
        columns = [FEATURES.index(f) for f in group]
        assert all(np.isnan(X[:, columns]).all() for X in seen[-1])
        assert all(used[f] == 0 for f in group)
    plain = seen[0]
    for (_, group), rows in zip(settings[1:], seen[1:]):
        left_out = [FEATURES.index(f) for f in group]
        assert all(not np.isnan(X[:, left_out]).all() for X in plain)
        others = [i for i in range(len(FEATURES)) if i not in left_out]
        assert all(np.array_equal(a[:, others], b[:, others], equal_nan=True) for a, b in zip(plain, rows))


def test_document_features_by_hand():
    """Where each candidate's document stands in the list: two passages of one page (side by side in it) and one
    of another; a record without a doc_id gets none of these."""
    from rag.rerank.features import DOCUMENT

    def hit(rank, doc, chunk, dense, prev=None, next_=None):
        record = {
            "chunk_id": chunk,
            "doc_id": doc,
            "text": "glacier ice",
            "prev_chunk_id": prev,
            "next_chunk_id": next_,
        }
        return Hit(rank, 0.0, record, {"dense_score": dense, "dense_rank": rank})

    hits = [
        hit(1, "b", "b1", 0.9),
        hit(2, "a", "a1", 0.7, next_="a2"),
        hit(3, "a", "a2", 0.8, prev="a1"),
        Hit(4, 0.0, {"chunk_id": "x", "text": "glacier"}, {}),
    ]
    rows = feature_matrix("glacier ice", hits, CorpusStats.build(["glacier ice", "sand"]))
    col = {n: i for i, n in enumerate(FEATURES)}
    get = lambda i, name: rows[i, col[name]]  # noqa: E731
    assert [get(i, "document_candidates") for i in range(3)] == [1, 2, 2]
    assert [get(i, "document_rank") for i in range(3)] == [1, 2, 2]
    assert get(2, "document_best_reciprocal_rank") == pytest.approx(1 / 2)  # its page's best passage is second
    assert (
        get(1, "sibling_best_reciprocal_rank") == pytest.approx(1 / 3) and get(0, "sibling_best_reciprocal_rank") == 0
    )
    assert get(2, "neighbour_best_reciprocal_rank") == pytest.approx(1 / 2)  # the chunk before it is second
    assert get(0, "neighbour_best_reciprocal_rank") == 0
    assert get(1, "document_dense_gap_to_best") == pytest.approx(0.1)  # page a's best dense 0.8 against 0.9
    assert get(0, "document_bm25_share_of_best") == pytest.approx(1.0)
    assert np.isnan(rows[3, [col[f] for f in DOCUMENT]]).all()


def test_a_ranker_trained_before_features_were_added_still_serves_on_its_own_columns(tmp_path):
    """A registry version is immutable: a ranker saved with an older, shorter feature list keeps serving, its booster
    reading exactly the columns it learned from; one naming a feature this version lacks asks to be retrained."""
    import json

    import lightgbm as lgb

    from rag.rerank.features import DOCUMENT
    from rag.rerank.ltr import LTR_FILE, LearnedRanker, save_ltr

    older = [f for f in FEATURES if f not in DOCUMENT]
    rng = np.random.default_rng(0)
    X, y = rng.random((200, len(older))), rng.integers(0, 2, 200)
    booster = lgb.train(
        {"objective": "lambdarank", "verbose": -1, "min_data_in_leaf": 5}, lgb.Dataset(X, y, group=[20] * 10), 5
    )
    save_ltr(tmp_path / "old", booster, CorpusStats.build(["glacier ice", "sand"]), FeedbackPriors(), {}, {})
    meta = json.loads((tmp_path / "old" / LTR_FILE).read_text())
    (tmp_path / "old" / LTR_FILE).write_text(json.dumps({**meta, "features": older}))
    hits = [_hit(r, t, dense_score=s, dense_rank=r) for r, t, s in ((1, "glacier ice", 0.9), (2, "sand", 0.2))]
    ranker = LearnedRanker(tmp_path / "old")
    rows = feature_matrix("glacier", hits, ranker.stats)
    expected = booster.predict(rows[:, [FEATURES.index(f) for f in older]])
    assert np.allclose(ranker.raw_scores("glacier", hits), expected)
    save_ltr(tmp_path / "future", booster, ranker.stats, FeedbackPriors(), {}, {})  # models load once per folder
    (tmp_path / "future" / LTR_FILE).write_text(json.dumps({**meta, "features": [*older, "a_feature_of_the_future"]}))
    with pytest.raises(ValueError, match="a_feature_of_the_future"):
        LearnedRanker(tmp_path / "future")


def test_first_stage_margin_starts_rank_one_at_zero_and_falls_with_log_rank():
    from rag.rerank.ltr import first_stage_margin

    rows = np.full((4, len(FEATURES)), np.nan)
    rows[:3, FEATURES.index("first_stage_rank")] = [1.0, np.e, np.e**2]  # the fourth has no rank: it starts at 0
    assert np.allclose(first_stage_margin(rows, 0.5), [0.0, -0.5, -1.0, 0.0])
    assert not first_stage_margin(rows, 0.0).any() and first_stage_margin(rows[:0], 1.0).shape == (0,)


def test_a_ranker_boosted_from_the_first_stage_learns_corrections_and_a_strong_prior_keeps_the_order(
    phrase_tables, monkeypatch
):
    """first_stage_prior: boosting starts from the first stage's order. A modest prior still lets the data overturn
    it (the answer the first stage put second comes first), a prior no tree can outweigh keeps it, and serving adds
    the same start to the trees' output (a ranker that ignored it would reorder by the trees alone)."""
    import lightgbm as lgb

    from rag.rerank import load_reranker
    from rag.rerank.ltr import BOOSTER_FILE
    from rag.training import RerankerTrainingConfig
    from rag.training.pipeline import train_candidate

    root, tables = phrase_tables
    monkeypatch.setenv("RAG_DATA_DIR", str(root))
    registry = ModelRegistry(root / "models")
    config = RerankerTrainingConfig(trees=60, min_child_samples=5, rerank_depth=10, early_stopping_rounds=20)
    modest, run, inputs = train_candidate(
        "reranker", tables, registry, config.model_copy(update={"first_stage_prior": 1.0}), log=lambda m: None
    )
    sel = run.selection_metrics
    assert sel["ndcg@10"] > sel["first_stage_ndcg@10"] + 0.1, sel  # training did something on top of the start
    strong, _, _ = train_candidate(
        "reranker", tables, registry, config.model_copy(update={"first_stage_prior": 50.0}), log=lambda m: None
    )
    hits = [_hit(r, f"passage {r} about the river") for r in range(1, 6)]
    for mv, prior in ((modest, 1.0), (strong, 50.0)):
        reranker = load_reranker(mv.name, registry=registry)
        assert reranker.first_stage_prior == prior
        rows = feature_matrix("river", hits, reranker.stats, reranker.priors.serving)
        trees = lgb.Booster(model_file=str(Path(mv.path) / BOOSTER_FILE)).predict(rows)
        assert np.allclose(reranker.raw_scores("river", hits), trees - prior * np.log(np.arange(1, 6)))
    question = next(iter(inputs.data.gate.queries.values()))
    scores = load_reranker(strong.name, registry=registry).raw_scores(question, hits)
    assert list(np.argsort(-scores)) == list(range(5))  # the first stage's order, whatever the trees say


def test_copied_questions_are_cut_out_of_their_chunks_before_the_first_stage():
    from rag.training.first_stage import KnownVectors, without_questions

    chunks = _chunks(
        {"a": "Cats purr when content.  They also purr when hurt or stressed.", "b": "Dogs bark at night."}
    )
    cut, found = without_questions(
        chunks, [("They also purr when hurt or stressed.", "a"), ("Dogs bark", "b"), ("Not in the chunk at all.", "b")]
    )
    texts = dict(zip(cut["chunk_id"], cut["text"]))
    assert found == 1 and texts["a"] == "Cats purr when content." and texts["b"] == "Dogs bark at night."
    assert cut.set_index("chunk_id").at["a", "content_hash"] != chunks.set_index("chunk_id").at["a", "content_hash"]

    class Counting:
        name, dim, version = "counting", 2, "1"

        def encode_passages(self, texts):
            return np.ones((len(texts), 2), dtype=np.float32)

    known = KnownVectors(Counting(), {"Dogs bark at night.": np.zeros(2, dtype=np.float32)})
    vectors = known.encode_passages(["Dogs bark at night.", "Cats purr when content."])
    assert known.encoded == 1 and vectors[0].tolist() == [0, 0] and vectors[1].tolist() == [1, 1]
