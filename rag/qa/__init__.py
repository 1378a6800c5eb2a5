"""Answers with citations: retrieve → (rerank) → filter → (neighbours) → prompt → generate → parse → attribute.

    result = answer_question("Which software must be installed?", AnswerSettings(strategy="paragraph"))
    result.answer, result.cited_chunk_ids, result.not_in_context

`Answerer` keeps the index (and models) open for a long-lived process such as the HTTP API.
"""
from rag.qa.models import NOT_IN_CONTEXT, AnswerResult, AnswerSettings

__all__ = ["NOT_IN_CONTEXT", "AnswerResult", "AnswerSettings"]
