"""Events -> dynamic keys per rule signature -> buckets and complete-data alerts.

The fan-out and the bucket aggregation are plain Spark operations; the decisions are
made by the columnar kernel (``velocity.engine.kernel``) in the executors' Python
workers, after Spark has shuffled the keyed events by (signature, key) and sorted each
partition so that every key's rows are contiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from velocity.delta.tables import (
    ALERT_SCHEMA,
    AMOUNT_TYPE,
    BUCKET_SCHEMA,
    SUM_TYPE,
)
from velocity.domain.rules import Rule, RuleSignature
from velocity.engine.bucketing import bucket_rows
from velocity.engine.cooldown import notify
from velocity.engine.fan_out import keyed_rows
from velocity.engine.kernel import BUCKET_FIGURES, KEYED_COLUMNS, decide_history
from velocity.engine.records import alert_lines, alert_rows
from velocity.spark.fan_out import keyed_table, last_hash_start

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
# An alert's SPEC §4 JSON line, made by Arrow in the executors
# (``velocity.engine.records.alert_lines``).
ALERT_LINE = StructField("line", StringType(), False)
# What an alerts file and a summary's counts need of an alert: its order and its line.
ALERT_LINE_SCHEMA = StructType(
    [
        StructField("eventTime", LongType(), False),
        StructField("ruleId", LongType(), False),
        StructField("ruleVersion", IntegerType(), False),
        StructField("transactionId", StringType(), False),
        StructField("kind", StringType(), False),
        ALERT_LINE,
    ]
)
_ALERT_ARROW = to_arrow_schema(ALERT_SCHEMA)
_KEYED_ARROW = to_arrow_schema(KEYED_SCHEMA)
_LINE_ARROW = to_arrow_schema(ALERT_LINE_SCHEMA)
_BUCKET_ARROW = to_arrow_schema(BUCKET_SCHEMA)


def keyed_events(events: DataFrame, signatures: Iterable[RuleSignature]) -> DataFrame:
    """One row per (event, signature) whose filter the event passes and whose key it has
    (KEYED_SCHEMA), made by the columnar ``velocity.engine.fan_out`` in the executors in
    one pass over the events; ``key`` is ``velocity.domain.rules.key_text``'s text."""
    signatures = list(signatures)
    if not signatures:
        return events.sparkSession.createDataFrame([], KEYED_SCHEMA)
    fields = {
        name
        for s in signatures
        for name in (*s.grouping_keys, *(n for n, _ in s.filter), s.aggregate_field)
        if name
    }
    columns = ["eventTime", "transactionId", *sorted(fields - {"transactionId"})]
    run = partial(_keyed_batches, signatures=signatures)
    return events.select(*columns).mapInArrow(run, KEYED_SCHEMA)


