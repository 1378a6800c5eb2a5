"""What an answer is asked with (AnswerSettings, plain data for YAML configs) and what comes back (AnswerResult)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rag.llm import LLMSettings
from rag.qa.encoding import DEFAULT_SENTENCE_ENCODER, SentenceEncoder

# The fixed answer for a question the retrieved context does not answer; the prompt asks the model for exactly
# this sentence, so coverage is counted by comparing against it.
NOT_IN_CONTEXT = "The answer is not in the provided documents."


class OverviewSettings(BaseModel):
    """Questions about the collection or a whole document ("What is this collection about?", "Summarize the
    documents", "What does handbook.docx cover?"): rag.qa.overview detects them and answers from each document's
    opening instead of from retrieved passages."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    max_documents: int = Field(20, ge=1, description="documents listed (extractive) or summarised (LLM map step)")
    sentences: int = Field(3, ge=1, description="opening sentences quoted when the question names one document")
    map_chunks: int = Field(2, ge=1, description="LLM map step: first chunks of each document given to the model")
    # A catalog of every document reads each chunk's payload once to find the first ones and keeps an entry per
    # document: a replica maps its collection's whole payload file for it, on the first question holding a cue such
    # as "about". Past this size a question names a document only among the documents of its own hits, which are
    # read through the doc_id index.
    catalog_max_chunks: int = Field(
        200_000,
        ge=0,
        description="collections up to this many chunks keep a catalog of every document for questions that name "
        "one; larger ones look for the named document among the question's hits",
    )


# What serving asks for when nothing names a model or reranker: the registry's `production` alias, so a promotion
# (retrain_job, a canary) reaches `rag serve`, `rag ask`, the web page and the demo without a flag. Before any
# promotion `production` is the implicit v0: the base embedder (rag.registry.IMPLICIT_PRODUCTION, minilm; indexing
# puts its collection behind `<strategy>__production`) and no reranker (retrieval order).
SERVED_MODEL = "production"
SERVED_RERANKER = "production"
# The retrieval mode where no active configuration (rag.tuning.active) sets one: hybrid-cc measured best on both
# corpora we have. SciFact test nDCG@10, all 5,183 abstracts: hybrid-cc 0.7313, hybrid-rrf 0.7147
# (bench/results/retrieval-full.json); SQuAD corpus: 0.894 vs 0.861 (`make bench-quick`'s bench/qa_eval.py run
# quoted in the README; no committed result file holds it). An applied configuration search winner sets its own.
DEFAULT_MODE = "hybrid-cc"


class AnswerSettings(BaseModel):
    """One answering configuration: retrieval → rerank → filter → neighbours → prompt → generate → attribute."""

    model_config = ConfigDict(extra="forbid")  # a typo in a config file fails loudly

    strategy: str = "paragraph"  # chunk set to search
    # Embedding model of the dense index (and of the extractive generator): a registry alias or version, a built-in
    # or a directory. "production" follows promotions.
    model: str | None = SERVED_MODEL
    # Who encodes the question on every request: "int8", the model's int8 ONNX twin, against the same float passage
    # vectors (a few times faster on a CPU; falls back to the model, with a warning, when no twin loads or it
    # disagrees with the model); "model", the model itself. bench/encoder_int8.py measures both on human questions.
    query_encoder: Literal["model", "int8"] = "int8"
    # Who encodes passage sentences (extractive answers, attribution): "model" or its int8 twin, whose vectors are
    # stored apart. Must match the index's (`rag index --sentence-encoder`), or the answer stage encodes them itself.
    # Default and why: docs/answering.md (bench/answers.py --only spans, arm after-int8-sentences).
    sentence_encoder: SentenceEncoder = DEFAULT_SENTENCE_ENCODER
    mode: str = DEFAULT_MODE  # a retrieval mode of rag.retrieval.RETRIEVERS, or "none" (no context: closed book)
    k: int = Field(10, ge=1, le=1000, description="hits retrieved (and reranked) before filtering")
    candidates: int = Field(100, ge=1, description="per-retriever depth before fusion")
    # 0.5: the best of the SciFact train sweep (alpha_train_sweep in bench/results/retrieval-full.json)
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="hybrid-cc weight of the dense score")
    rerank_depth: int = Field(
        50,
        ge=1,
        le=1000,
        description="with a reranker: first-stage hits it re-orders (its gate "
        "re-orders hybrid top 50), of which the best k go on",
    )
    # rag.rerank spec: None / "none", "production" (retrieval order until one is promoted), "candidate", a registered
    # version or a model directory
    reranker: str | None = SERVED_RERANKER
    top_k: int | None = Field(5, ge=1, description="passages kept for the prompt")
    # ...and only those scoring at least this: with a reranker a relevance probability in [0, 1] (rag.rerank), else the
    # retriever's own score (cosine for dense, BM25 for bm25, the fused score for hybrid modes)
    min_score: float | None = None
    prev_next: bool = False  # add each kept passage's neighbouring chunks
    prompt_order: Literal["simple", "long-context"] = "simple"
    generator: Literal["extractive", "llm"] = "extractive"
    llm: LLMSettings | None = None  # the backend for generator "llm" (and reflection); None -> RAG_LLM_* env
    reflect: bool = False  # one critique-and-revise pass after generation (LLM only)
    max_context_chars: int = Field(6000, ge=200, description="context budget of the prompt; whole passages only")
    # Extractive generator: the answer must share at least this share of the question's content terms with its
    # passage, or the honest answer is NOT_IN_CONTEXT.
    min_support: float = Field(0.5, ge=0.0, le=1.0)
    # Extractive generator: a best sentence that only announces what follows ("... would require the following
    # actions:") is continued into the list items or the sentence completing it, reading on into the next chunks,
    # while the answer stays within max_answer_chars (whole sentences / items only).
    continue_lead_ins: bool = True
    max_answer_chars: int = Field(
        800,
        ge=50,
        description="extractive: the longest answer a lead-in's continuation "
        "makes (the chosen sentence itself is never cut)",
    )
    attribution: bool = True
    attribution_top_k: int = Field(3, ge=1)
    attribution_threshold: float = Field(0.5, description="on [0, 1]: cosine, or the cross-encoder's sigmoid")
    overview: OverviewSettings = Field(default_factory=OverviewSettings)  # `overview: {enabled: false}` turns it off

    @classmethod
    def from_yaml(cls, path: Path) -> AnswerSettings:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"answer config {path} not found")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping of AnswerSettings fields, got {type(raw).__name__}")
        try:
            return cls(**raw)
        except Exception as exc:
            raise ValueError(f"{path}: invalid answer settings: {exc}") from exc


