"""Registry of chunking kinds (algorithms). Adding an algorithm = one `@register_kind` function.

A kind computes raw (start, end) spans over the canonical text; the shared builder (spans.py)
turns them into Chunk records, so kinds never deal with ids, pages, tables or whitespace.

The built-in kinds register themselves when the package loads (rag/chunking/__init__.py imports .kinds), and Python
loads the package before any of its modules: whoever reaches this registry finds them in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, field_validator

from rag.parsing.models import ParsedDocument

from .layout import DocLayout, Span
from .tokens import TOKENIZERS, Tokenizer

if TYPE_CHECKING:
    from rag.embedding import TextEmbedder

_KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


class KindParams(BaseModel):
    """Base of every kind's params: unknown keys are errors, so a YAML typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Counts Chunk.n_tokens, and sizes chunks for token-based kinds.
    tokenizer: str = "regex"

    @field_validator("tokenizer")
    @classmethod
    def _known_tokenizer(cls, v: str) -> str:
        if v not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {v!r} (known: {', '.join(sorted(TOKENIZERS))})")
        return v


@dataclass
class ChunkContext:
    """What a kind may use besides the document and its params."""

    doc: ParsedDocument
    layout: DocLayout
    tokenizer: Tokenizer
    # Returns the injected embedder, or loads the named one on first use (only semantic needs it).
    embedder: Callable[[str], "TextEmbedder"]


P = TypeVar("P", bound=KindParams)
SpanFn = Callable[[P, ChunkContext], list[Span]]


@dataclass(frozen=True)
class ChunkerKind(Generic[P]):
    name: str
    params_model: type[P]
    compute_spans: SpanFn
    # Part of the strategy fingerprint: bump when the algorithm's output changes for equal params.
    version: int = 1
    description: str = ""


KINDS: dict[str, ChunkerKind] = {}


def register_kind(name: str, params_model: type[P], *, version: int = 1) -> Callable[[SpanFn], SpanFn]:
    if not _KEBAB.match(name):
        raise ValueError(f"chunking kind names are kebab-case, got {name!r}")

    def decorator(fn: SpanFn) -> SpanFn:
        if name in KINDS:
            raise ValueError(f"chunking kind {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        KINDS[name] = ChunkerKind(name, params_model, fn, version, doc[0] if doc else "")
        return fn

    return decorator


def get_kind(name: str) -> ChunkerKind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown chunking kind {name!r} (known: {', '.join(sorted(KINDS))})") from None


def available_kinds() -> list[str]:
    return sorted(KINDS)
