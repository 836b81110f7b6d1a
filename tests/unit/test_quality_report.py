"""The data-quality report (pure): outcomes from GX result JSON, result rows, the summary."""

from __future__ import annotations

import json
from typing import Any

import pytest

from velocity.quality.report import (
    UNEXPECTED_SHOWN,
    QualityReport,
    SuiteOutcome,
    expectation_outcome,
    expected_text,
    format_summary,
    result_rows,
    suite_outcome,
)


def gx_result(
    expectation_type: str,
    success: bool,
    result: dict[str, Any],
    description: str | None = None,
    error: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """One entry of a GX 1.x validation result's ``results`` (``to_json_dict()`` shape)."""
    config: dict[str, Any] = {
        "type": expectation_type,
        "kwargs": {"batch_id": "velocity-suite", **kwargs},
        "meta": {},
        "severity": "critical",
    }
    if description is not None:
        config["description"] = description
    return {
        "success": success,
        "expectation_config": config,
        "result": result,
        "meta": {},
        "exception_info": {
            "raised_exception": error is not None,
            "exception_traceback": None,
            "exception_message": error,
        },
    }


def column_map(unexpected: list[Any], element_count: int = 10) -> dict[str, Any]:
    return {
        "element_count": element_count,
        "unexpected_count": len(unexpected),
        "unexpected_percent": 100.0 * len(unexpected) / element_count,
        "partial_unexpected_list": unexpected,
    }


def validation(*results: dict[str, Any]) -> dict[str, Any]:
    return {"success": all(r["success"] for r in results), "results": list(results)}


RECOUNT_MISMATCH = (
    'signature abc key ["p-1"] bucket 1767225600000: event_count stored 5, from events 4'
)


def failing_report() -> QualityReport:
    buckets = suite_outcome(
        "buckets",
        validation(
            gx_result(
                "expect_column_values_to_be_between",
                True,
                column_map([]),
                column="event_count",
                min_value=1,
            ),
            gx_result(
                "expect_column_values_to_be_null",
                False,
                column_map([RECOUNT_MISMATCH]),
                description="buckets equal a recount of the raw events",
                column="recount_mismatch",
            ),
        ),
    )
    quarantine = suite_outcome(
        "quarantine",
        validation(
            gx_result(
                "expect_column_max_to_be_between",
                False,
                {"observed_value": 0.4},
                column="quarantine_rate",
                min_value=0,
                max_value=0.05,
            ),
        ),
    )
    events = suite_outcome(
        "events",
        validation(
            gx_result(
                "expect_column_values_to_be_unique", True, column_map([]), column="transactionId"
            )
        ),
    )
    return QualityReport("run-1", 1_767_225_600_000, (events, quarantine, buckets), "/data/q/run-1")


def test_all_passing_summary_is_one_line_per_suite_and_a_verdict() -> None:
    events = suite_outcome(
        "events",
        validation(
            gx_result("expect_column_values_to_not_be_null", True, column_map([]), column="x"),
            gx_result("expect_column_values_to_be_unique", True, column_map([]), column="y"),
        ),
    )
    alerts = suite_outcome(
        "alerts",
        validation(
            gx_result("expect_column_values_to_be_unique", True, column_map([]), column="z")
        ),
    )
    report = QualityReport("run-7", 0, (events, alerts))

    assert report.success
    assert format_summary(report).splitlines() == [
        "events: passed 2 of 2 expectations",
        "alerts: passed 1 of 1 expectations",
        "data quality passed (run run-7)",
    ]


def test_failure_summary_names_suite_expectation_column_observed_expected_and_values() -> None:
    report = failing_report()
    summary = format_summary(report)

    assert not report.success
    lines = summary.splitlines()
    assert lines[:3] == [
        "events: passed 1 of 1 expectations",
        "quarantine: FAILED, passed 0 of 1 expectations",
        "buckets: FAILED, passed 1 of 2 expectations",
    ]
    assert "  FAILED expect_column_max_to_be_between(quarantine_rate)" in lines
    assert "    expected: max >= 0 and <= 0.05" in lines
    assert "    observed: 0.4" in lines
    assert "  FAILED expect_column_values_to_be_null(recount_mismatch)" in lines
    assert "    checks:   buckets equal a recount of the raw events" in lines
    assert "    observed: 1 unexpected of 10 rows" in lines
    assert f"      {RECOUNT_MISMATCH}" in lines
    assert lines[-1] == "data quality FAILED (run run-1; results in /data/q/run-1)"
    # A passing expectation is not detailed.
    assert "event_count)" not in summary


def test_only_a_few_unexpected_values_are_shown() -> None:
    values = [f"tx-{i}" for i in range(30)]
    outcome = expectation_outcome(
        "events",
        gx_result(
            "expect_column_values_to_be_unique",
            False,
            column_map(values, 100),
            column="transactionId",
        ),
    )
    report = QualityReport("r", 0, (SuiteOutcome("events", (outcome,)),))
    summary = format_summary(report)

    assert outcome.unexpected_values == tuple(values[:UNEXPECTED_SHOWN])
    assert f"    unexpected values (first {UNEXPECTED_SHOWN}):" in summary
    assert "tx-4" in summary and "tx-5" not in summary


def test_an_expectation_that_raised_fails_with_its_message() -> None:
    outcome = expectation_outcome(
        "alerts",
        gx_result(
            "expect_column_values_to_be_null",
            True,
            {},
            error="column rule_violation missing",
            column="rule_violation",
        ),
    )

    assert not outcome.success
    assert outcome.observed_text() == "error: column rule_violation missing"


def test_result_rows_keep_one_row_per_expectation_with_json_columns() -> None:
    rows = result_rows(failing_report())

    assert [(r["suite"], r["expectation_type"], r["success"]) for r in rows] == [
        ("events", "expect_column_values_to_be_unique", True),
        ("quarantine", "expect_column_max_to_be_between", False),
        ("buckets", "expect_column_values_to_be_between", True),
        ("buckets", "expect_column_values_to_be_null", False),
    ]
    assert {r["run_id"] for r in rows} == {"run-1"}
    rate = rows[1]
    assert json.loads(rate["kwargs_json"]) == {
        "column": "quarantine_rate",
        "min_value": 0,
        "max_value": 0.05,
    }
    assert json.loads(rate["observed_value_json"]) == 0.4
    assert rate["unexpected_count"] is None
    mismatch = rows[3]
    assert mismatch["unexpected_count"] == 1
    assert json.loads(mismatch["observed_value_json"])["unexpected_values"] == [RECOUNT_MISMATCH]


@pytest.mark.parametrize(
    ("expectation_type", "kwargs", "text"),
    [
        ("expect_column_values_to_be_between", {"min_value": 0.0}, "every value >= 0"),
        (
            "expect_column_values_to_be_between",
            {"min_value": 0.0, "max_value": 1e18, "strict_max": True},
            "every value >= 0 and < 10^18",
        ),
        ("expect_column_values_to_be_in_set", {"value_set": ["CRD", "CSH"]}, "one of {CRD, CSH}"),
        (
            "expect_column_pair_values_a_to_be_greater_than_b",
            {"column_A": "value_max", "column_B": "value_min", "or_equal": True},
            "value_max >= value_min",
        ),
        ("expect_something_new", {"batch_id": "b", "x": 1}, '{"x": 1}'),
    ],
)
def test_expected_text(expectation_type: str, kwargs: dict[str, Any], text: str) -> None:
    assert expected_text(expectation_type, kwargs) == text


def test_report_suite_lookup_names_the_suites_it_has() -> None:
    with pytest.raises(KeyError, match=r"it ran \['events', 'quarantine', 'buckets'\]"):
        failing_report().suite("alerts")
