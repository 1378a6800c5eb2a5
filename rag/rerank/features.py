"""Features of a (question, candidate passage) pair for the learning-to-rank reranker.

Three sources, all cheap on a CPU:
- what the first stage saw (rag.retrieval.Hit.signals): the fused rank, the dense cosine and BM25 score of the
  candidate and its rank in each list (NaN when the candidate was not in that list; LightGBM learns a branch
  for "missing");
- lexical evidence computed here with the same tokenizer as the BM25 index (stemmed, stopwords removed): BM25
  against the corpus statistics saved with the model (complete even for candidates outside BM25's top list),
  plain and IDF-weighted query-term coverage, query bigrams found in the passage, the longest run of
  consecutive query terms, lengths, and where the chunk sits in its document;
- users' ratings of the passage text (up / down counts and a smoothed prior), keyed by a hash of the text so a
  rating sticks to what the user saw, not to a chunk id whose text may change;
- where the candidate's document stands among the same question's candidates (DOCUMENT): how many of the list's
  passages come from it, its best first-stage rank, dense score and BM25, the rank of the document itself, and
  whether the chunks beside this one were found too. A passage of a page that holds the question's other words is
  the answer more often than an equally good-looking passage of a page found once.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

K1, B = 1.2, 0.75  # the BM25 index's own parameters (rag.index.bm25)
PASSAGE_TERMS_KEPT = 50_000  # passages whose terms PassageTerms remembers

FIRST_STAGE = [
    "first_stage_rank",
    "first_stage_reciprocal_rank",
    "dense_score",
    "dense_rank",
    "dense_gap_to_best",
    "bm25_score",
    "bm25_rank",
    "bm25_share_of_best",
]
LEXICAL = [
    "bm25_corpus_stats",
    "term_coverage",
    "idf_weighted_coverage",
    "bigram_coverage",
    "longest_term_run",
    "passage_terms",
    "query_terms",
    "log_char_start",
    "page_start",
]
FEEDBACK = ["feedback_up", "feedback_down", "feedback_prior"]
# Measured with complete labels (bench/reranker_ceiling.py --without document_features, docs/training.md): on 1,000
# people's TAT-QA questions the learner serves +9.27 recall@5 over the untrained default with these, +5.87 without;
# ConditionalQA +5.04 against -0.07; SciFact 0.7449 against 0.7502 nDCG@10 by document (within noise).
DOCUMENT = [
    "document_candidates",
    "document_best_reciprocal_rank",
    "document_rank",
    "document_dense_gap_to_best",
    "document_bm25_share_of_best",
    "sibling_best_reciprocal_rank",
    "neighbour_best_reciprocal_rank",
]
# How much of the question's wording a passage holds. Generated questions are built from their passage's own words, so
# these looked like what misleads a ranker on people's questions; left out (RerankerTrainingConfig.
# question_overlap_features), rankers lost more on people's questions on both corpora (docs/training.md).
QUESTION_OVERLAP = ["term_coverage", "idf_weighted_coverage", "bigram_coverage", "longest_term_run"]
FEATURES = FIRST_STAGE + LEXICAL + FEEDBACK + DOCUMENT

PriorLookup = Callable[[str, str], tuple[float, float]]  # (question, passage text hash) -> (up, down)


def text_key(text: str) -> str:
    """Identity of a passage text for feedback priors: whitespace-normalised, hashed."""
    return hashlib.sha256(" ".join(str(text).split()).encode()).hexdigest()[:16]


def terms(texts: Sequence[str]) -> list[list[str]]:
    from rag.index.bm25 import tokenize

    return tokenize(texts)


@dataclass
class CorpusStats:
    """Document frequencies of the chunk set the model was trained on: BM25 and IDF weights at serving time
    without the serving index (its statistics drift slowly as documents are added; exactness is not needed)."""

    documents: int
    average_length: float
    document_frequency: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, texts: Iterable[str]) -> CorpusStats:
        tokenized = terms(list(texts))
        df: Counter[str] = Counter()
        for tokens in tokenized:
            df.update(set(tokens))
        lengths = [len(t) for t in tokenized] or [0]
        return cls(len(tokenized), float(np.mean(lengths)) or 1.0, dict(df))

    def idf(self, term: str) -> float:
        n, df = self.documents, self.document_frequency.get(term, 0)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def to_json(self) -> dict:
        return {
            "documents": self.documents,
            "average_length": self.average_length,
            "document_frequency": self.document_frequency,
        }

    @classmethod
    def from_json(cls, data: dict) -> CorpusStats:
        return cls(
            int(data["documents"]),
            float(data["average_length"]),
            {k: int(v) for k, v in data["document_frequency"].items()},
        )


class PassageTerms:
    """`terms` for passages, remembered by text: a server reranks the same passages for many questions, and
    tokenizing 50 of them is most of a learned ranker's time per question. Bounded: emptied when full."""

    def __init__(self, max_entries: int = PASSAGE_TERMS_KEPT):
        self.max_entries = max_entries
        self._terms: dict[str, list[str]] = {}

    def __call__(self, texts: list[str]) -> list[list[str]]:
        missing = list(dict.fromkeys(t for t in texts if t not in self._terms))
        if missing:
            if len(self._terms) + len(missing) > self.max_entries:
                self._terms = {}
            self._terms.update(zip(missing, terms(missing)))
        known = self._terms  # one dict for this call, even if another thread empties the cache meanwhile
        return [known[t] if t in known else terms([t])[0] for t in texts]

    def warm(self, texts: Iterable[str], batch: int = 256) -> int:
        """Tokenize passages before any question asks for them; the number added. Cold, a question's 50 unseen
        passages cost several times a warm question (`bench/rerank_features.py`): a canary's first requests would
        time the tokenizer, not the ranker. Only when all of them fit beside what is known: the cache empties when
        full, so a corpus larger than it would lose the warm-up to the first unseen passage."""
        pending = [t for t in dict.fromkeys(texts) if t not in self._terms]
        if len(self._terms) + len(pending) > self.max_entries:
            return 0
        for start in range(0, len(pending), batch):
            part = pending[start : start + batch]
            self._terms.update(zip(part, terms(part)))
        return len(pending)


