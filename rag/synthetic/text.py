"""Token-level tests on questions shared by the generators, their filters and the style report."""

from __future__ import annotations

import re

# Openers of an English question: a wh-word, or an auxiliary that was moved in front of the subject.
WH_WORDS = frozenset({"who", "whom", "whose", "what", "when", "where", "which", "why", "how"})
AUXILIARIES = frozenset(
    {
        "is",
        "are",
        "was",
        "were",
        "am",
        "be",
        "do",
        "does",
        "did",
        "has",
        "have",
        "had",
        "can",
        "could",
        "will",
        "would",
        "shall",
        "should",
        "may",
        "might",
        "must",
    }
)
PREPOSITIONS = frozenset(
    {
        "in",
        "on",
        "at",
        "by",
        "for",
        "from",
        "to",
        "with",
        "since",
        "until",
        "during",
        "of",
        "after",
        "before",
        "into",
        "through",
        "under",
        "over",
        "about",
        "between",
        "among",
    }
)


def tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def stop_words() -> frozenset[str]:
    """spaCy's English list (a plain module: no model load); the first import takes a moment, so it is lazy."""
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(STOP_WORDS)


def content_tokens(text: str) -> list[str]:
    """Tokens that carry meaning: no stop words, no one-letter tokens other than digits."""
    stops = stop_words()
    return [t for t in tokens(text) if t not in stops and (len(t) > 1 or t.isdigit())]


def longest_common_run(a: list[str], b: list[str]) -> int:
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            if x == y:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def is_verbatim(question: str, passage: str) -> bool:
    """The question copies a run of the passage covering most of it."""
    q = tokens(question)
    return len(q) >= 4 and longest_common_run(q, tokens(passage)) >= 0.8 * len(q)


def opens_like_a_question(text: str) -> bool:
    """First word a wh-word or an auxiliary, or a preposition then a wh-word ("In which year ...", "Since when ...")."""
    words = tokens(text)[:2]
    if not words:
        return False
    return (
        words[0] in WH_WORDS
        or words[0] in AUXILIARIES
        or (words[0] in PREPOSITIONS and len(words) > 1 and words[1] in WH_WORDS)
    )


def has_question_form(text: str, *, strict: bool = False) -> bool:
    """Lenient (the style report, human questions included): ends with "?" or opens like a question, since people
    write both "what year did X end" and "X ended in which year?". Strict (generated questions): both."""
    ends = text.rstrip().endswith("?")
    opens = opens_like_a_question(text)
    return (ends and opens) if strict else (ends or opens)
