"""What a queue refresh reports: its size and coverage, where its questions came from, and how much experts
labelled since the previous refresh (from the feedback store's `expert_labels` table)."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from rag.annotation.queue import AnnotationQueue

LABEL_COLUMNS = ["item_id", "grade", "expert", "created_at", "label_id"]


def expert_labels(store) -> pd.DataFrame:
    """Every expert label row (item_id, grade, expert, created_at, label_id, ...); empty when the store has no such
    table yet (a store older than expert labelling): nothing was labelled then."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return store.table("expert_labels")
    except (KeyError, SQLAlchemyError):
        return pd.DataFrame(columns=LABEL_COLUMNS)


def current_labels(labels: pd.DataFrame) -> pd.DataFrame:
    """Each item's label now: its latest row (by label_id), unless that row has no grade (an expert's undo)."""
    if labels.empty:
        return labels
    latest = labels.sort_values("label_id").drop_duplicates("item_id", keep="last")
    return latest[latest["grade"].notna()]


def _utc(values) -> pd.Series:
    stamps = pd.to_datetime(pd.Series(list(values)), errors="coerce", utc=False)
    return stamps.dt.tz_localize("UTC") if stamps.dt.tz is None else stamps.dt.tz_convert("UTC")


def since_refresh(previous: AnnotationQueue | None, labels: pd.DataFrame) -> dict[str, int | str | None]:
    """Items labelled since the previous queue was built (`labels_since_refresh`: their current label is newer than
    that queue), and how many of them were items of that queue (`labelled_from_previous_queue`)."""
    if previous is None:
        return {
            "previous_queue_size": 0,
            "previous_queue_created_at": None,
            "labels_since_refresh": 0,
            "labelled_from_previous_queue": 0,
        }
    now = current_labels(labels)
    after = now.iloc[0:0]
    if not now.empty:
        after = now[(_utc(now["created_at"]) >= pd.Timestamp(previous.created_at).tz_convert("UTC")).to_numpy()]
    queued = {item.item_id for item in previous.items}
    return {
        "previous_queue_size": len(previous.items),
        "previous_queue_created_at": previous.created_at.isoformat(),
        "labels_since_refresh": int(len(after)),
        "labelled_from_previous_queue": int(after["item_id"].isin(queued).sum()),
    }


def coverage(queue: AnnotationQueue, corpus_documents: int) -> dict[str, int | float]:
    """How far the queue reaches: distinct questions and documents, the share of the corpus's documents it covers,
    where its questions came from, its mean uncertainty."""
    items = queue.items
    documents = {i.doc_id for i in items}
    sources = Counter(i.source for i in items)
    return {
        "queue_size": len(items),
        "distinct_questions": len({i.question for i in items}),
        "distinct_documents": len(documents),
        "corpus_documents": int(corpus_documents),
        "document_coverage": round(len(documents) / corpus_documents, 4) if corpus_documents else 0.0,
        "from_production": sources.get("production", 0),
        "from_synthetic": sources.get("synthetic", 0),
        "mean_uncertainty": round(sum(i.uncertainty for i in items) / len(items), 4) if items else 0.0,
    }


def preview(queue: AnnotationQueue, limit: int = 10) -> pd.DataFrame:
    """The first items as rows for a Markdown table."""
    rows = [
        {
            "#": n,
            "uncertainty": item.uncertainty,
            "source": item.source,
            "question": item.question[:80],
            "document": item.doc_id,
            "passage": " ".join(item.text.split())[:100],
            "signals": ", ".join(f"{k} {v:.2f}" for k, v in item.signals.items()),
        }
        for n, item in enumerate(queue.items[:limit], start=1)
    ]
    return pd.DataFrame(rows, columns=["#", "uncertainty", "source", "question", "document", "passage", "signals"])


__all__ = ["LABEL_COLUMNS", "coverage", "current_labels", "expert_labels", "preview", "since_refresh"]
