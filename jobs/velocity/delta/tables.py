"""The Delta tables of record: their names, schemas and the writes Velocity makes.

Every table lives under one root (``<data_dir>/tables`` for the live system,
``<data_dir>/backtest`` for backtests), so two data dirs never share state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from velocity.delta.names import (
    ALERT_REVIEWS,
    ALERTS,
    BACKFILLS,
    BUCKETS,
    DUPLICATES,
    EVENTS,
    LATE_EVENTS,
    QUARANTINE,
    RULE_EPOCHS,
    RULES,
    SIGNATURES,
)

__all__ = [
    "ALERTS",
    "ALERT_REVIEWS",
    "BACKFILLS",
    "BUCKETS",
    "DUPLICATES",
    "EVENTS",
    "LATE_EVENTS",
    "QUARANTINE",
    "RULES",
    "RULE_EPOCHS",
    "SIGNATURES",
]

# Amounts: < 10^18 with 8 places (SPEC §1); sums keep 8 places with room for 10^20 events.
AMOUNT_TYPE = DecimalType(26, 8)
SUM_TYPE = DecimalType(38, 8)

# Where each line came from; (source_file, source_block, line_seq) orders lines by arrival.
_SOURCE_FIELDS = [
    StructField("source_file", StringType(), False),
    StructField("source_block", LongType(), False),
    StructField("line_seq", LongType(), False),
    StructField("ingest_time", LongType(), False),
]

# An event's raw line and where it came from: kept with it, never decided on.
LINE_FIELDS = ("raw", *(f.name for f in _SOURCE_FIELDS))

EVENT_SCHEMA = StructType(
    [
        StructField("transactionId", StringType(), False),
        StructField("eventTime", LongType(), False),
        StructField("payerId", StringType(), False),
        StructField("beneficiaryId", StringType(), False),
        StructField("paymentAmount", AMOUNT_TYPE, False),
        StructField("paymentType", StringType(), False),
        StructField("ip", StringType(), True),
        StructField("deviceId", StringType(), True),
        StructField("action", StringType(), True),
        StructField("raw", StringType(), False),
        *_SOURCE_FIELDS,
    ]
)

# The live events table: every accepted event and the micro-batch that brought it.
LIVE_EVENT_SCHEMA = StructType(
    [*EVENT_SCHEMA.fields, StructField("stream_batch", LongType(), False)]
)

LATE_EVENT_SCHEMA = StructType(
    [
        StructField("transactionId", StringType(), False),
        StructField("eventTime", LongType(), False),
        StructField("watermark", LongType(), False),
        StructField("stream_batch", LongType(), False),
        # ``velocity.domain.schema.LateReason``; null in a table of an older Velocity: late.
        StructField("reason", StringType(), True),
    ]
)

# Signatures whose buckets are built: a signature that becomes active is built from the
# raw events first, so a new rule sees the history already inside its window.
SIGNATURE_SCHEMA = StructType(
    [
        StructField("signature_id", StringType(), False),
        StructField("signature_json", StringType(), False),
        StructField("built_batch", LongType(), False),
        # The widest window whose history these buckets hold: the narrowest widest-active-
        # window since the build, as eviction keeps no more. A wider rule rebuilds them.
        StructField("kept_window_ms", LongType(), True),
        # Whether these buckets keep their distinct values (``rules.distinct_counted``):
        # a UNIQUE_COUNT rule that starts counting rebuilds them when not. Null: a data
        # dir from before the column, whose buckets kept them all.
        StructField("kept_distinct", BooleanType(), True),
    ]
)

# One row per finished backfill run: what it covered and the alerts it emitted (their
# ids: a run that committed its alerts but died before publishing them is found by the
# next run). ``late_through_batch``: the late events of stream batches up to this one
# are covered (``velocity backfill --late``).
BACKFILL_SCHEMA = StructType(
    [
        StructField("run_id", StringType(), False),
        StructField("from_ms", LongType(), False),
        StructField("to_ms", LongType(), False),
        StructField("rule_ids", ArrayType(LongType(), False), False),
        StructField("late_through_batch", LongType(), True),
        StructField("events_evaluated", LongType(), False),
        StructField("corrections", LongType(), False),
        StructField("retractions", LongType(), False),
        StructField("alert_ids", ArrayType(StringType(), False), False),
        StructField("started_at", LongType(), False),
        StructField("finished_at", LongType(), False),
        # Added later: nullable (a run recorded before has none; create_if_missing adds
        # them to an older table). The Velocity page shows them.
        StructField("lock_seconds", DoubleType(), True),
        StructField("airflow_run_id", StringType(), True),
        # What a ``--late`` run covered, by reason (``LateReason``); null for a range.
        StructField("late_events", LongType(), True),
        StructField("out_of_order_events", LongType(), True),
    ]
)

QUARANTINE_SCHEMA = StructType(
    [
        StructField("raw", StringType(), False),
        StructField("reason_code", StringType(), False),
        StructField("reason", StringType(), False),
        *_SOURCE_FIELDS,
    ]
)

# The line parser's output: an event's columns or a quarantine reason, never both.
PARSED_SCHEMA = StructType(
    [
        StructField("accepted", BooleanType(), False),
        StructField("reason_code", StringType(), True),
        StructField("reason", StringType(), True),
        *[
            StructField(f.name, f.dataType, True)
            for f in EVENT_SCHEMA.fields
            if f.name != "raw" and f.name not in {s.name for s in _SOURCE_FIELDS}
        ],
        StructField("raw", StringType(), False),
        *_SOURCE_FIELDS,
    ]
)

# The figures of one bucket (``velocity.domain.buckets.BucketAggregate`` as columns).
_BUCKET_FIGURES = [
    StructField("event_count", LongType(), False),
    StructField("value_count", LongType(), False),
    StructField("value_sum", SUM_TYPE, True),
    StructField("value_min", AMOUNT_TYPE, True),
    StructField("value_max", AMOUNT_TYPE, True),
    StructField("distinct_values", ArrayType(StringType(), False), False),
]

# One g-wide bucket inside a compacted bucket. Nullable throughout: Delta enforces NOT NULL
# only on top-level columns, and a nested non-null field would only make writes fragile.
BUCKET_PART_TYPE = StructType(
    [
        StructField(f.name, f.dataType, True)
        for f in [StructField("bucket_start", LongType(), False), *_BUCKET_FIGURES]
    ]
)

# A row is either one g-wide bucket (``bucket_width_ms`` = g, ``parts`` null) or a compacted
# hour (``bucket_width_ms`` = 3 600 000): the hour's figures plus, in ``parts``, the g-wide
# buckets it was made of, so a window edge inside the hour is still exact. A late event
# that lands in a compacted hour adds a g-wide row next to it; readers merge both
# (``velocity.spark.evaluate.minute_buckets``) and the next compaction folds it in.
BUCKET_SCHEMA = StructType(
    [
        StructField("signature_id", StringType(), False),
        StructField("key", StringType(), False),
        StructField("bucket_start", LongType(), False),
        StructField("bucket_width_ms", LongType(), False),
        *_BUCKET_FIGURES,
        StructField("parts", ArrayType(BUCKET_PART_TYPE, True), True),
    ]
)

ALERT_SCHEMA = StructType(
    [
        StructField("alertId", StringType(), False),
        StructField("kind", StringType(), False),
        StructField("ruleId", LongType(), False),
        StructField("ruleVersion", IntegerType(), False),
        StructField("transactionId", StringType(), False),
        StructField("key", MapType(StringType(), StringType(), False), False),
        StructField("eventTime", LongType(), False),
        StructField("aggregatorFunctionType", StringType(), False),
        StructField("aggregateValue", StringType(), False),
        StructField("limitOperatorType", StringType(), False),
        StructField("limit", StringType(), False),
        StructField("windowStart", LongType(), False),
        StructField("windowEnd", LongType(), False),
        StructField("decisionTime", LongType(), False),
        StructField("signature_id", StringType(), False),
        # A shadow rule's alert (SPEC §2 SHADOW); null in a table of an older Velocity.
        StructField("shadow", BooleanType(), True),
        # SPEC §3 cooldown: true for an alert recorded but not published, with the
        # transactionId of the notified alert that suppressed it; null in older tables.
        StructField("suppressed", BooleanType(), True),
        StructField("suppressedBy", StringType(), True),
        # The case the stream's write-behind gathered it into (SPEC §4a); null for a
        # backfill's amendment and in older tables.
        StructField("caseId", StringType(), True),
        # The rule version's outcome (SPEC §4: ALERT, REVIEW or BLOCK); null in a table of
        # an older Velocity, whose rules were all ALERT (``alerts.stored_outcome``).
        StructField("outcome", StringType(), True),
    ]
)

RULE_SCHEMA = StructType(
    [
        StructField("ruleId", LongType(), False),
        StructField("version", IntegerType(), False),
        StructField("ruleState", StringType(), False),
        StructField("rule_json", StringType(), False),
        StructField("signature_id", StringType(), True),
        StructField("applied_at", LongType(), False),
    ]
)


# The rule versions the stream decided with from a micro-batch on (a row when they change;
# of two rows for one batch, the later recorded). The backfill decides each event with
# the versions of its batch (SPEC §3).
RULE_EPOCH_SCHEMA = StructType(
    [
        StructField("from_batch", LongType(), False),
        StructField("recorded_at", LongType(), False),
        StructField("rule_versions", StringType(), False),  # JSON [[ruleId, version], ...]
    ]
)

# The live system's tables (``<data_dir>/tables/<name>``) and their schemas.
LIVE_SCHEMAS: dict[str, StructType] = {
    EVENTS: LIVE_EVENT_SCHEMA,
    QUARANTINE: QUARANTINE_SCHEMA,
    DUPLICATES: EVENT_SCHEMA,
    LATE_EVENTS: LATE_EVENT_SCHEMA,
    BUCKETS: BUCKET_SCHEMA,
    ALERTS: ALERT_SCHEMA,
    SIGNATURES: SIGNATURE_SCHEMA,
    RULES: RULE_SCHEMA,
    BACKFILLS: BACKFILL_SCHEMA,
    RULE_EPOCHS: RULE_EPOCH_SCHEMA,
}


def table_exists(spark: SparkSession, path: Path) -> bool:
    from delta.tables import DeltaTable  # the Delta Python API needs a live session

    return bool(DeltaTable.isDeltaTable(spark, str(path)))


def table_version(spark: SparkSession, path: Path) -> int:
    """The table's current version, read from its log by the JVM (no Spark job: ~10 ms)."""
    jvm: Any = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path))
    defaults = [getattr(log, f"update$default${n}")() for n in (1, 2, 3)]
    return int(log.update(*defaults).version())


def read_table(spark: SparkSession, path: Path) -> DataFrame:
    return spark.read.format("delta").load(str(path))


def table_size(spark: SparkSession, path: Path) -> tuple[int, int]:
    """(bytes, files) of the table's current snapshot, as Delta's own detail reports them."""
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    if detail is None:
        return 0, 0
    return int(detail["sizeInBytes"]), int(detail["numFiles"])


def overwrite_table(df: DataFrame, path: Path) -> None:
    """Replace a table's contents (and schema) in one commit."""
    (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(str(path)))


def create_if_missing(spark: SparkSession, path: Path, schema: StructType) -> None:
    """An empty table with ``schema`` unless one is there already (safe to call repeatedly).

    A table made by an earlier Velocity gets the nullable columns it lacks, so a data dir
    survives an upgrade that adds one (as ``buckets.parts`` was).
    """
    if not table_exists(spark, path):
        spark.createDataFrame([], schema).write.format("delta").mode("append").save(str(path))
        return
    present = set(read_table(spark, path).columns)
    missing = [f for f in schema.fields if f.name not in present and f.nullable]
    if missing:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
