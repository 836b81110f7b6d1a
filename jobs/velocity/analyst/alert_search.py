"""Searching and paging the alerts people look at (pure: no Spark, Delta, Redis or Airflow).

The Velocity page lists alerts newest first from two sources: the alerts table (Delta, the
state of record) and the Redis alert stream, whose newest entries the stream has not
written to Delta yet (it writes behind Redis). This module decides what a page holds;
``velocity.delta.reader`` and ``velocity.redis.alert_feed`` fetch the candidates.

Invariants:

- Order: newest first by (decisionTime, alertId), a total order (alertIds are unique), so
  a page boundary (``Cursor``) is exact: the next page holds exactly the matching alerts
  below it, whatever arrived since.
- An alert on both sources is listed once (by alertId): a record is the same on both.
- A filter is refused whole (``InvalidFilterError``) naming the field at fault; every
  field given must hold, an empty field does not filter.
- Time bounds are of the alert's eventTime (the payment's time), in UTC, both inclusive;
  a bound written to the minute or the day covers the whole minute or day at its upper end
  (``to=2026-01-01 10:05`` takes 10:05:59.999).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from velocity.domain.alerts import AlertKind
from velocity.domain.schema import RULE_FIELDS, canonical_value
from velocity.errors import InvalidFieldError

PAGE_SIZE = 50  # alerts a page lists unless asked otherwise
PAGE_MAX = 500
# The filter's fields, by their names in a URL (and the page's form).
FILTER_FIELDS = ("rule", "kind", "key", "tx", "from", "to")


class InvalidFilterError(InvalidFieldError):
    """A filter refused whole; ``field`` names the URL field at fault."""


@dataclass(frozen=True)
class KeyPart:
    """``payerId=p-1`` (field and canonical value), or a bare value matching any key field."""

    field: str | None
    value: str

    def matches(self, key: Mapping[str, Any]) -> bool:
        if self.field is None:
            return any(str(v) == self.value for v in key.values())
        return self.field in key and str(key[self.field]) == self.value


@dataclass(frozen=True)
class AlertFilter:
    """Which alerts a person asked for; the default takes every alert."""

    rule_id: int | None = None
    kind: AlertKind | None = None
    key: tuple[KeyPart, ...] = ()
    transaction_id: str | None = None
    from_ms: int | None = None  # eventTime bounds, inclusive
    to_ms: int | None = None
    # The fields as written (stripped), for the form and the links that keep the filter.
    text: Mapping[str, str] = field(default_factory=dict, compare=False)

    def matches(self, alert: Mapping[str, Any]) -> bool:
        """Whether a SPEC §4 record (or a row of the alerts table) passes every field."""
        if self.rule_id is not None and alert.get("ruleId") != self.rule_id:
            return False
        if self.kind is not None and alert.get("kind") != self.kind.value:
            return False
        if self.transaction_id is not None and str(alert.get("transactionId")) != (
            self.transaction_id
        ):
            return False
        event_time = alert.get("eventTime")
        if self.from_ms is not None or self.to_ms is not None:
            if not isinstance(event_time, int) or isinstance(event_time, bool):
                return False
            if self.from_ms is not None and event_time < self.from_ms:
                return False
            if self.to_ms is not None and event_time > self.to_ms:
                return False
        key = alert.get("key")
        if self.key and not isinstance(key, Mapping):
            return False
        return all(part.matches(key) for part in self.key)  # type: ignore[arg-type]

    @property
    def empty(self) -> bool:
        return self == AlertFilter()

    def query(self) -> dict[str, str]:
        """The non-empty fields as URL parameters, as written."""
        return {name: self.text[name] for name in FILTER_FIELDS if self.text.get(name)}


def parse_filter(params: Mapping[str, str], rule_ids: Collection[int] | None) -> AlertFilter:
    """The filter of URL parameters ``rule``, ``kind``, ``key``, ``tx``, ``from``, ``to``
    (others are ignored); ``rule_ids``: the ruleIds that ever existed (None: not checked)."""
    text = {name: str(params.get(name) or "").strip() for name in FILTER_FIELDS}
    rule_id = None
    if text["rule"]:
        if not (text["rule"].isascii() and text["rule"].isdigit() and len(text["rule"]) <= 18):
            raise InvalidFilterError("rule", f"{text['rule']!r} is not a ruleId (a number)")
        rule_id = int(text["rule"])
        if rule_ids is not None and rule_id not in rule_ids:
            known = ", ".join(str(r) for r in sorted(rule_ids)) or "none"
            raise InvalidFilterError(
                "rule", f"no ruleId {rule_id} in the rules table (ruleIds: {known})"
            )
    kind = None
    if text["kind"]:
        try:
            kind = AlertKind(text["kind"].upper())
        except ValueError:
            choices = ", ".join(k.value for k in AlertKind)
            raise InvalidFilterError(
                "kind", f"{text['kind']!r} is not a kind; use one of {choices}"
            ) from None
    from_ms = parse_time(text["from"], "from", upper=False) if text["from"] else None
    to_ms = parse_time(text["to"], "to", upper=True) if text["to"] else None
    if from_ms is not None and to_ms is not None and to_ms < from_ms:
        raise InvalidFilterError("to", f"{text['to']!r} is before from {text['from']!r}")
    return AlertFilter(
        rule_id=rule_id,
        kind=kind,
        key=parse_key_filter(text["key"]),
        transaction_id=text["tx"] or None,
        from_ms=from_ms,
        to_ms=to_ms,
        text={k: v for k, v in text.items() if v},
    )


def parse_key_filter(text: str) -> tuple[KeyPart, ...]:
    """``payerId=p-4041, beneficiaryId=2034`` (the page shows keys so: a shown key can be
    pasted), or a bare value matched against every key field; values compared canonically."""
    parts = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        name, sep, value = (s.strip() for s in piece.partition("="))
        if not sep:
            name, value = "", name
        elif name not in RULE_FIELDS:
            raise InvalidFilterError(
                "key", f"{name!r} is not a field rules use; use one of {', '.join(RULE_FIELDS)}"
            )
        if not value:
            raise InvalidFilterError("key", f"{piece!r} has no value")
        if not name:
            parts.append(KeyPart(None, value))
            continue
        try:
            canonical = canonical_value(name, value)
        except ValueError as exc:
            raise InvalidFilterError("key", f"{piece!r}: {exc}") from None
        parts.append(KeyPart(name, canonical if canonical is not None else value))
    return tuple(parts)


# Date, optional time (minutes, seconds, fraction), optional zone: ISO 8601 with "T" or a
# space, as the page shows times ("2026-01-01 10:05:00.123Z").
_TIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?)?"
    r"\s*(Z|UTC|[+-]\d{2}:?\d{2})?",
    re.IGNORECASE,
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(text: str, field_name: str, upper: bool) -> int:
    """Epoch ms of a time written as ISO 8601 (UTC unless it names an offset) or as epoch
    ms. ``upper``: the last ms of the unit written (a day, minute or second), for an
    inclusive upper bound."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        return int(text)
    match = _TIME.fullmatch(text)
    if match is None:
        raise InvalidFilterError(
            field_name,
            f"{text!r} is not a time; write 2026-01-01 10:05 (UTC), 2026-01-01T10:05:00Z "
            "or epoch milliseconds",
        )
    day, hour, minute, second, fraction, zone = match.groups()
    try:
        moment = datetime.fromisoformat(day).replace(tzinfo=UTC)
        moment = moment.replace(
            hour=int(hour or 0),
            minute=int(minute or 0),
            second=int(second or 0),
            microsecond=int((fraction or "0").ljust(6, "0")),
        )
    except ValueError as exc:
        raise InvalidFilterError(field_name, f"{text!r} is not a time: {exc}") from None
    if zone and zone.upper() not in ("Z", "UTC"):
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        moment -= sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    if upper:
        unit = (
            timedelta(days=1)
            if hour is None
            else timedelta(minutes=1)
            if second is None
            else timedelta(seconds=1)
            if fraction is None
            else timedelta(microseconds=10 ** (6 - len(fraction)))
        )
        moment += unit - timedelta(microseconds=1)
    return (moment - _EPOCH) // timedelta(milliseconds=1)  # floors a fraction of a ms


