"""Markdown tables for Dagster metadata and CLI output (one writer for every stage)."""

from __future__ import annotations

import pandas as pd


def markdown_table(
    df: pd.DataFrame | None, columns: list[str], *, digits: int = 3, limit: int = 50, width: int = 120
) -> str:
    """Rows as a Markdown table: floats rounded, cells cut to `width`, pipes and newlines escaped."""
    if df is None or df.empty:
        return "_none_"

    def cell(value) -> str:
        text = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")[:width]

    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "\n".join(
        "| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in df.head(limit).to_dict("records")
    )
