"""Chunking: named strategies (config/chunking.yaml) over registered kinds, producing Chunk records.

chunks = chunk_document(doc, "fixed-512")
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rag.parsing.models import ParsedDocument

from . import kinds as _kinds  # noqa: F401  (registers the built-in kinds)
from .chunker import Chunker
from .config import (
    ChunkingConfigError,
    StrategyConfig,
    load_strategies,
    parse_strategy,
    strategy_fingerprint,
)
from .models import Chunk
from .registry import KINDS, KindParams, available_kinds, register_kind
from .spans import build_chunks

if TYPE_CHECKING:
    from rag.embedding import TextEmbedder

__all__ = [
    "Chunk",
    "Chunker",
    "ChunkingConfigError",
    "KINDS",
    "KindParams",
    "StrategyConfig",
    "available_kinds",
    "build_chunks",
    "chunk_document",
    "get_chunker",
    "load_strategies",
    "parse_strategy",
    "register_kind",
    "strategy_fingerprint",
]

Strategies = Mapping[str, StrategyConfig] | Path | str | None


def _resolve(strategies: Strategies) -> Mapping[str, StrategyConfig]:
    if strategies is None or isinstance(strategies, (str, Path)):
        return load_strategies(strategies)
    return strategies


def get_chunker(name: str, strategies: Strategies = None, embedder: TextEmbedder | None = None) -> Chunker:
    """The chunker of strategy `name`, from `strategies` (a loaded mapping or a YAML path; default:
    the configured file). `embedder` replaces the one a semantic strategy would load by name."""
    table = _resolve(strategies)
    try:
        config = table[name]
    except KeyError:
        raise ChunkingConfigError(f"unknown chunking strategy {name!r} (known: {', '.join(table) or 'none'})") from None
    return Chunker(config, embedder=embedder)


def chunk_document(
    doc: ParsedDocument,
    strategy_name: str,
    strategies: Strategies = None,
    embedder: TextEmbedder | None = None,
) -> list[Chunk]:
    return get_chunker(strategy_name, strategies, embedder).chunk(doc)
