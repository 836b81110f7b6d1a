"""Events -> dynamic keys per rule signature -> buckets and complete-data alerts.

The fan-out and the bucket aggregation are plain Spark operations; the per-key
window evaluation runs the pure ``velocity.windows`` engine inside Arrow batches,
one (signature, key) group at a time, after Spark has partitioned and sorted the
keyed events so that each group is contiguous in one partition.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial, reduce
from itertools import groupby
from operator import itemgetter
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from velocity.alerts import AlertKind, alert_record, rule_key
from velocity.buckets import BucketAggregate, bucket_from_columns
from velocity.delta.tables import ALERT_SCHEMA, AMOUNT_TYPE, BUCKET_PART_TYPE, SUM_TYPE
from velocity.rules import Rule, RuleSignature, rules_by_signature
from velocity.schema import NUMERIC_FIELDS
from velocity.spark.ingest import canonical_text
from velocity.windows import Decision, KeyedEvent, evaluate_key_history, evaluate_with_buckets

KEYED_SCHEMA = StructType(
    [
        StructField("signature_id", StringType(), False),
        StructField("key", StringType(), False),
        StructField("eventTime", LongType(), False),
        StructField("transactionId", StringType(), False),
        StructField("value", StringType(), True),
        StructField("number", AMOUNT_TYPE, True),
    ]
)
_ALERT_ARROW = to_arrow_schema(ALERT_SCHEMA)


def keyed_events(events: DataFrame, signatures: Iterable[RuleSignature]) -> DataFrame:
    """One row per (event, signature) whose filter the event passes and whose key it has.

    ``key`` is the JSON array of the key's canonical values in the signature's field
    order, the same text as ``velocity.rules.key_text``.
    """
    parts = []
    for signature in signatures:
        condition = F.lit(True)
        for name, allowed in signature.filter:
            condition = condition & canonical_text(name).isin(list(allowed))
        for name in signature.grouping_keys:
            condition = condition & F.col(name).isNotNull()
        key = (
            F.to_json(F.array(*[F.col(n) for n in signature.grouping_keys]))
            if signature.grouping_keys
            else F.lit("[]")
        )
        field = signature.aggregate_field
        value = canonical_text(field) if field else F.lit(None).cast("string")
        number = (
            F.col(field).cast(AMOUNT_TYPE)
            if field in NUMERIC_FIELDS
            else F.lit(None).cast(AMOUNT_TYPE)
        )
        parts.append(
            events.where(condition).select(
                F.lit(signature.signature_id).alias("signature_id"),
                key.alias("key"),
                F.col("eventTime"),
                F.col("transactionId"),
                value.alias("value"),
                number.alias("number"),
            )
        )
    if not parts:
        return events.sparkSession.createDataFrame([], KEYED_SCHEMA)
    return reduce(DataFrame.unionByName, parts)


BUCKET_FIGURES = (
    "event_count",
    "value_count",
    "value_sum",
    "value_min",
    "value_max",
    "distinct_values",
)
HOUR_MS = 3_600_000


def bucket_aggregates(keyed: DataFrame, width_ms: int) -> DataFrame:
    """Buckets per (signature, key, bucket start), as ``BucketAggregate`` defines them."""
    start = F.col("eventTime") - F.pmod(F.col("eventTime"), F.lit(width_ms))
    return (
        keyed.groupBy("signature_id", "key", start.alias("bucket_start"))
        .agg(
            F.count(F.lit(1)).alias("event_count"),
            F.count("value").alias("value_count"),
            F.sum("number").cast(SUM_TYPE).alias("value_sum"),
            F.min("number").alias("value_min"),
            F.max("number").alias("value_max"),
            F.array_sort(F.collect_set("value")).alias("distinct_values"),
        )
        .select(
            "signature_id",
            "key",
            "bucket_start",
            F.lit(width_ms).cast("long").alias("bucket_width_ms"),
            *BUCKET_FIGURES,
            F.lit(None).cast(ArrayType(BUCKET_PART_TYPE, True)).alias("parts"),
        )
    )


def merged_figures() -> list[Column]:
    """Aggregations that merge bucket rows as ``BucketAggregate.merge`` does."""
    return [
        F.sum("event_count").cast("long").alias("event_count"),
        F.sum("value_count").cast("long").alias("value_count"),
        F.sum("value_sum").cast(SUM_TYPE).alias("value_sum"),
        F.min("value_min").alias("value_min"),
        F.max("value_max").alias("value_max"),
        F.array_sort(F.array_distinct(F.flatten(F.collect_list("distinct_values")))).alias(
            "distinct_values"
        ),
    ]


def minute_buckets(buckets: DataFrame, width_ms: int) -> DataFrame:
    """The buckets table as g-wide buckets only: compacted hours expanded into their parts,
    and a part and a later g-wide row of the same bucket merged into one.

    Every reader that needs window edges (evaluation, the Redis mirror, reconcile, data
    quality) reads through this, so compaction never changes what it sees.
    """
    plain = buckets.where(F.col("parts").isNull()).select(
        "signature_id", "key", "bucket_start", *BUCKET_FIGURES
    )
    expanded = (
        buckets.where(F.col("parts").isNotNull())
        .select("signature_id", "key", F.explode("parts").alias("part"))
        .select("signature_id", "key", "part.*")
    )
    return (
        plain.unionByName(expanded)
        .groupBy("signature_id", "key", "bucket_start")
        .agg(*merged_figures())
        .select(
            "signature_id",
            "key",
            "bucket_start",
            F.lit(width_ms).cast("long").alias("bucket_width_ms"),
            *BUCKET_FIGURES,
        )
    )


def hour_buckets(minutes: DataFrame, width_ms: int) -> DataFrame:
    """Compacted rows (BUCKET_SCHEMA) of g-wide buckets (``minute_buckets``' shape): per
    (signature, key, hour) with two or more g-wide buckets, the hour's merged figures plus
    its g-wide buckets, sorted by start, as ``parts``; an hour with a single g-wide bucket
    stays that bucket (an hour row would only repeat its figures)."""
    hour = F.col("bucket_start") - F.pmod(F.col("bucket_start"), F.lit(HOUR_MS))
    part = F.struct(F.col("bucket_start"), *[F.col(n) for n in BUCKET_FIGURES])
    single = F.size("parts") == 1
    return (
        minutes.groupBy("signature_id", "key", hour.alias("hour_start"))
        .agg(*merged_figures(), F.array_sort(F.collect_list(part)).alias("parts"))
        .select(
            "signature_id",
            "key",
            F.when(single, F.col("parts")[0]["bucket_start"])
            .otherwise(F.col("hour_start"))
            .alias("bucket_start"),
            F.when(single, F.lit(width_ms))
            .otherwise(F.lit(HOUR_MS))
            .cast("long")
            .alias("bucket_width_ms"),
            *BUCKET_FIGURES,
            F.when(single, F.lit(None)).otherwise(F.col("parts")).alias("parts"),
        )
    )


def _alert_row(
    decision: Decision, signature_id: str, key_values: Sequence[str], decision_time: int
) -> dict[str, Any]:
    """An ALERT_SCHEMA row (key as key/value pairs, for Arrow's map type)."""
    record = alert_record(
        decision, rule_key(decision.rule, key_values), decision_time, AlertKind.ALERT
    )
    record["signature_id"] = signature_id
    record["key"] = list(record["key"].items())
    return record


def _alert_batches(
    batches: Iterator[pa.RecordBatch],
    rules: Mapping[str, Sequence[Rule]],
    width_ms: int,
    decision_time: int,
    batch_rows: int = 4096,
) -> Iterator[pa.RecordBatch]:
    def rows() -> Iterator[tuple[str, str, int, str, object, object]]:
        for batch in batches:
            yield from zip(
                *(batch.column(name).to_pylist() for name in KEYED_SCHEMA.fieldNames()),
                strict=True,
            )

    out: list[dict[str, object]] = []
    for (signature_id, key), group in groupby(rows(), key=itemgetter(0, 1)):
        events = [KeyedEvent(t, tx, value, number) for _, _, t, tx, value, number in group]  # type: ignore[arg-type]
        key_values = json.loads(key)
        for decision in evaluate_key_history(events, rules[signature_id], width_ms):
            out.append(_alert_row(decision, signature_id, key_values, decision_time))
            if len(out) >= batch_rows:
                yield pa.RecordBatch.from_pylist(out, schema=_ALERT_ARROW)
                out = []
    if out:
        yield pa.RecordBatch.from_pylist(out, schema=_ALERT_ARROW)


def _per_key(
    rows: DataFrame,
    rules: Iterable[Rule],
    order: Sequence[str],
    evaluate: Any,
    width_ms: int,
    decision_time: int,
    partitions: int,
) -> DataFrame:
    """Run ``evaluate`` over ``rows`` with each (signature, key) contiguous in one partition,
    sorted by ``order`` after the key; rows of signatures without a rule are dropped."""
    grouped = {sig.signature_id: group for sig, group in rules_by_signature(rules).items()}
    ordered = (
        rows.where(F.col("signature_id").isin(list(grouped)))
        .repartition(partitions, "signature_id", "key")
        .sortWithinPartitions("signature_id", "key", *order)
    )
    run = partial(evaluate, rules=grouped, width_ms=width_ms, decision_time=decision_time)
    return ordered.mapInArrow(run, ALERT_SCHEMA)


def evaluate_alerts(
    keyed: DataFrame, rules: Iterable[Rule], width_ms: int, decision_time: int, partitions: int
) -> DataFrame:
    """Complete-data alerts (SPEC §3) of ``rules`` over ``keyed`` events (ALERT_SCHEMA)."""
    return _per_key(
        keyed, rules, ["eventTime"], _alert_batches, width_ms, decision_time, partitions
    )


def empty_alerts(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], ALERT_SCHEMA)


# --- the stream's evaluation: stored buckets + the own buckets' raw events ---------------

# One row per input of a (signature, key) group: a stored bucket ("B"), a raw event of a
# target's own bucket ("E") or a target to decide ("T", also present as an "E" row).
STATE_ROW_SCHEMA = StructType(
    [
        StructField("signature_id", StringType(), False),
        StructField("key", StringType(), False),
        StructField("row_kind", StringType(), False),
        StructField("time", LongType(), False),
        StructField("transactionId", StringType(), True),
        StructField("value", StringType(), True),
        StructField("number", AMOUNT_TYPE, True),
        StructField("event_count", LongType(), True),
        StructField("value_count", LongType(), True),
        StructField("value_sum", SUM_TYPE, True),
        StructField("value_min", AMOUNT_TYPE, True),
        StructField("value_max", AMOUNT_TYPE, True),
        StructField("distinct_values", ArrayType(StringType(), False), True),
    ]
)


def state_rows(buckets: DataFrame, own_events: DataFrame, targets: DataFrame) -> DataFrame:
    """The union of stored buckets, own-bucket raw events and targets, as STATE_ROW_SCHEMA."""
    null = {
        name: F.lit(None).cast(STATE_ROW_SCHEMA[name].dataType)
        for name in STATE_ROW_SCHEMA.fieldNames()
    }

    def shaped(df: DataFrame, kind: str, columns: Mapping[str, Column]) -> DataFrame:
        exprs = {**null, **columns, "row_kind": F.lit(kind)}
        return df.select(*[exprs[n].alias(n) for n in STATE_ROW_SCHEMA.fieldNames()])

    event_columns = {
        "signature_id": F.col("signature_id"),
        "key": F.col("key"),
        "time": F.col("eventTime"),
        "transactionId": F.col("transactionId"),
        "value": F.col("value"),
        "number": F.col("number"),
    }
    bucket_columns = {name: F.col(name) for name in ("signature_id", "key", *BUCKET_FIGURES)}
    return (
        shaped(buckets, "B", {**bucket_columns, "time": F.col("bucket_start")})
        .unionByName(shaped(own_events, "E", event_columns))
        .unionByName(shaped(targets, "T", event_columns))
    )


def _state_alert_batches(
    batches: Iterator[pa.RecordBatch],
    rules: Mapping[str, Sequence[Rule]],
    width_ms: int,
    decision_time: int,
) -> Iterator[pa.RecordBatch]:
    def rows() -> Iterator[dict[str, Any]]:
        for batch in batches:
            yield from batch.to_pylist()

    out: list[dict[str, Any]] = []
    for (signature_id, key), group in groupby(rows(), key=itemgetter("signature_id", "key")):
        buckets: dict[int, BucketAggregate] = {}
        own: list[KeyedEvent] = []
        targets: list[KeyedEvent] = []
        for row in group:
            if row["row_kind"] == "B":
                buckets[row["time"]] = bucket_from_columns(row)
                continue
            event = KeyedEvent(row["time"], row["transactionId"], row["value"], row["number"])
            (own if row["row_kind"] == "E" else targets).append(event)
        key_values = json.loads(key)
        for decision in evaluate_with_buckets(buckets, own, targets, rules[signature_id], width_ms):
            out.append(_alert_row(decision, signature_id, key_values, decision_time))
    if out:
        yield pa.RecordBatch.from_pylist(out, schema=_ALERT_ARROW)


def evaluate_from_state(
    rows: DataFrame, rules: Iterable[Rule], width_ms: int, decision_time: int, partitions: int
) -> DataFrame:
    """Alerts of the "T" rows of ``rows`` (STATE_ROW_SCHEMA) under ``rules`` (ALERT_SCHEMA)."""
    return _per_key(rows, rules, [], _state_alert_batches, width_ms, decision_time, partitions)
