"""Incremental parsing of a document folder into the `documents` and `quarantine` tables.

Pure functions over DataFrames: the previous tables go in, the new tables and what changed come out.
A file is re-parsed only when its content hash or the parse settings changed; files that could not
be parsed are quarantined with a reason and are not retried until either changes. So are the entries the folder scan
could not read (rag.source: unreadable files and folders, broken links, FIFOs…) and documents over the character cap
(ParseSettings.max_document_chars), which never reach the documents table. Only the file's own faults quarantine it
(ParseError): a bug in our code or a broken environment raises ParserBug, naming the file, and the run writes
nothing, so the previous tables stay as they were.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Protocol

import pandas as pd

from rag.parsing import (
    ParseError,
    ParsedDocument,
    ParseSettings,
    QuarantineReason,
    parse_file,
    text_length_error,
)
from rag.parsing.models import Element
from rag.parsing.parallel import parse_files
from rag.progress import Progress, counter
from rag.source import SourceScan

log = logging.getLogger(__name__)

DOCUMENT_COLUMNS = [
    "doc_id",
    "source_path",
    "content_hash",
    "settings_fingerprint",
    "parser",
    "n_pages",
    "n_elements",
    "n_tables",
    "n_chars",
    "canonical_text",
    "elements_json",
    "metadata_json",
    "parsed_at",
]
QUARANTINE_COLUMNS = [
    "doc_id",
    "path",
    "content_hash",
    "settings_fingerprint",
    "reason",
    "exception_class",
    "message",
    "quarantined_at",
]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def document_to_row(doc: ParsedDocument, fingerprint: str) -> dict:
    return {
        "doc_id": doc.doc_id,
        "source_path": doc.source_path,
        "content_hash": doc.content_hash,
        "settings_fingerprint": fingerprint,
        "parser": doc.parser,
        "n_pages": doc.n_pages,
        "n_elements": len(doc.elements),
        "n_tables": doc.n_tables,
        "n_chars": len(doc.canonical_text),
        "canonical_text": doc.canonical_text,
        "elements_json": json.dumps([e.model_dump(exclude_none=True) for e in doc.elements], ensure_ascii=False),
        "metadata_json": json.dumps(doc.metadata, ensure_ascii=False),
        "parsed_at": _now(),
    }


def document_from_row(row: dict | pd.Series) -> ParsedDocument:
    return ParsedDocument(
        doc_id=row["doc_id"],
        source_path=row["source_path"],
        content_hash=row["content_hash"],
        parser=row["parser"],
        n_pages=int(row["n_pages"]),
        canonical_text=row["canonical_text"],
        elements=[Element(**e) for e in json.loads(row["elements_json"])],
        metadata=json.loads(row["metadata_json"] or "{}"),
    )


@dataclass
class ParseRun:
    documents: pd.DataFrame
    quarantine: pd.DataFrame
    parsed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)  # newly quarantined in this run
    seconds: float = 0.0

    @property
    def summary(self) -> dict[str, int | float]:
        reasons = self.quarantine["reason"].value_counts().to_dict() if len(self.quarantine) else {}
        return {
            "documents": len(self.documents),
            "parsed": len(self.parsed),
            "unchanged": len(self.unchanged),
            "removed": len(self.removed),
            "quarantined_new": len(self.quarantined),
            "quarantined_total": len(self.quarantine),
            "pages": int(self.documents["n_pages"].sum()) if len(self.documents) else 0,
            "tables": int(self.documents["n_tables"].sum()) if len(self.documents) else 0,
            "seconds": round(self.seconds, 3),
            **{f"quarantine_{k}": int(v) for k, v in reasons.items()},
        }


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})


def _by_id(df: pd.DataFrame | None) -> dict[str, dict]:
    return {} if df is None or df.empty else {r["doc_id"]: r for r in df.to_dict("records")}


class _Refusal(Protocol):  # a ParseError, or a RejectedFile of the scan
    reason: QuarantineReason
    exception_class: str
    message: str


def _quarantine_row(
    doc_id: str, path: str, content_hash: str, fingerprint: str, error: _Refusal, since: str | None = None
) -> dict:
    return {
        "doc_id": doc_id,
        "path": path,
        "content_hash": content_hash,
        "settings_fingerprint": fingerprint,
        "reason": error.reason.value,
        "exception_class": error.exception_class,
        "message": error.message,
        "quarantined_at": since or _now(),
    }


def _rejection_rows(scan: SourceScan, prev_quar: dict[str, dict], fingerprint: str, run: ParseRun) -> list[dict]:
    """What the scan could not even read (unreadable, broken links, FIFOs, outside the root) joins the quarantine;
    an entry already there for the same reason keeps its date."""
    rows = []
    for rejected in scan.rejected:
        old = prev_quar.get(rejected.doc_id) or {}
        since = old.get("quarantined_at") if old.get("reason") == rejected.reason.value else None
        if since is None:
            log.warning("quarantined %s: %s (%s)", rejected.doc_id, rejected.message, rejected.reason.value)
            run.quarantined.append(rejected.doc_id)
        rows.append(_quarantine_row(rejected.doc_id, str(rejected.path), "", fingerprint, rejected, since))
    return rows


def update_documents(
    scan: SourceScan,
    previous_documents: pd.DataFrame | None,
    previous_quarantine: pd.DataFrame | None,
    settings: ParseSettings,
    *,
    parse: Callable[..., ParsedDocument] = parse_file,
    on_progress: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> ParseRun:
    """`on_progress(doc_id)` before each file is parsed; `progress` counts the files to parse (unchanged ones are
    not) and their megabytes. Every document is checked against the character cap before it is returned, so nothing
    over it reaches the documents table: parsed ones, and stored ones too (the cap may have been lowered or come after
    them). PDFs are parsed in parallel processes when more than one core is free (rag.parsing.parallel); outcomes are
    applied in the scan's order, so the tables are the same whatever order the processes finish in."""
    started = time.perf_counter()
    fingerprint = settings.fingerprint()
    prev_docs, prev_quar = _by_id(previous_documents), _by_id(previous_quarantine)

    def unchanged(f, rows: dict[str, dict]) -> dict | None:  # the previous row of a file parsed as it is now
        old = rows.get(f.doc_id)
        same = old and (old["content_hash"], old["settings_fingerprint"]) == (f.content_hash, fingerprint)
        return old if same else None

    todo = [f for f in scan.files if unchanged(f, prev_docs) is None and unchanged(f, prev_quar) is None]
    advance = counter(progress, "parsing", len(todo), "documents")
    outcomes = parse_files(todo, settings, parse, on_start=on_progress, on_done=lambda f: advance(1, f.size))
    doc_rows: list[dict] = []
    run = ParseRun(documents=_empty(DOCUMENT_COLUMNS), quarantine=_empty(QUARANTINE_COLUMNS))
    quar_rows = _rejection_rows(scan, prev_quar, fingerprint, run)

    def quarantine(f, error: ParseError) -> None:
        log.warning("quarantined %s: %s (%s)", f.doc_id, error.message, error.reason.value)
        quar_rows.append(_quarantine_row(f.doc_id, str(f.path), f.content_hash, fingerprint, error))
        run.quarantined.append(f.doc_id)

    for f in scan.files:
        if (old_doc := unchanged(f, prev_docs)) is not None:
            if too_long := text_length_error(int(old_doc["n_chars"]), settings):
                quarantine(f, too_long)
                continue
            doc_rows.append(old_doc)
            run.unchanged.append(f.doc_id)
        elif (old_quarantine := unchanged(f, prev_quar)) is not None:
            quar_rows.append(old_quarantine)
            run.unchanged.append(f.doc_id)
        elif isinstance(outcome := outcomes[f.doc_id], ParseError):
            quarantine(f, outcome)
        elif too_long := text_length_error(len(outcome.canonical_text), settings):
            quarantine(f, too_long)  # checked here too, so a `parse` other than parse_file cannot store one over it
        else:
            doc_rows.append(document_to_row(outcome, fingerprint))
            run.parsed.append(f.doc_id)

    present = {f.doc_id for f in scan.files} | {r.doc_id for r in scan.rejected}
    run.removed = sorted((set(prev_docs) | set(prev_quar)) - present)
    if doc_rows:
        run.documents = pd.DataFrame(doc_rows, columns=DOCUMENT_COLUMNS).sort_values("doc_id", ignore_index=True)
    if quar_rows:
        run.quarantine = pd.DataFrame(quar_rows, columns=QUARANTINE_COLUMNS).sort_values("doc_id", ignore_index=True)
    run.seconds = time.perf_counter() - started
    return run
