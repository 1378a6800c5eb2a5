"""Incremental parsing of a document folder into the `documents` and `quarantine` tables.

Pure functions over DataFrames: the previous tables go in, the new tables and what changed come out.
A file is re-parsed only when its content hash or the parse settings changed; files that could not
be parsed are quarantined with a reason and are not retried until either changes. Only the file's own faults
quarantine it (ParseError): a bug in our code or a broken environment raises ParserBug, naming the file, and the
run writes nothing, so the previous tables stay as they were.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pandas as pd

from rag.parsing import ParseError, ParsedDocument, ParserBug, ParseSettings, QuarantineReason, parse_file
from rag.parsing.models import Element
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
    not)."""
    started = time.perf_counter()
    fingerprint = settings.fingerprint()
    prev_docs, prev_quar = _by_id(previous_documents), _by_id(previous_quarantine)

    def kept(f) -> dict | None:  # the previous row (document or quarantine) of an unchanged file
        same = (f.content_hash, fingerprint)
        for old in (prev_docs.get(f.doc_id), prev_quar.get(f.doc_id)):
            if old and (old["content_hash"], old["settings_fingerprint"]) == same:
                return old
        return None

    advance = counter(progress, "parsing", sum(1 for f in scan.files if kept(f) is None), "documents")
    doc_rows: list[dict] = []
    quar_rows: list[dict] = []
    run = ParseRun(documents=_empty(DOCUMENT_COLUMNS), quarantine=_empty(QUARANTINE_COLUMNS))

    for rejected in scan.rejected:
        quar_rows.append(
            {
                "doc_id": rejected.doc_id,
                "path": str(rejected.path),
                "content_hash": "",
                "settings_fingerprint": fingerprint,
                "reason": QuarantineReason.OUTSIDE_ROOT.value,
                "exception_class": "ValueError",
                "message": rejected.reason,
                "quarantined_at": prev_quar.get(rejected.doc_id, {}).get("quarantined_at") or _now(),
            }
        )

    for f in scan.files:
        same = (f.content_hash, fingerprint)
        old_doc, old_quar = prev_docs.get(f.doc_id), prev_quar.get(f.doc_id)
        if old_doc and (old_doc["content_hash"], old_doc["settings_fingerprint"]) == same:
            doc_rows.append(old_doc)
            run.unchanged.append(f.doc_id)
            continue
        if old_quar and (old_quar["content_hash"], old_quar["settings_fingerprint"]) == same:
            quar_rows.append(old_quar)
            run.unchanged.append(f.doc_id)
            continue
        if on_progress:
            on_progress(f.doc_id)
        try:
            doc = parse(f.path, settings, doc_id=f.doc_id, content_hash=f.content_hash)
        except ParseError as exc:  # the file's fault: quarantine it and go on with the others
            advance()
            log.warning("quarantined %s: %s (%s)", f.doc_id, exc.message, exc.reason.value)
            quar_rows.append(
                {
                    "doc_id": f.doc_id,
                    "path": str(f.path),
                    "content_hash": f.content_hash,
                    "settings_fingerprint": fingerprint,
                    "reason": exc.reason.value,
                    "exception_class": exc.exception_class,
                    "message": exc.message,
                    "quarantined_at": _now(),
                }
            )
            run.quarantined.append(f.doc_id)
            continue
        except ParserBug:
            raise
        except Exception as exc:  # a parse function outside rag.parsing: not known to be the file's fault
            raise ParserBug(str(f.path), exc) from exc
        doc_rows.append(document_to_row(doc, fingerprint))
        run.parsed.append(f.doc_id)
        advance()

    present = {f.doc_id for f in scan.files} | {r.doc_id for r in scan.rejected}
    run.removed = sorted((set(prev_docs) | set(prev_quar)) - present)
    if doc_rows:
        run.documents = pd.DataFrame(doc_rows, columns=DOCUMENT_COLUMNS).sort_values("doc_id", ignore_index=True)
    if quar_rows:
        run.quarantine = pd.DataFrame(quar_rows, columns=QUARANTINE_COLUMNS).sort_values("doc_id", ignore_index=True)
    run.seconds = time.perf_counter() - started
    return run
