"""Silence the libraries' known, harmless noise in CLI output; every other warning and error still shows.

Each filter names one library's own category or message, never a whole class of warnings:

- Dagster's PreviewWarning / BetaWarning / SupersessionWarning: printed while the Definitions load, about
  Dagster APIs the project chose on purpose (partitioned asset checks, sensor owners).
- numba's "unsafe cast from uint64 to int64" (NumbaTypeSafetyWarning) from ranx's compiled metrics: printed
  the first time numba compiles them. numba re-issues it with the file of ranx's source and no module, so
  Python takes the file's path (without .py) as the module: the filter matches ranx's files by path or name.
- matplotlib's INFO line "generated new fontManager": printed once per machine, when matplotlib first builds
  its font cache (the evaluation's plots), through the same root handler as GX's lines below.
- Great Expectations' INFO lines ("Created temporary directory ... for ephemeral docs site"): one logger of GX
  sets itself to INFO on import, and WordLlama's import installs a root handler at INFO that prints them.

Dagster's telemetry banner is not a warning: `orchestration.cli` turns telemetry off in the instance's dagster.yaml.
"""

from __future__ import annotations

import logging
import warnings

# Loggers held at WARNING. GX's `...types.base` sets its own level to INFO when imported, so a filter on that
# logger (kept across setLevel) drops its INFO records whenever GX is imported.
QUIET_LOGGERS = (
    "great_expectations",
    "great_expectations.data_context.types.base",
    "alembic",
    "matplotlib.font_manager",
)
# ranx's modules as warnings name them: "ranx.metrics.ndcg", or the path ".../ranx/metrics/ndcg" when numba re-issues
# a warning with only the file.
RANX_MODULE = r"(.*[/\\])?ranx[/\\.]"


def _at_least_warning(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def quiet_known_noise() -> None:
    """Install the filters above (idempotent). Call once at the start of a command."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        if _at_least_warning not in logger.filters:
            logger.addFilter(_at_least_warning)
    numba_cast = r"unsafe cast from \w+ to \w+\. Precision may be lost"
    warnings.filterwarnings("ignore", message=numba_cast, module=RANX_MODULE)
    try:  # dagster_shared only: importing it is cheap, unlike dagster itself
        from dagster_shared.utils.warnings import BetaWarning, PreviewWarning, SupersessionWarning
    except ImportError:
        return
    for category in (PreviewWarning, BetaWarning, SupersessionWarning):
        warnings.filterwarnings("ignore", category=category)
