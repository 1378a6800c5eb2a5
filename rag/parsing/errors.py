"""Why a file could not be parsed. Every reason is something a user can act on."""

from __future__ import annotations

import errno
from enum import Enum
from pathlib import Path


class QuarantineReason(str, Enum):
    ENCRYPTED = "encrypted"  # needs a password: add it to the password map in the parse settings
    MALFORMED = "malformed"  # the file is corrupt or not what its extension says
    EMPTY = "empty"  # zero bytes, or no text at all in a non-empty file
    NO_TEXT_LAYER = "no-text-layer"  # scanned/image-only PDF, and OCR is off, not installed or found no text
    UNSUPPORTED = "unsupported"  # no parser for this extension
    TOO_LARGE = "too-large"  # over the configured byte, page, character or chunk limit
    OUTSIDE_ROOT = "outside-root"  # path or symlink escapes the document root
    PARSER_ERROR = "parser-error"  # the parser failed unexpectedly (a bug or an unusual file)
    UNREADABLE = "unreadable"  # permission denied, an I/O error, or gone before it could be read
    BROKEN_LINK = "broken-link"  # a symlink to nothing, or a symlink loop: fix the link or remove it
    NOT_A_FILE = "not-a-file"  # a FIFO, socket or device: never opened (reading a FIFO blocks): move it out


class ParseError(Exception):
    """A file that cannot become a ParsedDocument; the caller quarantines it with `reason`."""

    def __init__(self, reason: QuarantineReason, message: str, cause: BaseException | None = None):
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message
        self.exception_class = type(cause).__name__ if cause is not None else "ParseError"

    def __reduce__(self):
        # Pickled whole, so a parse in another process (rag.ingest parses PDFs in parallel) raises it here as is.
        return _restore_parse_error, (self.reason, self.message, self.exception_class)


def _restore_parse_error(reason: QuarantineReason, message: str, exception_class: str) -> ParseError:
    error = ParseError(reason, message)
    error.exception_class = exception_class
    return error


def symlink_loop(exc: BaseException) -> ParseError:
    message = "symlink loop: the link leads back to itself (fix or remove it)"
    return ParseError(QuarantineReason.BROKEN_LINK, message, exc)


def unreadable(exc: OSError, what: str = "file") -> ParseError:
    """The quarantine entry of a `what` ("file", "folder") the operating system would not let us read."""
    if exc.errno == errno.ELOOP:  # Python 3.13 raises OSError for a symlink loop where 3.11 raises RuntimeError
        return symlink_loop(exc)
    if isinstance(exc, PermissionError):
        hint = f"permission denied (chmod the {what} so the pipeline's user can read it, or remove it)"
    elif isinstance(exc, FileNotFoundError):
        hint = f"the {what} vanished before it could be read (nothing to do if it was deleted on purpose; else re-run)"
    else:
        hint = f"{exc.strerror or exc} (check the disk or network share holding the {what}, then re-run)"
    return ParseError(QuarantineReason.UNREADABLE, f"unreadable: {hint}", exc)


class ParserBug(RuntimeError):
    """Parsing one file failed in our own code or in the environment (a missing module, no memory).

    Not the file's fault, so it is not quarantined: a quarantined file is not retried until it changes, and a
    bug or a broken install would otherwise quarantine every file it touches. The run fails and names the file.
    """

    def __init__(self, path: str, cause: BaseException):
        super().__init__(
            f"parsing {path} failed in our code or environment ({type(cause).__name__}: {str(cause)[:300]}); "
            "the file was not quarantined: fix the cause (see the traceback) and re-run"
        )
        self.path = path

    def __reduce__(self):
        return _restore_parser_bug, (self.path, str(self))


def _restore_parser_bug(path: str, message: str) -> ParserBug:
    bug = ParserBug.__new__(ParserBug)
    RuntimeError.__init__(bug, message)
    bug.path = path
    return bug


def _library_dirs() -> list[Path]:
    import sysconfig

    return [Path(sysconfig.get_path(name)).resolve() for name in ("stdlib", "platstdlib", "purelib", "platlib")]


def blames_the_file(exc: BaseException) -> bool:
    """Whether an unexpected exception says something about the file being parsed.

    An installed library (a parser, the standard library's zipfile…) raising on a file means the file is unusual:
    quarantine it. An exception raised by our own code, a missing module or exhausted memory is a bug or an
    environment problem: fail loudly instead.
    """
    if isinstance(exc, (ImportError, MemoryError)):
        return False
    tb = exc.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    if str(frame.f_globals.get("__name__", "")).split(".")[0] == "rag":
        return False
    raised_in = Path(frame.f_code.co_filename).resolve()
    return any(folder in raised_in.parents for folder in _library_dirs())
