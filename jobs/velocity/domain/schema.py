"""The event schema, declared once, and the validation of one event line.

Invariants callers rely on:
- Every field a rule may name is in ``EVENT_FIELDS`` with ``rule_usable=True``;
  nothing else is (rules naming other fields are rejected).
- ``canonical_value`` is the one definition of a field's value as compared by
  rules and keys: strings as they are, integers without a decimal point
  (``12`` and ``"12"`` are equal), amounts as normalised exact decimals.
- ``parse_event_line`` never raises on bad input: it returns a ``Rejection``
  with a reason code and a message naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from velocity.domain.decimals import decimal_places, format_decimal


class FieldKind(StrEnum):
    IDENTITY = "identity"  # string or integer, compared as canonical string
    TIME = "time"  # integer epoch milliseconds, >= 0
    KEY = "key"  # string or number, compared as canonical string
    AMOUNT = "amount"  # exact decimal
    ENUM = "enum"  # one of a fixed set of strings


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: FieldKind
    required: bool
    rule_usable: bool
    allowed: frozenset[str] = frozenset()

    @property
    def numeric(self) -> bool:
        """True when SUM, AVG, MIN and MAX may aggregate this field."""
        return self.kind is FieldKind.AMOUNT


EVENT_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("transactionId", FieldKind.IDENTITY, required=True, rule_usable=False),
    FieldSpec("eventTime", FieldKind.TIME, required=True, rule_usable=False),
    FieldSpec("payerId", FieldKind.KEY, required=True, rule_usable=True),
    FieldSpec("beneficiaryId", FieldKind.KEY, required=True, rule_usable=True),
    FieldSpec("paymentAmount", FieldKind.AMOUNT, required=True, rule_usable=True),
    FieldSpec(
        "paymentType",
        FieldKind.ENUM,
        required=True,
        rule_usable=True,
        allowed=frozenset({"CSH", "CRD"}),
    ),
    FieldSpec("ip", FieldKind.KEY, required=False, rule_usable=True),
    FieldSpec("deviceId", FieldKind.KEY, required=False, rule_usable=True),
    FieldSpec("action", FieldKind.KEY, required=False, rule_usable=True),
)
FIELDS_BY_NAME: Mapping[str, FieldSpec] = {f.name: f for f in EVENT_FIELDS}
RULE_FIELDS: tuple[str, ...] = tuple(f.name for f in EVENT_FIELDS if f.rule_usable)
NUMERIC_FIELDS: tuple[str, ...] = tuple(f.name for f in EVENT_FIELDS if f.numeric)
# Columns every accepted event carries, in this order, as canonical strings
# (eventTime as int and paymentAmount as Decimal besides).
KEY_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in EVENT_FIELDS if f.kind not in (FieldKind.TIME,)
)

MAX_AMOUNT = Decimal(10) ** 18
AMOUNT_DECIMAL_PLACES = 8
# Epoch milliseconds must fit a signed 64-bit long with room for window arithmetic.
MAX_EVENT_TIME = 2**62
_NUMERIC_STRING = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class RejectReason(StrEnum):
    NOT_JSON = "not_json"
    NOT_OBJECT = "not_object"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    AMOUNT_OUT_OF_RANGE = "amount_out_of_range"
    AMOUNT_PRECISION = "amount_precision"
    UNKNOWN_ENUM = "unknown_enum"
    TIME_OUT_OF_RANGE = "time_out_of_range"
    FUTURE_EVENT_TIME = "future_event_time"  # set in arrival order (velocity.domain.arrival)


class LateReason(StrEnum):
    """Why an accepted event is recorded for the backfill of late events (SPEC §3)."""

    LATE = "late"  # older than the watermark: counted, not decided
    OUT_OF_ORDER = "out_of_order"  # decided after a later event of one of its rule keys


@dataclass(frozen=True)
class Rejection:
    """Why one line was quarantined: a stable code for metrics and a message for people."""

    code: RejectReason
    message: str

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


@dataclass(frozen=True)
class Event:
    """An accepted event: canonical strings for every declared field (None when absent)."""

    transaction_id: str
    event_time: int
    amount: Decimal
    values: Mapping[str, str | None]

    def value(self, field: str) -> str | None:
        return self.values.get(field)


class _BadValue(Exception):
    def __init__(self, code: RejectReason, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse_amount(raw: object, field: str = "paymentAmount") -> Decimal:
    """An amount from a JSON number or numeric string, checked against SPEC §1's range."""
    if isinstance(raw, bool) or not isinstance(raw, (int, Decimal, str, float)):
        raise _BadValue(
            RejectReason.WRONG_TYPE, f"{field} must be a number or numeric string, got {raw!r}"
        )
    if isinstance(raw, str):
        text = raw.strip()
        if not _NUMERIC_STRING.match(text):
            raise _BadValue(RejectReason.WRONG_TYPE, f"{field} {raw!r} is not a decimal number")
        raw = text
    try:
        amount = Decimal(str(raw)) if isinstance(raw, float) else Decimal(raw)
    except InvalidOperation as exc:
        raise _BadValue(RejectReason.WRONG_TYPE, f"{field} {raw!r} is not a number") from exc
    if not amount.is_finite():
        raise _BadValue(RejectReason.AMOUNT_OUT_OF_RANGE, f"{field} {raw!r} is not finite")
    if amount < 0 or amount >= MAX_AMOUNT:
        raise _BadValue(
            RejectReason.AMOUNT_OUT_OF_RANGE, f"{field} {raw!r} is outside 0 <= amount < 10^18"
        )
    if decimal_places(amount) > AMOUNT_DECIMAL_PLACES:
        raise _BadValue(
            RejectReason.AMOUNT_PRECISION,
            f"{field} {raw!r} has more than {AMOUNT_DECIMAL_PLACES} decimal places",
        )
    return amount


