"""The Spark frames the data-quality suites run on, read from one consistent cut of the
live tables, and the ``quality_results`` table that keeps every run's results.

Checks that GX's built-in expectations cannot do exactly (decimal ranges, a recount
of the buckets from the raw events, an alert against its rule version) are computed
here as *violation columns*: a text naming the row and what is wrong, or null when
the row is fine. The suites expect those columns to be null, so a failure lists the
offending rows in words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from velocity.delta import tables
from velocity.delta.live import LiveTables, refuse_another_bucket_width
from velocity.delta.tables import LIVE_SCHEMAS
from velocity.domain.rules import Rule, RuleSignature, distinct_counted, rules_by_signature
from velocity.domain.schema import EVENT_FIELDS, MAX_AMOUNT
from velocity.domain.windows import horizon_seconds
from velocity.quality.alert_values import alert_violation, rule_terms
from velocity.redis import connection
from velocity.redis.lock import state_lock
from velocity.settings import Settings
from velocity.spark.evaluate import BUCKET_FIGURES, bucket_aggregates, keyed_events, minute_buckets

QUALITY_RESULTS = "quality_results"
QUALITY_RESULT_SCHEMA = StructType(
    [
        StructField("run_id", StringType(), False),
        StructField("run_time", LongType(), False),
        StructField("suite", StringType(), False),
        StructField("expectation_type", StringType(), False),
        StructField("description", StringType(), True),
        StructField("kwargs_json", StringType(), False),
        StructField("success", BooleanType(), False),
        StructField("observed_value_json", StringType(), True),
        StructField("unexpected_count", LongType(), True),
    ]
)

REQUIRED_EVENT_COLUMNS = tuple(f.name for f in EVENT_FIELDS if f.required)


@dataclass(frozen=True)
class Snapshot:
    """The live tables at the Delta versions pinned by ``pin_snapshot`` (None: no table)."""

    spark: SparkSession
    live: LiveTables
    versions: dict[str, int | None]

    def read(self, name: str) -> DataFrame:
        """Table ``name`` as of its pinned version; an empty frame when it did not exist."""
        version = self.versions[name]
        if version is None:
            return self.spark.createDataFrame([], LIVE_SCHEMAS[name])
        path = getattr(self.live, name)
        return self.spark.read.format("delta").option("versionAsOf", version).load(str(path))


def _current_version(spark: SparkSession, path: Path) -> int | None:
    from delta.tables import DeltaTable  # the Delta Python API needs a live session

    if not tables.table_exists(spark, path):
        return None
    row = DeltaTable.forPath(spark, str(path)).history(1).select("version").first()
    return None if row is None else int(row[0])


def pin_snapshot(
    spark: SparkSession, settings: Settings, names: Iterable[str] = tuple(LIVE_SCHEMAS)
) -> Snapshot:
    """Pin the current version of each table in ``names`` while holding the state lock.

    The stream appends a batch's events before it merges that batch's buckets, so two
    plain reads during a batch could see events whose buckets are not there yet. Under
    the lock no batch is half-written; the lock is held only to read version numbers.
    """
    live = LiveTables.of(settings)
    client = connection.connect(settings)
    connection.load_functions(client)  # the lock's release is a Redis Function
    with state_lock(client, settings, "velocity quality check"):
        versions = {name: _current_version(spark, getattr(live, name)) for name in names}
    return Snapshot(spark, live, versions)


# --- events ---------------------------------------------------------------------------


def events_frame(snapshot: Snapshot) -> DataFrame:
    """The accepted events with ``amount_out_of_range``: text when the amount is missing or
    outside SPEC §1's [0, 10^18), compared as exact decimals (a double would call
    999999999999999999.5 equal to 10^18)."""
    events = snapshot.read("events")
    amount = F.col("paymentAmount")
    upper = F.lit(int(MAX_AMOUNT)).cast("decimal(20,0)")
    outside = (amount < F.lit(0)) | (amount >= upper)
    return events.select(
        *REQUIRED_EVENT_COLUMNS,
        F.when(amount.isNull(), F.format_string("tx %s: no paymentAmount", F.col("transactionId")))
        .when(
            outside,
            F.format_string("tx %s: paymentAmount %s", F.col("transactionId"), amount),
        )
        .alias("amount_out_of_range"),
    )


# --- quarantine -----------------------------------------------------------------------


def quarantine_frame(snapshot: Snapshot) -> DataFrame:
    """One row per quarantined line (at least one row), each with the run's figures:
    ``accepted``, ``duplicates``, ``quarantined`` and ``quarantine_rate`` =
    quarantined / (accepted + duplicates + quarantined), 0 when there are no lines."""
    spark = snapshot.spark
    accepted = snapshot.read("events").count()
    duplicates = snapshot.read("duplicates").count()
    quarantine = snapshot.read("quarantine")
    quarantined = quarantine.count()
    total = accepted + duplicates + quarantined
    rate = quarantined / total if total else 0.0
    figures = spark.createDataFrame(
        [(accepted, duplicates, quarantined, rate)],
        "accepted long, duplicates long, quarantined long, quarantine_rate double",
    )
    # A left join keeps the figures' row when nothing is quarantined.
    return figures.join(quarantine.select("reason_code"), F.lit(True), "left")


# --- buckets --------------------------------------------------------------------------


def stored_minute_buckets(buckets: DataFrame, width_ms: int) -> DataFrame:
    """The buckets table as plain g-wide buckets (compacted hours expanded into parts)."""
    return minute_buckets(buckets, width_ms)


def _text(column: Column) -> Column:
    return F.coalesce(column.cast("string"), F.lit("null"))


def _figure_differences(stored: str, recount: str, distinct_counted: Column) -> Column:
    """``name stored X, from events Y`` for each figure that differs; '' when none does.
    Distinct values are compared where ``distinct_counted`` holds: elsewhere no rule reads
    them, and a stored list may be left from a UNIQUE_COUNT rule since paused."""
    parts = []
    for name in BUCKET_FIGURES:
        s, e = F.col(f"{stored}.{name}"), F.col(f"{recount}.{name}")
        compared = F.lit(True)
        if name == "distinct_values":
            s, e = F.array_sort(s), F.array_sort(e)
            shown_s, shown_e = F.to_json(s), F.to_json(e)
            compared = distinct_counted
        else:
            shown_s, shown_e = _text(s), _text(e)
        parts.append(
            F.when(
                compared & ~s.eqNullSafe(e),
                F.format_string(f"{name} stored %s, from events %s", shown_s, shown_e),
            )
        )
    return F.concat_ws("; ", *parts)


def bucket_recount(
    stored: DataFrame,
    events: DataFrame,
    signatures: Sequence[RuleSignature],
    distinct_counted: frozenset[str],
    width_ms: int,
    horizon_start: int | None,
) -> DataFrame:
    """Stored g-wide buckets of ``signatures`` side by side with the same buckets recomputed
    from the raw events, with ``recount_mismatch`` naming every figure that differs.

    Only buckets starting at ``horizon_start`` or later are compared (all when None): the
    stream keeps every bucket from there on, so one missing there is a defect, while older
    ones may be evicted, and a very late event may briefly re-create a partial bucket
    below the horizon until the next eviction. Rows carry the stored figures (null where
    the table lacks the bucket).
    """
    ids = [s.signature_id for s in signatures]
    mine = stored.where(F.col("signature_id").isin(ids))
    recount = bucket_aggregates(keyed_events(events, signatures), width_ms, distinct_counted)
    if horizon_start is not None:
        mine = mine.where(F.col("bucket_start") >= horizon_start)
        recount = recount.where(F.col("bucket_start") >= horizon_start)
    slot = ["signature_id", "key", "bucket_start"]
    joined = mine.alias("s").join(recount.alias("e"), slot, "full_outer")
    counted = F.col("signature_id").isin(sorted(distinct_counted))
    differences = _figure_differences("s", "e", counted)
    where = F.format_string(
        "signature %s key %s bucket %s: ",
        F.col("signature_id"),
        F.col("key"),
        F.col("bucket_start"),
    )
    mismatch = (
        F.when(
            F.col("s.event_count").isNull(),
            F.concat(
                where,
                F.format_string("missing from the table (events: %s)", F.col("e.event_count")),
            ),
        )
        .when(
            F.col("e.event_count").isNull(),
            F.concat(
                where,
                F.format_string("no such events (stored event_count %s)", F.col("s.event_count")),
            ),
        )
        .when(differences != "", F.concat(where, differences))
    )
    return joined.select(
        *slot,
        *[F.col(f"s.{name}").alias(name) for name in BUCKET_FIGURES if name != "distinct_values"],
        mismatch.alias("recount_mismatch"),
    )


def buckets_frame(snapshot: Snapshot, rules: Sequence[Rule], settings: Settings) -> DataFrame:
    """The stored g-wide buckets of the built, active signatures with ``recount_mismatch``.

    Buckets of signatures no longer active are left out (the stream drops them on its
    next batch), as are signatures not yet built (it builds them on its next batch).
    """
    width_ms = settings.bucket_width_ms
    built = {r[0] for r in snapshot.read("signatures").select("signature_id").collect()}
    signatures = [s for s in rules_by_signature(rules) if s.signature_id in built]
    events = snapshot.read("events")
    horizon_start = None
    if signatures:
        # The stream evicts behind the newest eventTime it has decided, never beyond this.
        newest = events.agg(F.max("eventTime")).first()
        if newest is not None and newest[0] is not None:
            horizon_ms = horizon_seconds(rules, settings) * 1000
            horizon_start = int(newest[0]) - horizon_ms
    buckets = snapshot.read("buckets")
    # Every bucket would look wrong; say what is wrong once instead.
    refuse_another_bucket_width(buckets, settings)
    stored = stored_minute_buckets(buckets, width_ms)
    counted = distinct_counted(rules)
    return bucket_recount(stored, events, signatures, counted, width_ms, horizon_start)


# --- alerts ---------------------------------------------------------------------------

_TERMS_SCHEMA = (
    "ruleId long, ruleVersion int, rule_aggregator string, rule_operator string, rule_limit string"
)


def alerts_frame(snapshot: Snapshot, rule_versions: Sequence[Rule]) -> DataFrame:
    """The alerts with ``rule_violation``: why an alert disagrees with its rule version
    (``velocity.quality.alert_values.alert_violation``), null when it agrees."""
    spark = snapshot.spark
    terms = spark.createDataFrame(rule_terms(rule_versions), _TERMS_SCHEMA)
    # Exact decimal logic in Python, run by Spark's workers (Arrow-batched), so it scales
    # with the alerts table and shares one definition of "fires" with the engine.
    violation = F.udf(alert_violation, StringType(), useArrow=True)
    alerts = snapshot.read("alerts")
    return alerts.join(terms, ["ruleId", "ruleVersion"], "left").select(
        "alertId",
        "kind",
        "ruleId",
        "ruleVersion",
        "transactionId",
        "aggregateValue",
        "limitOperatorType",
        "limit",
        violation(
            "kind",
            "ruleId",
            "ruleVersion",
            "transactionId",
            "aggregatorFunctionType",
            "aggregateValue",
            "limitOperatorType",
            "limit",
            "rule_aggregator",
            "rule_operator",
            "rule_limit",
        ).alias("rule_violation"),
    )


# --- results --------------------------------------------------------------------------


def write_results(
    spark: SparkSession, settings: Settings, run_id: str, rows: list[dict[str, Any]]
) -> Path:
    """Replace run ``run_id``'s rows in ``quality_results`` in one commit (a rerun of the
    same run id rewrites its rows, never adds a second copy); returns the table's path.

    ``run_id`` must already be checked safe to quote (``velocity.quality.run``).
    """
    path = settings.table_path(QUALITY_RESULTS)
    tables.create_if_missing(spark, path, QUALITY_RESULT_SCHEMA)
    frame = spark.createDataFrame(rows, QUALITY_RESULT_SCHEMA)
    (
        frame.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"run_id = '{run_id}'")
        .save(str(path))
    )
    return path
