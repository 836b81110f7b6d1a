"""Events -> dynamic keys per rule signature -> buckets and complete-data alerts.

The fan-out and the bucket aggregation are plain Spark operations; the per-key
window evaluation runs the pure ``velocity.windows`` engine inside Arrow batches,
one (signature, key) group at a time, after Spark has partitioned and sorted the
keyed events so that each group is contiguous in one partition.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from fractions import Fraction
from functools import partial, reduce
from itertools import groupby
from operator import itemgetter
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from velocity.alerts import ALERT_NAMESPACE, AlertKind, alert_record, rule_key
from velocity.buckets import BucketAggregate, bucket_from_columns
from velocity.decimals import decimal_places, format_decimal
from velocity.delta.tables import ALERT_SCHEMA, AMOUNT_TYPE, BUCKET_PART_TYPE, SUM_TYPE
from velocity.rules import Aggregator, Operator, Rule, RuleSignature, rules_by_signature
from velocity.schema import AMOUNT_DECIMAL_PLACES, NUMERIC_FIELDS
from velocity.spark.ingest import canonical_text, decimal_text
from velocity.windows import (
    Decision,
    KeyedEvent,
    evaluate_key_history,
    evaluate_with_buckets,
    format_aggregate,
)

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


def _merged_figures() -> list[Column]:
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
        .agg(*_merged_figures())
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
        .agg(*_merged_figures(), F.array_sort(F.collect_list(part)).alias("parts"))
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
    keyed: DataFrame,
    rules: Iterable[Rule],
    width_ms: int,
    decision_time: int,
    partitions: int,
    buckets: DataFrame | None = None,
) -> DataFrame:
    """Complete-data alerts (SPEC §3) of ``rules`` over ``keyed`` events (ALERT_SCHEMA).

    Spark expressions decide every rule whose limit they can compare exactly
    (``_sql_exact``); the pure engine decides the others, a key at a time. ``buckets``,
    when given, are ``keyed``'s g-wide buckets (``bucket_aggregates``), already computed.
    """
    rules = list(rules)
    in_sql = [r for r in rules if _sql_exact(r)]
    in_python = [r for r in rules if not _sql_exact(r)]
    parts = []
    if in_sql:
        parts.append(_sql_alerts(keyed, buckets, in_sql, width_ms, decision_time, partitions))
    if in_python:
        parts.append(
            _per_key(
                keyed, in_python, ["eventTime"], _alert_batches, width_ms, decision_time, partitions
            )
        )
    if not parts:
        return empty_alerts(keyed.sparkSession)
    return reduce(DataFrame.unionByName, parts)


# Window sums are added as DECIMAL(37, 8) so that a sum of two stays DECIMAL(38, 8): Spark
# drops scale from a wider result. A window sum above 10^29 fails the job, never rounds.
_WINDOW_SUM = DecimalType(37, 8)
_COUNT_DECIMAL = DecimalType(19, 0)
_AVG_LIMIT = DecimalType(18, 8)


def _sql_exact(rule: Rule) -> bool:
    """True when Spark's decimals compare ``aggregate OP limit`` exactly: a limit with at
    most 8 places and, for AVG (compared as ``total OP limit x count`` in DECIMAL(38, 8)),
    below 10^10; for the others below 10^29."""
    if decimal_places(rule.limit) > AMOUNT_DECIMAL_PLACES:
        return False
    bound = Decimal(10) ** (10 if rule.aggregator is Aggregator.AVG else 29)
    return abs(rule.limit) < bound


# The figures each aggregator reads of a window (``_window_figures``).
_FIGURES_READ = {
    Aggregator.COUNT: ("count",),
    Aggregator.UNIQUE_COUNT: ("values",),
    Aggregator.SUM: ("total",),
    Aggregator.AVG: ("total", "value_count"),
    Aggregator.MIN: ("min",),
    Aggregator.MAX: ("max",),
}


def _sql_alerts(
    keyed: DataFrame,
    buckets: DataFrame | None,
    rules: Sequence[Rule],
    width_ms: int,
    decision_time: int,
    partitions: int,
) -> DataFrame:
    """The alerts of ``rules``, all in Spark expressions, every signature in one plan.

    An event's window ``[own - W, t]`` (``own`` its bucket's start) is the whole buckets in
    ``[own - W, own)`` (a RANGE frame over its key's buckets, so a dense key costs buckets,
    not events) plus its own bucket's events up to ``t`` (a running frame, ties included),
    joined on (signature, key, own bucket). Both sides are hash-partitioned by (signature,
    key) once, so the windows and the join need no further shuffle.
    """
    signatures = {r.signature.signature_id for r in rules}
    # Which signatures read each figure, per window and of the own bucket: a figure is
    # aggregated over its readers' rows only, the others' masked to null.
    readers: dict[int, dict[str, set[str]]] = {}
    own_readers: dict[str, set[str]] = {}
    for rule in rules:
        for name in _FIGURES_READ[rule.aggregator]:
            sid = rule.signature.signature_id
            readers.setdefault(rule.window_ms, {}).setdefault(name, set()).add(sid)
            own_readers.setdefault(name, set()).add(sid)

    def of_readers(column: Column, sigs: set[str]) -> Column:
        if sigs == signatures:
            return column
        return F.when(F.col("signature_id").isin(*sorted(sigs)), column)

    group = ["signature_id", "key"]
    events_by_key = keyed.where(F.col("signature_id").isin(*signatures)).repartition(
        partitions, *group
    )
    bucket_rows = (
        bucket_aggregates(events_by_key, width_ms)
        if buckets is None
        else buckets.where(F.col("signature_id").isin(*signatures)).repartition(partitions, *group)
    )
    # name: (the aggregate over a frame of buckets, what is made of its result)
    whole_figures: dict[str, tuple[Any, Any]] = {
        "count": (lambda c: F.sum(c("event_count")), None),
        "value_count": (lambda c: F.sum(c("value_count")), None),
        "total": (lambda c: F.sum(c("value_sum")), lambda v: v.cast(_WINDOW_SUM)),
        "min": (lambda c: F.min(c("value_min")), None),
        "max": (lambda c: F.max(c("value_max")), None),
        "values": (lambda c: F.collect_list(c("distinct_values")), F.flatten),
    }
    by_time = Window.partitionBy(*group).orderBy("bucket_start")
    whole_columns: list[Column] = []
    for window_ms, wanted in sorted(readers.items()):
        frame = by_time.rangeBetween(-window_ms, -1)
        for name, sigs in sorted(wanted.items()):
            aggregate, finish = whole_figures[name]
            figure = aggregate(partial(lambda c, s: of_readers(F.col(c), s), s=sigs)).over(frame)
            whole_columns.append(
                (finish(figure) if finish else figure).alias(f"w{window_ms}_{name}")
            )
    whole = bucket_rows.select(*group, "bucket_start", *whole_columns)

    # name: (the aggregate over the own bucket's events up to the event, ...)
    own_figures: dict[str, tuple[Any, Any]] = {
        "count": (lambda c: F.count(c(F.lit(1))), None),
        "value_count": (lambda c: F.count(c(F.col("number"))), None),
        "total": (lambda c: F.sum(c(F.col("number"))), lambda v: v.cast(_WINDOW_SUM)),
        "min": (lambda c: F.min(c(F.col("number"))), None),
        "max": (lambda c: F.max(c(F.col("number"))), None),
        "values": (lambda c: F.collect_set(c(F.col("value"))), None),
    }
    running = (
        Window.partitionBy(*group, "bucket_start")
        .orderBy("eventTime")
        .rangeBetween(Window.unboundedPreceding, Window.currentRow)
    )
    own_columns: list[Column] = []
    for name, sigs in sorted(own_readers.items()):
        aggregate, finish = own_figures[name]
        figure = aggregate(partial(of_readers, sigs=sigs)).over(running)
        own_columns.append((finish(figure) if finish else figure).alias(f"own_{name}"))
    start = F.col("eventTime") - F.pmod(F.col("eventTime"), F.lit(width_ms))
    own = events_by_key.withColumn("bucket_start", start).select(
        *group, "bucket_start", "eventTime", "transactionId", *own_columns
    )
    events = own.join(whole, [*group, "bucket_start"])

    fired = []
    for rule in rules:
        window = _window_figures(f"w{rule.window_ms}_", rule.aggregator)
        value, fires = _decision(rule, window)
        is_avg = rule.aggregator is Aggregator.AVG
        fired.append(
            F.when(
                (F.col("signature_id") == rule.signature.signature_id) & fires,
                F.struct(
                    F.lit(rule.rule_id).alias("rule_id"),
                    value.alias("value"),
                    (F.col("bucket_start") - F.lit(rule.window_ms)).alias("window_start"),
                    (window["total"] if is_avg else F.lit(None)).cast(_WINDOW_SUM).alias("total"),
                    (window["value_count"] if is_avg else F.lit(None)).cast("long").alias("n"),
                ),
            )
        )
    decisions = events.select(
        *group,
        "eventTime",
        "transactionId",
        F.explode(F.filter(F.array(*fired), lambda d: d.isNotNull())).alias("d"),
    )
    return _alert_rows(decisions, rules, decision_time)


def _avg_texts(totals: pa.Array, counts: pa.Array) -> pa.Array:
    """AVG's SPEC §4 text, ``total / count`` rounded half-even (``format_aggregate``):
    Spark's decimal division rounds half-up. Null where the total is (every other rule)."""
    return pa.array(
        [
            None if total is None else format_aggregate(Fraction(total) / count)
            for total, count in zip(totals.to_pylist(), counts.to_pylist(), strict=True)
        ],
        type=pa.string(),
    )


