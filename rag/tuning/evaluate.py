"""Scoring one candidate configuration on a QA set, with a cache at every level.

- IndexCache: a (chunker, embedder) index is built once per search (through the pipeline's own incremental
  steps, so an index already on disk costs nothing) and shared by every candidate that uses it; BM25-only
  candidates need no embedder at all.
- Retrieval runs are cached by (index, mode, retrieval params, expansion, query set); reranked runs by that
  plus the reranker. Filters, neighbours and metrics are cheap and run per candidate.
So a search's cost follows the number of distinct indexes and retrieval runs, not the number of candidates.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

from rag.chunking import get_chunker, load_strategies
from rag.embedding import load_embedder
from rag.evaluation.metrics import evaluate_run, retrieval_score, run_from_hits
from rag.evaluation.qaset import QAItem, Relevance, context_chars, context_run, qrels_for_chunks
from rag.index.bm25 import BM25Index
from rag.retrieval.service import open_bm25
from rag.index.qdrant import QdrantSettings, get_client
from rag.llm import LLM
from rag.pipeline import bm25_step, chunk_step, embed_step
from rag.retrieval import DENSE_MODES, Hit, Index, RetrievalParams, retrieve
from rag.retrieval.fusion import reciprocal_rank_fusion
from rag.tuning.expansion import EXPANSIONS
from rag.tuning.generation import GenerationScorer
from rag.tuning.space import Genome, SearchSpace
from rag.store import DOCUMENTS_TABLE, TableStore, bm25_root

METRIC_K = 5  # RAGSmith's RetrievalScore is taken at k = 5
SCORE_METRICS = [f"{m}@{METRIC_K}" for m in ("recall", "map", "ndcg", "mrr")] + [
    f"precision@{METRIC_K}",
    f"hit_rate@{METRIC_K}",
]
# Reported beside the scores: the characters of context a candidate hands the prompt (what its hits cost).
REPORT_METRICS = SCORE_METRICS + ["context_chars"]
# What every candidate setting means when the space leaves it out (mirrors rag.qa.AnswerSettings' defaults).
DEFAULT_SETTINGS: dict[str, Any] = {
    "strategy": "paragraph",
    "model": "minilm",
    "mode": "hybrid-rrf",
    "k": 10,
    "candidates": 100,
    "alpha": 0.5,
    "mmr_lambda": None,
    "reranker": None,
    "top_k": 5,
    "min_score": None,
    "prev_next": False,
    "prompt_order": "simple",
    "query_expansion": "none",
    "max_context_chars": 6000,
}


class Objective(BaseModel):
    """F = (w_r·RetrievalScore + w_g·GenerationScore) / (w_r + w_g); F = RetrievalScore when nothing generates."""

    retrieval_weight: float = Field(0.5, ge=0.0)
    generation_weight: float = Field(0.5, ge=0.0)

    def combine(self, retrieval: float, generation: float | None) -> float:
        if generation is None or self.generation_weight == 0:
            return retrieval
        total = self.retrieval_weight + self.generation_weight
        return (self.retrieval_weight * retrieval + self.generation_weight * generation) / total


@dataclass
class Scored:
    fitness: float
    retrieval_score: float
    generation_score: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "fitness": self.fitness,
            "retrieval_score": self.retrieval_score,
            "generation_score": self.generation_score,
            "metrics": self.metrics,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, raw: dict) -> Scored:
        return cls(**raw)


@dataclass
class Workspace:
    """Where a search's corpus and indexes live: the pipeline's data dir, or a scratch dir for an outside corpus."""

    root: Path
    qdrant: QdrantSettings | None = None  # None: QDRANT_URL or <root>/qdrant

    def qdrant_settings(self) -> QdrantSettings:
        env = QdrantSettings.from_env()
        return self.qdrant or (env if env.url else QdrantSettings(path=str(Path(self.root) / "qdrant")))

    @property
    def tables(self) -> TableStore:
        return TableStore(Path(self.root) / "tables")


class IndexCache:
    """Indexes of (strategy, embedder) built at most once per search, through the pipeline's incremental steps."""

    def __init__(self, workspace: Workspace, chunking_config: Path | None = None):
        self.workspace = workspace
        self.strategies = load_strategies(chunking_config)
        self._chunks: dict[str, pd.DataFrame] = {}
        self._bm25: dict[str, BM25Index] = {}
        self._collections: dict[tuple[str, str], str] = {}
        self._indexes: dict[tuple[str, str | None], Index] = {}
        self.work: dict[str, dict] = {}  # what each build did (chunks written, points embedded, seconds)
        if workspace.tables.read(DOCUMENTS_TABLE, columns=["doc_id"]) is None:
            raise FileNotFoundError(
                f"no parsed documents under {workspace.root}: ingest documents first (rag index DOCS)"
            )

    def chunks(self, strategy: str) -> pd.DataFrame:
        if strategy not in self._chunks:
            if strategy not in self.strategies:
                raise ValueError(
                    f"unknown chunking strategy {strategy!r} in the search space (known: {', '.join(self.strategies)})"
                )
            run = chunk_step(self.workspace.tables, get_chunker(strategy, self.strategies))
            self.work[f"chunks:{strategy}"] = run.summary
            self._chunks[strategy] = run.chunks
        return self._chunks[strategy]

    def index(self, strategy: str, model: str | None) -> Index:
        """BM25 always; the dense collection only when `model` is given (BM25-only candidates share one index)."""
        key = (strategy, model)
        if key not in self._indexes:
            chunks = self.chunks(strategy)
            if strategy not in self._bm25:
                run = bm25_step(self.workspace.tables, self.workspace.root, strategy)
                self.work[f"bm25:{strategy}"] = run.summary
                self._bm25[strategy] = BM25Index.load(bm25_root(self.workspace.root, strategy))
            client = alias = embedder = None
            if model is not None:
                embedder = load_embedder(model)
                client = get_client(self.workspace.qdrant_settings())
                run = embed_step(self.workspace.tables, client, strategy, model, embedder)
                self.work[f"dense:{strategy}|{model}"] = run.summary
                self._collections[key] = alias = run.alias
            # With a collection, BM25 is the one its searches in serving use (the engine's, when it carries it).
            bm25 = (
                self._bm25[strategy]
                if model is None
                else open_bm25(bm25_root(self.workspace.root, strategy), client, alias)
            )
            searches = self.workspace.qdrant_settings()  # scored with the search parameters serving uses
            self._indexes[key] = Index(
                chunks.set_index("chunk_id"),
                bm25,
                client,
                alias,
                embedder,
                hnsw_ef=searches.hnsw_ef,
                exact=searches.exact_search,
            )
        return self._indexes[key]

    @property
    def counts(self) -> dict[str, int]:
        # An index is one BM25 index of a chunk set or one dense collection of (chunk set, embedder).
        return {
            "chunk_sets": len(self._chunks),
            "bm25_indexes": len(self._bm25),
            "dense_collections": len(self._collections),
            "distinct_indexes": len(self._bm25) + len(self._collections),
        }