class AnswerResult(BaseModel):
    question: str
    answer: str
    cited_chunk_ids: list[str]  # what the generator cited
    attributed_chunk_ids: list[str]  # what post-hoc attribution found supports the answer
    not_in_context: bool
    latency_ms: float
    chunks: list[dict]  # chunk_id, doc_id, page_start, page_end, text, score, rank, cited, attributed, ...
    generator: str
    settings: dict
    timings_ms: dict[str, float] = Field(default_factory=dict)  # per step
    draft: str | None = None  # the answer before reflection, when it was revised
    attribution_scorer: str | None = None  # what scored attribution: cross-encoder:<name> or embedding:<model>
    warnings: list[str] = Field(default_factory=list)  # degraded paths taken for this answer (e.g. a fallback)
    # What answered, resolved: embedder ("ft-minilm-v2", "minilm (base)"), reranker (a version or "none"), mode and
    # strategy. `settings` holds what was asked for ("production"), which does not say which version that was.
    served: dict[str, str | None] = Field(default_factory=dict)

    def sources(self) -> list[dict]:
        """(document, pages) of every cited or attributed chunk, cited first."""
        return [
            {
                "chunk_id": c["chunk_id"],
                "doc_id": c["doc_id"],
                "page_start": c["page_start"],
                "page_end": c["page_end"],
                "cited": c["cited"],
                "attributed": c["attributed"],
            }
            for c in sorted(self.chunks, key=lambda c: (not c["cited"], not c["attributed"], c["rank"]))
            if c["cited"] or c["attributed"]
        ]
