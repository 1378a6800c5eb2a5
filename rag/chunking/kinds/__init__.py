"""Built-in chunking kinds; importing this package registers them all."""

from . import document, semantic, sentence, structure, tokenwise  # noqa: F401
