"""The outcome of a data-quality run: what each expectation saw, the readable summary, and
the rows kept in the ``quality_results`` table. Pure: no GX, Spark or Delta here.

Outcomes are built from GX validation results as plain JSON dicts (GX's
``to_json_dict()``), so formatting is tested without running GX. Invariants:

- An expectation that raised inside GX counts as failed, with its error message.
- ``QualityReport.success`` is true only when every expectation of every suite passed.
- ``format_summary`` shows one line per suite when all pass; otherwise, for each failed
  expectation, the suite, expectation, column, observed vs expected and at most
  ``UNEXPECTED_SHOWN`` unexpected values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The suites, one per subject, in the order they run and are reported.
SUITE_NAMES = ("events", "quarantine", "buckets", "alerts")
# Unexpected values shown per failed expectation in the summary and kept per result row.
UNEXPECTED_SHOWN = 5


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def _number(value: object) -> str:
    """A bound as people write it: ``0`` not ``0.0``, ``1e+18`` as ``10^18``."""
    if isinstance(value, float) and value.is_integer():
        if abs(value) >= 1e15:
            exponent = len(str(int(abs(value)))) - 1
            if abs(value) == 10.0**exponent:
                return f"{'-' if value < 0 else ''}10^{exponent}"
        return str(int(value))
    return str(value)


def _between(kwargs: Mapping[str, Any]) -> str:
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    low_op = ">" if kwargs.get("strict_min") else ">="
    high_op = "<" if kwargs.get("strict_max") else "<="
    parts = []
    if low is not None:
        parts.append(f"{low_op} {_number(low)}")
    if high is not None:
        parts.append(f"{high_op} {_number(high)}")
    return " and ".join(parts) or "any value"


def expected_text(expectation_type: str, kwargs: Mapping[str, Any]) -> str:
    """What an expectation asks for, in a few words (falls back to its kwargs as JSON)."""
    match expectation_type:
        case "expect_column_values_to_not_be_null":
            return "no nulls"
        case "expect_column_values_to_be_null":
            return "null in every row"
        case "expect_column_values_to_be_unique":
            return "every value unique"
        case "expect_column_values_to_be_in_set":
            return "one of {" + ", ".join(str(v) for v in kwargs.get("value_set", [])) + "}"
        case "expect_column_values_to_be_between":
            return f"every value {_between(kwargs)}"
        case "expect_column_max_to_be_between":
            return f"max {_between(kwargs)}"
        case "expect_column_min_to_be_between":
            return f"min {_between(kwargs)}"
        case "expect_column_pair_values_a_to_be_greater_than_b":
            op = ">=" if kwargs.get("or_equal") else ">"
            return f"{kwargs.get('column_A')} {op} {kwargs.get('column_B')}"
        case "expect_table_row_count_to_equal":
            return f"{kwargs.get('value')} rows"
    shown = {k: v for k, v in kwargs.items() if k != "batch_id"}
    return _json(shown)


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result in one run."""

    suite: str
    expectation_type: str
    kwargs: Mapping[str, Any]  # GX's kwargs without the run-specific batch_id
    description: str | None
    success: bool
    observed: object  # JSON-able: GX's observed_value, or counts and a few unexpected values
    unexpected_count: int | None
    element_count: int | None
    unexpected_values: tuple[object, ...]
    error: str | None = None

    @property
    def column(self) -> str | None:
        """The column(s) the expectation reads, e.g. ``value_max, value_min`` for a pair."""
        if "column" in self.kwargs:
            return str(self.kwargs["column"])
        if "column_A" in self.kwargs:
            return f"{self.kwargs['column_A']}, {self.kwargs.get('column_B')}"
        if "column_list" in self.kwargs:
            return ", ".join(str(c) for c in self.kwargs["column_list"])
        return None

    @property
    def expected(self) -> str:
        return expected_text(self.expectation_type, self.kwargs)

    def observed_text(self) -> str:
        if self.error is not None:
            return f"error: {self.error}"
        if self.unexpected_count is not None:
            total = "" if self.element_count is None else f" of {self.element_count} rows"
            return f"{self.unexpected_count} unexpected{total}"
        return _json(self.observed)


@dataclass(frozen=True)
class SuiteOutcome:
    """One suite (one subject: events, quarantine, buckets or alerts) in one run."""

    name: str
    outcomes: tuple[ExpectationOutcome, ...]

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)

    @property
    def failures(self) -> tuple[ExpectationOutcome, ...]:
        return tuple(o for o in self.outcomes if not o.success)


