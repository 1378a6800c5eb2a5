"""The feedback loop end to end on SciFact, driven by the sensor (no manual step):

1. a SciFact slice is indexed; a QA set of inverse-cloze pseudo-queries stands in for synthetic_qa; the base
   MiniLM is registered and deployed as production (v1, serving alias <strategy>__production);
2. SciFact **train** queries are asked through the API (`/ask`, model "production"); feedback derived from the
   train qrels is posted (`/feedback`: a retrieved relevant passage +1, every other retrieved passage -1);
3. after every batch, feedback_volume_sensor is evaluated (Dagster test utilities) until it requests a retrain;
   the requested run of retrain_job is executed in-process: fine-tune, gate, promote (only if the gate passes);
4. the API picks up the new index, and SciFact **test** nDCG@10 (dense, production) is compared before/after.

    nice -n 15 .venv/bin/python bench/feedback_loop.py [--train-queries 809] [--threshold 2800] [--max-steps 150]

A held-out 30 % of the rated questions (by text) never trains: it selects the checkpoint and, once there are 20 of
them, is what the gate scores (rag.training.data.training_data).

tests/test_feedback_loop.py runs the same loop at toy size.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SCIFACT = REPO.parent / "shared" / "datasets" / "scifact"
STRATEGY = "scifact"
TOKEN = "feedback-loop-token-0123456789"
from bench.provenance import commit  # noqa: E402 - after the path setup


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
    items = [QAItem(qid=f"ic{i}", question=q, qtype="inverse-cloze", doc_id=pid, split=split_for(pid, 0.3),
                    evidence=[Evidence(doc_id=pid, start=0, end=len(texts[pid]))], source="inverse-cloze")
             for i, (q, _, pid) in enumerate(inverse_cloze(texts, n_pseudo, seed=seed))]
    tables.write(to_frame(items), "synthetic_qa")
    return {"train_queries": {q: train.queries[q] for q in train_q}, "train_qrels": {q: train.qrels[q] for q in train_q},
            "test_queries": {q: test.queries[q] for q in test_q}, "test_qrels": {q: test.qrels[q] for q in test_q},
            "chunks": len(chunks), "qa_items": len(items)}


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
        promote("embedder", registry, v1, target=ServingTarget.of_client(TableStore(root / "tables"), get_client(settings), [STRATEGY]),
                log=lambda _: None, force_reason="the loop's starting point: the untrained base model deployed as v1")
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
        hits = {q: [h.chunk["chunk_id"] for h in retrieve(index, text, "dense", RetrievalParams(k=10))] for q, text in queries.items()}
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
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answer = http.post("/ask", json={"question": question, "session_id": f"replay-{qid}"}, headers=headers)
    answer.raise_for_status()
    data = answer.json()
    if relevant is None or not data["passages"]:
        return 0, data["model_version"]
    ratings = [{"chunk_id": p["chunk_id"], "score": 1 if relevant.get(p["chunk_id"], 0) > 0 else -1} for p in data["passages"]]
    ack = http.post("/feedback", json={"query_id": data["query_id"], "idempotency_key": f"replay-{qid}", "passages": ratings},
                    headers=headers)
    ack.raise_for_status()
    return len(ack.json()["event_ids"]), data["model_version"]


def gate_figures(run) -> dict:
    """Each gate check of a retrain run: passed, description and its flat metadata figures."""
    return {e.check_name: {"passed": e.passed, "description": e.description,
                           **{k: v.value for k, v in e.metadata.items()
                              if isinstance(v.value, (int, float, str)) and k != "comparison"}}
            for e in run.get_asset_check_evaluations()}


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

    return Definitions(assets=[finetuned_embedder, trained_reranker, production_embedder, production_reranker],
                       asset_checks=[finetuned_embedder_gate, trained_reranker_gate], jobs=[retrain_job],
                       executor=in_process_executor,
                       resources={"data_store": DataStore(data_dir=str(root)), "qdrant": QdrantResource(path=str(root / "qdrant")),
                                  "feedback_loop": loop, "rollout": rollout or Rollout(promotion="direct")})


def run_loop(root: Path, *, n_train: int, n_test: int, n_distractors: int, n_pseudo: int, threshold: int, batch: int,
             training: dict, log=print) -> dict:
    from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context
    from fastapi.testclient import TestClient

    from rag.feedback import FeedbackStore
    from rag.registry import ModelRegistry
    from rag.serving.server import build_app
    from rag.serving.settings import ServeSettings
    from resources.feedback import FeedbackLoop
    from sensors.feedback import feedback_volume_sensor

    root = Path(root)
    started = time.perf_counter()
    data = build_slice(root, n_train=n_train, n_test=n_test, n_distractors=n_distractors, n_pseudo=n_pseudo)
    log(f"slice: {data['chunks']} abstracts, {len(data['train_queries'])} train / {len(data['test_queries'])} test queries, "
        f"{data['qa_items']} pseudo-queries in the QA set")
    out: dict = {"chunks": data["chunks"], "train_queries": len(data["train_queries"]), "test_queries": len(data["test_queries"]),
                 "threshold": threshold, "training": training, "ticks": []}
    loop = FeedbackLoop(data_dir=str(root), volume_threshold=threshold, retrain_run_config=training)
    registry = ModelRegistry(root / "models")
    with DagsterInstance.ephemeral() as instance:
        out["deployed"] = deploy_base(root, instance)
        out["ndcg@10_before"] = ndcg_at_10(root, data["test_queries"], data["test_qrels"])
        log(f"deployed {out['deployed']}; test nDCG@10 before: {out['ndcg@10_before']:.4f}")
        store = FeedbackStore(root=root)
        app = build_app(ServeSettings(api_token=TOKEN, refresh_seconds=0), root=root, store=store, strategy=STRATEGY,
                        model="production", mode="dense", k=10, top_k=10, attribution=False)

        def tick():
            with build_sensor_context(instance=instance, resources={"feedback_loop": loop}) as context:
                return feedback_volume_sensor(context)

        request = None
        with TestClient(app) as http:
            events, served = 0, None
            queries = list(data["train_queries"].items())
            for start in range(0, len(queries), batch):
                for qid, question in queries[start:start + batch]:
                    n, served = ask_and_rate(http, qid, question, data["train_qrels"][qid])
                    events += n
                result = tick()
                if isinstance(result, SkipReason):
                    out["ticks"].append(result.skip_message)
                    continue
                assert isinstance(result, SensorResult) and result.run_requests
                request = result.run_requests[0]
                out["ticks"].append(f"RunRequest {request.run_key}")
                break
            out["served_before"], out["feedback_events"], out["queries_replayed"] = served, events, min(start + batch, len(queries))
            log(f"{out['queries_replayed']} train queries replayed, {events} feedback events; sensor ticks: {out['ticks']}")
            if request is None:
                out["fired"] = False
                return out
            out["fired"] = True
            train_started = time.perf_counter()
            run = retrain_definitions(root, loop).resolve_job_def("retrain_job").execute_in_process(
                run_config=request.run_config, tags=request.tags, instance=instance, raise_on_error=False)
            out["retrain_seconds"] = round(time.perf_counter() - train_started, 1)
            out["run_success"] = run.success
            out["gates"] = gate_figures(run)
            production = registry.resolve("embedder", "production")
            out["production_after"] = production.version if production else None
            log(f"retrain run {'succeeded' if run.success else 'failed'} in {out['retrain_seconds']} s; gates: {out['gates']}; "
                f"production embedder now {out['production_after']}")
            app.state.serving.refresh(force=True)
            out["served_after"] = ask_and_rate(http, "after", data["test_queries"][next(iter(data["test_queries"]))], None)[1]
            out["tick_after"] = tick().skip_message
        store.close()
        out["ndcg@10_after"] = ndcg_at_10(root, data["test_queries"], data["test_qrels"])
        candidate = registry.versions("embedder")[-1]
        if candidate.version != out["production_after"]:  # rejected: what it would have scored on the test queries
            out["rejected_candidate"] = candidate.name
            out["rejected_candidate_ndcg@10"] = candidate_ndcg_at_10(root, candidate.version, data["test_queries"], data["test_qrels"])
            log(f"rejected candidate {candidate.name}: test nDCG@10 {out['rejected_candidate_ndcg@10']:.4f}")
        log(f"test nDCG@10 after: {out['ndcg@10_after']:.4f} (before {out['ndcg@10_before']:.4f}); next tick: {out['tick_after']}")
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-queries", type=int, default=809, help="SciFact train queries to replay (809 = all)")
    parser.add_argument("--test-queries", type=int, default=150)
    parser.add_argument("--distractors", type=int, default=1000)
    parser.add_argument("--pseudo", type=int, default=600, help="inverse-cloze questions in the QA set")
    parser.add_argument("--threshold", type=int, default=2800, help="feedback events that start a retrain (about 3.6 per replayed query)")
    parser.add_argument("--batch", type=int, default=50, help="queries replayed between sensor ticks")
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--data-dir", type=Path, help="default: a temporary folder")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not SCIFACT.is_dir():
        print(f"SciFact not available at {SCIFACT}")
        return 0
    import tempfile

    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"})
    with tempfile.TemporaryDirectory(prefix="feedback-loop-") as tmp:
        root = args.data_dir or Path(tmp)
        os.environ["RAG_DATA_DIR"] = str(root)  # "production" resolves through this data dir's registry
        training = {"max_steps": args.max_steps, "max_seq_length": 128, "batch_size": 32, "max_pairs": 4000}
        result = run_loop(root, n_train=args.train_queries, n_test=args.test_queries, n_distractors=args.distractors,
                          n_pseudo=args.pseudo, threshold=args.threshold, batch=args.batch, training=training,
                          log=lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True))
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "commit": commit(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **result}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
