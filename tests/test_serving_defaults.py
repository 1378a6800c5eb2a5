"""Serving defaults: `rag serve` and `rag ask` with no flags serve the registry's `production` embedder and reranker
(the base MiniLM and retrieval order until a promotion, the promoted versions after one, without a restart) in the
default mode (hybrid-cc, or the applied active configuration's); /health names the versions served. Indexing the
base model puts `<strategy>__production` on its collection until a promotion moves it, and never moves it back."""

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from rag.feedback import FeedbackStore
from rag.index.qdrant import QdrantSettings, alias_target, close_client, get_client
from rag.index.sync import sync_bm25, sync_collection
from rag.registry import ModelRegistry
from rag.store import CHUNKS_TABLE, TableStore, bm25_root
from tests.test_api import AUTH, TEXTS, TOKEN, chunk_table

STRATEGY = "paragraph"  # AnswerSettings' default chunk set: the server below gets no flags at all
quiet = lambda _: None  # noqa: E731


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A data dir with chunk set `paragraph` and its BM25 files; the registry and Qdrant folder are the data dir's."""
    root = tmp_path / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(root))  # load_embedder resolves `production` through this registry
    monkeypatch.setenv("RAG_API_TOKEN", TOKEN)
    for name in ("QDRANT_URL", "RAG_QDRANT_PATH", "RAG_ANSWER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    tables = TableStore(root / "tables")
    chunks = chunk_table(TEXTS).assign(strategy=STRATEGY)
    tables.write(chunks, CHUNKS_TABLE, STRATEGY)
    sync_bm25(chunks, bm25_root(root, STRATEGY))
    return root


def qdrant(root: Path) -> QdrantSettings:
    return QdrantSettings(path=str(root / "qdrant"))


def index_base_model(root: Path, registry: ModelRegistry | None = None):
    """What `rag index`, the embedding_collections asset and the nightly job run for the base model."""
    from rag.embedding import load_embedder
    from rag.pipeline import embed_step

    settings = qdrant(root)
    try:
        return embed_step(
            TableStore(root / "tables"),
            get_client(settings),
            STRATEGY,
            "minilm",
            load_embedder("minilm"),
            registry=registry,
        )
    finally:
        close_client(settings)


def aliases(root: Path) -> dict[str, str | None]:
    settings = qdrant(root)
    try:
        client = get_client(settings)
        return {name: alias_target(client, f"{STRATEGY}__{name}") for name in ("minilm", "production", "ft-minilm-v1")}
    finally:
        close_client(settings)


def tiny_ranker(folder: Path) -> Path:
    """A real learned ranker (LightGBM LambdaRank on random features): enough to be loaded and served."""
    import lightgbm as lgb

    from rag.rerank.features import FEATURES, CorpusStats, FeedbackPriors
    from rag.rerank.ltr import save_ltr

    rng = np.random.default_rng(0)
    features = rng.random((40, len(FEATURES)))
    labels = (features[:, 0] > 0.5).astype(int)
    booster = lgb.train(
        {"objective": "lambdarank", "verbose": -1, "min_data_in_leaf": 1, "num_leaves": 3},
        lgb.Dataset(features, labels, group=[10] * 4),
        num_boost_round=3,
    )
    return save_ltr(
        folder,
        booster,
        CorpusStats.build(TEXTS.values()),
        FeedbackPriors.from_pairs([], []),
        {"slope": 1.0, "intercept": 0.0},
        {},
    )


def promote_both(root: Path, tmp_path: Path) -> None:
    """A fine-tuned embedder (MiniLM's weights under a registry version) and a learned reranker, promoted the way
    retrain_job does it (forced here: no gate verdict), the embedder with its serving alias swap."""
    from rag.embedding import _minilm_dir
    from rag.lifecycle.promotion import promote
    from rag.lifecycle.target import ServingTarget

    registry = ModelRegistry(root / "models")
    embedder = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm"})
    reranker = registry.register(
        "reranker", tiny_ranker(tmp_path / "ranker"), {"base_model": "minilm", "family": "ltr"}
    )
    settings = qdrant(root)
    try:
        promote(
            "embedder",
            registry,
            embedder,
            target=ServingTarget.of_client(TableStore(root / "tables"), get_client(settings), [STRATEGY]),
            force_reason="test promotion",
            log=quiet,
        )
    finally:
        close_client(settings)
    promote("reranker", registry, reranker, force_reason="test promotion", log=quiet)


def test_indexing_the_base_model_keeps_production_on_it_until_a_promotion_moves_it(root, tmp_path):
    run = index_base_model(root)
    before = aliases(root)
    assert before["production"] == before["minilm"] == run.collection  # a fresh index serves `production`
    index_base_model(root)
    assert aliases(root) == before  # idempotent

    promote_both(root, tmp_path)
    promoted = aliases(root)["production"]
    assert promoted == aliases(root)["ft-minilm-v1"] and promoted != before["minilm"]
    index_base_model(root)  # the nightly re-index after a promotion
    assert aliases(root)["production"] == promoted  # a promotion's alias is never moved back

    # Only production's own state decides: with another registry's (empty) view, a foreign alias still stays.
    index_base_model(root, registry=ModelRegistry(tmp_path / "empty-registry"))
    assert aliases(root)["production"] == promoted


def test_an_index_older_than_the_production_alias_serves_production_from_the_base_collection(root):
    from rag.embedding import load_embedder
    from rag.retrieval.service import open_index

    settings = qdrant(root)
    try:  # as `rag index` left a data dir before it set <strategy>__production
        sync_collection(
            get_client(settings),
            TableStore(root / "tables").read(CHUNKS_TABLE, STRATEGY),
            load_embedder("minilm"),
            strategy=STRATEGY,
            model="minilm",
        )
    finally:
        close_client(settings)
    assert aliases(root)["production"] is None
    index = open_index(STRATEGY, "production", root=root, qdrant=settings)
    assert index.alias == f"{STRATEGY}__minilm" and index.embedder.name == "minilm"
    close_client(settings)


def test_rag_serve_with_no_flags_serves_production_and_follows_a_promotion(root, tmp_path):
    from rag.serving.server import build_app
    from rag.serving.settings import ServeSettings

    index_base_model(root)
    store = FeedbackStore(f"sqlite:///{tmp_path / 'fb.sqlite'}")
    # What `rag serve` builds with no flags (cmd_serve: from_env, then no answer overrides).
    app = build_app(ServeSettings.from_env(refresh_seconds=0), root=root, store=store)
    question = "which animal does purr and chase mice"
    with TestClient(app) as client:
        served = client.get("/health").json()["served"]
        # Questions are encoded by MiniLM's int8 twin (AnswerSettings.query_encoder), passages stay float.
        assert served.pop("query_encoder").startswith("minilm-int8 (")
        assert served == {
            "embedder": "minilm (base)",
            "reranker": "none",
            "mode": "hybrid-cc",
            "strategy": STRATEGY,
            "model": "production",
            "reranker_spec": "production",
            "config": "defaults",
        }
        answer = client.post("/ask", json={"question": question}, headers=AUTH).json()
        assert answer["model_version"].startswith("minilm@") and answer["passages"][0]["chunk_id"] == "cats"

        promote_both(root, tmp_path)  # while the server runs; its refresh thread would pick it up the same way
        serving = app.state.serving
        assert serving.refresh() is False and serving.refresh() is True  # seen, then stable: swapped in
        served = client.get("/health").json()["served"]
        assert served["embedder"] == "ft-minilm-v1" and served["reranker"] == "ce-ltr-v1"
        assert served["query_encoder"].startswith("ft-minilm-v1-int8 (")  # the promoted weights' own twin
        assert serving.current().reranker.name == "ce-ltr-v1"
        answer = client.post("/ask", json={"question": question}, headers=AUTH).json()
        assert answer["model_version"].startswith("ft-minilm-v1@")
        queries = store.table("queries")
        assert queries["model_version"].str.startswith("ft-minilm-v1@").sum() == 1
    store.close()


def test_default_mode_is_hybrid_cc_unless_an_applied_configuration_sets_one(root, tmp_path):
    from rag.qa import AnswerSettings
    from rag.serving.server import answer_settings
    from rag.serving.settings import ServeSettings
    from rag.tuning.active import apply_configuration

    defaults = AnswerSettings()
    assert (defaults.mode, defaults.model, defaults.reranker) == ("hybrid-cc", "production", "production")
    assert answer_settings(ServeSettings.from_env()).mode == "hybrid-cc"
    best = tmp_path / "best_config.yaml"
    best.write_text("strategy: paragraph\nmode: dense\ntop_k: 3\n")
    apply_configuration(best, root, reason="test")
    applied = answer_settings(ServeSettings.from_env())
    assert (applied.mode, applied.top_k, applied.model) == ("dense", 3, "production")  # unset fields keep the defaults
    assert answer_settings(ServeSettings.from_env(), mode="bm25").mode == "bm25"  # a flag still wins


def test_rag_search_with_no_flags_searches_what_serves(root, capsys):
    import argparse
    import json

    from rag.cli import add_library_commands, cmd_search

    index_base_model(root)
    parser = argparse.ArgumentParser()
    add_library_commands(parser.add_subparsers(dest="command"))
    query = ["search", "what do rockets burn", "--strategy", STRATEGY, "--k", "3", "--json"]
    served = parser.parse_args(query)
    assert (served.model, served.mode) == ("production", "hybrid-cc")
    try:
        cmd_search(served)
        by_default = json.loads(capsys.readouterr().out)
        cmd_search(parser.parse_args([*query, "--model", "minilm", "--mode", "hybrid-cc"]))
        explicit = json.loads(capsys.readouterr().out)
    finally:
        close_client(qdrant(root))
    assert by_default == explicit and len(by_default) == 3


def test_answers_computed_at_once_default_to_the_cores_up_to_two(monkeypatch):
    import os

    from rag.serving.settings import ServeSettings

    monkeypatch.delenv("RAG_ASK_CONCURRENCY", raising=False)
    assert ServeSettings.from_env().ask_concurrency == min(2, os.cpu_count() or 1)
    monkeypatch.setenv("RAG_ASK_CONCURRENCY", "3")
    assert ServeSettings.from_env().ask_concurrency == 3
    monkeypatch.setenv("RAG_ASK_CONCURRENCY", "0")
    with pytest.raises(ValueError, match="ask_concurrency"):
        ServeSettings.from_env()
