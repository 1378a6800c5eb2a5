"""A thin runner for Great Expectations 1.x suites over a pandas DataFrame.

It returns plain records (no Dagster types) so the Dagster layer maps them to asset check results
and the library stays testable alone. Each call uses an ephemeral context: nothing is written to disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@dataclass(frozen=True)
class ExpectationOutcome:
    expectation: str
    column: str | None
    success: bool
    unexpected_count: int | None
    unexpected_percent: float | None
    sample_unexpected: list[Any]
    observed_value: Any


@dataclass(frozen=True)
class SuiteOutcome:
    suite: str
    success: bool
    rows: int
    expectations: list[ExpectationOutcome]

    @property
    def failed(self) -> list[ExpectationOutcome]:
        return [e for e in self.expectations if not e.success]


def run_expectations(df: pd.DataFrame, expectations: list, suite_name: str) -> SuiteOutcome:
    """Validate `df` against GX expectation objects (e.g. `gxe.ExpectColumnValuesToBeUnique(...)`)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (
        context.data_sources.add_pandas(f"{suite_name}-source")
        .add_dataframe_asset(f"{suite_name}-asset")
        .add_batch_definition_whole_dataframe(f"{suite_name}-batch")
        .get_batch(batch_parameters={"dataframe": df})
    )
    suite = gx.ExpectationSuite(name=suite_name)
    for expectation in expectations:
        suite.add_expectation(expectation)
    result = batch.validate(suite)
    outcomes = []
    for res in result.results:
        details = res.result or {}
        outcomes.append(
            ExpectationOutcome(
                expectation=res.expectation_config.type,
                column=res.expectation_config.kwargs.get("column"),
                success=bool(res.success),
                unexpected_count=details.get("unexpected_count"),
                unexpected_percent=details.get("unexpected_percent"),
                sample_unexpected=list(details.get("partial_unexpected_list") or [])[:5],
                observed_value=details.get("observed_value"),
            )
        )
    return SuiteOutcome(suite=suite_name, success=bool(result.success), rows=len(df), expectations=outcomes)
