"""Keyword queries: a few salient terms of a passage, as people type them into a search box ("eiffel tower 1930").

Terms are runs of neighbouring content words (at most three, so "eiffel tower" stays one term), ranked by tf-idf
with document frequencies over every passage of the run: what sets a passage apart from the rest of the corpus is
what a person looking for it would type.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator

from rag.synthetic.text import content_tokens, stop_words

MAX_TERM_WORDS = 3
TERMS = (2, 6)  # terms per query, inclusive
KEYWORD_MIN_WORDS = 2  # a search-box query's floor, below the 5 words other questions need (rag.quality.suites)
SHORT_QUERY_WORDS = 6


class KeywordQueries:
    """Document frequencies of the run's passages, and queries drawn from one passage against them."""

    def __init__(self, passages: Iterable[str]):
        self.df: Counter[str] = Counter()
        self.n = 0
        self.add(passages)

    def add(self, passages: Iterable[str]) -> None:
        """Count more passages of the run (drawn later, e.g. the dev documents' extra ones)."""
        for text in passages:
            self.df.update(set(content_tokens(text)))
            self.n += 1

    def idf(self, token: str) -> float:
        return math.log((1 + self.n) / (1 + self.df[token])) + 1.0  # smoothed, as scikit-learn's

    def terms(self, text: str) -> list[str]:
        """Distinct terms of the passage, best first (ties: first seen first)."""
        stops = stop_words()
        runs: list[list[str]] = [[]]
        capital = None
        for raw in re.findall(r"\w+|[^\w\s]", text):  # punctuation ends a term, as a stop word does
            token = raw.lower()
            word = token.isalnum() and (len(token) > 1 or token.isdigit()) and not (token.isdigit() and len(token) > 8)
            if token in stops or not word:
                runs.append([])
                capital = None
                continue
            if capital is not None and raw[:1].isupper() != capital:  # "champion | New England Patriots"
                runs.append([])
            capital = raw[:1].isupper()
            runs[-1].append(token)
        pieces = [run[i : i + MAX_TERM_WORDS] for run in runs for i in range(0, len(run), MAX_TERM_WORDS)]
        tf = Counter(t for piece in pieces for t in piece)
        score = {t: tf[t] * self.idf(t) for t in tf}
        seen: dict[str, float] = {}
        for piece in pieces:
            term = " ".join(piece)
            if piece and term not in seen:
                seen[term] = max(score[t] for t in piece)
        ranked = sorted(seen, key=lambda term: -seen[term])  # stable: first seen wins a tie
        out, used = [], set()
        for term in ranked:  # one word in two terms would repeat it in the query
            words = set(term.split())
            if not words & used:
                out.append(term)
                used |= words
        return out

    def queries(self, text: str, rng: random.Random, min_words: int = 1, max_words: int = 50) -> Iterator[str]:
        """Queries of 2-6 of the passage's best terms, in a seeded order; more terms (up to 6) where fewer would be
        under min_words. Each call of next() draws a new length, so a second query of a passage differs."""
        terms = self.terms(text)
        for _ in range(3):
            k = rng.randint(*TERMS)
            chosen = terms[:k]
            while len(" ".join(chosen).split()) < min_words and len(chosen) < min(TERMS[1], len(terms)):
                chosen = terms[: len(chosen) + 1]
            # Long terms make long queries; people rarely type more than six words, so trailing terms go while
            # what is left still has two terms and min_words.
            while (
                len(chosen) > TERMS[0]
                and len(" ".join(chosen).split()) > SHORT_QUERY_WORDS
                and len(" ".join(chosen[:-1]).split()) >= min_words
            ):
                chosen = chosen[:-1]
            if len(chosen) < TERMS[0] or not min_words <= len(" ".join(chosen).split()) <= max_words:
                return
            chosen = list(chosen)
            rng.shuffle(chosen)
            yield " ".join(chosen)