_SURROGATE = re.compile("[\ud800-\udfff]")


def _scalar_text(field: str, raw: object) -> str:
    """Canonical string of a string or number value; rejects objects, arrays, booleans."""
    if isinstance(raw, (bool, dict, list)) or raw is None:
        raise _BadValue(
            RejectReason.WRONG_TYPE,
            f"{field} must be a string or number, got {type(raw).__name__} {raw!r}",
        )
    if isinstance(raw, str):
        if not raw.isascii() and _SURROGATE.search(raw):
            # JSON can spell one ("\\ud800"), but it is no text: UTF-8 (Delta, Arrow,
            # Redis keys) cannot hold it.
            raise _BadValue(
                RejectReason.WRONG_TYPE,
                f"{field} {raw!r} holds an unpaired UTF-16 surrogate, which is not text",
            )
        return raw
    if isinstance(raw, int):
        return str(raw)
    if isinstance(raw, Decimal):
        return str(raw)
    if isinstance(raw, float):
        return repr(raw)
    raise _BadValue(RejectReason.WRONG_TYPE, f"{field} has unsupported type {type(raw).__name__}")


def _is_missing(raw: object) -> bool:
    return raw is None or (isinstance(raw, str) and raw.strip() == "")


def canonical_value(field: str, raw: object) -> str | None:
    """The value of ``field`` as rules and keys compare it; None when absent.

    Raises ``ValueError`` (with the reason) when the value has a wrong type for the field.
    """
    spec = FIELDS_BY_NAME[field]
    if _is_missing(raw):
        return None
    try:
        return _canonical(spec, raw)
    except _BadValue as exc:
        raise ValueError(exc.message) from exc


def parse_key_values(text: str) -> dict[str, str]:
    """A key written ``field=value[,field=value]``, each value canonical (``12`` and ``"12"``
    agree). Raises ``ValueError`` naming the part that is wrong."""
    key: dict[str, str] = {}
    for part in filter(None, text.split(",")):
        name, sep, value = part.partition("=")
        if not sep or name not in RULE_FIELDS:
            raise ValueError(f"part {part!r} must be field=value with a field of {RULE_FIELDS}")
        canonical = canonical_value(name, value)
        if canonical is None:
            raise ValueError(f"{name} has an empty value")
        key[name] = canonical
    return key


def _canonical(spec: FieldSpec, raw: object) -> str:
    if spec.kind is FieldKind.AMOUNT:
        return format_decimal(parse_amount(raw, spec.name))
    if spec.kind is FieldKind.TIME:
        return str(_event_time(raw))
    if spec.kind is FieldKind.IDENTITY and not (
        isinstance(raw, str) or (isinstance(raw, int) and not isinstance(raw, bool))
    ):
        raise _BadValue(
            RejectReason.WRONG_TYPE,
            f"{spec.name} must be a string or integer, got {type(raw).__name__} {raw!r}",
        )
    text = _scalar_text(spec.name, raw)
    if spec.kind is FieldKind.ENUM and text not in spec.allowed:
        raise _BadValue(
            RejectReason.UNKNOWN_ENUM,
            f"{spec.name} {text!r} is not one of {sorted(spec.allowed)}",
        )
    return text


