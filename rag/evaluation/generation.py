"""Generation metrics: SQuAD exact match and token F1, ROUGE-L, semantic similarity, answer accuracy, source
accuracy, coverage, latency; and, with a judge LLM, faithfulness and answer relevancy (deepeval's definitions).

A metric that could not be computed (no judge, no reference, a "not in context" answer to judge) is None, never 0:
absent is not the same as bad.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

import numpy as np
import pandas as pd

from rag.evaluation.qaset import Evidence, QAItem

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, references: Iterable[str]) -> float:
    return float(any(normalize_answer(prediction) == normalize_answer(r) for r in references))


def _f1(pred_tokens: list[str], ref_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if not pred_tokens or not ref_tokens:
        return float(pred_tokens == ref_tokens)
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, references: Iterable[str]) -> float:
    """SQuAD token F1 against the best reference."""
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(r).split()) for r in references), default=0.0)


def _rouge_tokens(text: str) -> list[str]:
    # rouge-score's default tokenizer: lower case, runs of [a-z0-9] (no stemming)
    return re.findall(r"[a-z0-9]+", text.lower())


def lcs_length(a: list[str], b: list[str]) -> int:
    """Longest common subsequence, by the classic dynamic programme over one row."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev_diag = 0
        for j, y in enumerate(b, start=1):
            prev_diag, row[j] = row[j], prev_diag + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(prediction: str, references: Iterable[str]) -> float:
    """ROUGE-L F-measure (β = 1, as rouge-score reports it) against the best reference."""
    pred = _rouge_tokens(prediction)
    best = 0.0
    for ref in references:
        ref_tokens = _rouge_tokens(ref)
        lcs = lcs_length(pred, ref_tokens)
        if lcs:
            p, r = lcs / len(pred), lcs / len(ref_tokens)
            best = max(best, 2 * p * r / (p + r))
    return best


def answer_accuracy(prediction: str, references: Iterable[str]) -> float:
    """Normalised match: 1 when a normalised reference occurs in the normalised prediction as whole words (a
    sentence that contains the answer counts; "1990s" does not contain "1990")."""
    pred = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(r) and f" {normalize_answer(r)} " in pred for r in references))


def semantic_similarity(embedder, predictions: list[str], references: list[str]) -> np.ndarray:
    """Cosine of the embeddings of each prediction and its reference (rows are L2-normalised)."""
    if not predictions:
        return np.zeros(0)
    return np.einsum("ij,ij->i", embedder.encode_passages(predictions), embedder.encode_passages(references))


def overlaps(chunk: dict, evidence: Iterable[Evidence]) -> bool:
    return any(
        chunk["doc_id"] == ev.doc_id and min(int(chunk["char_end"]), ev.end) > max(int(chunk["char_start"]), ev.start)
        for ev in evidence
    )


def source_hit(chunks: list[dict], chunk_ids: Iterable[str], evidence: list[Evidence]) -> float:
    """1 when one of `chunk_ids` (among the answer's chunks) overlaps an evidence span."""
    wanted = set(chunk_ids)
    return float(any(overlaps(c, evidence) for c in chunks if c["chunk_id"] in wanted))


# --- LLM judge (deepeval-style, statement level) -----------------------------------------------------
VERDICT = re.compile(r"\b(yes|no|idk)\b", re.IGNORECASE)


def _verdict(judge, prompt: str) -> str:
    reply = judge.chat([{"role": "user", "content": prompt}], max_new_tokens=8)
    m = VERDICT.search(reply or "")
    return m.group(1).lower() if m else "idk"


def statements(answer: str) -> list[str]:
    """The answer's statements. deepeval asks the judge to extract them; here they are the answer's sentences,
    which a small judge cannot get wrong and which cost no call."""
    from rag.qa.attribution import passage_sentences

    return passage_sentences(answer)


def faithfulness(judge, answer: str, contexts: list[str]) -> float | None:
    """Share of the answer's statements the context does not contradict (deepeval: verdict "no" = contradiction,
    "idk" counts as faithful). None when there is nothing to judge."""
    claims = statements(answer)
    if not claims or not contexts:
        return None
    context = "\n\n".join(contexts)
    verdicts = [
        _verdict(
            judge,
            f"Context:\n{context}\n\nClaim: {claim}\n\nDoes the context support the claim? Answer yes if it "
            "does, no if it contradicts it, idk if it says nothing about it. Reply with one word: yes, no or idk.",
        )
        for claim in claims
    ]
    return sum(v != "no" for v in verdicts) / len(verdicts)


