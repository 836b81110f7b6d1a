"""Lines of JSON text -> validated events, quarantined lines and dropped duplicates.

Validation runs the pure ``velocity.schema`` parser in an Arrow UDF, so the
stream, the backtest and the tests share one definition of a bad event.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from velocity.arrival import Arrivals, Verdict
from velocity.decimals import EXACT
from velocity.delta.tables import AMOUNT_TYPE, EVENT_SCHEMA, PARSED_SCHEMA, QUARANTINE_SCHEMA
from velocity.schema import (
    EVENT_FIELDS,
    FIELDS_BY_NAME,
    MAX_EVENT_TIME,
    FieldKind,
    Rejection,
    is_blank,
    parse_event_line,
)

ARRIVAL_ORDER = ("source_file", "source_block", "line_seq")
_EVENT_COLUMNS = [f.name for f in EVENT_FIELDS]
# What the parser returns per line; the raw text and its source stay in the JVM.
_VERDICT_FIELDS = [
    f
    for f in PARSED_SCHEMA.fields
    if f.name not in ("raw", "source_file", "source_block", "line_seq", "ingest_time")
]
VERDICT_TYPE = StructType([StructField("blank", BooleanType(), False), *_VERDICT_FIELDS])
_VERDICT_ARROW = to_arrow_schema(VERDICT_TYPE)
_VERDICT_ARROW_STRUCT = pa.struct(list(_VERDICT_ARROW))
_AMOUNT_QUANTUM = Decimal("1e-8")


def read_event_lines(spark: SparkSession, path: str) -> DataFrame:
    """Every line of a JSON-lines file or folder, with where it came from.

    (source_file, source_block, line_seq) orders lines by arrival: a partition reads
    each block's lines in order, and ``monotonically_increasing_id`` grows with the
    row's position in its partition.
    """
    text = spark.read.option("recursiveFileLookup", "true").text(path)
    return with_line_order(with_line_source(text))


def with_line_source(text: DataFrame) -> DataFrame:
    """A text source's lines as ``raw`` with the file and block they came from."""
    return text.select(
        F.col("value").alias("raw"),
        F.col("_metadata.file_path").alias("source_file"),
        F.col("_metadata.file_block_start").alias("source_block"),
    )


def kafka_messages(messages: DataFrame) -> DataFrame:
    """A Kafka source's messages as lines: ``raw`` is the value as text ("" for a message
    without one, which the parser then quarantines), ``source_file`` names the topic and
    partition (``kafka://<topic>/<partition>``) and ``source_block`` is the offset, so a
    quarantined message says where it is and the arrival order is (partition, offset)."""
    return messages.select(
        F.coalesce(F.col("value").cast("string"), F.lit("")).alias("raw"),
        F.concat(
            F.lit("kafka://"), F.col("topic"), F.lit("/"), F.col("partition").cast("string")
        ).alias("source_file"),
        F.col("offset").alias("source_block"),
    )


def with_line_order(lines: DataFrame) -> DataFrame:
    """Adds ``line_seq``, the line's position in its partition (not on a streaming frame)."""
    return lines.withColumn("line_seq", F.monotonically_increasing_id())