def _event_time(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _BadValue(
            RejectReason.WRONG_TYPE,
            f"eventTime must be an integer of epoch milliseconds, got {raw!r}",
        )
    if raw < 0 or raw >= MAX_EVENT_TIME:
        raise _BadValue(RejectReason.TIME_OUT_OF_RANGE, f"eventTime {raw} is negative or too large")
    return raw


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number here")


def parse_event_object(obj: object) -> Event | Rejection:
    """Validate one decoded JSON value against the schema."""
    if type(obj) is dict:
        plain = _plain_event(obj)
        if plain is not None:
            return plain
    return _checked_event(obj)


# An amount spelled plainly: no sign, exponent or leading zero, at most 18 digits before
# the point and 8 after: in range and precision by its spelling alone.
_PLAIN_AMOUNT = re.compile(r"(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,8})?")
_REQUIRED_TEXT = tuple(f.name for f in EVENT_FIELDS if f.required and f.kind is FieldKind.KEY)
_OPTIONAL_TEXT = tuple(f.name for f in EVENT_FIELDS if not f.required)
_PAYMENT_TYPES = FIELDS_BY_NAME["paymentType"].allowed


def _plain_event(obj: dict[str, Any]) -> Event | None:
    """The common event, taken without ``_checked_event``'s field-by-field dispatch:
    ASCII strings and integers where text goes, an integer eventTime in range, a plainly
    spelled amount. Anything else gives None, and ``_checked_event`` decides (with its
    exact reasons). Equal to ``_checked_event`` wherever it answers (property-tested)."""
    transaction_id = _plain_text(obj.get("transactionId"))
    event_time = obj.get("eventTime")
    payment_type = obj.get("paymentType")
    if (
        transaction_id is None
        or not isinstance(event_time, int)
        or isinstance(event_time, bool)
        or not 0 <= event_time < MAX_EVENT_TIME
        or not isinstance(payment_type, str)
        or payment_type not in _PAYMENT_TYPES
    ):
        return None
    raw_amount = obj.get("paymentAmount")
    if isinstance(raw_amount, bool):
        return None
    if isinstance(raw_amount, int):
        if not 0 <= raw_amount < MAX_AMOUNT:
            return None
        amount, amount_text = Decimal(raw_amount), str(raw_amount)
    else:
        if isinstance(raw_amount, str):
            spelled = raw_amount
        elif isinstance(raw_amount, Decimal):
            spelled = str(raw_amount)
        else:
            return None
        if not _PLAIN_AMOUNT.fullmatch(spelled):
            return None
        amount = raw_amount if isinstance(raw_amount, Decimal) else Decimal(spelled)
        amount_text = spelled.rstrip("0").rstrip(".") if "." in spelled else spelled
    values: dict[str, str | None] = {
        "transactionId": transaction_id,
        "eventTime": str(event_time),
    }
    for name in _REQUIRED_TEXT:
        text = _plain_text(obj.get(name))
        if text is None:
            return None
        values[name] = text
    values["paymentAmount"] = amount_text
    values["paymentType"] = payment_type
    for name in _OPTIONAL_TEXT:
        raw = obj.get(name)
        if raw is None:
            values[name] = None
            continue
        text = _plain_text(raw)
        if text is None:
            if isinstance(raw, str) and not raw.strip():
                values[name] = None  # blank: absent
                continue
            return None
        values[name] = text
    return Event(transaction_id, event_time, amount, values)


def _plain_text(raw: object) -> str | None:
    """A non-blank ASCII string as it is, an integer as its digits; None otherwise."""
    if isinstance(raw, str):
        return raw if raw.isascii() and raw.strip() else None
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    return None


def _checked_event(obj: object) -> Event | Rejection:
    """Every field checked in turn against its kind, with the reason of the first that
    fails."""
    if not isinstance(obj, dict):
        return Rejection(
            RejectReason.NOT_OBJECT, f"expected a JSON object, got {type(obj).__name__}"
        )
    values: dict[str, str | None] = {}
    event_time, amount = 0, Decimal(0)
    try:
        for spec in EVENT_FIELDS:
            raw = obj.get(spec.name)
            if _is_missing(raw):
                if spec.required:
                    raise _BadValue(
                        RejectReason.MISSING_FIELD, f"{spec.name} is missing, null or empty"
                    )
                values[spec.name] = None
            elif spec.kind is FieldKind.AMOUNT:  # required: exactly one, the payment amount
                amount = parse_amount(raw, spec.name)
                values[spec.name] = format_decimal(amount)
            elif spec.kind is FieldKind.TIME:  # required: exactly one, the eventTime
                event_time = _event_time(raw)
                values[spec.name] = str(event_time)
            else:
                values[spec.name] = _canonical(spec, raw)
    except _BadValue as exc:
        return Rejection(exc.code, exc.message)
    transaction_id = values["transactionId"]
    if transaction_id is None:  # required, so checked above; keeps the type checker honest
        return Rejection(RejectReason.MISSING_FIELD, "transactionId is missing")
    return Event(transaction_id, event_time, amount, values)


def parse_event_line(line: str) -> Event | Rejection:
    """Validate one line of JSON text. Never raises on bad input."""
    try:
        obj = json.loads(line, parse_float=Decimal, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        return Rejection(RejectReason.NOT_JSON, f"not valid JSON: {exc}")
    return parse_event_object(obj)


def is_blank(line: str) -> bool:
    """Blank lines carry no event; readers skip them rather than quarantine them."""
    return line.strip() == ""