def _keyed_batches(
    batches: Iterator[pa.RecordBatch], signatures: Sequence[RuleSignature]
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield from keyed_rows(pa.Table.from_batches([batch]), signatures, _KEYED_ARROW).to_batches()


HOUR_MS = 3_600_000


def key_partitioned(keyed: DataFrame, partitions: int | None = None) -> DataFrame:
    """Keyed rows (KEYED_COLUMNS) shuffled by (signature, key) into ``partitions`` (None:
    ``spark.sql.shuffle.partitions``) and sorted, so each key's rows are contiguous in
    one partition: the input of ``partition_buckets`` and ``partition_alerts``."""
    keys = ("signature_id", "key")
    if partitions is None:
        shuffled = keyed.repartition(*keys)
    else:
        shuffled = keyed.repartition(partitions, *keys)
    return shuffled.sortWithinPartitions(*keys).select(*KEYED_COLUMNS)


def bucket_aggregates(
    keyed: DataFrame, width_ms: int, distinct_counted: frozenset[str]
) -> DataFrame:
    """Buckets per (signature, key, bucket start), as ``BucketAggregate`` defines them
    (BUCKET_SCHEMA, g-wide rows), keeping distinct values for ``distinct_counted``
    signatures only (``velocity.domain.rules.distinct_counted``)."""
    return partition_buckets(key_partitioned(keyed), width_ms, distinct_counted)


def partition_buckets(
    ordered: DataFrame, width_ms: int, distinct_counted: frozenset[str]
) -> DataFrame:
    """The buckets of ``key_partitioned`` rows, made per partition by the columnar
    ``velocity.engine.bucketing`` in the executors (BUCKET_SCHEMA, g-wide rows)."""
    make = partial(_bucket_batches, width_ms=width_ms, distinct_counted=distinct_counted)
    return ordered.mapInArrow(make, BUCKET_SCHEMA)


def _bucket_batches(
    batches: Iterator[pa.RecordBatch],
    width_ms: int,
    distinct_counted: frozenset[str],
    signature_ids: Sequence[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """One partition's buckets (rows sorted by signature, key; or, given
    ``signature_ids``, ``hash_partitioned`` rows), whole keys at a time."""
    chunks = (
        _whole_keys(batches, KERNEL_CHUNK_ROWS)
        if signature_ids is None
        else keyed_chunks(batches, signature_ids, KERNEL_CHUNK_ROWS)
    )
    for chunk in chunks:
        rows = bucket_rows(chunk, width_ms, distinct_counted)
        yield from bucket_table(rows, width_ms).to_batches()


def bucket_table(rows: pa.Table, width_ms: int) -> pa.Table:
    """g-wide ``bucket_rows`` as rows of the buckets table (BUCKET_SCHEMA)."""
    n = rows.num_rows
    columns = {
        **{name: rows.column(name) for name in rows.column_names},
        "bucket_width_ms": pa.array(np.full(n, width_ms), pa.int64()),
        "parts": pa.nulls(n, _BUCKET_ARROW.field("parts").type),
    }
    return pa.table([columns[name] for name in _BUCKET_ARROW.names], schema=_BUCKET_ARROW)


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


# Keyed rows the kernel decides at a time: a partition's rows arrive sorted by
# (signature, key) and are cut at a key's end once this many have gathered, so a
# partition of any size is decided in bounded memory.
KERNEL_CHUNK_ROWS = 1_000_000


def _alert_batches(
    batches: Iterator[pa.RecordBatch],
    rules: Sequence[Rule],
    width_ms: int,
    decision_time: int,
    schema: pa.Schema,
    chunk_rows: int = KERNEL_CHUNK_ROWS,
    signature_ids: Sequence[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The alerts of one partition's keyed rows (sorted by signature, key; or, given
    ``signature_ids``, ``hash_partitioned`` HASHED_SCHEMA rows): the columnar kernel over
    chunks that each hold whole keys, and so each key's whole cooldown; ``schema``'s
    columns of ALERT_SCHEMA and ALERT_LINE."""
    chunks = (
        _whole_keys(batches, chunk_rows)
        if signature_ids is None
        else keyed_chunks(batches, signature_ids, chunk_rows)
    )
    for chunk in chunks:
        decisions = decide_history(chunk, rules, width_ms)
        by = notify(decisions, chunk, rules).suppressed_by
        alerts = alert_rows(decisions, chunk, rules, decision_time, _ALERT_ARROW, by)
        yield from _with_lines(alerts, schema).to_batches()


def _with_lines(alerts: pa.Table, schema: pa.Schema) -> pa.Table:
    """``schema``'s columns of alert rows, their JSON line among them if it names one."""
    if ALERT_LINE.name in schema.names:
        alerts = alerts.append_column(ALERT_LINE.name, alert_lines(alerts))
    return alerts.select(schema.names).cast(schema)


def alert_line_rows(alerts: DataFrame) -> DataFrame:
    """ALERT_LINE_SCHEMA rows of stored alert rows (ALERT_SCHEMA's columns)."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from _with_lines(pa.Table.from_batches([batch]), _LINE_ARROW).to_batches()

    return alerts.mapInArrow(run, ALERT_LINE_SCHEMA)


def _whole_keys(
    batches: Iterator[pa.RecordBatch],
    chunk_rows: int,
    last_start: Callable[[pa.Table], int] | None = None,
) -> Iterator[pa.Table]:
    """A partition's rows (sorted by signature, key) as tables of whole keys: cut at a
    key's end once ``chunk_rows`` have gathered, so any partition fits in bounded memory.
    ``last_start``: where a chunk's last key (or run of keys that must stay together)
    begins; ``_last_key_start`` when None."""
    last_start = last_start or _last_key_start
    pending: list[pa.RecordBatch] = []
    gathered = 0
    for batch in batches:
        pending.append(batch)
        gathered += batch.num_rows
        if gathered < chunk_rows:
            continue
        chunk = pa.Table.from_batches(pending)
        cut = last_start(chunk)
        if cut == 0:
            continue  # one key so far: keep gathering
        yield chunk.slice(0, cut)
        rest = chunk.slice(cut)
        pending, gathered = rest.to_batches(), rest.num_rows
    if gathered:
        yield pa.Table.from_batches(pending)


def keyed_chunks(
    batches: Iterator[pa.RecordBatch], signature_ids: Sequence[str], chunk_rows: int
) -> Iterator[pa.Table]:
    """A ``hash_partitioned`` partition's rows as kernel tables (``keyed_table``) of whole
    keys: cut where the hash changes once ``chunk_rows`` have gathered, so any partition
    is decided in bounded memory and every key (and every key sharing its hash) whole."""
    for chunk in _whole_keys(batches, chunk_rows, last_hash_start):
        yield keyed_table(chunk, signature_ids)


def _last_key_start(chunk: pa.Table) -> int:
    """Where the chunk's last (signature, key) begins (its rows may go on in the next)."""
    last = chunk.num_rows - 1
    same = pc.and_(
        pc.equal(chunk.column("signature_id"), chunk.column("signature_id")[last]),
        pc.equal(chunk.column("key"), chunk.column("key")[last]),
    )
    return int(pc.index(same, True).as_py())


def evaluate_alerts(
    keyed: DataFrame, rules: Iterable[Rule], width_ms: int, decision_time: int, partitions: int
) -> DataFrame:
    """Complete-data alerts (SPEC §3) of ``rules`` over ``keyed`` events (ALERT_SCHEMA)."""
    rules = list(rules)
    signatures = sorted({rule.signature.signature_id for rule in rules})
    ordered = key_partitioned(keyed.where(F.col("signature_id").isin(signatures)), partitions)
    return partition_alerts(ordered, rules, width_ms, decision_time)


def partition_alerts(
    ordered: DataFrame,
    rules: Sequence[Rule],
    width_ms: int,
    decision_time: int,
    schema: StructType = ALERT_SCHEMA,
    signature_ids: Sequence[str] | None = None,
) -> DataFrame:
    """The alerts of ``key_partitioned`` rows (or, given ``signature_ids``,
    ``hash_partitioned`` HASHED_SCHEMA rows), decided per partition by the columnar
    kernel in the executors (``schema``: columns of ALERT_SCHEMA and ALERT_LINE); rows of
    signatures without a rule decide nothing."""
    run = partial(
        _alert_batches,
        rules=rules,
        width_ms=width_ms,
        decision_time=decision_time,
        schema=to_arrow_schema(schema),
        signature_ids=signature_ids,
    )
    return ordered.mapInArrow(run, schema)


def hashed_alerts(
    ordered: DataFrame,
    signatures: Sequence[RuleSignature],
    rules: Sequence[Rule],
    width_ms: int,
    decision_time: int,
    schema: StructType = ALERT_SCHEMA,
) -> DataFrame:
    """``partition_alerts`` of ``hash_partitioned`` rows (HASHED_SCHEMA, made by
    ``hashed_keyed_events`` for ``signatures``): the same alerts, each partition in one
    Arrow hop from the JVM."""
    ids = [s.signature_id for s in signatures]
    return partition_alerts(ordered, rules, width_ms, decision_time, schema, ids)


def hashed_buckets(
    ordered: DataFrame,
    signatures: Sequence[RuleSignature],
    width_ms: int,
    distinct_counted: frozenset[str],
) -> DataFrame:
    """``partition_buckets`` of ``hash_partitioned`` rows (HASHED_SCHEMA, made by
    ``hashed_keyed_events`` for ``signatures``)."""
    make = partial(
        _bucket_batches,
        width_ms=width_ms,
        distinct_counted=distinct_counted,
        signature_ids=[s.signature_id for s in signatures],
    )
    return ordered.mapInArrow(make, BUCKET_SCHEMA)


def empty_alerts(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], ALERT_SCHEMA)