def _window_figures(prefix: str, aggregator: Aggregator) -> dict[str, Column]:
    """An event's window figures: its whole buckets' (``prefix``) merged with its own
    bucket's events up to it (``own_``), as ``BucketAggregate.merge`` does."""

    def plus(name: str) -> Column:
        whole, own = F.col(prefix + name), F.col("own_" + name)
        return F.coalesce(whole + own, whole, own)

    match aggregator:
        case Aggregator.COUNT:
            return {"count": F.coalesce(F.col(prefix + "count"), F.lit(0)) + F.col("own_count")}
        case Aggregator.UNIQUE_COUNT:
            return {
                "distinct": F.size(
                    F.array_distinct(F.concat(F.col(prefix + "values"), F.col("own_values")))
                )
            }
        case Aggregator.MIN:
            return {"min": F.least(F.col(prefix + "min"), F.col("own_min"))}
        case Aggregator.MAX:
            return {"max": F.greatest(F.col(prefix + "max"), F.col("own_max"))}
        case Aggregator.SUM:
            return {"total": plus("total")}
        case Aggregator.AVG:
            return {"total": plus("total"), "value_count": plus("value_count")}
    raise AssertionError(aggregator)  # unreachable: match is exhaustive


_SQL_COMPARISONS = {
    Operator.EQUAL: Column.__eq__,
    Operator.NOT_EQUAL: Column.__ne__,
    Operator.GREATER_EQUAL: Column.__ge__,
    Operator.LESS_EQUAL: Column.__le__,
    Operator.GREATER: Column.__gt__,
    Operator.LESS: Column.__lt__,
}


