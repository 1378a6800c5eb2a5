"""The one spaCy pipeline the rule-based question generator parses with, loaded once per process."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

MODEL = "en_core_web_sm"


@lru_cache(maxsize=1)
def english() -> Any:
    """en_core_web_sm with parser, tagger, lemmatizer and NER (answer-aware questions need all four)."""
    try:
        import spacy

        return spacy.load(MODEL)
    except (ImportError, OSError) as exc:  # OSError: spaCy is there, the model package is not
        raise RuntimeError(
            f"answer-aware questions need spaCy and its {MODEL} model ({exc}); `make install` installs "
            "both (packaging/en_core_web_sm_alias), or leave answer-aware out of question_mix"
        ) from exc