@dataclass(frozen=True)
class QualityReport:
    """Every suite of one run; where its full GX results were written."""

    run_id: str
    run_time: int  # epoch ms
    suites: tuple[SuiteOutcome, ...]
    results_dir: str | None = None

    @property
    def success(self) -> bool:
        return all(s.success for s in self.suites)

    def suite(self, name: str) -> SuiteOutcome:
        for suite in self.suites:
            if suite.name == name:
                return suite
        raise KeyError(f"no suite {name!r} in run {self.run_id}; it ran {self.suite_names}")

    @property
    def suite_names(self) -> list[str]:
        return [s.name for s in self.suites]


def _partial_values(result: Mapping[str, Any]) -> tuple[object, ...]:
    values = result.get("partial_unexpected_list") or []
    return tuple(values[:UNEXPECTED_SHOWN])


def expectation_outcome(suite: str, result: Mapping[str, Any]) -> ExpectationOutcome:
    """One entry of a GX validation result's ``results`` list (as JSON) as an outcome."""
    config = result.get("expectation_config") or {}
    kwargs = {k: v for k, v in (config.get("kwargs") or {}).items() if k != "batch_id"}
    figures = result.get("result") or {}
    exception = result.get("exception_info") or {}
    error = exception.get("exception_message") if exception.get("raised_exception") else None
    values = _partial_values(figures)
    unexpected = figures.get("unexpected_count")
    if "observed_value" in figures:
        observed: object = figures["observed_value"]
    else:
        observed = {
            "element_count": figures.get("element_count"),
            "unexpected_count": unexpected,
            "unexpected_values": list(values),
        }
    return ExpectationOutcome(
        suite=suite,
        expectation_type=str(config.get("type", "unknown")),
        kwargs=kwargs,
        description=config.get("description"),
        success=bool(result.get("success")) and error is None,
        observed=observed,
        unexpected_count=None if unexpected is None else int(unexpected),
        element_count=figures.get("element_count"),
        unexpected_values=values,
        error=error,
    )


def suite_outcome(name: str, validation: Mapping[str, Any]) -> SuiteOutcome:
    """A GX suite validation result (``to_json_dict()``) as a ``SuiteOutcome``."""
    results = validation.get("results") or []
    return SuiteOutcome(name, tuple(expectation_outcome(name, r) for r in results))


def result_rows(report: QualityReport) -> list[dict[str, Any]]:
    """One row per expectation result, in the ``quality_results`` table's columns."""
    return [
        {
            "run_id": report.run_id,
            "run_time": report.run_time,
            "suite": outcome.suite,
            "expectation_type": outcome.expectation_type,
            "description": outcome.description,
            "kwargs_json": _json(dict(outcome.kwargs)),
            "success": outcome.success,
            "observed_value_json": _json(outcome.observed),
            "unexpected_count": outcome.unexpected_count,
        }
        for suite in report.suites
        for outcome in suite.outcomes
    ]


def _failure_lines(outcome: ExpectationOutcome) -> Iterator[str]:
    column = f"({outcome.column})" if outcome.column else ""
    yield f"  FAILED {outcome.expectation_type}{column}"
    if outcome.description:
        yield f"    checks:   {outcome.description}"
    yield f"    expected: {outcome.expected}"
    yield f"    observed: {outcome.observed_text()}"
    if outcome.unexpected_values:
        more = (
            ""
            if outcome.unexpected_count is None
            or outcome.unexpected_count <= len(outcome.unexpected_values)
            else f" (first {len(outcome.unexpected_values)})"
        )
        yield f"    unexpected values{more}:"
        for value in outcome.unexpected_values:
            yield f"      {value if isinstance(value, str) else _json(value)}"


def format_summary(report: QualityReport) -> str:
    """The readable summary: one line per suite, then the details of every failure."""
    lines = []
    for suite in report.suites:
        total = len(suite.outcomes)
        if suite.success:
            lines.append(f"{suite.name}: passed {total} of {total} expectations")
        else:
            passed = total - len(suite.failures)
            lines.append(f"{suite.name}: FAILED, passed {passed} of {total} expectations")
    for suite in report.suites:
        if suite.failures:
            lines.append(f"{suite.name}:")
            for outcome in suite.failures:
                lines.extend(_failure_lines(outcome))
    verdict = "passed" if report.success else "FAILED"
    where = f"; results in {report.results_dir}" if report.results_dir else ""
    lines.append(f"data quality {verdict} (run {report.run_id}{where})")
    return "\n".join(lines)


def failed_suites(report: QualityReport) -> Sequence[str]:
    return [s.name for s in report.suites if not s.success]
