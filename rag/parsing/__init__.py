"""Parse a file into a ParsedDocument (ordered elements over one canonical text) or raise ParseError."""

from __future__ import annotations

import codecs
import hashlib
from functools import lru_cache
from pathlib import Path

from rag.parsing import boilerplate
from rag.parsing.errors import ParseError, ParserBug, QuarantineReason, blames_the_file, unreadable
from rag.parsing.models import ELEMENT_SEPARATOR, Element, ParsedDocument, assemble
from rag.parsing.settings import MAX_DOCUMENT_CHARS_ENV, PARSER_VERSION, ParseSettings
from rag.parsing.text import BOMS

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
    "text_length_error",
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


MARKDOWN_EXTENSIONS = frozenset({".md"})


@lru_cache(maxsize=1)
def plain_text_extensions() -> frozenset[str]:
    """The extensions unstructured reads as plain text (.txt, .log, source code…): their text is their characters."""
    from unstructured.file_utils.model import FileType

    return frozenset(e.lower() for e in getattr(FileType.TXT, "_extensions", ()) or ())


def text_length_error(
    n_chars: int, settings: ParseSettings, counted: str = "parsed text is {:,} characters"
) -> ParseError | None:
    """The quarantine entry of a document whose text is over the character cap, else None."""
    cap = settings.max_document_chars
    if n_chars <= cap:
        return None
    return ParseError(
        QuarantineReason.TOO_LARGE,
        f"{counted.format(n_chars)}; the cap is {cap:,} ({MAX_DOCUMENT_CHARS_ENV} / "
        "ParseSettings.max_document_chars): split the file or raise the cap",
    )


_WHITESPACE = " \t\n\r\f\v"


def _plain_text_chars(path: Path) -> int:
    """The characters of a plain-text file other than whitespace. The text parser keeps them all (bullets aside) and
    only normalizes whitespace, so this is a floor under the parsed text's length, read in a second or so instead of
    the minutes that parsing a huge single line takes. Undecodable bytes count one each, as in an 8-bit encoding."""
    with open(path, "rb") as fh:
        head = fh.read(4)
        fh.seek(0)
        encoding = next((e for bom, e in BOMS if head.startswith(bom)), "utf-8")
        decoder = codecs.getincrementaldecoder(encoding)("replace")
        count = 0
        for block in iter(lambda: fh.read(1 << 20), b""):
            text = decoder.decode(block)
            count += len(text) - sum(text.count(c) for c in _WHITESPACE)
    return count


def _refuse_before_parsing(path: Path, settings: ParseSettings) -> None:
    """What needs no parser: a readable, non-empty file under the byte limit in a known format, and for plain text
    (whose length is known before parsing) under the character cap."""
    try:
        size = path.stat().st_size
    except OSError as exc:  # gone or unreadable since the scan listed it
        raise unreadable(exc) from exc
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
    # A file has no more characters than bytes, so only files over the cap in bytes are read to count.
    if ext in plain_text_extensions() and size > settings.max_document_chars:
        try:
            chars = _plain_text_chars(path)
        except OSError as exc:
            raise unreadable(exc) from exc
        if error := text_length_error(chars, settings, "its text is {:,} characters, whitespace aside"):
            raise error


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _parse_text_format(path: Path, ext: str) -> tuple[list, int, str]:
    """Plain text and Markdown, read natively (megabytes a second, where unstructured read kilobytes)."""
    if ext in MARKDOWN_EXTENSIONS:
        from rag.parsing.markdown import parse_markdown

        return *parse_markdown(path), "markdown"
    from rag.parsing.text import parse_text

    return *parse_text(path), "text"


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
    _refuse_before_parsing(path, settings)
    ext = path.suffix.lower()
    try:
        content_hash = content_hash or sha256_file(path)
    except OSError as exc:
        raise unreadable(exc) from exc
    try:
        if ext == ".pdf":
            with open(path, "rb") as fh:
                head = fh.read(1024)
            if b"%PDF-" not in head:
                raise ParseError(QuarantineReason.MALFORMED, "not a PDF: the %PDF- header is missing")
            from rag.parsing.pdf import parse_pdf

            drafts, n_pages, metadata = parse_pdf(path, doc_id=doc_id, settings=settings)
            parser = "pdfplumber"
        elif ext in plain_text_extensions() or ext in MARKDOWN_EXTENSIONS:
            drafts, n_pages, parser = _parse_text_format(path, ext)
            metadata = {}
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
    if settings.strip_boilerplate:
        drafts, furniture = boilerplate.set_aside(drafts)
        if furniture:
            metadata = {**metadata, boilerplate.METADATA_KEY: boilerplate.record(furniture)}
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
    if error := text_length_error(len(doc.canonical_text), settings):
        raise error
    return doc
