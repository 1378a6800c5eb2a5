"""The SciFact feedback-loop slice that bench/feedback_loop.py, bench/canary_loop.py and bench/canary_paired.py
share: the slice's data and QA set, the base model deployed as production v1, one query asked and rated through the
API, the retrain job's definitions, and test nDCG@10 of the index, of a candidate and of an answerer.
"""

from __future__ import annotations

import random
from pathlib import Path

from bench.lib.datasets import SCIFACT

STRATEGY = "scifact"
TOKEN = "feedback-loop-token-0123456789"
# Every simulated user is its own client, as people behind an authenticating proxy are: the benches' servers read
# this header (ServeSettings.client_header), since all their requests come from one address, which a canary bounds
# as one client.
USER_HEADER = "X-Simulated-User"


def slice_queries(n_train: int, n_test: int, seed: int = 0):
    """(train, test, the sampled train query ids, the sampled test query ids, the rng after sampling): the queries
    a slice of this seed asks and is scored on."""
    from rag.evaluation.beir import load_beir

    train, test = load_beir(SCIFACT, "train"), load_beir(SCIFACT, "test")
    rng = random.Random(seed)
    train_q = sorted(train.qrels)
    test_q = sorted(test.qrels)
    rng.shuffle(train_q), rng.shuffle(test_q)
    return train, test, train_q[:n_train], test_q[:n_test], rng


def build_slice(root: Path, *, n_train: int, n_test: int, n_distractors: int, n_pseudo: int, seed: int = 0) -> dict:
    """Chunk table (one chunk per abstract), BM25, QA set; returns the train/test queries and qrels."""
    from rag.evaluation.qaset import Evidence, QAItem, split_for, to_frame
    from rag.index.sync import sync_bm25
    from rag.store import CHUNKS_TABLE, TableStore, bm25_root
    from rag.training.pseudo import inverse_cloze

    train, test, train_q, test_q, rng = slice_queries(n_train, n_test, seed)
    docs = {d for q in train_q for d in train.qrels[q]} | {d for q in test_q for d in test.qrels[q]}
    corpus = train.corpus.set_index("chunk_id")
    others = sorted(set(corpus.index) - docs)
    docs |= set(rng.sample(others, min(n_distractors, len(others))))
    chunks = corpus.loc[sorted(docs)].reset_index().assign(strategy=STRATEGY)
    tables = TableStore(root / "tables")
    tables.write(chunks, CHUNKS_TABLE, STRATEGY)
    sync_bm25(chunks, bm25_root(root, STRATEGY))
    texts = dict(zip(chunks["chunk_id"], chunks["text"]))
    items = [
        QAItem(
            qid=f"ic{i}",
            question=q,
            qtype="inverse-cloze",
            doc_id=pid,
            split=split_for(pid, 0.3),
            evidence=[Evidence(doc_id=pid, start=0, end=len(texts[pid]))],
            source="inverse-cloze",
        )
        for i, (q, _, pid) in enumerate(inverse_cloze(texts, n_pseudo, seed=seed))
    ]
    tables.write(to_frame(items), "synthetic_qa")
    return {
        "train_queries": {q: train.queries[q] for q in train_q},
        "train_qrels": {q: train.qrels[q] for q in train_q},
        "test_queries": {q: test.queries[q] for q in test_q},
        "test_qrels": {q: test.qrels[q] for q in test_q},
        "chunks": len(chunks),
        "qa_items": len(items),
    }


def deploy_base(root: Path, instance) -> str:
    """Register the base MiniLM as embedder v1 and promote it: collection + serving alias <strategy>__production."""
    from orchestration.partitions import chunking_strategy_partitions
    from rag.embedding import _minilm_dir
    from rag.index.qdrant import QdrantSettings, close_client, get_client
    from rag.registry import ModelRegistry
    from rag.store import TableStore
    from rag.lifecycle.promotion import promote
    from rag.lifecycle.target import ServingTarget

    instance.add_dynamic_partitions(chunking_strategy_partitions.name, [STRATEGY])
    registry = ModelRegistry(root / "models")
    v1 = registry.register("embedder", Path(_minilm_dir()), {"base_model": "minilm", "strategy": STRATEGY})
    settings = QdrantSettings(path=str(root / "qdrant"))
    try:
        target = ServingTarget.of_client(TableStore(root / "tables"), get_client(settings), [STRATEGY])
        promote(
            "embedder",
            registry,
            v1,
            target=target,
            log=lambda _: None,
            force_reason="the loop's starting point: the untrained base model deployed as v1",
        )
    finally:
        close_client(settings)
    return v1.version


