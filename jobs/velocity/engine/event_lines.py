"""Lines of JSON text -> one verdict per line, a block of lines at a time (pure; SPEC §1).

``velocity.domain.schema.parse_event_line`` is the definition of a valid event and of every
quarantine reason; it costs about 10 µs a line in Python. ``line_verdicts`` gives the
same verdicts column by column, with Arrow's JSON reader:

1. The *plain* lines are picked by one regular expression: a flat JSON object of ASCII
   text (no escapes, no nested objects or arrays, no line breaks), the shape nearly
   every event has. Python's ``json`` and Arrow's reader agree on such a line.
2. Their numbers are quoted with a marker (``:12,`` becomes ``:"§12",``), so every
   declared field reads as text whatever the producer chose (the generator mixes
   ``"payerId": 12`` and ``"payerId": "p-12"``, as real producers do), and Arrow reads
   them a block at a time. A block Arrow refuses (a key given twice, a ``true`` where
   text goes) is halved until the refused lines are alone.
3. Each declared field is checked as a column, and a line is *answered* only when it is
   an event ``parse_event_line`` accepts, with the same values.

Every other line (malformed, unusual, refused) is parsed by ``parse_event_line``, so
each quarantine reason stays exact. The two paths are property-tested equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from velocity.domain.decimals import EXACT
from velocity.domain.schema import (
    EVENT_FIELDS,
    FIELDS_BY_NAME,
    FieldKind,
    Rejection,
    is_blank,
    parse_event_line,
)

_WS = "[ \t]*"
_TEXT = '"[ !#-\\[\\]-~]*"'  # printable ASCII but for the quote and the backslash
_NUMBER = "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
# ``true`` and ``false`` are left out: Arrow refuses them where text goes, and a refused
# line costs a halving of its block each time.
_VALUE = f"(?:{_TEXT}|{_NUMBER}|null)"
_MEMBER = f"{_TEXT}{_WS}:{_WS}{_VALUE}{_WS}"
PLAIN_LINE = f"^{_WS}\\{{{_WS}(?:{_MEMBER}(?:,{_WS}{_MEMBER})*)?\\}}{_WS}$"
# A number as a member's value; inside a text it may match too, which breaks the JSON, so
# Arrow refuses that line and the line parser takes it.
_NUMBER_VALUE = "(:[ \t]*)(-?[0-9][0-9.eE+-]*)([ \t]*[,}])"
NUMBER_MARK = "\u00a7"
_QUOTED_NUMBER = f'\\1"{NUMBER_MARK}\\2"\\3'


def _schema_order_line() -> str:
    """The event as SPEC §1 lists its fields, each once, nothing else, no spaces: what
    most producers write (the generator does). Each field's token is captured: a text
    with its quotes, or a number (checked by the field's rule after)."""
    token = "(?P<{}>" + _TEXT + "|-?[0-9][0-9.eE+-]*)"
    members = [
        f'{"" if i == 0 else ","}"{f.name}":{token.format(f.name)}'
        if f.required
        else f'(?:,"{f.name}":{token.format(f.name)})?'
        for i, f in enumerate(EVENT_FIELDS)
    ]
    return "^\\{" + "".join(members) + "\\}$"


SCHEMA_ORDER_LINE = _schema_order_line()

# Spelled plainly, these are exactly what the line parser accepts with the same text.
_INTEGER = "^(?:0|-?[1-9][0-9]*)$"  # "-0" is the integer 0: left to the line parser
_EVENT_TIME = "^(?:0|[1-9][0-9]{0,17})$"  # below 10^18 < 2^62: in range by its length
_AMOUNT = "^(?:0|[1-9][0-9]{0,17})(?:\\.[0-9]{1,8})?$"
_PAYMENT_TYPES = sorted(FIELDS_BY_NAME["paymentType"].allowed)
_AMOUNT_QUANTUM = Decimal("1e-8")

_DECLARED = [f.name for f in EVENT_FIELDS]
_READ_SCHEMA = pa.schema([(name, pa.string()) for name in _DECLARED])
_READ_OPTIONS = pj.ReadOptions(use_threads=False, block_size=1 << 24)
_PARSE_OPTIONS = pj.ParseOptions(
    explicit_schema=_READ_SCHEMA, unexpected_field_behavior="ignore", newlines_in_values=False
)
# Lines read by Arrow at a time (a refused block is halved, so smaller costs less then).
BLOCK_LINES = 4096


@dataclass(frozen=True)
class FieldTokens:
    """One declared field over some lines: its text (a number's spelling, or a text's
    content), whether it was a number, whether it was there."""

    text: pa.Array
    number: np.ndarray
    present: np.ndarray


def line_texts(raws: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """A text column's lines as str. Spark's text source passes the file's bytes through
    unchecked; bytes that are not UTF-8 become U+FFFD, so such a line is judged (and kept)
    as text instead of failing the whole batch."""
    try:
        return raws.to_pylist()
    except UnicodeDecodeError:
        as_bytes: list[bytes | None] = raws.cast(pa.binary()).to_pylist()
        return [None if b is None else b.decode("utf-8", errors="replace") for b in as_bytes]


def parsed_in_arrival_order(
    lines: pa.Table, schema: pa.Schema, judge_blank: bool = False
) -> pa.Table:
    """A micro-batch's lines (``raw``, ``source_file``, ``source_block``) in arrival order,
    each with its ``line_seq`` and its verdict's fields (``line_verdicts``, as ``schema``)
    as columns; blank lines left out unless judged. Arrival order is (file or topic
    partition, block or offset, position in what Spark gave)."""
    position = pa.array(np.arange(lines.num_rows, dtype=np.int64))
    ordered = lines.append_column("_position", position).sort_by(
        [("source_file", "ascending"), ("source_block", "ascending"), ("_position", "ascending")]
    )
    verdicts = line_verdicts(ordered.column("raw"), schema, judge_blank)
    parsed = ordered.drop_columns(["_position"]).append_column(
        "line_seq", pa.array(np.arange(ordered.num_rows, dtype=np.int64))
    )
    for field in verdicts.type:
        parsed = parsed.append_column(field.name, verdicts.field(field.name))
    return parsed.filter(pc.invert(parsed.column("blank"))).drop_columns(["blank"])


def line_verdicts(
    raws: pa.Array | pa.ChunkedArray, schema: pa.Schema, judge_blank: bool = False
) -> pa.StructArray:
    """One verdict per line, in order, as ``schema`` (``blank``, ``accepted``,
    ``reason_code``, ``reason``, then the event's columns): the lines in the schema's
    order by one regular expression, the other plain lines by Arrow's JSON reader, the
    rest by ``parse_event_line``. A blank line is marked blank (files skip them), or with
    ``judge_blank`` quarantined like any other text (a message must hold an event)."""
    raws = raws.combine_chunks() if isinstance(raws, pa.ChunkedArray) else raws
    left = np.flatnonzero(pc.fill_null(pc.string_is_ascii(raws), False).to_numpy(False))
    answered: list[tuple[np.ndarray, dict[str, pa.Array]]] = []
    for tokens_of in (_schema_order_tokens, _plain_line_tokens):
        lines, tokens = tokens_of(raws.take(left))
        events, columns = _events(tokens)
        taken = left[lines[events]]
        answered.append((taken, {n: c.filter(pa.array(events)) for n, c in columns.items()}))
        left = np.setdiff1d(left, taken, assume_unique=True)
    fast = np.concatenate([rows for rows, _ in answered])
    rest = np.setdiff1d(np.arange(len(raws)), fast, assume_unique=True)
    slow = _line_by_line(raws.take(rest), schema, judge_blank)
    constant = {
        "blank": pa.array(np.zeros(len(fast), dtype=bool)),
        "accepted": pa.array(np.ones(len(fast), dtype=bool)),
        "reason_code": pa.nulls(len(fast), pa.string()),
        "reason": pa.nulls(len(fast), pa.string()),
    }
    order = pa.array(np.argsort(np.concatenate([fast, rest]), kind="stable"))
    arrays = []
    for f in schema:
        parts = [constant[f.name]] if f.name in constant else [c[f.name] for _, c in answered]
        arrays.append(
            pa.concat_arrays([*(p.cast(f.type) for p in parts), slow.field(f.name)]).take(order)
        )
    return pa.StructArray.from_arrays(arrays, fields=list(schema))


def _schema_order_tokens(lines: pa.Array) -> tuple[np.ndarray, dict[str, FieldTokens]]:
    """The lines ``SCHEMA_ORDER_LINE`` matches (their positions) and their fields."""
    captured = pc.extract_regex(lines, SCHEMA_ORDER_LINE)
    matched = np.flatnonzero(captured.is_valid().to_numpy(zero_copy_only=False))
    captured = captured.take(pa.array(matched))
    tokens = {}
    for i, name in enumerate(_DECLARED):
        token = pc.struct_field(captured, [i])
        present = pc.not_equal(token, "")  # an absent optional field captures nothing
        text = pc.starts_with(token, '"')
        tokens[name] = FieldTokens(
            pc.if_else(text, pc.utf8_slice_codeunits(token, 1, -1), token),
            ~text.to_numpy(zero_copy_only=False) & present.to_numpy(zero_copy_only=False),
            present.to_numpy(zero_copy_only=False),
        )
    return matched, tokens


def _plain_line_tokens(lines: pa.Array) -> tuple[np.ndarray, dict[str, FieldTokens]]:
    """The plain lines (``PLAIN_LINE``) Arrow's JSON reader reads (their positions) and
    their fields."""
    plain = np.flatnonzero(
        pc.fill_null(pc.match_substring_regex(lines, PLAIN_LINE), False).to_numpy(False)
    )
    quoted = pc.replace_substring_regex(lines.take(pa.array(plain)), _NUMBER_VALUE, _QUOTED_NUMBER)
    read, read_ok = _read_blocks(quoted)
    keep = pa.array(np.flatnonzero(read_ok))
    tokens = {}
    for name, value in read.items():
        value = value.take(keep)
        marked = pc.fill_null(pc.starts_with(value, NUMBER_MARK), False)
        tokens[name] = FieldTokens(
            pc.if_else(marked, pc.utf8_slice_codeunits(value, 1), value),
            marked.to_numpy(zero_copy_only=False),
            value.is_valid().to_numpy(zero_copy_only=False),
        )
    return plain[read_ok], tokens


def _events(tokens: dict[str, FieldTokens]) -> tuple[np.ndarray, dict[str, pa.Array]]:
    """Which lines are events the line parser accepts as they are, and their columns
    (every line has a row; only the answered rows mean anything)."""
    n = len(next(iter(tokens.values())).number)
    answered = np.ones(n, dtype=bool)
    columns: dict[str, pa.Array] = {}
    for spec in EVENT_FIELDS:
        ok, columns[spec.name] = _CHECKS[spec.kind](tokens[spec.name], spec.required)
        answered &= ok
    return answered, columns


def _read_blocks(quoted: pa.Array) -> tuple[dict[str, pa.Array], np.ndarray]:
    """The declared fields of every line as text (None where Arrow refused the line's
    block down to the line), and which lines Arrow read."""
    n = len(quoted)
    read_ok = np.ones(n, dtype=bool)
    pieces: list[pa.Table] = [_READ_SCHEMA.empty_table()]
    pending = [(start, min(start + BLOCK_LINES, n)) for start in range(0, n, BLOCK_LINES)]
    while pending:
        start, stop = pending.pop(0)
        table = _read_json(quoted.slice(start, stop - start))
        if table is not None:
            pieces.append(table)
        elif stop - start == 1:
            read_ok[start] = False
            nothing = {name: pa.nulls(1, pa.string()) for name in _DECLARED}
            pieces.append(pa.table(nothing, schema=_READ_SCHEMA))
        else:
            middle = (start + stop) // 2
            pending[:0] = [(start, middle), (middle, stop)]
    table = pa.concat_tables(pieces)
    return {name: table.column(name).combine_chunks() for name in _DECLARED}, read_ok


def _read_json(lines: pa.Array) -> pa.Table | None:
    """Arrow's JSON reader over ``lines``; None when it refuses them or reads another
    number of rows than there are lines."""
    whole = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines)
    text = pc.binary_join(whole, pa.scalar("\n", lines.type))[0]
    try:
        table = pj.read_json(
            pa.BufferReader(text.as_buffer()),
            read_options=_READ_OPTIONS,
            parse_options=_PARSE_OPTIONS,
        )
    except pa.ArrowInvalid:
        return None
    return table if table.num_rows == len(lines) else None


Check = Callable[[FieldTokens, bool], tuple[np.ndarray, pa.Array]]


def _matches(value: pa.Array, pattern: str) -> np.ndarray:
    return pc.fill_null(pc.match_substring_regex(value, pattern), False).to_numpy(
        zero_copy_only=False
    )


def _text_check(field: FieldTokens, required: bool) -> tuple[np.ndarray, pa.Array]:
    """Text where a key or an identity goes: non-blank text as it is, an integer as its
    digits; absent or blank is None when optional. (Floats and the rest go to the line
    parser.)"""
    blank = field.present & ~field.number & ~_matches(field.text, "[^ ]")
    ok = np.where(field.number, _matches(field.text, _INTEGER), field.present & ~blank)
    if required:
        return ok, field.text
    absent = pa.array(blank | ~field.present)
    return ok | blank | ~field.present, pc.if_else(absent, pa.scalar(None, pa.string()), field.text)


def _time_check(field: FieldTokens, required: bool) -> tuple[np.ndarray, pa.Array]:
    ok = field.number & _matches(field.text, _EVENT_TIME)
    return ok, pc.cast(pc.if_else(pa.array(ok), field.text, "0"), pa.int64())


def _amount_check(field: FieldTokens, required: bool) -> tuple[np.ndarray, pa.Array]:
    ok = field.present & _matches(field.text, _AMOUNT)
    return ok, pc.cast(pc.if_else(pa.array(ok), field.text, "0"), pa.decimal128(26, 8))


def _enum_check(field: FieldTokens, required: bool) -> tuple[np.ndarray, pa.Array]:
    allowed = pc.fill_null(pc.is_in(field.text, value_set=pa.array(_PAYMENT_TYPES)), False)
    return allowed.to_numpy(zero_copy_only=False) & ~field.number, field.text


_CHECKS: dict[FieldKind, Check] = {
    FieldKind.IDENTITY: _text_check,
    FieldKind.KEY: _text_check,
    FieldKind.TIME: _time_check,
    FieldKind.AMOUNT: _amount_check,
    FieldKind.ENUM: _enum_check,
}


def _line_by_line(raws: pa.Array, schema: pa.Schema, judge_blank: bool) -> pa.StructArray:
    """``parse_event_line`` over each line (blank lines marked unless judged), as
    ``schema``."""
    columns: dict[str, list[object]] = {name: [] for name in schema.names}
    rejected = dict.fromkeys(f.name for f in EVENT_FIELDS)
    for raw in line_texts(raws):
        if raw is None or (is_blank(raw) and not judge_blank):
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
    return pa.StructArray.from_arrays(
        [pa.array(columns[f.name], type=f.type) for f in schema], fields=list(schema)
    )
