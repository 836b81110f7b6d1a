"""Test-data builders: valid SPEC §1 events and SPEC §2 rules, and Hypothesis strategies.

Builders return *valid* data by default; a test states only what it changes:
``event_obj(paymentAmount="-1")``, ``rule_obj(windowMinutes=0)``. Pass ``ABSENT``
to leave a field out entirely (``event_obj(ip=ABSENT)``); ``None`` writes a JSON null.

The strategies aim at the places where window engines break: a few minutes of
event time around ``BASE_TIME`` (a minute boundary, so on every bucket edge),
times exactly on bucket and minute edges and one millisecond either side, many
equal timestamps, small pools of key values (``7`` and ``"7"`` are the same
key), optional fields absent or empty, and windows of 1 to 5 minutes.
"""

from __future__ import annotations

import itertools
import json
import os
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from hypothesis import strategies as st

from velocity.domain.buckets import ALLOWED_BUCKET_SECONDS
from velocity.domain.rules import Rule, RuleEntry, RuleSignature, parse_rule
from velocity.domain.schema import FIELDS_BY_NAME, Event, Rejection, parse_event_object
from velocity.domain.stream_batch import KeyState, SignatureKey
from velocity.domain.windows import KeyedEvent
from velocity.generate import GenerateOptions, generate_events
from velocity.redis.commit_args import BucketChanges, KeyChange
from velocity.redis.keys import RedisKeys, bucket_value, recent_fragment


