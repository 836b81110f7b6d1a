"""Lines of JSON text -> validated events, quarantined lines and dropped duplicates.

Validation runs the pure ``velocity.schema`` parser inside Arrow batches, so the
stream, the backtest and the tests share one definition of a bad event.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from velocity.decimals import EXACT
from velocity.delta.tables import EVENT_SCHEMA, PARSED_SCHEMA, QUARANTINE_SCHEMA
from velocity.schema import EVENT_FIELDS, FieldKind, Rejection, is_blank, parse_event_line

ARRIVAL_ORDER = ("source_file", "source_block", "line_seq")
_EVENT_COLUMNS = [f.name for f in EVENT_FIELDS]
_ARROW_SCHEMA = to_arrow_schema(PARSED_SCHEMA)
_AMOUNT_QUANTUM = Decimal("1e-8")


def read_event_lines(spark: SparkSession, path: str) -> DataFrame:
    """Every line of a JSON-lines file or folder, with the file and block it came from."""
    return (
        spark.read.option("recursiveFileLookup", "true")
        .text(path)
        .select(
            F.col("value").alias("raw"),
            F.col("_metadata.file_path").alias("source_file"),
            F.col("_metadata.file_block_start").alias("source_block"),
        )
    )


def _parse_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    # line_seq counts lines within this partition: with (file, block) it orders lines as they
    # arrived, because one partition reads each block's lines in order.
    seq = 0
    ingest_time = int(time.time() * 1000)
    for batch in batches:
        columns: dict[str, list[object]] = {name: [] for name in _ARROW_SCHEMA.names}
        raws = batch.column("raw").to_pylist()
        files = batch.column("source_file").to_pylist()
        blocks = batch.column("source_block").to_pylist()
        for raw, source_file, block in zip(raws, files, blocks, strict=True):
            if raw is None or is_blank(raw):
                continue
            seq += 1
            parsed = parse_event_line(raw)
            row: dict[str, object] = dict.fromkeys(_EVENT_COLUMNS)
            if isinstance(parsed, Rejection):
                row.update(accepted=False, reason_code=parsed.code.value, reason=parsed.message)
            else:
                row.update(parsed.values)
                row.update(
                    accepted=True,
                    reason_code=None,
                    reason=None,
                    eventTime=parsed.event_time,
                    paymentAmount=parsed.amount.quantize(_AMOUNT_QUANTUM, context=EXACT),
                )
            row.update(
                raw=raw,
                source_file=source_file,
                source_block=block,
                line_seq=seq,
                ingest_time=ingest_time,
            )
            for name, values in columns.items():
                values.append(row[name])
        yield pa.RecordBatch.from_pydict(columns, schema=_ARROW_SCHEMA)


def parse_events(lines: DataFrame) -> DataFrame:
    """Validate each line: ``accepted`` rows carry the event, the others a reason."""
    return lines.mapInArrow(_parse_batches, PARSED_SCHEMA)


@dataclass(frozen=True)
class Ingested:
    events: DataFrame  # accepted, first arrival of each transactionId (EVENT_SCHEMA)
    quarantine: DataFrame  # QUARANTINE_SCHEMA
    duplicates: DataFrame  # EVENT_SCHEMA: accepted lines whose transactionId came earlier


def arrival_order() -> list[Column]:
    return [F.col(c) for c in ARRIVAL_ORDER]


def split_parsed(parsed: DataFrame) -> Ingested:
    """Quarantine the rejected lines and keep the first arrival of each transactionId."""
    quarantine = parsed.where(~F.col("accepted")).select(*QUARANTINE_SCHEMA.fieldNames())
    accepted = parsed.where(F.col("accepted")).select(*EVENT_SCHEMA.fieldNames())
    ranked = accepted.withColumn(
        "_arrival_rank",
        F.row_number().over(Window.partitionBy("transactionId").orderBy(*arrival_order())),
    )
    first = ranked.where(F.col("_arrival_rank") == 1).drop("_arrival_rank")
    later = ranked.where(F.col("_arrival_rank") > 1).drop("_arrival_rank")
    return Ingested(first, quarantine, later)


def canonical_text(column: str) -> Column:
    """The canonical string of an event column, as ``velocity.schema.canonical_value`` gives it.

    Amounts are stored as DECIMAL(26,8); their canonical text drops trailing zeros.
    """
    kind = {f.name: f.kind for f in EVENT_FIELDS}[column]
    if kind is FieldKind.AMOUNT:
        text = F.col(column).cast("string")
        stripped = F.regexp_replace(F.regexp_replace(text, "0+$", ""), r"\.$", "")
        return F.when(stripped == "", F.lit("0")).otherwise(stripped)
    return F.col(column)
