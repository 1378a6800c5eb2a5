"""The server follows the production configuration (rag.training.configuration): when a promotion or a rollback moves
the registry's `configuration` alias, the next refresh opens the index of the new chunk set and answers with the
new retrieval settings; requests in flight finish on the old one.

The operator's explicit settings win: a field given on the command line, in RAG_ANSWER_CONFIG or in an applied
configuration file is pinned, and a production configuration never overrides it (`pinned`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


class ConfiguredServing:
    """A rag.serving.index.ServingIndex for the settings the production configuration asks for now, replaced when
    those change. `open_serving(settings)` opens one (and raises when it cannot: the previous one keeps serving)."""

    def __init__(
        self,
        base,
        *,
        root: Path,
        open_serving: Callable[[object], object],
        pinned: frozenset[str] = frozenset(),
    ):
        self.base, self.root, self.open_serving, self.pinned = base, Path(root), open_serving, pinned
        self._lock = threading.Lock()
        self._settings = self._wanted()
        self._serving = open_serving(self._settings)
        self.last_refresh_error: str | None = None

    def _wanted(self):
        from rag.registry import ModelRegistry
        from rag.training.configuration import served_settings

        return served_settings(self.base, ModelRegistry(self.root / "models"), self.pinned)

    def settings(self):
        """The answer settings served now."""
        return self._settings

    def current(self):
        return self._serving.current()

    @property
    def strategy(self) -> str:
        return self._settings.strategy

    @property
    def generation(self) -> int:
        return self._serving.generation

    def info(self) -> dict:
        return {**self._serving.info(), "mode": self._settings.mode, "alpha": self._settings.alpha}

    def refresh(self, force: bool = False) -> bool:
        wanted = self._wanted()
        if wanted == self._settings:
            return self._serving.refresh(force=force)
        with self._lock:
            if wanted == self._settings:
                return True
            try:
                opened = self.open_serving(wanted)
            except Exception as exc:  # noqa: BLE001 - the previous configuration keeps serving; /health says why
                self.last_refresh_error = f"cannot serve the production configuration: {type(exc).__name__}: {exc}"
                log.exception("the production configuration cannot be served yet; the previous one still serves")
                return False
            old, self._serving, self._settings = self._serving, opened, wanted
            self.last_refresh_error = None
        log.info("now serving chunk set %s, mode %s, alpha %s", wanted.strategy, wanted.mode, wanted.alpha)
        timer = threading.Timer(30.0, old.close)  # requests in flight finish on the old index first
        timer.daemon = True
        timer.start()
        return True

    def close(self) -> None:
        self._serving.close()
