"""Parse a file into a ParsedDocument (ordered elements over one canonical text) or raise ParseError."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from rag.parsing.errors import ParseError, ParserBug, QuarantineReason, blames_the_file
from rag.parsing.models import ELEMENT_SEPARATOR, Element, ParsedDocument, assemble
from rag.parsing.settings import PARSER_VERSION, ParseSettings

__all__ = [
    "ELEMENT_SEPARATOR",
    "Element",
    "ParseError",
    "ParserBug",
    "ParseSettings",
    "ParsedDocument",
    "QuarantineReason",
    "parse_file",
    "supported_extensions",
    "PARSER_VERSION",
]


@lru_cache(maxsize=1)
def supported_extensions() -> frozenset[str]:
    """PDF plus every extension unstructured has a partitioner for (lower-case, with the dot)."""
    from unstructured.file_utils.model import FileType

    exts = {".pdf"}
    for file_type in FileType:
        if file_type.is_partitionable:
            exts.update(getattr(file_type, "_extensions", ()) or ())
    return frozenset(e.lower() for e in exts)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_file(
    path: Path | str,
    settings: ParseSettings | None = None,
    *,
    doc_id: str | None = None,
    content_hash: str | None = None,
) -> ParsedDocument:
    path = Path(path)
    settings = settings or ParseSettings()
    doc_id = doc_id or path.name
    size = path.stat().st_size
    if size == 0:
        raise ParseError(QuarantineReason.EMPTY, "file is 0 bytes")
    if size > settings.max_file_bytes:
        raise ParseError(
            QuarantineReason.TOO_LARGE,
            f"{size} bytes exceeds the limit of {settings.max_file_bytes} (ParseSettings.max_file_bytes)",
        )
    ext = path.suffix.lower()
    if ext not in supported_extensions():
        raise ParseError(QuarantineReason.UNSUPPORTED, f"no parser for '{ext or path.name}' files")
    content_hash = content_hash or sha256_file(path)
    try:
        if ext == ".pdf":
            with open(path, "rb") as fh:
                head = fh.read(1024)
            if b"%PDF-" not in head:
                raise ParseError(QuarantineReason.MALFORMED, "not a PDF: the %PDF- header is missing")
            from rag.parsing.pdf import parse_pdf

            drafts, n_pages, metadata = parse_pdf(path, doc_id=doc_id, settings=settings)
            parser = "pdfplumber"
        else:
            from rag.parsing.office import parse_with_unstructured

            drafts, n_pages = parse_with_unstructured(path)
            metadata, parser = {}, "unstructured"
    except (ParseError, ParserBug):
        raise
    except RecursionError as exc:
        raise ParseError(QuarantineReason.MALFORMED, "file structure is too deeply nested", exc) from exc
    except Exception as exc:
        if not blames_the_file(exc):
            raise ParserBug(str(path), exc) from exc
        raise ParseError(QuarantineReason.PARSER_ERROR, f"{type(exc).__name__}: {exc}"[:500], exc) from exc
    doc = assemble(
        drafts,
        doc_id=doc_id,
        source_path=str(path),
        content_hash=content_hash,
        parser=parser,
        n_pages=n_pages,
        metadata=metadata,
    )
    if not doc.canonical_text.strip():
        raise ParseError(QuarantineReason.EMPTY, "the file contains no text")
    return doc
