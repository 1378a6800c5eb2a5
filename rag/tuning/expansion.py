"""Query expansion with an LLM: several rephrasings fused by RRF (multi-query) or a hypothetical answer
passage searched instead of the bare question (HyDE). Each returns the query texts to retrieve with."""

from __future__ import annotations

from collections.abc import Callable

from rag.llm import LLM

MULTI_QUERY_PROMPT = (
    "Write {n} different search queries that would find passages answering the question. "
    "One query per line, no numbering.\n\nQuestion: {question}\nQueries:\n"
)
HYDE_PROMPT = "Write a short passage that answers the question.\n\nQuestion: {question}\nPassage:"


def no_expansion(llm: LLM | None, question: str) -> list[str]:
    return [question]


def multi_query(llm: LLM, question: str, n: int = 3) -> list[str]:
    """The question plus up to n distinct non-empty rephrasings."""
    lines = llm.complete(MULTI_QUERY_PROMPT.format(n=n, question=question), max_new_tokens=96).splitlines()
    queries = [question]
    for line in lines:
        text = line.strip().lstrip("-*0123456789.) ").strip()
        if text and text.lower() not in {q.lower() for q in queries}:
            queries.append(text)
    return queries[: n + 1]


def hyde(llm: LLM, question: str) -> list[str]:
    """The question followed by a hypothetical answer passage (so BM25 keeps the question's terms too)."""
    passage = llm.complete(HYDE_PROMPT.format(question=question), max_new_tokens=96, stop=["\n\n"]).strip()
    return [f"{question}\n{passage}" if passage else question]


EXPANSIONS: dict[str, Callable[[LLM | None, str], list[str]]] = {
    "none": no_expansion,
    "multi-query": multi_query,
    "hyde": hyde,
}
