"""The serving configuration people's questions choose: which chunk set, retrieval mode and hybrid weight answer.

A configuration is learned like a model: from the exported feedback dataset, split as every learner splits it
(rag.training.data.split_feedback: the held-out questions never choose), it is searched on the training questions,
registered as a `configuration` version (configuration.yaml) and gated on the held-out ones against the production
configuration, with the same paired test as embedders and rerankers; then released, canaried or rolled back like them.

Relevance crosses chunk sets through the documents: a passage a person rated +1 is a span of a document
(doc_id, char_start, char_end), and a chunk of another chunk set is relevant to the question when it holds that span
as rag.evaluation.qaset.Relevance says (the rule the evaluations use). So a chunk set users never saw can be judged
by what they said about the text, and a finer or coarser one is neither favoured nor punished by the rule itself.
Users rated only what production showed, so the comparison leans towards production: a configuration that finds
other relevant text gets no credit for it. A candidate has to win despite that.

The search reads each chunk set's BM25 and dense rankings once per question and fuses them for every mode and weight
as the retrievers do (rag.retrieval): the grid costs two searches per question and chunk set. The gate then ranks its
questions through the full serving path (rag.qa.Answerer.rank: first stage, production reranker, filters) for both
configurations.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field

from rag.evaluation.metrics import evaluate_run
from rag.evaluation.qaset import NOT_RELEVANT_IN_CONTEXT, Evidence, QAItem, Relevance, qrels_for_chunks
from rag.store import CHUNKS_TABLE, DOCUMENTS_TABLE, TableStore, bm25_root
from rag.training.answers import answer_spans

FILE = "configuration.yaml"
SEARCH_FILE = "search.csv"
MODES = ("bm25", "dense", "hybrid-cc", "hybrid-rrf")


class ServingConfiguration(BaseModel):
    """What a `configuration` version holds: the answer settings it sets (rag.qa.AnswerSettings fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    strategy: str = Field(description="chunk set searched")
    mode: str = Field(description="retrieval mode: bm25, dense, hybrid-cc or hybrid-rrf")
    alpha: float = Field(0.5, ge=0, le=1, description="hybrid-cc weight of the dense score")

    @property
    def label(self) -> str:
        weight = f" α {self.alpha:g}" if self.mode == "hybrid-cc" else ""
        return f"{self.strategy} · {self.mode}{weight}"

    def apply(self, settings):
        """`settings` (AnswerSettings) with this configuration's fields."""
        return settings.model_copy(update=self.model_dump())

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / FILE
        path.write_text(yaml.safe_dump(self.model_dump(), sort_keys=True))
        return path

    @classmethod
    def load(cls, folder: Path) -> ServingConfiguration:
        path = Path(folder) / FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: a configuration version holds its {FILE}")
        return cls.model_validate(yaml.safe_load(path.read_text()) or {})

    @classmethod
    def of(cls, settings) -> ServingConfiguration:
        """The configuration `settings` (AnswerSettings) serve with."""
        return cls(strategy=settings.strategy, mode=settings.mode, alpha=settings.alpha)


class ConfigurationSpace(BaseModel):
    """What the search tries (run config of the trained_configuration asset)."""

    model_config = ConfigDict(extra="forbid")
    strategies: list[str] | None = Field(
        None, description="chunk sets to try; None: every chunk set with a BM25 index and a production collection"
    )
    modes: list[str] = Field(list(MODES), description="retrieval modes to try")
    alphas: list[float] = Field([0.2, 0.35, 0.5, 0.65, 0.8], description="hybrid-cc weights of the dense score")
    candidates: int = Field(100, ge=10, description="per-retriever depth before fusion, as RetrievalParams")
    depth: int = Field(20, ge=10, description="ranks scored (nDCG@10, MRR@10, recall@20 need 20)")
    min_questions: int = Field(20, ge=1, description="fewest training questions with a located passage to search on")

    def grid(self, strategies: list[str]) -> list[ServingConfiguration]:
        out = []
        for strategy in strategies:
            for mode in self.modes:
                weights = self.alphas if mode == "hybrid-cc" else [0.5]
                out += [ServingConfiguration(strategy=strategy, mode=mode, alpha=a) for a in weights]
        return out


class TooFewQuestions(ValueError):
    """Not enough rated questions to choose or judge a configuration; the message says how many more."""


# --- people's questions as spans of documents ---------------------------------------------------------------------


def _squash(text: str) -> str:
    return " ".join(str(text).split())


@dataclass
class PassageSpans:
    """Where a passage text people rated lies in the documents: every chunk set's chunks by text, and the documents'
    text for a passage no chunk set holds any more."""

    by_text: dict[str, list[tuple[str, int, int]]]
    documents: dict[str, str]

    @classmethod
    def of(cls, tables: TableStore, strategies: list[str]) -> PassageSpans:
        by_text: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        for strategy in strategies:
            chunks = tables.read(CHUNKS_TABLE, strategy)
            if chunks is None:
                continue
            located = zip(chunks["text"], chunks["doc_id"], chunks["char_start"], chunks["char_end"])
            for text, doc, start, end in located:
                spans = by_text[_squash(text)]
                if (doc, int(start), int(end)) not in spans:
                    spans.append((doc, int(start), int(end)))
        documents = tables.read(DOCUMENTS_TABLE)
        texts = dict(zip(documents["doc_id"], documents["canonical_text"])) if documents is not None else {}
        return cls(dict(by_text), texts)

    def spans(self, passage: str) -> list[Evidence]:
        found = self.by_text.get(_squash(passage))
        if found:
            return [Evidence(doc_id=d, start=s, end=e) for d, s, e in found]
        needle = _squash(passage)[:200]
        for doc, text in self.documents.items():  # a passage of a chunk set since re-chunked: find its text
            at = _squash(text).find(needle) if needle else -1
            if at != -1:
                return (
                    [Evidence(doc_id=doc, start=0, end=len(text))]
                    if len(needle) < 20
                    else [Evidence(doc_id=doc, start=_raw_offset(text, at), end=_raw_offset(text, at + len(needle)))]
                )
        return []


def _raw_offset(text: str, squashed_offset: int) -> int:
    """The offset in `text` of a character at `squashed_offset` in its whitespace-squashed form."""
    seen, in_space = 0, True
    for i, ch in enumerate(text):
        if ch.isspace():
            if not in_space and seen < squashed_offset:
                seen += 1
            in_space = True
            continue
        if seen >= squashed_offset:
            return i
        seen += 1
        in_space = False
    return len(text)


@dataclass
class Judged:
    """Questions with the document spans people marked as answering them."""

    queries: dict[str, str] = field(default_factory=dict)  # id -> text
    spans: dict[str, list[Evidence]] = field(default_factory=dict)  # id -> relevant spans
    weights: dict[str, float] = field(default_factory=dict)  # id -> how many questions it stands for (default 1)

    def __len__(self) -> int:
        return len(self.queries)

    def weight_of(self, table: pd.DataFrame) -> pd.Series:
        """Each row's weight (`qid` column), scaled to a mean of 1 over the table."""
        weights = table["qid"].map(lambda q: self.weights.get(q, 1.0)).astype(float)
        return weights / weights.mean() if len(weights) and weights.mean() > 0 else weights

    def weighted(self, table: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
        """Per-question scores times their weight: paired tests on them weigh each question by what it stands for
        (a sign-flip test flips a question's weighted difference as a whole, so it stays valid)."""
        out = table.copy()
        weights = self.weight_of(table).to_numpy()
        for metric in metrics:
            out[metric] = out[metric].to_numpy() * weights
        return out

    def qrels(self, chunks: pd.DataFrame) -> dict[str, dict[str, int]]:
        """Relevant chunks of one chunk set per question (every question keyed; none relevant: empty)."""
        items = [
            QAItem(qid=q, question=self.queries[q], qtype="dataset", doc_id=s[0].doc_id, evidence=s)
            for q, s in self.spans.items()
            if s
        ]
        found = qrels_for_chunks(items, chunks, Relevance())
        return {q: found.get(q, {}) for q in self.queries}

    def read_run(self, reads: dict[str, dict[str, int]], starts: dict[str, tuple[str, int, int]], depth: int) -> dict:
        """A ranx run of what the answer reads per question ({chunk_id: characters read}, best first; `starts`:
        chunk_id -> (doc_id, char_start, char_end): chunk_starts). A passage read only in part stays a hit only
        when that part holds one of the question's spans: a whole document cut to the budget holds the answer only
        if the answer is before the cut (rag.evaluation.qaset.context_run's rule)."""
        rule, run = Relevance(), {}
        for q, read in reads.items():
            ranked = []
            for cid, chars in read.items():
                doc, start, end = starts.get(cid, ("", 0, 0))
                read_end = min(end, start + chars)  # a table's HTML is longer than its span in the text
                if not any(rule.holds(ev, doc, start, read_end) for ev in self.spans.get(q, ())):
                    cid += NOT_RELEVANT_IN_CONTEXT  # takes its place in the context, counts as no hit
                ranked.append(cid)
            run[q] = {c: float(depth - r) for r, c in enumerate(ranked)} or {"-": 0.0}
        return run


def judged_questions(split, locate: PassageSpans) -> tuple[Judged, Judged]:
    """(training questions, held-out questions) of a FeedbackSplit with the spans of their +1 passages and of their
    corrected answers found in the documents (answer_spans). A corrected answer is what tells where the answer was
    when none of the passages production showed held it: without it, the only questions with an answer key would be
    those production already answered. A question with nothing located is left out."""
    train, by_text, liked = Judged(), defaultdict(list), set()
    for text, passage in split.positives:
        found = locate.spans(passage)
        by_text[text].extend(found)
        if found:
            liked.add(text)
    for text, answer in getattr(split, "corrections", []):
        by_text[text].extend(answer_spans(answer, locate.documents))
    for i, (text, spans) in enumerate(sorted(by_text.items())):
        if spans:
            key = f"train:{hashlib.sha256(text.encode()).hexdigest()[:12]}:{i}"
            train.queries[key], train.spans[key] = text, spans
    _weigh_failures(train, {k for k, t in train.queries.items() if t not in liked}, split.failed_questions)
    held, failed_keys = Judged(), set()
    corrected = getattr(split, "dev_corrections", {})
    for key in sorted(set(split.dev_queries) | set(corrected)):
        text = split.dev_queries.get(key) or corrected[key][0]
        spans = [s for cid in split.dev_qrels.get(key, {}) for s in locate.spans(split.dev_passages.get(cid, ""))]
        if not spans:
            failed_keys.add(key)
        spans += [s for answer in corrected.get(key, ("", []))[1] for s in answer_spans(answer, locate.documents)]
        if spans:
            held.queries[key], held.spans[key] = text, spans
    _weigh_failures(held, failed_keys & set(held.queries), split.dev_failed_questions)
    return train, held


def _weigh_failures(judged: Judged, corrected: set[str], failures: int) -> None:
    """People say where the answer was for a question production failed only when they correct it; the others they
    merely down-vote. Each located correction then stands for failures / corrections questions of its side, so that
    the questions production answered (every one with its +1 passage) do not outweigh the failures by their number
    alone: otherwise production would look right on nearly every labelled question, by how labels arise."""
    if corrected and failures > len(corrected):
        weight = failures / len(corrected)
        judged.weights.update(dict.fromkeys(corrected, weight))


# --- the search ---------------------------------------------------------------------------------------------------


def searchable_strategies(tables: TableStore, root: Path, space: ConfigurationSpace, qdrant=None) -> list[str]:
    """The chunk sets the search may choose: named in the space (else every one), with chunks, a BM25 index and a
    collection of the production embedder (a configuration the server could not open is never proposed)."""
    from rag.index.qdrant import QdrantSettings, alias_target, get_client
    from rag.lifecycle.promotion import serving_alias
    from rag.retrieval.service import production_fallback

    folder = tables.root / CHUNKS_TABLE
    present = sorted(p.parent.name for p in folder.glob("*/data.parquet")) if folder.exists() else []
    names = space.strategies or present
    client = get_client(qdrant or QdrantSettings.from_env())
    usable = []
    for strategy in names:
        if tables.read(CHUNKS_TABLE, strategy) is None or not bm25_root(root, strategy).exists():
            continue
        fallback = production_fallback(strategy, "production")
        if alias_target(client, serving_alias(strategy)) is None and (
            fallback is None or alias_target(client, fallback) is None
        ):
            continue
        usable.append(strategy)
    return usable


def _components(index, questions: dict[str, str], depth: int) -> dict[str, tuple[list, list]]:
    from rag.retrieval import SearchFilter, bm25_ranking, dense_ranking

    flt = SearchFilter()
    return {
        q: (dense_ranking(index, text, depth, flt), bm25_ranking(index, text, depth, flt))
        for q, text in questions.items()
    }


def _fused(mode: str, alpha: float, dense: list, sparse: list) -> list[tuple[str, float]]:
    from rag.retrieval.fusion import convex_combination, reciprocal_rank_fusion

    if mode == "bm25":
        return sparse
    if mode == "dense":
        return dense
    if mode == "hybrid-rrf":
        return reciprocal_rank_fusion([dense, sparse], k=60)
    return convex_combination(dense, sparse, alpha)


METRICS = ["ndcg@10", "mrr@10", "recall@5", "recall@20"]


@dataclass(frozen=True)
class ReadBudget:
    """What the answer stage reads of a ranking, and so what a configuration is judged on: the first top_k passages,
    fewer when they overflow the context budget (rag.qa.prompt.fit_context keeps the best and drops from the bottom).
    Judged on whole rankings instead, a chunk set of whole documents looks best (one coarse passage holds every
    answer of its document) while people are shown one or two of them: on TAT-QA its canary lost, wins 21 / losses
    29 by people's clicks."""

    top_k: int
    max_chars: int

    @classmethod
    def of(cls, settings) -> ReadBudget:
        return cls(top_k=int(settings.top_k or 5), max_chars=int(settings.max_context_chars))

    def cut(self, ranked: list[str], length) -> list[str]:
        """The prefix of `ranked` (chunk ids, best first) the answer reads; `length(chunk_id)` is a passage's size."""
        kept, used = [], 0
        for chunk_id in ranked[: self.top_k]:
            used += length(chunk_id)
            if kept and used > self.max_chars:
                break
            kept.append(chunk_id)
        return kept

    def chars_read(self, kept: list[str], length) -> dict[str, int]:
        """How much of each kept passage the answer reads: all of it, but the best passage alone over the budget is
        cut to the budget (fit_context), and an answer past the cut is not read."""
        if len(kept) == 1 and length(kept[0]) > self.max_chars:
            return {kept[0]: self.max_chars}
        return {c: length(c) for c in kept}


def passage_lengths(chunks: pd.DataFrame) -> dict[str, int]:
    """Each chunk's size as the prompt reads it (tables as HTML), as fit_context counts it."""
    from rag.qa.prompt import passage_text

    html = chunks["table_html"] if "table_html" in chunks.columns else [None] * len(chunks)
    return {
        cid: len(passage_text({"text": text, "table_html": table}))
        for cid, text, table in zip(chunks["chunk_id"], chunks["text"], html)
    }


def chunk_starts(chunks: pd.DataFrame) -> dict[str, tuple[str, int, int]]:
    """chunk_id -> (doc_id, char_start, char_end): where the part of a chunk the answer reads lies."""
    located = zip(chunks["chunk_id"], chunks["doc_id"], chunks["char_start"], chunks["char_end"])
    return {cid: (doc, int(start), int(end)) for cid, doc, start, end in located}


def search(
    judged: Judged,
    tables: TableStore,
    root: Path,
    space: ConfigurationSpace,
    strategies: list[str],
    *,
    budget: ReadBudget,
    qdrant=None,
    log=print,
) -> pd.DataFrame:
    """Every configuration of the grid on the judged questions, each ranking cut to what the answer reads (`budget`):
    one row per configuration with its mean metrics, best first (nDCG@10, then MRR@10)."""
    from rag.index.qdrant import QdrantSettings
    from rag.retrieval.service import open_index

    rows = []
    for strategy in strategies:
        chunks = tables.read(CHUNKS_TABLE, strategy)
        qrels = judged.qrels(chunks)
        index = open_index(strategy, "production", root=root, qdrant=qdrant or QdrantSettings.from_env())
        known = set(chunks["chunk_id"])  # the chunk set the index serves
        lengths, starts = passage_lengths(chunks), chunk_starts(chunks)
        length = lengths.get  # a chunk the table lacks reads as empty
        components = _components(index, judged.queries, space.candidates)
        for config in space.grid([strategy]):
            reads = {}
            for q, (dense, sparse) in components.items():
                ranked = [c for c, _ in _fused(config.mode, config.alpha, dense, sparse) if c in known]
                reads[q] = budget.chars_read(budget.cut(ranked, lambda c: length(c, 0)), lambda c: length(c, 0))
            _, per_question = evaluate_run(qrels, judged.read_run(reads, starts, space.depth), METRICS)
            weights = judged.weight_of(per_question)
            means = {m: float((per_question[m] * weights).mean()) for m in METRICS}
            rows.append({**config.model_dump(), "label": config.label, **{m: round(v, 4) for m, v in means.items()}})
        best = max(r["ndcg@10"] for r in rows if r["strategy"] == strategy)
        log(f"configuration search: {strategy}: best nDCG@10 {best:.4f} on {len(judged)} questions")
    table = pd.DataFrame(rows)
    return table.sort_values(["ndcg@10", "mrr@10"], ascending=False, kind="stable").reset_index(drop=True)


def choose(table: pd.DataFrame, production: ServingConfiguration) -> ServingConfiguration:
    """The best configuration of a search; production's own when it scores as high (no change for nothing)."""
    best = table.iloc[0]
    top = table[(table["ndcg@10"] == best["ndcg@10"]) & (table["mrr@10"] == best["mrr@10"])]
    for row in top.to_dict("records"):
        if ServingConfiguration(strategy=row["strategy"], mode=row["mode"], alpha=row["alpha"]) == production:
            return production
    return ServingConfiguration(strategy=best["strategy"], mode=best["mode"], alpha=float(best["alpha"]))


# --- the gate -----------------------------------------------------------------------------------------------------


def served_table(
    answerer, judged: Judged, chunks: pd.DataFrame, metrics: list[str], budget: ReadBudget, depth: int = 20
) -> pd.DataFrame:
    """Per-question metrics of what a served answerer's answer reads (its full serving path, cut by `budget`) on the
    judged questions."""
    from rag.qa.prompt import passage_text

    reads = {}
    for q, text in judged.queries.items():
        hits = {h.chunk["chunk_id"]: h for h in answerer.rank(text)[:depth]}

        def length(c: str) -> int:
            return len(passage_text(hits[c].chunk))

        reads[q] = budget.chars_read(budget.cut(list(hits), length), length)
    run = judged.read_run(reads, chunk_starts(chunks), depth)
    return evaluate_run(judged.qrels(chunks), run, metrics)[1]


def feedback_hash(dataset: Path | None) -> str:
    if dataset is None:
        return ""
    stats = Path(dataset) / "stats.json"
    return json.loads(stats.read_text()).get("version", "") if stats.exists() else ""


# --- the registry: what serves, training and gating a candidate ---------------------------------------------------

FOLLOWED = ("strategy", "mode", "alpha")  # the answer settings a production configuration sets


def production_configuration(registry) -> tuple[ServingConfiguration | None, object | None]:
    """(the production configuration, its version); (None, None) before any was promoted (the implicit v0: the
    server's own settings)."""
    mv = registry.resolve("configuration", "production")
    if mv is None:
        return None, None
    return ServingConfiguration.load(mv.path), mv


def served_settings(settings, registry, pinned: frozenset[str] | set[str] = frozenset()):
    """`settings` (AnswerSettings) with the production configuration's fields, except those an operator `pinned`
    (given explicitly); unchanged before any configuration was promoted."""
    production, _ = production_configuration(registry)
    if production is None:
        return settings
    update = {k: v for k, v in production.model_dump().items() if k not in pinned}
    return settings.model_copy(update=update)


def serving_defaults(root: Path):
    """What serves when no configuration was promoted: the applied configuration file (rag.tuning.active), else
    AnswerSettings' defaults."""
    from rag.qa import AnswerSettings
    from rag.tuning.active import active_file

    path = active_file(root)
    return AnswerSettings.from_yaml(path) if path is not None else AnswerSettings()


def base_settings(root: Path):
    """serving_defaults ranked 20 deep for scoring."""
    return serving_defaults(root).model_copy(update={"top_k": 20, "attribution": False})


def configuration_label(mv) -> str:
    return mv.name if mv is not None else "the server's own settings (implicit v0)"


@dataclass
class Learned:
    version: object  # the registered ModelVersion
    chosen: ServingConfiguration
    production: ServingConfiguration
    search: pd.DataFrame
    questions: int  # training questions the search scored
    held_out: int  # questions held out for the gate

    @property
    def summary(self) -> dict:
        best = self.search.iloc[0].to_dict()
        mine = self.search[self.search["label"] == self.production.label]
        return {
            "chosen": self.chosen.label,
            "production": self.production.label,
            "search_questions": self.questions,
            "held_out_questions": self.held_out,
            "configurations_tried": len(self.search),
            "best_ndcg@10": best["ndcg@10"],
            "production_ndcg@10": float(mine["ndcg@10"].iloc[0]) if len(mine) else None,
        }


def train_configuration(
    tables: TableStore,
    registry,
    *,
    root: Path,
    space: ConfigurationSpace,
    feedback_dataset: Path | None,
    dev_fraction: float,
    qdrant=None,
    log=print,
) -> Learned:
    """Search the grid on people's training questions, register the best configuration as `candidate`."""
    import tempfile
    from types import SimpleNamespace

    from rag.feedback import judgments
    from rag.registry.tracking import log_training, training_run
    from rag.training.data import split_feedback

    if feedback_dataset is None:
        raise TooFewQuestions(
            "no feedback dataset: a configuration is chosen on people's rated questions only (run retrain_job from "
            "feedback_volume_sensor, or pass feedback_dataset)"
        )
    split = split_feedback(judgments(Path(feedback_dataset)), dev_fraction)
    current, current_mv = production_configuration(registry)
    production = current or ServingConfiguration.of(base_settings(root))
    strategies = searchable_strategies(tables, root, space, qdrant)
    if production.strategy not in strategies:
        strategies.append(production.strategy)
    train, held = judged_questions(split, PassageSpans.of(tables, strategies))
    if len(train) < space.min_questions:
        raise TooFewQuestions(
            f"{len(train)} rated questions with a passage found in the documents; the search needs "
            f"{space.min_questions} (ConfigurationSpace.min_questions): let more people rate answers"
        )
    with training_run(
        registry,
        "configuration",
        seed=None,
        training_data_hash=feedback_hash(feedback_dataset),
        qa_set_version="",
        strategy=production.strategy,
        base_model="serving",
        uses_torch=False,
    ) as run_id:
        budget = ReadBudget.of(serving_defaults(root))
        table = search(train, tables, root, space, strategies, budget=budget, qdrant=qdrant, log=log)
        chosen = choose(table, production)
        hyperparameters = {
            **space.model_dump(),
            "searched_strategies": strategies,
            "feedback_dataset": str(feedback_dataset),
            "feedback_dev_fraction": dev_fraction,
            "read_budget": {"top_k": budget.top_k, "max_context_chars": budget.max_chars},
        }
        history = [{"step": i, **{m: row[m] for m in METRICS}} for i, row in enumerate(table.to_dict("records"))]
        learned = Learned(None, chosen, production, table, len(train), len(held))
        log_training(registry, run_id, SimpleNamespace(log_history=history, summary=learned.summary), hyperparameters)
        with tempfile.TemporaryDirectory(dir=registry.root, prefix=".train-") as scratch:
            folder = Path(scratch) / "model"
            chosen.save(folder)
            table.to_csv(folder / SEARCH_FILE, index=False)
            mine = table[table["label"] == chosen.label].iloc[0].to_dict()
            manifest = {
                "family": "serving",
                "base_model": "serving",
                "parent_version": current_mv.version if current_mv is not None else None,
                "training_data_hash": feedback_hash(feedback_dataset),
                "strategy": chosen.strategy,
                "configuration": chosen.model_dump(),
                "hyperparameters": hyperparameters,
                "metrics": {"selection": {m: mine[m] for m in METRICS}, "search": learned.summary},
            }
            learned.version = registry.register("configuration", folder, manifest, move=True, run_id=run_id)
    registry.set_alias("configuration", "candidate", learned.version.version)
    log(f"registered configuration {learned.version.name} ({chosen.label}) as candidate: {learned.summary}")
    return learned


def gate_configuration(tables: TableStore, registry, candidate, settings, *, root: Path, log=print):
    """Candidate vs production configuration on the held-out people's questions, each ranked through the full serving
    path; the verdict goes into the candidate's manifest (what promote() and a canary's start check)."""
    from datetime import UTC, datetime

    from rag.feedback import judgments
    from rag.qa import Answerer
    from rag.registry.tracking import record_gate
    from rag.training.data import split_feedback
    from rag.training.gate import TooFewGateQuestions, gate_decision, gate_metrics
    from rag.training.pipeline import withdraw_rejected

    trained = candidate.hyperparameters
    split = split_feedback(judgments(Path(trained["feedback_dataset"])), trained["feedback_dev_fraction"])
    current, current_mv = production_configuration(registry)
    base = base_settings(root)
    production = current or ServingConfiguration.of(base)
    chosen = ServingConfiguration.load(candidate.path)
    _, held = judged_questions(split, PassageSpans.of(tables, sorted({production.strategy, chosen.strategy})))
    embedder, reranker = registry.resolve("embedder", "production"), registry.resolve("reranker", "production")
    recorded = {
        "against": configuration_label(current_mv),
        "candidate_version": candidate.version,
        "production_version": current_mv.version if current_mv is not None else None,
        "candidate_configuration": chosen.label,
        "production_configuration": production.label,
        "settings": settings.model_dump(),
        "gate_set": f"{len(held)} held-out questions people rated or corrected",
        "corrected_questions": sum(1 for w in held.weights.values() if w > 1),
        "failed_questions_held_out": split.dev_failed_questions,
        # What it was ranked through: a verdict over other models says nothing about today's (rag.lifecycle.verdicts)
        "first_stage_embedder": embedder.version if embedder else None,
        "served_reranker": reranker.version if reranker else None,
        "qa_set_version": "",
        "strategy": chosen.strategy,
    }
    now = datetime.now(UTC).isoformat(timespec="seconds")
    if len(held) < settings.min_questions:
        why = (
            f"{len(held)} held-out rated questions with a passage found in the documents; the gate needs "
            f"{settings.min_questions}: let more people rate answers"
        )
        verdict = {
            **recorded,
            "passed": False,
            "better": False,
            "not_worse": False,
            "outcome": "no verdict",
            "reasons": why,
            "questions": len(held),
            "gated_at": now,
        }
        registry.update_metrics("configuration", candidate.version, {"gate": verdict})
        record_gate(registry, candidate, verdict)
        withdraw_rejected(registry, "configuration", candidate, verdict)
        raise TooFewGateQuestions(why)
    metrics = gate_metrics(settings)
    budget = ReadBudget.of(serving_defaults(root))
    recorded["read_budget"] = {"top_k": budget.top_k, "max_context_chars": budget.max_chars}
    tables_by = {}
    for name, config in (("production", production), ("candidate", chosen)):
        answerer = Answerer(config.apply(base), root=root)
        served = served_table(answerer, held, tables.read(CHUNKS_TABLE, config.strategy), metrics, budget)
        tables_by[name] = held.weighted(served, metrics)
    result = gate_decision(tables_by["production"], tables_by["candidate"], settings, labels_from_production=True)
    verdict = {
        **result.metadata,
        **recorded,
        "worse_means": "significantly lower (the labels come from production's own lists)",
        "passed": bool(result.passed),
        "gated_at": now,
    }
    registry.update_metrics("configuration", candidate.version, {"gate": verdict})
    record_gate(registry, candidate, verdict, result)
    withdraw_rejected(registry, "configuration", candidate, verdict)
    log(f"configuration gate: {chosen.label} vs {production.label} on {len(held)} questions: {result.outcome}")
    return result