def _bm25(query: list[str], passage: Counter, length: int, stats: CorpusStats) -> float:
    norm = K1 * (1 - B + B * length / max(stats.average_length, 1e-9))
    return sum(stats.idf(t) * passage[t] * (K1 + 1) / (passage[t] + norm) for t in set(query) if passage[t])


def _longest_run(query: list[str], passage_terms: set[str]) -> int:
    best = run = 0
    for t in query:
        run = run + 1 if t in passage_terms else 0
        best = max(best, run)
    return best


def _number(value, default=np.nan) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if math.isfinite(out) else default


def feature_matrix(
    query: str,
    hits: Sequence,
    stats: CorpusStats,
    priors: PriorLookup | None = None,
    passage_terms: Callable[[list[str]], list[list[str]]] = terms,
) -> np.ndarray:
    """One row per hit (rag.retrieval.Hit: .rank, .chunk, .signals), columns in FEATURES order."""
    rows = np.full((len(hits), len(FEATURES)), np.nan, dtype=np.float64)
    if not len(hits):
        return rows
    q_terms = terms([query])[0]
    q_set = set(q_terms)
    q_bigrams = set(zip(q_terms, q_terms[1:]))
    q_idf = {t: stats.idf(t) for t in q_set}
    idf_total = sum(q_idf.values()) or 1.0
    texts = [str(h.chunk.get("text", "")) for h in hits]
    tokenized = passage_terms(texts)
    signals = [getattr(h, "signals", None) or {} for h in hits]
    dense = [_number(s.get("dense_score")) for s in signals]
    bm25 = [_number(s.get("bm25_score")) for s in signals]
    best_dense = np.nanmax(dense) if not np.all(np.isnan(dense)) else np.nan
    best_bm25 = np.nanmax(bm25) if not np.all(np.isnan(bm25)) else np.nan
    col = {name: i for i, name in enumerate(FEATURES)}
    for i, (hit, sig, tokens) in enumerate(zip(hits, signals, tokenized)):
        rank = _number(sig.get("first_stage_rank"), float(getattr(hit, "rank", i + 1)))
        counts = Counter(tokens)
        present = set(counts)
        row = rows[i]
        row[col["first_stage_rank"]] = rank
        row[col["first_stage_reciprocal_rank"]] = 1.0 / max(rank, 1.0)
        row[col["dense_score"]] = dense[i]
        row[col["dense_rank"]] = _number(sig.get("dense_rank"))
        row[col["dense_gap_to_best"]] = best_dense - dense[i]
        row[col["bm25_score"]] = bm25[i]
        row[col["bm25_rank"]] = _number(sig.get("bm25_rank"))
        row[col["bm25_share_of_best"]] = bm25[i] / best_bm25 if best_bm25 and best_bm25 > 0 else np.nan
        row[col["bm25_corpus_stats"]] = _bm25(q_terms, counts, len(tokens), stats)
        row[col["term_coverage"]] = len(q_set & present) / len(q_set) if q_set else 0.0
        row[col["idf_weighted_coverage"]] = sum(q_idf[t] for t in q_set & present) / idf_total if q_set else 0.0
        p_bigrams = set(zip(tokens, tokens[1:]))
        row[col["bigram_coverage"]] = len(q_bigrams & p_bigrams) / len(q_bigrams) if q_bigrams else 0.0
        row[col["longest_term_run"]] = _longest_run(q_terms, present) / max(len(q_terms), 1)
        row[col["passage_terms"]] = len(tokens)
        row[col["query_terms"]] = len(q_terms)
        row[col["log_char_start"]] = math.log1p(max(_number(hit.chunk.get("char_start"), 0.0), 0.0))
        row[col["page_start"]] = _number(hit.chunk.get("page_start"))
        up, down = priors(query, text_key(texts[i])) if priors else (0.0, 0.0)
        row[[col[name] for name in FEEDBACK]] = feedback_columns(up, down)
    _document_context(rows, hits, col)
    return rows


