"""The answer pipeline: retrieve → (rerank) → filter → (neighbours) → fit the context budget → order →
generate → parse → attribute. `Answerer` opens the index, models and LLM once; `ask` is cheap after that."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from rag.embedding import INT8_SUFFIX, TextEmbedder, load_embedder
from rag.llm import LLM, LLMSettings, load_llm
from rag.qa.attribution import CrossEncoderScorer, EmbeddingScorer, PairScorer, attribute
from rag.qa.encoding import CachedEmbedder, open_sentence_store, sentence_encoder
from rag.qa.generators import GENERATORS, ExtractiveGenerator, Generation, Generator
from rag.qa.models import AnswerResult, AnswerSettings
from rag.qa.overview import OVERVIEW_CUES, Catalog, detect_overview, extractive_overview, llm_overview, words
from rag.qa.prompt import Passage, fit_context, label_passages
from rag.qa.steps import augment_prev_next, filter_hits, reorder_long_context
from rag.rerank import rerank
from rag.rerank.features import PASSAGE_TERMS_KEPT
from rag.retrieval.chunks import lookup_of
from rag.retrieval import DENSE_MODES, RETRIEVERS, Hit, Index, RetrievalError, RetrievalParams, retrieve, validate_query
from rag.store import data_dir

NO_RETRIEVAL = "none"
# The most passages a learned ranker is warmed with: its term cache's bound, so a larger corpus is never read for it
# (its warm would refuse them anyway).
WARM_PASSAGES = PASSAGE_TERMS_KEPT
log = logging.getLogger(__name__)


def _registry(root: Path | None):
    from rag.registry import ModelRegistry

    return ModelRegistry(Path(root) / "models") if root is not None else None


def load_reranker_spec(spec: str | None, root: Path | None = None):
    """A rag.rerank Reranker for `spec` (None / "none" → None); registry names resolve under root/models."""
    if not spec or spec == "none":
        return None
    from rag.rerank import load_reranker

    reranker = load_reranker(spec, registry=_registry(root))
    if reranker is None and spec.strip() == "production":
        # Serving "production" before any reranker was promoted: retrieval order stands; the serving index rebuilds its
        # answerer when the registry's aliases change, so the first promoted reranker is served without a restart.
        return None
    if reranker is None:
        raise ValueError(
            f"no reranker {spec!r} is registered yet: train one (retrain_job), or set `reranker: "
            "production` (retrieval order until one is promoted) or `reranker: none`"
        )
    return reranker


def load_production_reranker(root: Path | None = None) -> tuple[object | None, str | None]:
    """(the registered production reranker, or None; why it could not be loaded, or None). `production` is the
    default of every answer, so a promoted reranker that fails to load must not stop answering: the answer falls
    back to retrieval order (and attribution to embedding similarity), and says so in the logs and every result."""
    from rag.rerank import load_reranker

    try:
        return load_reranker("production", registry=_registry(root)), None
    except Exception as exc:  # noqa: BLE001 - any load failure; reported, never silent
        note = (
            f"the production reranker failed to load ({type(exc).__name__}: {str(exc)[:200]}): retrieval order "
            "where it would rerank, and attribution uses embedding similarity"
        )
        log.warning("%s", note)
        return None, note


def production_cross_encoder(
    root: Path | None = None, loaded: tuple[object | None, str | None] | None = None
) -> tuple[object | None, str | None]:
    """(the registered production reranker when it reads text pairs (a cross-encoder), or None; why attribution cannot
    use it, or None). A learned ranker scores question -> passage with first-stage signals; an (answer, passage) pair
    has none, so attribution uses embedding cosine with it. `loaded`: load_production_reranker's result when the
    answerer already loaded it to rerank (one load for both)."""
    reranker, note = loaded if loaded is not None else load_production_reranker(root)
    if reranker is None or getattr(reranker, "needs_hits", False):
        return None, note
    return reranker, None


def served_embedder(
    index: Index | None, embedder: TextEmbedder | None, model: str | None, root: Path | None
) -> str | None:
    """The embedder's served name: a registered version ("ft-minilm-v2"), "minilm (base)" for `production` before
    any promotion (the implicit v0), or the name asked for; None when nothing embeds."""
    loaded = getattr(index, "embedder", None) or embedder
    if loaded is None:
        return None
    name = getattr(loaded, "name", None) or model
    if model is not None and model.removesuffix(INT8_SUFFIX) == "production":
        from rag.registry import ModelRegistry

        registry = ModelRegistry(Path(root) / "models") if root is not None else ModelRegistry()
        if registry.resolve("embedder", "production") is None:
            return f"{name} (base)"
    return name


def llm_from_env() -> LLMSettings:
    return LLMSettings(
        backend=os.environ.get("RAG_LLM_BACKEND", "none"), model=os.environ.get("RAG_LLM_MODEL", "smollm2")
    )


class Answerer:
    """Long-lived: opens the index once. Pass `index`, `reranker`, `attribution_scorer` or `embedder` (e.g. one
    CachedEmbedder for many Answerers) to reuse ones already open; otherwise they come from the settings and the
    data dir."""

    def __init__(
        self,
        settings: AnswerSettings | None = None,
        llm: LLM | None = None,
        *,
        root: Path | None = None,
        qdrant=None,
        index: Index | None = None,
        reranker=None,
        attribution_scorer: PairScorer | None = None,
        embedder: TextEmbedder | None = None,
    ):
        self.settings = s = settings or AnswerSettings()
        self.root = root
        if s.mode != NO_RETRIEVAL and s.mode not in RETRIEVERS:
            raise RetrievalError(f"unknown retrieval mode {s.mode!r} (known: {NO_RETRIEVAL}, {', '.join(RETRIEVERS)})")
        if s.generator not in GENERATORS:
            raise ValueError(f"unknown generator {s.generator!r} (known: {', '.join(GENERATORS)})")
        self.index = index
        if index is None and s.mode != NO_RETRIEVAL:
            from rag.retrieval.service import open_index

            self.index = open_index(
                s.strategy,
                s.model,
                root=root,
                qdrant=qdrant,
                need_dense=s.mode in DENSE_MODES,
                need_bm25=s.mode in {"bm25", "hybrid-rrf", "hybrid-cc"},
                query_encoder=s.query_encoder,
            )
        if embedder is None and self.index is not None and self.index.embedder is not None:
            embedder = self.index.embedder
        if (
            embedder is None
            and s.model
            and (s.generator == "extractive" or (s.attribution and attribution_scorer is None))
        ):
            embedder = load_embedder(s.model)
        # The sentence store of the data dir the index came from: root, or the default one open_index read.
        store_root = root if root is not None else (data_dir() if index is None and self.index is not None else None)
        self.embedder = self._sentence_vectors(embedder, store_root)
        if llm is None and s.generator == "llm":
            llm = load_llm(s.llm or llm_from_env())
        self.llm = llm
        production = None  # (reranker, load failure) of the registry's production reranker, loaded once
        if reranker is None and (s.reranker or "").strip() == "production":
            production = load_production_reranker(root)
            reranker = production[0]
        if reranker is None and production is None:
            reranker = load_reranker_spec(s.reranker, root)
        self.reranker = reranker
        self.attribution_scorer = attribution_scorer
        self.attribution_note: str | None = production[1] if production is not None else None
        if self.attribution_scorer is None and s.attribution:
            cross_encoder, self.attribution_note = production_cross_encoder(root, production)
            if cross_encoder is not None:
                self.attribution_scorer = CrossEncoderScorer(cross_encoder)
            elif self.embedder is not None:
                self.attribution_scorer = EmbeddingScorer(self.embedder)
        self.generator: Generator = GENERATORS[s.generator](s, self.embedder, llm)
        if isinstance(self.generator, ExtractiveGenerator) and self.index is not None:
            self.generator.next_chunk = self._chunk_record  # a lead-in's list may go on in the next chunk
        self._catalog: Catalog | None = None  # the documents, for overview questions; built on the first one
        self._names_in_hits: bool | None = None  # too many chunks for a catalog of every document (catalog_max_chunks)
        self._served: dict[str, str | None] | None = None

    def warm_reranker_in_background(self) -> None:
        """A learned ranker remembers the terms of the passages it has scored, and an unseen passage costs several
        times a seen one. A long-lived server calls this once it has built the answerer: a background thread hands
        the ranker the index's passages before the first questions, so its first requests (which a canary's latency
        guardrail times against production) cost what later ones do. Not done on construction: a one-question
        `rag ask` would pay for the whole corpus beside its only question."""
        warm = getattr(self.reranker, "warm", None)
        lookup = lookup_of(self.index)
        if warm is None or lookup is None:
            return

        def run() -> None:
            try:
                # A corpus larger than the ranker's term cache is not warmed: the cache would empty on the way.
                if (texts := lookup.texts(limit=WARM_PASSAGES)) is not None:
                    warm(texts)
            except Exception:  # noqa: BLE001 - a cold cache is slower, never wrong: answering goes on
                log.warning("warming the reranker's passage terms failed", exc_info=True)

        threading.Thread(target=run, name="reranker-warm", daemon=True).start()

    def _sentence_vectors(self, embedder: TextEmbedder | None, root: Path | None) -> CachedEmbedder | None:
        """The generator and attribution encode the same passage sentences: they read them from the data dir's
        sentence store (filled at index time) through a CachedEmbedder, and take the question's vector from
        retrieval when retrieval has one from the same model, so a question's only encoding is the question's."""
        if embedder is None:
            return None
        if not isinstance(embedder, CachedEmbedder):
            embedder = sentence_encoder(self.settings.model or embedder.name, embedder, self.settings.sentence_encoder)
            embedder = CachedEmbedder(embedder, store=open_sentence_store(root, embedder))
        index_embedder = getattr(self.index, "embedder", None)
        # The int8 twin is shared per model folder (rag.embedding.onnx_int8), so retrieval's query encoder may be it.
        same = embedder.embedder is index_embedder or embedder.embedder is getattr(self.index, "query_encoder", None)
        if embedder.query_vector is None and index_embedder is not None and same:
            embedder.query_vector = self.index.query_vector
        return embedder

    def _chunk_record(self, chunk_id: str) -> dict | None:
        return self.index.lookup.get_many([chunk_id]).get(chunk_id)

    def served(self) -> dict[str, str | None]:
        """The versions this answerer serves, resolved: what /health and `rag ask --json` name. A settings value like
        "production" says what was asked for, not which version it was when the answerer was built."""
        if self._served is None:  # the models are loaded once, so what they are cannot change after the first call
            s, reranker = self.settings, self.reranker
            reranker_name = "none" if reranker is None else getattr(reranker, "name", type(reranker).__name__)
            self._served = {
                "embedder": served_embedder(self.index, self.embedder, s.model, self.root),
                # what encodes the questions: the embedder itself, or its int8 twin (rag.embedding.onnx_int8)
                "query_encoder": _query_encoder_name(self.index),
                "reranker": reranker_name,
                "mode": s.mode,
                "strategy": None if s.mode == NO_RETRIEVAL else s.strategy,
                "model": s.model,
                "reranker_spec": s.reranker,
            }
        return dict(self._served)

    def catalog(self) -> Catalog | None:
        """The index's documents with their titles and first chunks (None without an index)."""
        if self._catalog is None and self.index is not None:
            self._catalog = self.index.lookup.catalog()
        return self._catalog

    def names_documents_among_hits(self) -> bool:
        """Whether a question naming a document is matched against its own hits' documents instead of a catalog of
        every document: the collection holds more than overview.catalog_max_chunks chunks (counted once)."""
        lookup = lookup_of(self.index)
        if lookup is None or self._catalog is not None:
            return False
        if self._names_in_hits is None:
            self._names_in_hits = len(lookup) > self.settings.overview.catalog_max_chunks
        return self._names_in_hits

    def _overview(self, question: str, hits: list[Hit] | None = None):
        """(passages, generation) answering an overview question (rag.qa.overview), or None for any other. `hits`:
        the question's passages, whose documents are the ones it may name (names_documents_among_hits)."""
        s = self.settings
        if not s.overview.enabled or self.index is None or not set(words(question)) & OVERVIEW_CUES:
            return None  # the cue check first: most questions never need the catalog
        if hits is not None:
            named = {str(h.chunk["doc_id"]) for h in hits if h.chunk.get("doc_id") is not None}
            catalog = lookup_of(self.index).catalog(doc_ids=named)
        else:
            catalog = None if self.names_documents_among_hits() else self.catalog()
        request = detect_overview(question, catalog)
        if request is None:
            return None
        if request.doc_ids is None:  # about the whole collection
            catalog = self.catalog()
        if s.generator == "llm":
            max_new_tokens = s.llm.max_new_tokens if s.llm else 128
            return llm_overview(question, request, catalog, s.overview, self.llm, max_new_tokens=max_new_tokens)
        return extractive_overview(request, catalog, s.overview)

    def _retrieve(self, question: str) -> list[Hit]:
        s = self.settings
        if s.mode == NO_RETRIEVAL:
            return []
        # A reranker re-orders the first stage's top rerank_depth, as its gate measured it (GateSettings.rerank_depth):
        # re-ordering only the top k would serve a narrower model than the one that was promoted.
        k = max(s.k, s.rerank_depth) if self.reranker is not None else s.k
        return retrieve(
            self.index, question, s.mode, RetrievalParams(k=k, candidates=max(s.candidates, k), alpha=s.alpha)
        )

    def _rerank(self, question: str, hits: list[Hit]) -> list[Hit]:
        if self.reranker is None or not hits:
            return hits
        return rerank(self.reranker, question, hits, self.settings.k)

    def rank(self, question: str) -> list[Hit]:
        """retrieve → rerank → filter: the passages this answerer would put in the prompt, best first. A canary
        interleaves two answerers' rankings and answers from the result with ask(question, ranked=...)."""
        s = self.settings
        question = validate_query(question)
        return filter_hits(self._rerank(question, self._retrieve(question)), top_k=s.top_k, min_score=s.min_score)

    def ask(self, question: str, *, ranked: list[Hit] | None = None) -> AnswerResult:
        """Answer `question`; with `ranked`, from those passages (already filtered, best first) instead of this
        answerer's own retrieval."""
        s = self.settings
        question = validate_query(question)
        timings: dict[str, float] = {}
        started = clock = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[name] = round((now - clock) * 1000, 2)
            clock = now

        overview = self._overview(question)
        if overview is not None:
            # About the collection or a whole document: answered from the documents' openings, not from retrieval;
            # the lines quote (extractive) or summarise (LLM) the cited chunks, so attribution is not run.
            passages, generation = overview
            lap("overview")
            return self._result(
                question, passages, generation, [], {}, f"overview:{self.generator.name}", timings, started
            )
        if ranked is None:
            hits = self._retrieve(question)
            lap("retrieve")
            hits = self._rerank(question, hits)
            lap("rerank")
            hits = filter_hits(hits, top_k=s.top_k, min_score=s.min_score)
        else:
            hits = list(ranked)
        if self.names_documents_among_hits() and (overview := self._overview(question, hits)) is not None:
            passages, generation = overview
            lap("overview")
            return self._result(
                question, passages, generation, [], {}, f"overview:{self.generator.name}", timings, started
            )
        if s.prompt_order == "long-context":
            hits = reorder_long_context(hits)
        if s.prev_next and hits:  # after reordering, so each neighbour sits beside its hit
            hits = augment_prev_next(self.index, hits)
        hits = fit_context(hits, s.max_context_chars)
        passages = None if s.mode == NO_RETRIEVAL else label_passages(hits)
        generation = self.generator.generate(question, passages)
        if generation.continued and passages is not None:
            # The chunks an answer read on into (a lead-in's list in the next chunk) are shown and cited with it.
            lead = generation.parsed.cited_chunk_ids[0]
            extra = [
                Hit(len(passages) + n, 0.0, {**c, "neighbour_of": lead}) for n, c in enumerate(generation.continued, 1)
            ]
            passages = passages + [Passage(str(h.rank), h) for h in extra]
        lap("generate")
        parsed = generation.parsed
        attributed: list[str] = []
        scores: dict[str, float] = {}
        if self.attribution_scorer is not None and passages and not parsed.not_in_context:
            picked, all_scores = attribute(
                parsed.answer,
                [p.chunk["text"] for p in passages],
                self.attribution_scorer,
                top_k=s.attribution_top_k,
                threshold=s.attribution_threshold,
            )
            attributed = [passages[i].chunk_id for i in picked]
            scores = {p.chunk_id: round(sc, 4) for p, sc in zip(passages, all_scores)}
        lap("attribute")
        return self._result(question, passages, generation, attributed, scores, self.generator.name, timings, started)

    def _result(
        self,
        question: str,
        passages: list[Passage] | None,
        generation: Generation,
        attributed: list[str],
        scores: dict[str, float],
        generator: str,
        timings: dict[str, float],
        started: float,
    ) -> AnswerResult:
        s, parsed = self.settings, generation.parsed
        timings["total"] = round((time.perf_counter() - started) * 1000, 2)
        chunks = [
            _chunk_view(
                p.hit, p.label, p.chunk_id in parsed.cited_chunk_ids, p.chunk_id in attributed, scores.get(p.chunk_id)
            )
            for p in passages or []
        ]
        return AnswerResult(
            question=question,
            answer=parsed.answer,
            cited_chunk_ids=parsed.cited_chunk_ids,
            attributed_chunk_ids=attributed,
            not_in_context=parsed.not_in_context,
            latency_ms=timings["total"],
            chunks=chunks,
            generator=generator,
            settings=s.model_dump(mode="json", exclude={"llm"}) | {"llm": _llm_name(self.llm)},
            timings_ms=timings,
            draft=generation.draft,
            attribution_scorer=getattr(self.attribution_scorer, "name", None) if s.attribution else None,
            warnings=[self.attribution_note] if self.attribution_note else [],
            served=self.served(),
        )


