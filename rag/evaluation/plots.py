"""PNG plots for evaluation reports (matplotlib, headless)."""

from __future__ import annotations

import base64
import io

import pandas as pd


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt

    return plt


def recall_curves(summary: pd.DataFrame, title: str) -> bytes:
    """Recall@k at each cutoff the reports were scored at, one line per row (mode or configuration)."""
    plt = _pyplot()
    ks = sorted(int(c.split("@")[1]) for c in summary.columns if c.startswith("recall@"))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for row in summary.to_dict("records"):
        label = " / ".join(
            str(row[c]) for c in ("strategy", "model", "mode") if c in row and row[c] and summary[c].nunique() > 1
        ) or row.get("mode", "")
        ax.plot(ks, [row[f"recall@{k}"] for k in ks], marker="o", label=label)
    ax.set_xlabel("k"), ax.set_ylabel("recall@k"), ax.set_ylim(0, 1.02), ax.set_xticks(ks), ax.set_title(title)
    ax.grid(alpha=0.3), ax.legend(fontsize=7)
    return _png(fig)


def metric_bars(summary: pd.DataFrame, metric: str, title: str, top: int = 30) -> bytes:
    """Horizontal bars of one metric per configuration, best on top."""
    plt = _pyplot()
    data = summary.sort_values(metric, ascending=True).tail(top)
    # BM25 rows of the summary have an empty model
    labels = [" · ".join(r[c] for c in ("strategy", "model", "mode") if r[c]) for r in data.to_dict("records")]
    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.28 * len(data) + 1)))
    ax.barh(
        labels, data[metric], color=["tab:green" if b else "tab:blue" for b in data.get("best", [False] * len(data))]
    )
    ax.set_xlabel(metric), ax.set_xlim(0, 1), ax.set_title(title), ax.tick_params(axis="y", labelsize=7)
    return _png(fig)


def markdown_image(png: bytes, alt: str) -> str:
    """Inline PNG for Markdown metadata: the Dagster UI renders data URIs."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"
