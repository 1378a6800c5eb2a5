"""Answers with citations: retrieve → (rerank) → filter → (neighbours) → prompt → generate → parse → attribute.

    result = answer_question("Which software must be installed?", AnswerSettings(strategy="paragraph"))
    result.answer, result.cited_chunk_ids, result.not_in_context, result.sources()

`Answerer` keeps the index (and models) open for a long-lived process such as the HTTP API.
"""

from rag.qa.models import NOT_IN_CONTEXT, AnswerResult, AnswerSettings
from rag.qa.pipeline import Answerer, answer_question

__all__ = ["NOT_IN_CONTEXT", "AnswerResult", "AnswerSettings", "Answerer", "answer_question"]
