"""A Chunker binds one named strategy to its kind and runs it on documents."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag.parsing.models import ParsedDocument

from .config import StrategyConfig, strategy_fingerprint
from .layout import DocLayout
from .models import Chunk
from .registry import ChunkContext, get_kind
from .spans import build_chunks
from .tokens import get_tokenizer

if TYPE_CHECKING:
    from rag.embedding import TextEmbedder


class Chunker:
    def __init__(self, config: StrategyConfig, embedder: TextEmbedder | None = None) -> None:
        self.config = config
        self.kind = get_kind(config.kind)
        self.tokenizer = get_tokenizer(config.params.tokenizer)
        self._embedder = embedder

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def fingerprint(self) -> str:
        return strategy_fingerprint(self.config)

    def _get_embedder(self, name: str) -> TextEmbedder:
        # Loaded only when a kind asks, so non-semantic strategies never import a model.
        if self._embedder is None:
            from rag.embedding import load_embedder

            self._embedder = load_embedder(name)
        return self._embedder

    def chunk(self, doc: ParsedDocument) -> list[Chunk]:
        if not doc.canonical_text.strip():
            return []
        layout = DocLayout(doc)
        ctx = ChunkContext(doc=doc, layout=layout, tokenizer=self.tokenizer, embedder=self._get_embedder)
        spans = self.kind.compute_spans(self.config.params, ctx)
        return build_chunks(doc, self.config.name, spans, self.tokenizer, layout)