def _decision(rule: Rule, window: Mapping[str, Column]) -> tuple[Column, Column]:
    """(the aggregate as SPEC §4 text, whether ``aggregate OP limit`` holds) for ``rule``;
    AVG's text is left null here and made exact by ``_avg_text``."""
    compare = _SQL_COMPARISONS[rule.operator]
    limit = F.lit(rule.limit)
    if rule.aggregator is Aggregator.AVG:
        total, count = window["total"], window["value_count"]
        bound = F.lit(rule.limit).cast(_AVG_LIMIT) * count.cast(_COUNT_DECIMAL)
        fires = total.isNotNull() & (count > 0) & compare(total, bound)
        return F.lit(None).cast("string"), fires
    (value,) = window.values()
    fires = value.isNotNull() & compare(value, limit)
    if rule.aggregator in (Aggregator.COUNT, Aggregator.UNIQUE_COUNT):
        return value.cast("string"), fires
    return decimal_text(value), fires


_AVG_TEXT = F.arrow_udf(_avg_texts, StringType())  # type: ignore[call-overload]


def _alert_rows(decisions: DataFrame, rules: Sequence[Rule], decision_time: int) -> DataFrame:
    """ALERT_SCHEMA rows of decisions (signature_id, key, eventTime, transactionId and
    ``d``: rule_id, value, window_start, and AVG's total and count)."""
    by_id = {r.rule_id: r for r in rules}

    def per_rule(make: Any) -> Column:
        column = None
        for rule_id, rule in by_id.items():
            branch = make(rule)
            column = (
                F.when(F.col("d.rule_id") == rule_id, branch)
                if column is None
                else column.when(F.col("d.rule_id") == rule_id, branch)
            )
        return column  # type: ignore[return-value]

    key_values = F.from_json(F.col("key"), ArrayType(StringType()))

    def key_map(rule: Rule) -> Column:
        pairs = []
        for name in rule.grouping_keys:
            pairs += [F.lit(name), key_values[rule.signature.grouping_keys.index(name)]]
        return F.create_map(*pairs)

    name = F.concat_ws(
        "|",
        F.col("d.rule_id").cast("string"),
        per_rule(lambda r: F.lit(str(r.version))),
        F.lit(AlertKind.ALERT.value),
        F.col("transactionId"),
    )
    columns = {
        "alertId": uuid5_text(ALERT_NAMESPACE, name),
        "kind": F.lit(AlertKind.ALERT.value),
        "ruleId": F.col("d.rule_id").cast("long"),
        "ruleVersion": per_rule(lambda r: F.lit(r.version)).cast("int"),
        "transactionId": F.col("transactionId"),
        "key": per_rule(key_map),
        "eventTime": F.col("eventTime"),
        "aggregatorFunctionType": per_rule(lambda r: F.lit(r.aggregator.value)),
        "aggregateValue": (
            F.coalesce(F.col("d.value"), _AVG_TEXT(F.col("d.total"), F.col("d.n")))
            if any(r.aggregator is Aggregator.AVG for r in rules)
            else F.col("d.value")
        ),
        "limitOperatorType": per_rule(lambda r: F.lit(r.operator.value)),
        "limit": per_rule(lambda r: F.lit(format_decimal(r.limit))),
        "windowStart": F.col("d.window_start"),
        "windowEnd": F.col("eventTime"),
        "decisionTime": F.lit(decision_time).cast("long"),
        "signature_id": F.col("signature_id"),
    }
    return decisions.select(*[columns[n].alias(n) for n in ALERT_SCHEMA.fieldNames()])


def uuid5_text(namespace: uuid.UUID, name: Column) -> Column:
    """``str(uuid.uuid5(namespace, name))`` as a Spark expression (RFC 4122 §4.3: SHA-1
    of the namespace and the name's UTF-8, version 5, variant 10)."""
    digest = F.sha1(F.concat(F.unhex(F.lit(namespace.hex)), F.encode(name, "UTF-8")))
    variant = F.lower(
        F.hex(F.conv(F.substring(digest, 17, 1), 16, 10).cast("int").bitwiseAND(3).bitwiseOR(8))
    )
    return F.concat_ws(
        "-",
        F.substring(digest, 1, 8),
        F.substring(digest, 9, 4),
        F.concat(F.lit("5"), F.substring(digest, 14, 3)),
        F.concat(variant, F.substring(digest, 18, 3)),
        F.substring(digest, 21, 12),
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