def qa_fingerprint(items: list[QAItem]) -> str:
    digest = hashlib.sha256()
    for item in sorted(items, key=lambda i: i.qid):
        digest.update(json.dumps([item.qid, item.question, [e.model_dump() for e in item.evidence]]).encode())
    return digest.hexdigest()[:16]


def needs_dense(settings: dict) -> bool:
    return settings["mode"] in DENSE_MODES or settings.get("mmr_lambda") is not None


class PipelineEvaluator:
    """settings → Scored, by running the candidate's retrieval pipeline over the QA set on cached indexes.

    The steps after retrieval are the answer pipeline's own (rag.qa.steps, rag.rerank), in its order:
    retrieve k (of `candidates` per retriever) → rerank → filter (top_k, min_score) → neighbours → prompt order.
    """

    def __init__(
        self,
        workspace: Workspace,
        items: list[QAItem],
        *,
        objective: Objective | None = None,
        llm: LLM | None = None,
        generator: GenerationScorer | None = None,
        generation_questions: int = 20,
        rerankers: dict[str, Any] | None = None,
        chunking_config: Path | None = None,
        relevance: Relevance | None = None,
    ):
        if not items:
            raise ValueError("the QA set is empty: generate one (synthetic_qa) or pass a SQuAD JSON")
        self.items = items
        self.objective = objective or Objective()
        self.relevance = relevance or Relevance()
        self.llm = llm
        self.generator = generator
        self.generation_questions = generation_questions
        self.indexes = IndexCache(workspace, chunking_config)
        self.qa_key = qa_fingerprint(items)
        self._rerankers = dict(rerankers or {})
        self._runs: dict[tuple, dict[str, list[Hit]]] = {}
        self._qrels: dict[str, dict[str, dict[str, int]]] = {}
        self._expansions: dict[tuple[str, str], list[str]] = {}
        self.retrieval_runs = 0
        self.rerank_runs = 0

    # --- capabilities that decide feasibility ------------------------------------------------------
    @property
    def capabilities(self) -> set[str]:
        caps = set()
        if self.llm is not None:
            caps.add("llm")
        if self.generator is not None:
            caps.add("generator")
        if self._reranker("production") is not None:
            caps.add("trained-reranker")
        return caps

    def _reranker(self, spec: str | None):
        if spec is None:
            return None
        if spec not in self._rerankers:
            from rag.rerank import load_reranker

            self._rerankers[spec] = load_reranker(spec)
        return self._rerankers[spec]

    @property
    def context(self) -> str:
        """What a cached fitness depends on besides the genome: the QA set, the corpus, the objective."""
        docs = self.indexes.workspace.tables.read(DOCUMENTS_TABLE, columns=["doc_id", "content_hash"])
        corpus = hashlib.sha256("".join(sorted(docs["doc_id"] + ":" + docs["content_hash"])).encode()).hexdigest()[:16]
        gen = f"{self.generator.generator.name}/{self.generator.judge.name}" if self.generator else "none"
        # v2: contexts cut to the prompt's budget and span relevance; fitnesses cached under v1 (any overlap, whole
        # chunks) are not comparable and must not be reused.
        return (
            f"v2|qa={self.qa_key}|corpus={corpus}|{self.objective.model_dump_json()}|relevance={self.relevance.model_dump_json()}"
            f"|gen={gen}|llm={getattr(self.llm, 'name', 'none')}"
        )

    def identity(self, settings: dict) -> str:
        """What a genome's name does not pin down: the strategy's parameters and the embedder's weights, so a
        cached fitness goes stale when either changes (a re-tuned strategy, a newly promoted fine-tuned model)."""
        from rag.chunking import strategy_fingerprint

        s = DEFAULT_SETTINGS | settings
        config = self.indexes.strategies.get(s["strategy"])
        parts = [strategy_fingerprint(config) if config is not None else "unknown-strategy"]
        if needs_dense(s):
            parts.append(load_embedder(s["model"]).version)
        return "/".join(parts)

    # --- the cached stages --------------------------------------------------------------------------
    def _queries(self, expansion: str, question: str) -> list[str]:
        key = (expansion, question)
        if key not in self._expansions:
            self._expansions[key] = EXPANSIONS[expansion](self.llm, question)
        return self._expansions[key]

    def _retrieved(self, s: dict) -> tuple[Index, dict[str, list[Hit]]]:
        model = s["model"] if needs_dense(s) else None
        index = self.indexes.index(s["strategy"], model)
        params = RetrievalParams(k=s["k"], candidates=s["candidates"], alpha=s["alpha"], mmr_lambda=s.get("mmr_lambda"))
        # alpha only matters to hybrid-cc: other modes share one run whatever the alpha.
        key = (
            s["strategy"],
            model,
            s["mode"],
            s["alpha"] if s["mode"] == "hybrid-cc" else None,
            s["k"],
            s["candidates"],
            s.get("mmr_lambda"),
            s["query_expansion"],
            self.qa_key,
        )
        if key not in self._runs:
            self.retrieval_runs += 1
            run = {}
            for item in self.items:
                lists = [
                    retrieve(index, q, s["mode"], params) for q in self._queries(s["query_expansion"], item.question)
                ]
                run[item.qid] = lists[0] if len(lists) == 1 else self._fused(index, lists, s["k"])
            self._runs[key] = run
        run = self._runs[key]
        if s.get("reranker"):
            rkey = key + (s["reranker"],)
            if rkey not in self._runs:
                self.rerank_runs += 1
                from rag.rerank import rerank

                reranker = self._reranker(s["reranker"])
                if reranker is None:
                    raise ValueError(f"reranker {s['reranker']!r} is not available: train and register one first")
                questions = {i.qid: i.question for i in self.items}
                self._runs[rkey] = {qid: rerank(reranker, questions[qid], hits, s["k"]) for qid, hits in run.items()}
            run = self._runs[rkey]
        return index, run

    @staticmethod
    def _fused(index: Index, lists: list[list[Hit]], k: int) -> list[Hit]:
        fused = reciprocal_rank_fusion([[(h.chunk["chunk_id"], h.score) for h in hits] for hits in lists])
        return [Hit(rank, score, index.record(cid)) for rank, (cid, score) in enumerate(fused[:k], start=1)]

    def _qrels_for(self, strategy: str) -> dict[str, dict[str, int]]:
        if strategy not in self._qrels:
            self._qrels[strategy] = qrels_for_chunks(self.items, self.indexes.chunks(strategy), self.relevance)
        return self._qrels[strategy]

    def contexts(self, settings: dict) -> dict[str, list[Hit]]:
        """The passages each question's prompt would get under this configuration, in relevance order, cut to the
        prompt's character budget as the answer pipeline cuts them."""
        from rag.qa.prompt import fit_context
        from rag.qa.steps import augment_prev_next, filter_hits

        s = DEFAULT_SETTINGS | settings
        index, run = self._retrieved(s)
        out = {}
        for qid, hits in run.items():
            hits = filter_hits(hits, top_k=s.get("top_k"), min_score=s.get("min_score"))
            hits = augment_prev_next(index, hits) if s.get("prev_next") else hits
            out[qid] = fit_context(hits, s["max_context_chars"])
        return out

    def score(self, settings: dict) -> Scored:
        started = time.perf_counter()
        s = DEFAULT_SETTINGS | settings
        contexts = self.contexts(s)
        passages = {qid: [h.chunk for h in hits] for qid, hits in contexts.items()}
        found = self._qrels_for(s["strategy"])
        # Every question is scored: one whose evidence no chunk of this strategy holds is a miss, so a strategy
        # that drops text cannot look better by shrinking the question set.
        qrels = {i.qid: found.get(i.qid, {}) for i in self.items}
        mean, _ = evaluate_run(
            qrels, run_from_hits(context_run(self.items, passages, qrels, self.relevance)), SCORE_METRICS
        )
        metrics = dict(mean)
        retrieval = retrieval_score(metrics, METRIC_K)
        generation = self._generation_score(s, contexts) if self.generator is not None else None
        metrics["questions_with_relevant_chunk"] = float(len(found))
        metrics["context_chars"] = context_chars(passages)
        return Scored(
            self.objective.combine(retrieval, generation), retrieval, generation, metrics, time.perf_counter() - started
        )

    def _generation_score(self, s: dict, contexts: dict[str, list[Hit]]) -> float:
        from rag.qa.steps import reorder_long_context

        scored = [i for i in self.items if i.answer][: self.generation_questions]
        if not scored:
            raise ValueError("GenerationScore needs reference answers: the QA set has none")
        total = 0.0
        for item in scored:
            hits = contexts[item.qid]
            if s.get("prompt_order") == "long-context":
                hits = reorder_long_context(hits)
            total += self.generator.score(item.question, item.answer, hits)
        return total / len(scored)

    @property
    def counts(self) -> dict[str, int]:
        return self.indexes.counts | {"retrieval_runs": self.retrieval_runs, "rerank_runs": self.rerank_runs}


def genome_scorer(evaluator: PipelineEvaluator, space: SearchSpace):
    """genome of `space` → Scored (a restricted space numbers its options differently, so the space is bound here)."""

    def score(genome: Genome) -> Scored:
        return evaluator.score(space.settings(genome))

    return score


def genome_identity(evaluator: PipelineEvaluator, space: SearchSpace):
    def identity(genome: Genome) -> str:
        return evaluator.identity(space.settings(genome))

    return identity
