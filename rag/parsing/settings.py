"""User-facing parse settings (limits, passwords, OCR)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os

from pydantic import BaseModel, Field

from rag.parsing.ocr import engine_id


MAX_DOCUMENT_CHARS_ENV = "RAG_MAX_DOCUMENT_CHARS"
# A 1000-page PDF (max_pages) of dense text is about 3 million characters and War and Peace 3.2 million: 5 million
# refuses no ordinary document, while a 50 MB single-line text export (52 million) is refused before it is parsed,
# chunked or embedded by every strategy (one line of 5 million characters took about a minute to parse here).
DEFAULT_MAX_DOCUMENT_CHARS = 5_000_000


def int_from_env(name: str, default: int) -> int:
    """A whole-number setting from the environment (`_` and `,` allowed as digit separators), else `default`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw.replace("_", "").replace(",", ""))
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number: unset it or give a count such as {default}") from None


class ParseSettings(BaseModel):
    max_file_bytes: int = Field(200 * 1024 * 1024, description="Files larger than this are quarantined.")
    max_document_chars: int = Field(
        default_factory=lambda: int_from_env(MAX_DOCUMENT_CHARS_ENV, DEFAULT_MAX_DOCUMENT_CHARS),
        gt=0,
        description=f"Documents whose text is longer are quarantined as too-large before anything is stored "
        f"(env {MAX_DOCUMENT_CHARS_ENV}). One long document costs every chunking strategy and embedder.",
    )
    max_pages: int = Field(1000, description="PDFs with more pages than this are quarantined.")
    # Keys are doc_ids or glob patterns over doc_ids (e.g. "finance/*.pdf"); values are passwords.
    pdf_passwords: dict[str, str] = Field(default_factory=dict)
    extract_tables: bool = True
    strip_boilerplate: bool = Field(
        True,
        description="Keep page furniture out of the text: a PDF's running headers, footers and page numbers (lines "
        "repeating at the top or bottom of most pages) and an Office file's header and footer. They are recorded "
        "in the document's metadata['boilerplate'] instead.",
    )
    ocr: bool = Field(
        True,
        description="Read PDF pages without a text layer (scanned or image-only) with Tesseract OCR. "
        "Off: a PDF with no text layer at all is quarantined as no-text-layer.",
    )
    ocr_language: str = Field(
        "eng",
        description="Tesseract language code(s), joined by '+' (e.g. 'eng+fra'); each needs "
        "its data package (Debian: tesseract-ocr-<code>, '_' written '-').",
    )
    ocr_dpi: int = Field(
        300,
        ge=72,
        le=600,
        description="Resolution a page is rendered at for OCR (Tesseract reads "
        "best at 300; lower is faster and misses small print).",
    )
    ocr_page_timeout_s: float = Field(
        120.0, gt=0, description="A page whose OCR takes longer quarantines the file as parser-error."
    )

    def password_for(self, doc_id: str) -> str | None:
        if doc_id in self.pdf_passwords:
            return self.pdf_passwords[doc_id]
        for pattern, password in self.pdf_passwords.items():
            if fnmatch.fnmatch(doc_id, pattern):
                return password
        return None

    def fingerprint(self) -> str:
        """Changes when any setting that affects parse output changes, forcing a re-parse."""
        payload = self.model_dump()
        # Passwords are hashed in, never stored: a new password must retry encrypted files.
        payload["pdf_passwords"] = sorted(
            (k, hashlib.sha256(v.encode()).hexdigest()) for k, v in self.pdf_passwords.items()
        )
        payload["parser_version"] = PARSER_VERSION
        # The character cap came after documents were stored: at its default it stays out, so upgrading re-parses
        # nothing (rag.ingest quarantines stored documents over it from their n_chars); any other value is in, so
        # raising the cap retries the documents it refused.
        if payload["max_document_chars"] == DEFAULT_MAX_DOCUMENT_CHARS:
            del payload["max_document_chars"]
        # Installing, upgrading or removing Tesseract changes what scanned pages parse to.
        payload["ocr_engine"] = engine_id() if self.ocr else None
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# Bump when parser code changes its output, so stored documents are re-parsed.
# 2: OCR of pages without a text layer; 3: page furniture set aside; 4: table captions, column labels and stacked rows,
# double-spaced paragraphs, sideways glyphs sized upright; 5: plain text and Markdown read natively (rag.parsing.text,
# rag.parsing.markdown) instead of through unstructured.
PARSER_VERSION = "5"
