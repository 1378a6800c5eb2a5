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


def check_chunks(chunks: pd.DataFrame, documents: pd.DataFrame, *, min_chars: int = 1, max_chars: int | None = None) -> SuiteOutcome:
    """Chunk invariants: unique ids, spans that reproduce the text from the canonical document, sane lengths."""
    import great_expectations.expectations as gxe

    canonical = dict(zip(documents["doc_id"], documents["canonical_text"]))

    def span_matches(row) -> bool:
        text = canonical.get(row["doc_id"])
        return text is not None and text[int(row["char_start"]):int(row["char_end"])] == row["text"]

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
        gxe.ExpectColumnValuesToBeBetween(column="text_chars_without_tables", min_value=max(1, min_chars), max_value=max_chars),
        gxe.ExpectColumnValuesToBeInSet(column="span_consistent", value_set=[True]),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="char_end", column_B="char_start", or_equal=False),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="page_end", column_B="page_start", or_equal=True),
        gxe.ExpectColumnValuesToBeBetween(column="page_start", min_value=1),
    ]
    return run_expectations(df, expectations, "chunk_sets")