def answer_relevancy(judge, question: str, answer: str) -> float | None:
    """Share of the answer's statements relevant to the question (deepeval: "idk" counts as relevant)."""
    claims = statements(answer)
    if not claims:
        return None
    verdicts = [
        _verdict(
            judge,
            f"Question: {question}\nStatement: {claim}\n\nIs the statement relevant to answering the question? "
            "Reply with one word: yes, no or idk.",
        )
        for claim in claims
    ]
    return sum(v != "no" for v in verdicts) / len(verdicts)


# --- over a QA set -----------------------------------------------------------------------------------
def references_of(item: QAItem) -> list[str]:
    return [item.answer] if item.answer else []


def score_answers(items: list[QAItem], results: list, *, embedder=None, judge=None) -> pd.DataFrame:
    """One row per question: every metric of its AnswerResult. Unanswerable metrics are NaN (absent)."""
    sims = {}
    with_ref = [(i, it, r) for i, (it, r) in enumerate(zip(items, results)) if references_of(it)]
    if embedder is not None and with_ref:
        values = semantic_similarity(
            embedder, [r.answer for _, _, r in with_ref], [references_of(it)[0] for _, it, _ in with_ref]
        )
        sims = {i: float(v) for (i, _, _), v in zip(with_ref, values)}
    rows = []
    for i, (item, res) in enumerate(zip(items, results)):
        refs = references_of(item)
        answered = not res.not_in_context
        contexts = [c["text"] for c in res.chunks]
        rows.append(
            {
                "qid": item.qid,
                "question": item.question,
                "reference": item.answer,
                "answer": res.answer,
                "not_in_context": res.not_in_context,
                "exact_match": exact_match(res.answer, refs) if refs and answered else (0.0 if refs else None),
                "f1": token_f1(res.answer, refs) if refs and answered else (0.0 if refs else None),
                "rouge_l": rouge_l(res.answer, refs) if refs and answered else (0.0 if refs else None),
                "semantic_similarity": sims.get(i),
                "answer_accuracy": answer_accuracy(res.answer, refs) if refs and answered else (0.0 if refs else None),
                "source_accuracy": source_hit(res.chunks, res.cited_chunk_ids, item.evidence),
                "attributed_source_accuracy": source_hit(res.chunks, res.attributed_chunk_ids, item.evidence),
                "retrieved_evidence": float(any(overlaps(c, item.evidence) for c in res.chunks)),
                "latency_ms": res.latency_ms,
                "faithfulness": faithfulness(judge, res.answer, contexts) if judge is not None and answered else None,
                "answer_relevancy": answer_relevancy(judge, item.question, res.answer)
                if judge is not None and answered
                else None,
            }
        )
    return pd.DataFrame(rows)


METRICS = [
    "exact_match",
    "f1",
    "rouge_l",
    "semantic_similarity",
    "answer_accuracy",
    "source_accuracy",
    "attributed_source_accuracy",
    "retrieved_evidence",
    "faithfulness",
    "answer_relevancy",
]


def summarize_answers(per_question: pd.DataFrame) -> dict:
    """Means over questions (every question counts: a "not in context" answer to an answerable question scores 0 on
    accuracy and source accuracy), coverage, latency p50/p95; a metric no question had is None."""
    out: dict = {"n_questions": int(len(per_question))}
    for metric in METRICS:
        values = (
            pd.to_numeric(per_question[metric], errors="coerce") if metric in per_question else pd.Series(dtype=float)
        )
        out[metric] = round(float(values.mean()), 4) if values.notna().any() else None
    out["coverage"] = round(float(1 - per_question["not_in_context"].mean()), 4) if len(per_question) else None
    latency = per_question["latency_ms"] if len(per_question) else pd.Series(dtype=float)
    out["latency_p50_ms"] = round(float(latency.median()), 1) if len(latency) else None
    out["latency_p95_ms"] = round(float(latency.quantile(0.95)), 1) if len(latency) else None
    return out