def feedback_columns(up: float, down: float) -> tuple[float, float, float]:
    """The FEEDBACK columns of a passage people liked `up` and rated down `down` times (for other questions): the
    counts and their Laplace-smoothed like share, 1/2 for a passage nobody rated."""
    return up, down, (up + 1.0) / (up + down + 2.0)


def _document_context(rows: np.ndarray, hits: Sequence, col: dict[str, int]) -> None:
    """Fill the DOCUMENT columns from the list itself: every candidate of the question is in `hits`, so these need
    nothing but the chunk records' doc_id and neighbour ids (NaN where a record has no doc_id)."""
    chunks = [getattr(h, "chunk", None) or {} for h in hits]
    docs = [c.get("doc_id") for c in chunks]
    reciprocal = rows[:, col["first_stage_reciprocal_rank"]]
    dense = rows[:, col["dense_score"]]
    bm25 = rows[:, col["bm25_corpus_stats"]]
    by_doc: dict[str, list[int]] = {}
    for i, doc in enumerate(docs):
        if doc is not None:
            by_doc.setdefault(str(doc), []).append(i)
    best_rr = {doc: max(reciprocal[i] for i in members) for doc, members in by_doc.items()}
    doc_rank = {doc: r + 1 for r, doc in enumerate(sorted(by_doc, key=lambda d: -best_rr[d]))}
    best_dense = np.nanmax(dense) if not np.all(np.isnan(dense)) else np.nan
    best_bm25 = np.nanmax(bm25) if not np.all(np.isnan(bm25)) else np.nan
    position = {c.get("chunk_id"): i for i, c in enumerate(chunks) if c.get("chunk_id") is not None}
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        members = by_doc[str(doc)]
        row = rows[i]
        row[col["document_candidates"]] = len(members)
        row[col["document_best_reciprocal_rank"]] = best_rr[str(doc)]
        row[col["document_rank"]] = doc_rank[str(doc)]
        doc_dense = dense[members]
        if not np.all(np.isnan(doc_dense)):
            row[col["document_dense_gap_to_best"]] = best_dense - np.nanmax(doc_dense)
        if best_bm25 and best_bm25 > 0:
            row[col["document_bm25_share_of_best"]] = np.nanmax(bm25[members]) / best_bm25
        row[col["sibling_best_reciprocal_rank"]] = max((reciprocal[j] for j in members if j != i), default=0.0)
        beside = [position.get(chunks[i].get(key)) for key in ("prev_chunk_id", "next_chunk_id")]
        row[col["neighbour_best_reciprocal_rank"]] = max((reciprocal[j] for j in beside if j is not None), default=0.0)


@dataclass
class FeedbackPriors:
    """Up / down counts per passage text from users' ratings. At training time a question's own ratings are left
    out of its features (leave-one-out), or the model would learn to read the label from the prior."""

    up: Counter = field(default_factory=Counter)
    down: Counter = field(default_factory=Counter)
    _own: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def from_pairs(cls, positives: Iterable[tuple[str, str]], negatives: Iterable[tuple[str, str]]) -> FeedbackPriors:
        priors = cls()
        for sign, pairs in ((1, positives), (-1, negatives)):
            for question, passage in pairs:
                key = text_key(passage)
                own = priors._own.get((question, key), (0, 0))
                if sign > 0:
                    priors.up[key] += 1
                    priors._own[(question, key)] = (own[0] + 1, own[1])
                else:
                    priors.down[key] += 1
                    priors._own[(question, key)] = (own[0], own[1] + 1)
        return priors

    def serving(self, question: str, key: str) -> tuple[float, float]:
        return float(self.up.get(key, 0)), float(self.down.get(key, 0))

    def leave_one_out(self, question: str, key: str) -> tuple[float, float]:
        own_up, own_down = self._own.get((question, key), (0, 0))
        return float(self.up.get(key, 0) - own_up), float(self.down.get(key, 0) - own_down)

    def to_json(self) -> dict:
        return {"up": dict(self.up), "down": dict(self.down)}

    @classmethod
    def from_json(cls, data: dict | None) -> FeedbackPriors:
        data = data or {}
        return cls(Counter(data.get("up", {})), Counter(data.get("down", {})))


__all__ = [
    "DOCUMENT",
    "FEATURES",
    "FEEDBACK",
    "QUESTION_OVERLAP",
    "CorpusStats",
    "FeedbackPriors",
    "PassageTerms",
    "feature_matrix",
    "feedback_columns",
    "text_key",
]
