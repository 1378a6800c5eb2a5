"""Why a file could not be parsed. Every reason is something a user can act on."""
from __future__ import annotations

from enum import Enum


class QuarantineReason(str, Enum):
    ENCRYPTED = "encrypted"  # needs a password: add it to the password map in the parse settings
    MALFORMED = "malformed"  # the file is corrupt or not what its extension says
    EMPTY = "empty"  # zero bytes, or no text at all in a non-empty file
    NO_TEXT_LAYER = "no-text-layer"  # scanned/image-only PDF; OCR is not enabled
    UNSUPPORTED = "unsupported"  # no parser for this extension
    TOO_LARGE = "too-large"  # over the configured byte or page limit
    OUTSIDE_ROOT = "outside-root"  # path or symlink escapes the document root
    PARSER_ERROR = "parser-error"  # the parser failed unexpectedly (a bug or an unusual file)


class ParseError(Exception):
    """A file that cannot become a ParsedDocument; the caller quarantines it with `reason`."""

    def __init__(self, reason: QuarantineReason, message: str, cause: BaseException | None = None):
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message
        self.exception_class = type(cause).__name__ if cause is not None else "ParseError"