def line_texts(raws: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """A text column's lines as str. Spark's text source passes the file's bytes through
    unchecked; bytes that are not UTF-8 become U+FFFD, so such a line is judged (and kept)
    as text instead of failing the whole batch."""
    try:
        return raws.to_pylist()
    except UnicodeDecodeError:
        as_bytes: list[bytes | None] = raws.cast(pa.binary()).to_pylist()
        return [None if b is None else b.decode("utf-8", errors="replace") for b in as_bytes]


def verdicts(raws: pa.Array) -> pa.Array:
    """The pure parser over a batch of lines: one verdict struct per line, in order; a
    null line (one the JVM already accepted) gets a null verdict without a Python step."""
    present = pc.is_valid(raws)
    if not pc.any(present).as_py():
        return pa.nulls(len(raws), type=_VERDICT_ARROW_STRUCT)
    positions = pc.indices_nonzero(present).to_pylist()
    columns: dict[str, list[object]] = {name: [] for name in _VERDICT_ARROW.names}
    rejected = dict.fromkeys(_EVENT_COLUMNS)
    for raw in line_texts(raws.filter(present)):
        if raw is None or is_blank(raw):
            row: dict[str, object] = {**rejected, "blank": True, "accepted": False}
        else:
            parsed = parse_event_line(raw)
            if isinstance(parsed, Rejection):
                row = {
                    **rejected,
                    "blank": False,
                    "accepted": False,
                    "reason_code": parsed.code.value,
                    "reason": parsed.message,
                }
            else:
                row = {
                    **parsed.values,
                    "blank": False,
                    "accepted": True,
                    "reason_code": None,
                    "reason": None,
                    "eventTime": parsed.event_time,
                    "paymentAmount": parsed.amount.quantize(_AMOUNT_QUANTUM, context=EXACT),
                }
        for name, values in columns.items():
            values.append(row.get(name))
    judged = pa.StructArray.from_arrays(
        [pa.array(columns[f.name], type=f.type) for f in _VERDICT_ARROW],
        fields=list(_VERDICT_ARROW),
    )
    if len(positions) == len(raws):
        return judged
    # Scatter the judged lines back to their places; the rest stay null.
    take: list[int | None] = [None] * len(raws)
    for judged_index, position in enumerate(positions):
        take[position] = judged_index
    slots = pa.array(take, type=pa.int64())
    return judged.take(slots)


# --- the JVM's share of parsing --------------------------------------------------------
#
# Most lines are plain: one flat JSON object, no escapes, no control characters, fields
# of the declared types. The JVM accepts those by itself (``from_json``); every other line,
# and every line it would reject, goes to the pure parser, which stays the one definition
# of a bad event. So the JVM only ever *accepts*, and only what the pure parser accepts,
# with the same values; tests/spark/test_ingest.py holds it to that on hostile lines.

_WS = r"[ \t\r]*"
# Escapes and control characters are the pure parser's: JSON forbids raw control
# characters, and an escape may spell a lone surrogate, which is no text.
_ESCAPES = r"[\x00-\x1f\\]"
# The JVM's text of a literal, an object, an array or a non-finite number (quoted) where a
# string belongs (the pure parser rejects those), and of a number with a fraction or an
# exponent (the JVM passes it through a double, the pure parser keeps the Decimal's own
# text). A string that merely looks like one goes to the pure parser too, which costs
# time, never correctness.
_TOKEN_TEXT = r'^(?:true|false|[{\["])'
_DOUBLE_TEXT = r"^-?[0-9]+[.eE]"
# The amount's own text, after its last key and up to the next comma: a plain decimal in
# range with at most 8 places, as a number or a string.
_AMOUNT_TEXT = rf'^{_WS}:{_WS}("?)([0-9]{{1,18}}(?:\.[0-9]{{1,8}})?)\1{_WS}}}?{_WS}$'
# Python's str.strip() whitespace (every such character is below U+3001), as a Java
# character class: a line of only these is blank, a value of only these is missing
# (``velocity.schema``).
_PY_SPACE = "".join(f"\\u{c:04x}" for c in range(0x3001) if chr(c).isspace())
_BLANK = f"^[{_PY_SPACE}]*$"
_HAS_TEXT = f"[^{_PY_SPACE}]"
_JSON_FIELDS = StructType(
    [
        *(
            StructField(f.name, LongType() if f.kind is FieldKind.TIME else StringType())
            for f in EVENT_FIELDS
        ),
        StructField("_corrupt", StringType()),
    ]
)
_JSON_OPTIONS = {
    "columnNameOfCorruptRecord": "_corrupt",
    "allowSingleQuotes": "false",
    "allowNonNumericNumbers": "false",
}


def _present_text(column: Column) -> Column:
    return column.isNotNull() & column.rlike(_HAS_TEXT)


def with_plain_events(lines: DataFrame) -> DataFrame:
    """``lines`` plus ``_plain``: the accepted event of a plain line as a verdict struct
    (VERDICT_TYPE), or null when the line is not plain or the pure parser must judge it.

    The JSON and the amount's text are read once per line, in a projection of their own:
    inside the conditions below Spark would parse them again at every reference.
    Everything here scans a line at most once; the checks read the short field values.
    """
    raw = F.col("raw")
    after_amount = F.substring_index(F.substring_index(raw, '"paymentAmount"', -1), ",", 1)
    read = lines.select(
        "*",
        F.from_json(raw, _JSON_FIELDS, _JSON_OPTIONS).alias("_json"),
        F.regexp_extract(after_amount, _AMOUNT_TEXT, 2).try_cast(AMOUNT_TYPE).alias("_amount"),
        (
            F.is_valid_utf8(raw)
            & F.ltrim(raw).startswith("{")
            # One flat object and nothing after it (from_json ignores trailing text): its
            # first closing brace is its last character.
            & (F.instr(raw, "}") == F.length(F.rtrim(raw)))
            & ~raw.rlike(_ESCAPES)
        ).alias("_flat"),
    )
    fields, amount = F.col("_json"), F.col("_amount")
    plain = (
        F.col("_flat")
        & fields["_corrupt"].isNull()
        # The amount the JVM parsed is the one whose text was read (not an earlier duplicate key).
        & (fields["paymentAmount"].try_cast(DecimalType(38, 18)) == amount)
        & fields["eventTime"].between(0, MAX_EVENT_TIME - 1)
        & fields["paymentType"].isin(*sorted(FIELDS_BY_NAME["paymentType"].allowed))
    )
    values: dict[str, Column] = {}
    for spec in EVENT_FIELDS:
        value = fields[spec.name]
        if spec.kind in (FieldKind.KEY, FieldKind.IDENTITY):
            plain = plain & (value.isNull() | ~value.rlike(_TOKEN_TEXT))
            plain = plain & (value.isNull() | ~value.rlike(_DOUBLE_TEXT))
            if spec.required:
                plain = plain & _present_text(value)
            else:
                # Absent or "" is no value; only-whitespace is left to the pure parser.
                plain = plain & (value.isNull() | (value == "") | value.rlike(_HAS_TEXT))
                value = F.when(value != "", value)
        values[spec.name] = value
    values["paymentAmount"] = amount
    verdict = {
        **{name: F.lit(None) for name in VERDICT_TYPE.fieldNames()},
        **values,
        "blank": F.lit(False),
        "accepted": F.lit(True),
    }
    event = F.struct(*[verdict[f.name].cast(f.dataType).alias(f.name) for f in VERDICT_TYPE.fields])
    return read.withColumn("_plain", F.when(plain, event)).drop("_json", "_amount", "_flat")


def parse_events(lines: DataFrame) -> DataFrame:
    """Validate each line (blank ones dropped): ``accepted`` rows carry the event, others a reason.

    Plain lines are accepted in the JVM (``with_plain_events``); the rest go to the pure parser.
    Output columns are ``PARSED_SCHEMA``'s.
    """
    parse = F.arrow_udf(verdicts, VERDICT_TYPE)  # type: ignore[call-overload]
    # Blank lines leave before parsing: a filter on the verdict would be pushed below the
    # projections with every expression of the parse inlined into it, parsing twice.
    present = lines.where(~F.col("raw").rlike(_BLANK))
    judged = with_plain_events(present).withColumn(
        "_verdict",
        F.coalesce(F.col("_plain"), parse(F.when(F.col("_plain").isNull(), F.col("raw")))),
    )
    return judged.select(
        *[
            F.col(f"_verdict.{f.name}").alias(f.name)
            if f.name in VERDICT_TYPE.fieldNames()
            else F.col(f.name)
            for f in PARSED_SCHEMA.fields
            if f.name != "ingest_time"
        ],
        F.unix_millis(F.current_timestamp()).alias("ingest_time"),
    )


@dataclass(frozen=True)
class Ingested:
    events: DataFrame  # accepted, first arrival of each transactionId (EVENT_SCHEMA)
    quarantine: DataFrame  # QUARANTINE_SCHEMA
    duplicates: DataFrame  # EVENT_SCHEMA: accepted lines whose transactionId came earlier


def arrival_order() -> list[Column]:
    return [F.col(c) for c in ARRIVAL_ORDER]


def split_parsed(parsed: DataFrame, max_future_ms: int) -> Ingested:
    """Quarantine the rejected lines and the events far in the future, keep the first
    arrival of each transactionId (``velocity.arrival``, one pass in arrival order)."""
    accepted = parsed.where(F.col("accepted")).select(*EVENT_SCHEMA.fieldNames())
    # Only the lines not accepted come back from the pass: few, so broadcast.
    others = F.broadcast(arrival_verdicts(accepted, max_future_ms))
    verdicts = accepted.join(others, list(ARRIVAL_ORDER), "left")
    first = verdicts.where(F.col("_verdict").isNull()).select(*EVENT_SCHEMA.fieldNames())
    later = verdicts.where(F.col("_verdict") == Verdict.DUPLICATE.value).select(
        *EVENT_SCHEMA.fieldNames()
    )
    future = verdicts.where(F.col("_verdict") == Verdict.FUTURE.value).select(
        *[
            F.col(f"_{name}").alias(name) if name in ("reason_code", "reason") else F.col(name)
            for name in QUARANTINE_SCHEMA.fieldNames()
        ]
    )
    quarantine = parsed.where(~F.col("accepted")).select(*QUARANTINE_SCHEMA.fieldNames())
    return Ingested(first, quarantine.unionByName(future), later)


_VERDICT_ROWS = StructType(
    [
        *(f for f in PARSED_SCHEMA.fields if f.name in ARRIVAL_ORDER),
        StructField("_verdict", StringType(), False),
        StructField("_reason_code", StringType(), True),
        StructField("_reason", StringType(), True),
    ]
)


def arrival_verdicts(accepted: DataFrame, max_future_ms: int) -> DataFrame:
    """The valid lines that are not accepted (duplicates and far-future events), by their
    arrival position, with the verdict and, for quarantine, the reason.

    Admission is sequential (whether an event is too far ahead depends on the events
    accepted before it), so it runs as one pass over the lines in arrival order: one
    partition, sorted, scanning only (transactionId, eventTime).
    """
    order = list(ARRIVAL_ORDER)
    lines = (
        accepted.select(*order, "transactionId", "eventTime")
        .repartition(1)
        .sortWithinPartitions(*order)
    )
    schema = to_arrow_schema(_VERDICT_ROWS)

    def scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        arrivals = Arrivals((), None, max_future_ms)
        for batch in batches:
            out: dict[str, list[object]] = {name: [] for name in schema.names}
            positions = zip(*(batch.column(name).to_pylist() for name in order), strict=True)
            ids = batch.column("transactionId").to_pylist()
            times = batch.column("eventTime").to_pylist()
            for position, transaction_id, event_time in zip(positions, ids, times, strict=True):
                verdict = arrivals.admit(transaction_id, event_time)
                if verdict is Verdict.ACCEPTED:
                    continue
                why = arrivals.future_rejection(event_time) if verdict is Verdict.FUTURE else None
                for name, value in zip(order, position, strict=True):
                    out[name].append(value)
                out["_verdict"].append(verdict.value)
                out["_reason_code"].append(None if why is None else why.code.value)
                out["_reason"].append(None if why is None else why.message)
            yield pa.RecordBatch.from_pydict(out, schema=schema)

    return lines.mapInArrow(scan, _VERDICT_ROWS)  # type: ignore[arg-type]


def canonical_text(column: str) -> Column:
    """The canonical string of an event column, as ``velocity.schema.canonical_value`` gives it.

    Amounts are stored as DECIMAL(26,8); their canonical text drops trailing zeros.
    """
    kind = {f.name: f.kind for f in EVENT_FIELDS}[column]
    if kind is FieldKind.AMOUNT:
        return decimal_text(F.col(column))
    return F.col(column)


def decimal_text(value: Column) -> Column:
    """A decimal column as ``velocity.decimals.format_decimal`` writes it: no trailing zeros."""
    text = value.cast("string")
    stripped = F.regexp_replace(F.regexp_replace(text, "0+$", ""), r"\.$", "")
    return F.when(stripped == "", F.lit("0")).otherwise(stripped)