@dataclass(frozen=True, order=True)
class Cursor:
    """A page boundary: the (decisionTime, alertId) of the last alert listed."""

    decision_time: int
    alert_id: str

    def text(self) -> str:
        return f"{self.decision_time}_{self.alert_id}"

    @classmethod
    def of(cls, alert: Mapping[str, Any]) -> Cursor:
        return cls(int(alert["decisionTime"]), str(alert["alertId"]))


def parse_cursor(text: str, field_name: str = "before") -> Cursor:
    """A cursor as ``Cursor.text`` writes it (``<decisionTime>_<alertId>``)."""
    time_text, sep, alert_id = text.strip().partition("_")
    if not (sep and alert_id and time_text.isascii() and time_text.isdigit()):
        raise InvalidFilterError(
            field_name, f"{text!r} is not a page boundary (<decisionTime>_<alertId>)"
        )
    return Cursor(int(time_text), alert_id)


def parse_limit(text: str | None) -> int:
    """How many alerts a page lists: ``PAGE_SIZE`` unless 1 to ``PAGE_MAX`` is asked for."""
    if not text:
        return PAGE_SIZE
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= PAGE_MAX:
        raise InvalidFilterError("limit", f"{text!r} is not a number from 1 to {PAGE_MAX}")
    return int(text)


@dataclass(frozen=True)
class AlertPage:
    """Alerts newest first; ``older``: the boundary of the next page, None at the last."""

    alerts: Sequence[Mapping[str, Any]]
    older: Cursor | None


def page_of(
    candidates: Iterable[Mapping[str, Any]],
    query: AlertFilter,
    before: Cursor | None,
    limit: int,
    more: bool = False,
) -> AlertPage:
    """The ``limit`` newest alerts of ``candidates`` that pass ``query`` and lie below
    ``before``, each alertId once. ``more``: a source held further matching alerts it did
    not hand over (so there is an older page even when the candidates fit this one)."""
    unique: dict[str, Mapping[str, Any]] = {}
    for alert in candidates:
        alert_id = str(alert.get("alertId"))
        if alert_id in unique or "decisionTime" not in alert:
            continue
        if query.matches(alert) and (before is None or Cursor.of(alert) < before):
            unique[alert_id] = alert
    ordered = sorted(unique.values(), key=Cursor.of, reverse=True)
    shown = ordered[:limit]
    older = Cursor.of(shown[-1]) if shown and (len(ordered) > limit or more) else None
    return AlertPage(shown, older)


def key_text(key: Mapping[str, Any] | None, order: Sequence[str] = ()) -> str:
    """``payerId=p-4041, beneficiaryId=2034``: the fields in ``order`` (the rule's grouping
    keys) first, the rest as given; "(all)" for the one group of a rule without keys."""
    if not key:
        return "(all)"
    names = [n for n in order if n in key] + [n for n in key if n not in order]
    return ", ".join(f"{name}={key[name]}" for name in names)


def duration_text(ms: int | float | None) -> str | None:
    """A duration for people: ``850 ms``, ``4.2 s``, ``42 s``, ``5 min 9 s``, ``2 h 5 min``,
    ``3 d 4 h``; None stays None."""
    if ms is None:
        return None
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms} ms"
    if ms < 10_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