def _query_encoder_name(index: Index | None) -> str | None:
    if index is None or index.embedder is None:
        return None
    twin = index.query_encoder
    return "embedder" if twin is None else f"{twin.name} ({twin.version})"


def _llm_name(llm: LLM | None) -> str | None:
    return getattr(llm, "name", None) if llm is not None else None


def _chunk_view(hit: Hit, label: str, cited: bool, attributed: bool, attribution_score: float | None) -> dict:
    """A passage as the answer shows it: the hit's own JSON (rag.retrieval.Hit.to_json) plus how the answer used it."""
    c = hit.chunk
    html = c.get("table_html")
    neighbour = c.get("neighbour_of")
    return hit.to_json() | {
        "table_html": html if isinstance(html, str) else None,
        "label": label,
        "cited": cited,
        "attributed": attributed,
        "attribution_score": attribution_score,
        "neighbour_of": neighbour if isinstance(neighbour, str) else None,
        **({"team": c["team"], "shared": bool(c.get("shared"))} if c.get("team") else {}),
    }  # team/shared: interleaved canary answers only


def answer_question(question: str, settings: AnswerSettings | None = None, **kw) -> AnswerResult:
    """One question, one Answerer (opens the index each call: for many questions keep an `Answerer`)."""
    return Answerer(settings, **kw).ask(question)