def ndcg_at_10(root: Path, queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> float:
    """Test nDCG@10 of dense retrieval with the production embedder, straight from the primary index."""
    from rag.evaluation.metrics import evaluate_run, run_from_hits
    from rag.index.qdrant import QdrantSettings, close_client
    from rag.retrieval import RetrievalParams, retrieve
    from rag.retrieval.service import open_index

    settings = QdrantSettings(path=str(root / "qdrant"))
    try:
        index = open_index(STRATEGY, "production", root=root, qdrant=settings, need_bm25=False)
        hits = {
            q: [h.chunk["chunk_id"] for h in retrieve(index, text, "dense", RetrievalParams(k=10))]
            for q, text in queries.items()
        }
    finally:
        close_client(settings)  # the API's replica refresh and the retrain run open it again
    return evaluate_run(qrels, run_from_hits(hits), ["ndcg@10"])[0]["ndcg@10"]


def candidate_ndcg_at_10(root: Path, version: str, queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> float:
    """Test nDCG@10 of a registered embedder that was not promoted (so it has no collection): exact dense
    search over the chunk set, as the gate scores candidates."""
    from rag.embedding import load_embedder
    from rag.evaluation.metrics import evaluate_run
    from rag.registry import ModelRegistry
    from rag.store import CHUNKS_TABLE, TableStore
    from rag.training.data import IRSet
    from rag.training.gate import dense_run

    chunks = TableStore(root / "tables").read(CHUNKS_TABLE, STRATEGY)
    ir = IRSet(queries, dict(zip(chunks["chunk_id"], chunks["text"])), qrels)
    embedder = load_embedder(str(ModelRegistry(root / "models").resolve("embedder", version).path))
    return evaluate_run(qrels, dense_run(embedder, ir, depth=10), ["ndcg@10"])[0]["ndcg@10"]


def ask_and_rate(http, qid: str, question: str, relevant: dict[str, int] | None) -> tuple[int, str | None]:
    """One query through the API, rated from its qrels (None: not rated); returns (feedback events stored, the
    served model version)."""
    headers = {"Authorization": f"Bearer {TOKEN}", USER_HEADER: f"replay-{qid}"}  # each replayed question its own user
    http.cookies.clear()  # and its own session
    answer = http.post("/ask", json={"question": question, "session_id": f"replay-{qid}"}, headers=headers)
    answer.raise_for_status()
    data = answer.json()
    if relevant is None or not data["passages"]:
        return 0, data["model_version"]
    ratings = [
        {"chunk_id": p["chunk_id"], "score": 1 if relevant.get(p["chunk_id"], 0) > 0 else -1} for p in data["passages"]
    ]
    ack = http.post(
        "/feedback",
        headers=headers,
        json={
            "query_id": data["query_id"],
            "idempotency_key": f"replay-{qid}",
            "passages": ratings,
            "session": data["session"],
        },
    )
    ack.raise_for_status()
    return len(ack.json()["event_ids"]), data["model_version"]


def gate_figures(run) -> dict:
    """Each gate check of a retrain run: passed, description and its flat metadata figures."""
    return {
        e.check_name: {
            "passed": e.passed,
            "description": e.description,
            **{
                k: v.value
                for k, v in e.metadata.items()
                if isinstance(v.value, (int, float, str)) and k != "comparison"
            },
        }
        for e in run.get_asset_check_evaluations()
    }


def retrain_definitions(root: Path, loop, rollout=None):
    """retrain_job with this data dir's resources; `rollout` (resources.rollout.Rollout) sets the promotion policy,
    default "direct": a candidate whose gate passes is promoted straight away."""
    from dagster import Definitions, in_process_executor

    from assets.training import (
        finetuned_embedder,
        finetuned_embedder_gate,
        production_embedder,
        production_reranker,
        trained_reranker,
        trained_reranker_gate,
    )
    from orchestration.training import retrain_job
    from resources.qdrant import QdrantResource
    from resources.rollout import Rollout
    from resources.storage import DataStore

    return Definitions(
        assets=[finetuned_embedder, trained_reranker, production_embedder, production_reranker],
        asset_checks=[finetuned_embedder_gate, trained_reranker_gate],
        jobs=[retrain_job],
        executor=in_process_executor,
        resources={
            "data_store": DataStore(data_dir=str(root)),
            "qdrant": QdrantResource(path=str(root / "qdrant")),
            "feedback_loop": loop,
            "rollout": rollout or Rollout(promotion="direct"),
        },
    )


def answerer_ndcg_at_10(answerer, queries: dict[str, str], qrels: dict[str, dict[str, int]]):
    """(mean nDCG@10, per-query nDCG@10 Series by query id) of an answerer's own ranking: retrieve → rerank → top_k."""
    from rag.evaluation.metrics import evaluate_run, run_from_hits

    hits = {q: [h.chunk["chunk_id"] for h in answerer.rank(text)] for q, text in queries.items()}
    mean, table = evaluate_run(qrels, run_from_hits(hits), ["ndcg@10"])
    return mean["ndcg@10"], table.set_index("qid")["ndcg@10"]
