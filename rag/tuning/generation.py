"""GenerationScore for a candidate configuration (RAGSmith): mean of an LLM judge's rating and the semantic
similarity between the generated and the reference answer. Only used when a generator and a judge are given."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from rag.embedding import TextEmbedder
from rag.llm import LLM
from rag.retrieval import Hit

JUDGE_PROMPT = (
    "Rate how well the candidate answer matches the reference answer to the question, from 1 (wrong or "
    "unrelated) to 5 (same meaning). Reply with the number only.\n\nQuestion: {question}\n"
    "Reference answer: {reference}\nCandidate answer: {answer}\nRating:"
)


def judge_rating(judge: LLM, question: str, reference: str, answer: str) -> float:
    """The judge's 1–5 rating mapped to [0, 1]; an unparseable reply counts as the lowest rating."""
    reply = judge.complete(JUDGE_PROMPT.format(question=question, reference=reference, answer=answer), max_new_tokens=4)
    match = re.search(r"[1-5]", reply)
    return (int(match.group()) - 1) / 4 if match else 0.0


def semantic_similarity(embedder: TextEmbedder, a: str, b: str) -> float:
    """Cosine of the two texts' embeddings, clipped to [0, 1]."""
    va, vb = embedder.encode([a, b])
    return float(np.clip(np.dot(va, vb), 0.0, 1.0))


@dataclass
class GenerationScorer:
    generator: LLM
    judge: LLM
    embedder: TextEmbedder

    def answer(self, question: str, hits: list[Hit]) -> str:
        from rag.qa.prompt import build_messages, label_passages

        return self.generator.chat(build_messages(question, label_passages(hits))).strip()

    def score(self, question: str, reference: str, hits: list[Hit]) -> float:
        answer = self.answer(question, hits)
        return (
            judge_rating(self.judge, question, reference, answer)
            + semantic_similarity(self.embedder, answer, reference)
        ) / 2