class _Absent:
    """Marker for "leave this field out" (distinct from None, which is a JSON null)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()

# 2026-01-01T00:00:00Z: a multiple of every bucket width and of one minute.
BASE_TIME: Final = 1_767_225_600_000
MINUTE_MS: Final = 60_000

# SPEC §2's operator spellings, written out here (not imported) so the tests hold the
# code to the contract rather than to itself.
OPERATOR_SYMBOLS: Final = ("=", "!=", ">=", "<=", ">", "<")
OPERATOR_NAMES: Final = ("EQUAL", "NOT_EQUAL", "GREATER_EQUAL", "LESS_EQUAL", "GREATER", "LESS")
OPERATOR_SHORT: Final = ("eq", "ne", "gte", "lte", "gt", "lt")
OPERATOR_SPELLINGS: Final = OPERATOR_SYMBOLS + OPERATOR_NAMES + OPERATOR_SHORT
AGGREGATORS: Final = ("SUM", "COUNT", "AVG", "MIN", "MAX", "UNIQUE_COUNT")
NUMERIC_AGGREGATORS: Final = ("SUM", "AVG", "MIN", "MAX")
RULE_STATES: Final = ("ACTIVE", "PAUSE", "DELETE", "CONTROL")
CONTROL_TYPES: Final = ("CLEAR_STATE_ALL", "DELETE_RULES_ALL", "EXPORT_RULES_CURRENT")
# The fields SPEC §1 lets rules use.
RULE_USABLE_FIELDS: Final = (
    "payerId",
    "beneficiaryId",
    "paymentAmount",
    "paymentType",
    "ip",
    "deviceId",
    "action",
)
REQUIRED_EVENT_FIELDS: Final = (
    "transactionId",
    "eventTime",
    "payerId",
    "beneficiaryId",
    "paymentAmount",
    "paymentType",
)
OPTIONAL_EVENT_FIELDS: Final = ("ip", "deviceId", "action")

_transaction_ids = itertools.count(1)


def next_transaction_id() -> str:
    """A transactionId no other builder call in this process has returned."""
    return f"tx-{next(_transaction_ids)}"


def _with_overrides(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for name, value in overrides.items():
        if value is ABSENT:
            out.pop(name, None)
        else:
            out[name] = value
    return out


# --------------------------------------------------------------------------- events


def event_obj(**overrides: Any) -> dict[str, Any]:
    """A valid SPEC §1 event as a decoded JSON object, with a fresh transactionId."""
    base: dict[str, Any] = {
        "transactionId": next_transaction_id(),
        "eventTime": BASE_TIME,
        "payerId": "payer-1",
        "beneficiaryId": "beneficiary-1",
        "paymentAmount": 100,
        "paymentType": "CRD",
    }
    return _with_overrides(base, overrides)


def json_text(value: object) -> str:
    """Compact JSON; a ``Decimal`` is written as a JSON number with exactly its digits.

    (``json.dumps`` cannot write Decimals, and going through float would lose the
    exactness the schema promises to keep.)
    """
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        items = (f"{json.dumps(str(k))}:{json_text(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def event_line(**overrides: Any) -> str:
    """One JSON line holding ``event_obj(**overrides)`` (no trailing newline)."""
    return json_text(event_obj(**overrides))


def event_lines(objs: Iterable[Mapping[str, Any]]) -> str:
    """A JSON-lines text, one object per line, ending with a newline."""
    return "".join(json_text(obj) + "\n" for obj in objs)


def accepted_rows(lines: Sequence[str]) -> pa.Table:
    """Event lines (one file, one block) parsed and admitted as the stream does: the
    accepted ones, in arrival order, as events-table columns."""
    from velocity.engine.event_lines import parsed_in_arrival_order
    from velocity.spark.ingest import VERDICT_ARROW  # imports pyspark: only when used

    table = pa.table(
        {
            "raw": pa.array(list(lines), pa.string()),
            "source_file": pa.repeat(pa.scalar("f"), len(lines)),
            "source_block": pa.repeat(pa.scalar(0, pa.int64()), len(lines)),
        }
    )
    parsed = parsed_in_arrival_order(table, VERDICT_ARROW)
    return parsed.filter(parsed.column("accepted"))


def accepted(obj: Mapping[str, Any]) -> Event:
    """The accepted Event of a decoded object; raises ValueError if the schema rejects it."""
    result = parse_event_object(dict(obj))
    if isinstance(result, Rejection):
        raise ValueError(f"builder produced a rejected event {obj!r}: {result}")
    return result


def event(**overrides: Any) -> Event:
    """``accepted(event_obj(**overrides))``."""
    return accepted(event_obj(**overrides))


# --------------------------------------------------------------------------- rules


def rule_obj(**overrides: Any) -> dict[str, Any]:
    """A valid ACTIVE SPEC §2 rule as a decoded JSON object (the SPEC's example, no filter)."""
    base: dict[str, Any] = {
        "ruleId": 1,
        "ruleState": "ACTIVE",
        "groupingKeyNames": ["payerId", "beneficiaryId"],
        "aggregateFieldName": "paymentAmount",
        "aggregatorFunctionType": "SUM",
        "limitOperatorType": ">",
        "limit": 200000,
        "windowMinutes": 1440,
    }
    return _with_overrides(base, overrides)


def rule_entry(obj: Mapping[str, Any]) -> RuleEntry:
    """The parsed entry of one rule object; ValueError naming the problems if it is invalid."""
    entry, problems = parse_rule(dict(obj))
    if entry is None:
        raise ValueError(f"builder produced an invalid rule {obj!r}: {problems}")
    return entry


def make_rule(**overrides: Any) -> Rule:
    """The ``Rule`` of ``rule_obj(**overrides)``; ValueError if it is not a full rule."""
    entry = rule_entry(rule_obj(**overrides))
    if not isinstance(entry, Rule):
        raise ValueError(f"expected a Rule, got {entry!r}")
    return entry


def rules_text(objs: Sequence[Mapping[str, Any]], layout: str = "array") -> str:
    """A rules file: ``array`` (one JSON array), ``lines`` (JSON lines) or ``object`` (one)."""
    if layout == "array":
        return json_text(list(objs))
    if layout == "lines":
        return event_lines(objs)
    if layout == "object":
        if len(objs) != 1:
            raise ValueError("layout 'object' holds exactly one rule")
        return json_text(objs[0])
    raise ValueError(f"unknown layout {layout!r}; use array, lines or object")


# --------------------------------------------------------------------------- keyed events


def keyed_event(
    event_time: int = BASE_TIME,
    transaction_id: str | None = None,
    value: str | None = None,
    number: Decimal | int | str | None = None,
) -> KeyedEvent:
    """A KeyedEvent; giving only ``number`` also sets ``value`` to its canonical string."""
    dec = None if number is None else Decimal(number)
    if dec is not None and value is None:
        value = "0" if dec.is_zero() else format(dec.normalize(), "f")
    return KeyedEvent(event_time, transaction_id or next_transaction_id(), value, dec)


def keyed_event_of(event: Event, signature: RuleSignature) -> KeyedEvent:
    """An accepted Event as ``signature`` sees it, built the way the engine's callers do.

    ``value`` is the canonical value of the signature's field (None for COUNT, whose
    signature has no field); ``number`` is its Decimal when the field is numeric.
    """
    field = signature.aggregate_field
    value = None if field is None else event.value(field)
    number = None
    if field is not None and value is not None and FIELDS_BY_NAME[field].numeric:
        number = Decimal(value)
    return KeyedEvent(event.event_time, event.transaction_id, value, number)


def keyed_histories(
    events: Iterable[Event], signature: RuleSignature
) -> dict[tuple[str, ...], list[KeyedEvent]]:
    """Per key, the events of ``signature`` in input order (filter applied, keyless dropped)."""
    histories: dict[tuple[str, ...], list[KeyedEvent]] = defaultdict(list)
    for ev in events:
        if not signature.passes_filter(ev.values):
            continue
        key = signature.key_of(ev.values)
        if key is None:
            continue
        histories[key].append(keyed_event_of(ev, signature))
    return dict(histories)


# --------------------------------------------------------------------------- strategies

bucket_seconds: st.SearchStrategy[int] = st.sampled_from(ALLOWED_BUCKET_SECONDS)

# Small pools, so that keys, filters and distinct values collide often.
PAYER_IDS: Final[tuple[object, ...]] = ("p1", "p2", 7, "7")
BENEFICIARY_IDS: Final[tuple[object, ...]] = ("b1", "b2", 12)
IPS: Final[tuple[object, ...]] = ("10.0.0.1", "10.0.0.2")
DEVICE_IDS: Final[tuple[object, ...]] = ("d1", "d2", 3)
ACTIONS: Final[tuple[object, ...]] = ("login", "pay")
PAYMENT_TYPES: Final[tuple[object, ...]] = ("CSH", "CRD")
# Amounts as JSON would give them: ints, exact Decimals (JSON decimals) and numeric strings;
# several spellings of the same value.
AMOUNTS: Final[tuple[object, ...]] = (
    0,
    1,
    2,
    10,
    "1.5",
    Decimal("1.50"),
    "100.50",
    Decimal("100.5"),
    "0.00000001",
    "33.33333333",
    250000,
    "999999999999999999.99999999",
)
FIELD_VALUES: Final[Mapping[str, tuple[object, ...]]] = {
    "payerId": PAYER_IDS,
    "beneficiaryId": BENEFICIARY_IDS,
    "paymentAmount": AMOUNTS,
    "paymentType": PAYMENT_TYPES,
    "ip": IPS,
    "deviceId": DEVICE_IDS,
    "action": ACTIONS,
}
# An optional field is absent, null, empty or one of its values.
_MISSING_SPELLINGS: Final[tuple[object, ...]] = (ABSENT, None, "")


def event_times(base: int = BASE_TIME, span_minutes: int = 7) -> st.SearchStrategy[int]:
    """Epoch ms in ``[base - 1, base + span]``, often exactly on or next to a bucket edge."""
    span_ms = span_minutes * MINUTE_MS
    anywhere = st.integers(0, span_ms)
    on_edges = st.builds(
        lambda minute, second, delta: minute * MINUTE_MS + second * 1000 + delta,
        st.integers(0, span_minutes),
        st.sampled_from((0, 1, 2, 5, 10, 15, 20, 30, 45, 59)),
        st.sampled_from((-1, 0, 0, 0, 1)),
    )
    return st.one_of(anywhere, on_edges).map(lambda offset: max(0, base + offset))


def _optional(values: Sequence[object]) -> st.SearchStrategy[object]:
    return st.sampled_from((*_MISSING_SPELLINGS, *values))


@st.composite
def event_objs(
    draw: st.DrawFn,
    transaction_id: object | None = None,
    times: st.SearchStrategy[int] | None = None,
) -> dict[str, Any]:
    """A random valid SPEC §1 event object (optional fields absent, null, empty or set)."""
    obj: dict[str, Any] = {
        "transactionId": (
            transaction_id
            if transaction_id is not None
            else draw(
                st.one_of(
                    st.integers(0, 10**9),
                    st.text(min_size=1, max_size=8).filter(lambda s: s.strip() != ""),
                )
            )
        ),
        "eventTime": draw(times if times is not None else event_times()),
        "payerId": draw(st.sampled_from(PAYER_IDS)),
        "beneficiaryId": draw(st.sampled_from(BENEFICIARY_IDS)),
        "paymentAmount": draw(st.sampled_from(AMOUNTS)),
        "paymentType": draw(st.sampled_from(PAYMENT_TYPES)),
    }
    for name in OPTIONAL_EVENT_FIELDS:
        value = draw(_optional(FIELD_VALUES[name]))
        if value is not ABSENT:
            obj[name] = value
    if draw(st.booleans()):
        obj["extra"] = draw(st.sampled_from(({"nested": [1, 2]}, [1], "x", None)))
    return obj


@st.composite
def event_obj_lists(
    draw: st.DrawFn, min_size: int = 0, max_size: int = 25, span_minutes: int = 7
) -> list[dict[str, Any]]:
    """Event objects with distinct transactionIds and many equal timestamps."""
    size = draw(st.integers(min_size, max_size))
    pool = draw(st.lists(event_times(span_minutes=span_minutes), min_size=1, max_size=6))
    # Half the time from a small pool of times (ties), else anywhere (edges).
    times = st.one_of(st.sampled_from(pool), event_times(span_minutes=span_minutes))
    objs = []
    for index in range(size):
        # Integers and strings both, never equal as canonical strings.
        tx: object = index if index % 3 == 0 else f"tx-{index}"
        objs.append(draw(event_objs(transaction_id=tx, times=times)))
    return objs


def events(
    min_size: int = 0, max_size: int = 25, span_minutes: int = 7
) -> st.SearchStrategy[list[Event]]:
    """Accepted, de-duplicated Events (as the engine receives them)."""
    return event_obj_lists(min_size, max_size, span_minutes).map(
        lambda objs: [accepted(obj) for obj in objs]
    )


def _cased(text: str) -> st.SearchStrategy[str]:
    """``text`` in upper, lower, title or alternating case (enums are case-insensitive)."""
    alternating = "".join(c.lower() if i % 2 else c.upper() for i, c in enumerate(text))
    return st.sampled_from((text.upper(), text.lower(), text.title(), alternating))


def _filter_values(field: str) -> st.SearchStrategy[object]:
    values = FIELD_VALUES[field]
    single = st.sampled_from(values)
    several = st.lists(st.sampled_from(values), min_size=1, max_size=3)
    return st.one_of(single, several)


@st.composite
def rule_filters(draw: st.DrawFn) -> dict[str, object]:
    """A filter of 0-2 fields, each with one value or a list of values."""
    fields = draw(st.lists(st.sampled_from(RULE_USABLE_FIELDS), unique=True, max_size=2))
    return {name: draw(_filter_values(name)) for name in fields}


def _limits(aggregator: str) -> st.SearchStrategy[object]:
    if aggregator in ("COUNT", "UNIQUE_COUNT"):
        return st.one_of(st.integers(0, 6), st.sampled_from((Decimal("1.5"), Decimal("2.0"))))
    return st.one_of(
        st.sampled_from(AMOUNTS).map(lambda a: Decimal(str(a))),
        st.sampled_from((Decimal("50.25"), Decimal("101"), Decimal("33.33333333333"), -1)),
        st.integers(0, 500),
    )


@st.composite
def rule_objs(
    draw: st.DrawFn,
    rule_id: int | None = None,
    states: Sequence[str] = ("ACTIVE",),
    window_minutes: st.SearchStrategy[int] | None = None,
) -> dict[str, Any]:
    """A random valid SPEC §2 rule object.

    Every aggregator and operator spelling in random case, grouping keys of any
    length (also empty) in random order, filters with one value or a list, COUNT
    rules with or without a (ignored) field, windows of 1 to 5 minutes by default.
    """
    aggregator = draw(st.sampled_from(AGGREGATORS))
    obj: dict[str, Any] = {
        "ruleId": rule_id if rule_id is not None else draw(st.integers(1, 10**6)),
        "ruleState": draw(st.sampled_from(tuple(states)).flatmap(_cased)),
        "groupingKeyNames": draw(
            st.lists(st.sampled_from(RULE_USABLE_FIELDS), unique=True, max_size=3)
        ),
        "aggregatorFunctionType": draw(_cased(aggregator)),
        "limitOperatorType": draw(st.sampled_from(OPERATOR_SPELLINGS).flatmap(_cased)),
        "limit": draw(_limits(aggregator)),
        "windowMinutes": draw(window_minutes if window_minutes is not None else st.integers(1, 5)),
    }
    if aggregator in NUMERIC_AGGREGATORS:
        obj["aggregateFieldName"] = "paymentAmount"
    elif aggregator == "UNIQUE_COUNT":
        obj["aggregateFieldName"] = draw(st.sampled_from(RULE_USABLE_FIELDS))
    else:
        field = draw(st.sampled_from((ABSENT, *RULE_USABLE_FIELDS)))
        if field is not ABSENT:
            obj["aggregateFieldName"] = field
    rule_filter = draw(st.one_of(st.just(ABSENT), rule_filters()))
    if rule_filter is not ABSENT:
        obj["filter"] = rule_filter
    return obj


def rules(
    states: Sequence[str] = ("ACTIVE",),
    window_minutes: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[Rule]:
    """A random valid ``Rule`` (see ``rule_objs``)."""
    return rule_objs(states=states, window_minutes=window_minutes).map(
        lambda obj: _as_rule(rule_entry(obj))
    )


def _as_rule(entry: RuleEntry) -> Rule:
    if not isinstance(entry, Rule):
        raise ValueError(f"expected a Rule, got {entry!r}")
    return entry


@st.composite
def rule_sets(
    draw: st.DrawFn,
    min_size: int = 1,
    max_size: int = 4,
    states: Sequence[str] = ("ACTIVE", "ACTIVE", "ACTIVE", "PAUSE"),
    shared_signature_bias: bool = True,
) -> list[Rule]:
    """Rules with distinct ruleIds 1..n; some PAUSEd; often sharing a signature.

    With ``shared_signature_bias`` a later rule sometimes copies an earlier rule's
    keys, filter and field with another aggregator, limit or window, so that
    ``evaluate_key_history`` sees several rules (and windows) per signature.
    """
    size = draw(st.integers(min_size, max_size))
    objs: list[dict[str, Any]] = []
    for index in range(size):
        obj = draw(rule_objs(rule_id=index + 1, states=states))
        if shared_signature_bias and len(objs) > 0 and draw(st.booleans()):
            model = draw(st.sampled_from(objs))
            copied = ["groupingKeyNames", "filter"]
            if aggregator_of(model) == aggregator_of(obj) == "UNIQUE_COUNT":
                copied.append("aggregateFieldName")
            for name in copied:
                obj.pop(name, None)
                if name in model:
                    obj[name] = model[name]
        objs.append(obj)
    return [_as_rule(rule_entry(obj)) for obj in objs]


def aggregator_of(obj: Mapping[str, Any]) -> str:
    return str(obj["aggregatorFunctionType"]).upper()


def shuffled(items: Sequence[Any]) -> st.SearchStrategy[list[Any]]:
    """``items`` in a random order."""
    return st.permutations(list(items))


# The fields of a SPEC §4 alert record, written out here rather than taken from the code.
SPEC_ALERT_FIELDS = {
    "alertId",
    "kind",
    "ruleId",
    "ruleVersion",
    "transactionId",
    "key",
    "eventTime",
    "aggregatorFunctionType",
    "aggregateValue",
    "limitOperatorType",
    "limit",
    "windowStart",
    "windowEnd",
    "decisionTime",
    "outcome",
}


def generated_in_arrival_order(folder: Path, options: GenerateOptions) -> Path:
    """``velocity generate`` into ``folder``, each file's modification time in name order.

    The file source orders new files by modification time; files written in the same
    millisecond would arrive in directory-listing order, not the generator's.
    """
    generate_events(folder, options)
    for order, path in enumerate(sorted(folder.glob("*.jsonl"))):
        os.utime(path, (1_700_000_000 + order, 1_700_000_000 + order))
    return folder


def alert_row(
    alert_id: str,
    rule: tuple[int, int],
    decision_time: int,
    kind: str = "ALERT",
    transaction_id: str | None = None,
    shadow: bool | None = None,
) -> dict[str, Any]:
    """A row of the alerts table (``velocity.delta.tables.ALERT_SCHEMA``) of ruleId and
    version ``rule``, decided at ``decision_time``; ``shadow`` given: with the column of
    that name (a table of an older Velocity has none)."""
    row = {
        "alertId": alert_id,
        "kind": kind,
        "ruleId": rule[0],
        "ruleVersion": rule[1],
        "transactionId": transaction_id or f"tx-{alert_id}",
        "key": [("payerId", "p-1")],
        "eventTime": decision_time - 5,
        "aggregatorFunctionType": "COUNT",
        "aggregateValue": "6",
        "limitOperatorType": ">",
        "limit": "5",
        "windowStart": decision_time - 600_005,
        "windowEnd": decision_time - 5,
        "decisionTime": decision_time,
        "signature_id": "s",
    }
    if shadow is not None:
        row["shadow"] = shadow
    return row


def append_alerts(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append ``rows`` (``alert_row``) to the alerts table at ``path`` in one commit, with
    delta-rs, in the stream's schema (the table is created by the first call)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema(
        [
            pa.field("alertId", pa.string()),
            pa.field("kind", pa.string()),
            pa.field("ruleId", pa.int64()),
            pa.field("ruleVersion", pa.int32()),
            pa.field("transactionId", pa.string()),
            pa.field("key", pa.map_(pa.string(), pa.string())),
            pa.field("eventTime", pa.int64()),
            pa.field("aggregatorFunctionType", pa.string()),
            pa.field("aggregateValue", pa.string()),
            pa.field("limitOperatorType", pa.string()),
            pa.field("limit", pa.string()),
            pa.field("windowStart", pa.int64()),
            pa.field("windowEnd", pa.int64()),
            pa.field("decisionTime", pa.int64()),
            pa.field("signature_id", pa.string()),
        ]
    )
    if any("shadow" in row for row in rows):
        schema = schema.append(pa.field("shadow", pa.bool_()))
    write_deltalake(
        str(path), pa.Table.from_pylist(list(rows), schema), mode="append", schema_mode="merge"
    )


@st.composite
def decision_histories(
    draw: st.DrawFn, transaction_id: str, version: int, base: int = BASE_TIME
) -> list[dict[str, Any]]:
    """The rows one decision of (ruleId 4, ``version``, ``transaction_id``) may leave in
    the alerts table (SPEC §3): an ALERT or a backfill's CORRECTION, then RETRACTIONs and
    CORRECTIONs in turn, so its net count stays 0 or 1; a RETRACTION and the CORRECTION
    after it may share a decisionTime (a backfill amends a value that way), a raising row
    and the RETRACTION after it never do."""
    steps = draw(st.integers(1, 5))
    at = base + draw(st.integers(0, 5_000))
    rows = []
    for step in range(steps):
        retracts = step % 2 == 1
        if step == 0:
            kind = draw(st.sampled_from(["ALERT", "CORRECTION"]))
        else:
            kind = "RETRACTION" if retracts else "CORRECTION"
            at += draw(st.integers(1 if retracts else 0, 3_000))
        alert_id = f"{transaction_id}-v{version}-{step}"
        rows.append(alert_row(alert_id, (4, version), at, kind, transaction_id))
    return rows


def asked_keys(slots: Sequence[tuple[str, str]]) -> pa.Table:
    """(signature, key)s as the columns ``mirror.read_stream_state`` asks for."""
    return pa.table(
        {
            "signature_id": pa.array([sig for sig, _ in slots], pa.string()),
            "key": pa.array([key for _, key in slots], pa.string()),
        }
    )


# Values that sit on the plain path's edges: kinds it declines, spellings it must read
# exactly as the checked path does, and values it must not take as they are.
EDGE_FIELD_VALUES = st.sampled_from(
    [
        None, "", " ", "\u00a0", "x", " x ", "é", "\ud800", 0, 7, -1, True, 1.5, 10**18,
        10**18 - 1, Decimal("1E+2"), Decimal("43.660"), Decimal("-0.0"), Decimal("0.00000001"),
        "0", "00", "0.0", "10.0", "1.50", "007", "1e2", "+1", "0.123456789", "1" * 19,
        "999999999999999999.99999999", "CRD", "crd", "CSH", [], {}, "NaN",
    ]
)  # fmt: skip


def payer_partitions(lines: Sequence[str], partitions: int) -> list[list[str]]:
    """Event ``lines`` (arrival order) cut as a topic keyed by payerId would hold them:
    each payer in one partition (by a stable hash), each partition in arrival order."""
    parts: list[list[str]] = [[] for _ in range(partitions)]
    for line in lines:
        payer = str(json.loads(line)["payerId"])
        parts[zlib.crc32(payer.encode()) % partitions].append(line)
    return parts


def lagging_reads(
    parts: Sequence[Sequence[str]], paces: Sequence[int], delays: Sequence[int]
) -> list[list[str]]:
    """The micro-batches a consumer makes of ``parts`` read at different paces: partition
    ``i`` gives ``paces[i]`` lines a batch from batch ``delays[i]`` on (paused before),
    until every partition is read; each batch holds its partitions' lines in turn."""
    taken = [0] * len(parts)
    batches: list[list[str]] = []
    while any(t < len(p) for t, p in zip(taken, parts, strict=True)):
        batch: list[str] = []
        for i, part in enumerate(parts):
            if len(batches) >= delays[i]:
                batch.extend(part[taken[i] : taken[i] + paces[i]])
                taken[i] = min(len(part), taken[i] + paces[i])
        batches.append(batch)
    return [b for b in batches if b]


def two_groups_one_chunk_apart(lines: Sequence[str], chunk: int) -> list[list[str]]:
    """A lagging source: payers in two groups (by a stable hash), the events cut into
    ``chunk``-event chunks in arrival order, and batch ``i`` holding the first group's
    events of chunk ``i`` and the second group's of chunk ``i − 1``: every payer stays in
    order, the second group is read one chunk late."""
    chunks = [lines[i : i + chunk] for i in range(0, len(lines), chunk)]
    first, second = [], []
    for part in chunks:
        groups = payer_partitions(part, 2)
        first.append(groups[0])
        second.append(groups[1])
    return [
        (first[i] if i < len(first) else []) + (second[i - 1] if i > 0 else [])
        for i in range(len(chunks) + 1)
    ]


def landed_in_order(folder: Path, batches: Sequence[Sequence[str]]) -> Path:
    """One file per batch in ``folder``, modification times in batch order (the file
    source then reads one a micro-batch, in that order)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, batch in enumerate(batches):
        path = folder / f"batch-{index:05d}.jsonl"
        path.write_text("".join(f"{line}\n" for line in batch))
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
    return folder


def key_changes(
    keys: RedisKeys,
    changed: Mapping[SignatureKey, tuple[KeyState, Sequence[int]]],
    dropped: Iterable[tuple[str, str, int]] = (),
) -> BucketChanges:
    """A commit's changes written as a dense key's changes, whatever each key's size (the
    stream picks packed or dense per key; these tests drive the dense run directly): each
    changed key's ``starts`` get their value in its new state (with its newest eventTime)
    and their raw events when it holds them; the ``dropped`` buckets go."""
    drops: dict[SignatureKey, list[int]] = {}
    for sig, key, start in dropped:
        drops.setdefault((sig, key), []).append(start)
    out = []
    for slot in [*changed, *(s for s in drops if s not in changed)]:
        state, starts = changed.get(slot, (KeyState(), ()))
        sets = [
            (start, bucket_value(state.buckets[start], state.last_times.get(start)))
            for start in starts
            if start in state.buckets
        ]
        started = [
            (start, recent_fragment(state.recent[start]))
            for start in starts
            if start in state.recent
        ]
        out.append(KeyChange(keys.key_base(*slot), sets, started, drops.get(slot, ())))
    return BucketChanges.of(out)
