"""The great-expectations suites, one per subject, and their validation (GX 1.x Fluent API).

Each run builds an ephemeral GX context (nothing is written to a GX project folder;
the results are kept by ``velocity.quality.run``), one Spark data source, and one
whole-DataFrame batch per subject frame from ``velocity.quality.checks``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame

from velocity.domain.schema import FIELDS_BY_NAME, RejectReason
from velocity.quality.checks import REQUIRED_EVENT_COLUMNS
from velocity.quality.report import SUITE_NAMES

# GX must never phone home (usage statistics): there may be no network at all. Set before
# GX is imported, which reads it.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")

import great_expectations as gx
import great_expectations.expectations as gxe
from great_expectations.data_context.types.base import ProgressBarsConfig

ALERT_KINDS = ("ALERT", "CORRECTION", "RETRACTION")


def events_suite() -> list[Any]:
    """SPEC §1 on the accepted events: what the parser guarantees must hold in the table."""
    # A missing paymentAmount is reported by amount_out_of_range, with its transactionId.
    not_null = [
        gxe.ExpectColumnValuesToNotBeNull(column=name, description=f"{name} is required")
        for name in REQUIRED_EVENT_COLUMNS
        if name != "paymentAmount"
    ]
    return [
        *not_null,
        gxe.ExpectColumnValuesToBeUnique(
            column="transactionId", description="one accepted event per transactionId"
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="eventTime", min_value=0, description="eventTime is epoch ms >= 0"
        ),
        gxe.ExpectColumnValuesToBeNull(
            column="amount_out_of_range",
            description="paymentAmount present and 0 <= paymentAmount < 10^18, as exact decimals",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="paymentType",
            value_set=sorted(FIELDS_BY_NAME["paymentType"].allowed),
            description="paymentType is a known type",
        ),
    ]


def quarantine_suite(max_rate: float) -> list[Any]:
    """The share of quarantined lines, and that every quarantine reason is a known one."""
    return [
        gxe.ExpectColumnMaxToBeBetween(
            column="quarantine_rate",
            min_value=0,
            max_value=max_rate,
            description="quarantined / (accepted + duplicates + quarantined) "
            "at most VELOCITY_QUALITY_MAX_QUARANTINE_RATE",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="reason_code",
            value_set=sorted(r.value for r in RejectReason),
            description="every quarantined line has a known reason code",
        ),
    ]


def buckets_suite() -> list[Any]:
    """Bucket invariants, and the buckets equal a recount from the raw events."""
    return [
        gxe.ExpectColumnValuesToBeBetween(
            column="event_count", min_value=1, description="a stored bucket holds an event"
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="value_count", min_value=0, description="no negative counts"
        ),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="event_count",
            column_B="value_count",
            or_equal=True,
            description="values counted <= events counted",
        ),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="value_max",
            column_B="value_min",
            or_equal=True,
            ignore_row_if="either_value_is_missing",
            description="value_min <= value_max where both are present",
        ),
        gxe.ExpectColumnValuesToBeNull(
            column="recount_mismatch",
            description="counts, sum, min, max and distinct values equal a recount of the "
            "raw events per signature, key and bucket",
        ),
    ]


def alerts_suite() -> list[Any]:
    """Alert identity and kind, and every alert agrees with its rule version."""
    return [
        gxe.ExpectColumnValuesToNotBeNull(column="alertId", description="alertId is set"),
        gxe.ExpectColumnValuesToBeUnique(
            column="alertId", description="alertId is unique (deterministic per decision)"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="kind", value_set=list(ALERT_KINDS), description="kind is a SPEC §4 kind"
        ),
        gxe.ExpectColumnValuesToBeNull(
            column="rule_violation",
            description="every ALERT/CORRECTION's aggregateValue OP limit holds, exactly, "
            "with the aggregator, operator and limit of its rule version",
        ),
    ]


def suite_expectations(name: str, max_quarantine_rate: float) -> list[Any]:
    """The expectations of suite ``name`` (one of ``SUITE_NAMES``)."""
    match name:
        case "events":
            return events_suite()
        case "quarantine":
            return quarantine_suite(max_quarantine_rate)
        case "buckets":
            return buckets_suite()
        case "alerts":
            return alerts_suite()
    raise KeyError(f"no suite {name!r}; the suites are {list(SUITE_NAMES)}")


def validate(
    frames: Mapping[str, DataFrame], expectations: Mapping[str, Sequence[Any]]
) -> dict[str, dict[str, Any]]:
    """Run each suite on its frame; GX's full validation result per suite, as JSON dicts.

    GX persists each frame while its metrics are computed; it is unpersisted after.
    """
    # GX logs a warning for every decimal it turns into a float to *display* it; the
    # checks themselves compare in Spark, exactly.
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_spark(name="velocity")
    results: dict[str, dict[str, Any]] = {}
    for name, frame in frames.items():
        suite = gx.ExpectationSuite(name=name, expectations=list(expectations[name]))
        definition = source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe(
            name
        )
        try:
            batch = definition.get_batch(batch_parameters={"dataframe": frame})
            # BASIC: counts and the first unexpected values, without SUMMARY's value counts
            # (one more Spark job per expectation).
            result = batch.validate(suite, result_format="BASIC")
        finally:
            frame.unpersist()
        results[name] = result.to_json_dict()
    return results
