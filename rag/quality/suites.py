"""The data-quality expectations of each table, as GX 1.x suites."""

from __future__ import annotations

import pandas as pd

from rag.quality.gx import SuiteOutcome, run_expectations


def check_documents(documents: pd.DataFrame) -> SuiteOutcome:
    import great_expectations.expectations as gxe

    df = documents.assign(text_chars=documents["canonical_text"].fillna("").str.strip().str.len())
    return run_expectations(
        df,
        [
            gxe.ExpectColumnValuesToNotBeNull(column="doc_id"),
            gxe.ExpectColumnValuesToBeUnique(column="doc_id"),
            gxe.ExpectColumnValuesToBeBetween(column="text_chars", min_value=1),
            gxe.ExpectColumnValuesToBeBetween(column="n_pages", min_value=1),
            gxe.ExpectColumnValuesToMatchRegex(column="content_hash", regex=r"^[0-9a-f]{64}$"),
        ],
        "parsed_documents",
    )


def check_chunks(
    chunks: pd.DataFrame, documents: pd.DataFrame, *, min_chars: int = 1, max_chars: int | None = None
) -> SuiteOutcome:
    """Chunk invariants: unique ids, spans that reproduce the text from the canonical document, sane lengths."""
    import great_expectations.expectations as gxe

    canonical = dict(zip(documents["doc_id"], documents["canonical_text"]))
    content_hash = dict(zip(documents["doc_id"], documents["content_hash"]))

    def span_matches(row) -> bool | None:
        text = canonical.get(row["doc_id"])
        if text is not None and "doc_content_hash" in row and row["doc_content_hash"] != content_hash[row["doc_id"]]:
            # Chunks kept after a failed re-chunking belong to the previous version of the document; the
            # failure itself fails the check (chunk_failures), and GX skips the None here.
            return None
        return text is not None and text[int(row["char_start"]) : int(row["char_end"])] == row["text"]

    text_chars = chunks["text"].fillna("").str.strip().str.len()
    df = chunks.assign(
        span_consistent=chunks.apply(span_matches, axis=1) if len(chunks) else pd.Series(dtype=bool),
        text_chars=text_chars,
        # Tables are never cut inside a row, so a chunk holding one long row may exceed the size
        # bound; GX skips nulls, which exempts exactly those chunks from the upper bound.
        text_chars_without_tables=text_chars.where(chunks["table_html"].isna()).astype("float"),
    )
    expectations = [
        gxe.ExpectColumnValuesToBeUnique(column="chunk_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="text"),
        gxe.ExpectColumnValuesToBeBetween(column="text_chars", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(
            column="text_chars_without_tables", min_value=max(1, min_chars), max_value=max_chars
        ),
        gxe.ExpectColumnValuesToBeInSet(column="span_consistent", value_set=[True]),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="char_end", column_B="char_start", or_equal=False),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="page_end", column_B="page_start", or_equal=True),
        gxe.ExpectColumnValuesToBeBetween(column="page_start", min_value=1),
    ]
    return run_expectations(df, expectations, "chunk_sets")


# Question kinds with their own floor on words: keyword queries are what people type into a search box, two or three
# words (rag.synthetic.keywords.KEYWORD_MIN_WORDS).
MIN_WORDS_BY_TYPE = {"keyword": 2}


def check_qa_set(
    qa: pd.DataFrame,
    documents: pd.DataFrame,
    *,
    min_words: int = 5,
    max_words: int = 50,
    dev_share: tuple[float, float] = (0.05, 0.5),
) -> SuiteOutcome:
    """QA set invariants: question length (keyword queries from 2 words, MIN_WORDS_BY_TYPE), evidence spans
    non-empty and inside their document, a sane dev share of the documents (`dev_share`: the range of
    SynthSettings.dev_fraction a sound split comes from; the split is by document)."""
    import json

    import great_expectations.expectations as gxe

    lengths = dict(zip(documents["doc_id"], documents["n_chars"]))

    def spans_ok(evidence_json: str) -> bool:
        spans = json.loads(evidence_json)
        return bool(spans) and all(
            s["doc_id"] in lengths and 0 <= s["start"] < s["end"] <= lengths[s["doc_id"]] for s in spans
        )

    words = qa["question"].fillna("").str.split().str.len()
    floor = qa["qtype"].map(MIN_WORDS_BY_TYPE).fillna(min_words) if "qtype" in qa else min_words
    df = qa.assign(
        # words below the floor of the question's kind, or 0: one expectation covers every kind
        question_words_under_floor=(floor - words).clip(lower=0),
        question_words=words,
        evidence_valid=qa["evidence_json"].map(spans_ok) if len(qa) else pd.Series(dtype=bool),
        dev_document=_dev_document(qa),
    )
    expectations = [
        gxe.ExpectColumnValuesToBeUnique(column="qid"),
        gxe.ExpectColumnValuesToBeBetween(column="question_words", max_value=max_words),
        gxe.ExpectColumnValuesToBeInSet(column="question_words_under_floor", value_set=[0]),
        gxe.ExpectColumnValuesToBeInSet(column="evidence_valid", value_set=[True]),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "dev", "test"]),
    ]
    if qa["doc_id"].nunique() >= 2:  # a split by document needs at least two documents
        low, high = dev_document_share(qa["doc_id"].nunique(), dev_share)
        expectations.append(gxe.ExpectColumnMeanToBeBetween(column="dev_document", min_value=low, max_value=high))
    return run_expectations(df, expectations, "synthetic_qa")


def _dev_document(qa: pd.DataFrame) -> pd.Series:
    """1.0 / 0.0 on each document's first question (dev or not), null on the others: the column's mean is the share
    of documents in dev (GX skips nulls). Not the share of questions: synthetic_qa tops the dev documents up to
    SynthSettings.dev_questions for the gate, so on a corpus of a hundred papers most questions are dev."""
    first = ~qa["doc_id"].duplicated()
    return (qa["split"] == "dev").astype(float).where(first)


def dev_document_share(n_documents: int, dev_share: tuple[float, float]) -> tuple[float, float]:
    """The share of `n_documents` that rag.evaluation.qaset.assign_splits puts in dev at each end of `dev_share`:
    whole documents, at least one (two documents give one half whatever the fraction)."""
    from rag.evaluation.qaset import assign_splits

    def share(fraction: float) -> float:
        splits = assign_splits([str(i) for i in range(n_documents)], fraction)
        return sum(split == "dev" for split in splits.values()) / n_documents

    return share(dev_share[0]), share(dev_share[1])


def check_report(report: pd.DataFrame, metric_columns: list[str]) -> SuiteOutcome:
    """Every metric is a number in [0, 1]."""
    import great_expectations.expectations as gxe

    expectations = []
    for column in metric_columns:
        expectations += [
            gxe.ExpectColumnValuesToNotBeNull(column=column),
            gxe.ExpectColumnValuesToBeBetween(column=column, min_value=0.0, max_value=1.0),
        ]
    return run_expectations(report, expectations, "retrieval_report")
