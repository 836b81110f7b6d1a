"""Why an alert fired: the events of its window and the figures that make its value (pure);
and how the pre-authorization check judged each rule (``check_working``).

An alert names its rule version, key and window ``[windowStart, windowEnd]`` (SPEC §4).
Its explanation is every accepted event of that key that passes the rule's filter inside
the window, and the aggregate recomputed from exactly those events, shown as the figures
an analyst can add up by hand. ``agrees`` says whether they give the alert's value.

A stream ALERT counts the events that had arrived up to and including its micro-batch
(SPEC §3, Streaming): the caller passes only those. An amendment (CORRECTION) counts
complete data: every event known when it was decided. Events that arrived after a
decision make the recount differ; the explanation then says so rather than hiding it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from velocity.analyst.alert_search import duration_text, key_text
from velocity.domain.alerts import AlertKind, alert_id
from velocity.domain.buckets import BucketAggregate, aggregate_of_events
from velocity.domain.rules import Aggregator, Rule, aggregate_text
from velocity.domain.rules import key_text as signature_key_text
from velocity.domain.schema import Event
from velocity.domain.stream_batch import key_groups
from velocity.domain.windows import KeyedEvent, aggregate_value, format_aggregate

# A window can hold months of a busy key's payments: show the newest (the alerted one
# among them), count them all.
SHOWN_EVENTS = 200
SHOWN_VALUES = 50


@dataclass(frozen=True)
class Explanation:
    """An alert, the events of its window, and the aggregate they give."""

    alert: Mapping[str, Any]
    rule: Rule
    events: tuple[KeyedEvent, ...]
    figures: BucketAggregate
    recomputed: str | None  # None: the window holds no value for the aggregator

    @property
    def agrees(self) -> bool:
        if self.recomputed is None:
            return False
        return Decimal(self.recomputed) == Decimal(self.alert["aggregateValue"])

    @property
    def arithmetic(self) -> str:
        """The one line that adds up to the value: ``a + b + c = total``, ``n events``, …
        (a busy window shows its newest values and counts the earlier ones)."""
        figures, rule = self.figures, self.rule
        valued = [e.value for e in self.events if e.value is not None]
        shown, earlier = valued[-SHOWN_EVENTS:], max(0, len(valued) - SHOWN_EVENTS)

        def listed(separator: str) -> str:
            return (f"… ({earlier} earlier){separator}" if earlier else "") + separator.join(shown)

        match rule.aggregator:
            case Aggregator.COUNT:
                return f"{figures.count} events in the window"
            case Aggregator.UNIQUE_COUNT:
                values = sorted(figures.distinct)
                more = (
                    f", … ({len(values) - SHOWN_VALUES} more)" if len(values) > SHOWN_VALUES else ""
                )
                return (
                    f"{figures.distinct_count} distinct {rule.aggregate_field}: "
                    f"{', '.join(values[:SHOWN_VALUES])}{more}"
                )
            case Aggregator.SUM:
                return f"{listed(' + ')} = {self.recomputed}"
            case Aggregator.AVG:
                total = _text(figures.total)
                count = figures.value_count
                return f"({listed(' + ')}) / {count} = {total} / {count} = {self.recomputed}"
            case Aggregator.MIN:
                return f"min({listed(', ')}) = {self.recomputed}"
            case Aggregator.MAX:
                return f"max({listed(', ')}) = {self.recomputed}"
        raise AssertionError(rule.aggregator)  # unreachable: match is exhaustive

    @property
    def verdict(self) -> str:
        if self.agrees:
            return (
                f"the {len(self.events)} events of the window give {self.recomputed}, "
                f"the alert's value: {self.alert['aggregateValue']} "
                f"{self.alert['limitOperatorType']} {self.alert['limit']}"
            )
        return (
            f"the {len(self.events)} events known now give {self.recomputed}, not the alert's "
            f"{self.alert['aggregateValue']}: events of the window arrived after the decision "
            "(a backfill amends it), or the alert was retracted"
        )

    @property
    def notification(self) -> str | None:
        """Whether the alert was notified or its rule's cooldown suppressed it, and by
        which notified alert (SPEC §3); None for a rule without a cooldown."""
        alert, rule = self.alert, self.rule
        if alert.get("suppressed"):
            by = alert.get("suppressedBy")
            return (
                f"suppressed by the rule's {rule.cooldown_minutes}-minute cooldown: the "
                f"notified alert {suppressor_alert_id(alert)} (transaction {by}) of this "
                "key came less than the cooldown before it; recorded, not published"
            )
        if rule.cooldown_minutes and alert["kind"] == AlertKind.ALERT.value:
            return (
                f"notified: the first of its key, or at least {rule.cooldown_minutes} "
                "minutes after the key's last notified alert"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "alert": dict(self.alert),
            "rule": {"version": self.rule.version, **self.rule.to_json()},
            "eventCount": len(self.events),
            "events": [
                {
                    "transactionId": e.transaction_id,
                    "eventTime": e.event_time,
                    "value": e.value,
                }
                for e in self.events[-SHOWN_EVENTS:]
            ],
            "figures": {
                "count": self.figures.count,
                "valueCount": self.figures.value_count,
                "sum": _text(self.figures.total),
                "min": _text(self.figures.minimum),
                "max": _text(self.figures.maximum),
                "distinctCount": self.figures.distinct_count,
            },
            "arithmetic": self.arithmetic,
            "recomputedValue": self.recomputed,
            "agrees": self.agrees,
            "verdict": self.verdict,
            "notification": self.notification,
            "suppressedByAlertId": suppressor_alert_id(self.alert),
        }


def suppressor_alert_id(alert: Mapping[str, Any]) -> str | None:
    """The alertId of the notified alert that suppressed ``alert`` (None: notified)."""
    by = alert.get("suppressedBy")
    if not alert.get("suppressed") or by is None:
        return None
    return alert_id(alert["ruleId"], alert["ruleVersion"], by, AlertKind.ALERT)


def _text(value: Decimal | None) -> str | None:
    return None if value is None else format_aggregate(value)


def alert_key_text(alert: Mapping[str, Any], rule: Rule) -> str:
    """The alert's key as the signature's key text (its fields in signature order)."""
    key = alert["key"]
    return signature_key_text(tuple(str(key[name]) for name in rule.signature.grouping_keys))


def explain_alert(alert: Mapping[str, Any], rule: Rule, events: Iterable[Event]) -> Explanation:
    """The explanation of ``alert`` (a SPEC §4 record) by ``rule`` (its version) from
    ``events``: any accepted events, at least those of the window that counted."""
    if alert["ruleId"] != rule.rule_id or alert["ruleVersion"] != rule.version:
        raise ValueError(
            f"alert of ruleId {alert['ruleId']} v{alert['ruleVersion']} explained with "
            f"ruleId {rule.rule_id} v{rule.version}"
        )
    if alert["kind"] == AlertKind.RETRACTION:
        raise ValueError("a RETRACTION withdraws an earlier alert; explain that alert instead")
    lower, upper = alert["windowStart"], alert["windowEnd"]
    signature = rule.signature
    groups = key_groups((e for e in events if lower <= e.event_time <= upper), [signature])
    in_window = sorted(
        groups.get((signature.signature_id, alert_key_text(alert, rule)), []),
        key=lambda e: (e.event_time, e.transaction_id),
    )
    figures = aggregate_of_events((e.value, e.number) for e in in_window)
    value = aggregate_value(figures, rule.aggregator)
    recomputed = None if value is None else format_aggregate(value)
    return Explanation(alert, rule, tuple(in_window), figures, recomputed)


def check_working(checked: Mapping[str, Any], rule: Rule | None, payment: Event) -> str:
    """How the pre-authorization check judged one rule (an entry of its answer's ``rules``,
    SPEC §5a) for ``payment``, in words: ``SUM(paymentAmount) over 1 d by payerId=p-18 =
    250120.5 (the payment's 120.5 included) > 200000 → fires: BLOCK``. ``rule``: the version
    the check evaluated (None: not known here; the words then name the rule by its id). No
    events are listed: the check reads the window's buckets, never its events."""
    key = checked.get("key") or {}
    if rule is None:
        measured = f"ruleId {checked['ruleId']} v{checked['ruleVersion']}"
    else:
        measured = f"{aggregate_text(rule)} over {duration_text(rule.window_ms)}"
    order = rule.grouping_keys if rule else ()
    measured += f" by {key_text(key, order)}" if key else " of all payments"
    comparison = f"{checked['limitOperatorType']} {checked['limit']}"
    value = checked.get("aggregateValue")
    own = _payment_part(rule, payment)
    if value is None:
        return f"{measured}: no value in the window{own} → does not fire"
    if not checked["fired"]:
        return f"{measured} = {value}{own}, not {comparison} → does not fire"
    text = f"{measured} = {value}{own} {comparison} → fires: {checked['outcome']}"
    if "notified" in checked:
        cooldown = f"its {rule.cooldown_minutes}-minute cooldown" if rule else "its cooldown"
        text += (
            f"; its alert would be notified (none of this key's within {cooldown})"
            if checked["notified"]
            else f"; its alert would be suppressed: this key alerted within {cooldown}"
        )
    return text


def _payment_part(rule: Rule | None, payment: Event) -> str:
    """What the payment itself adds to its window (the check counts it in, SPEC §5a)."""
    if rule is None:
        return ""
    if rule.aggregator is Aggregator.COUNT or rule.aggregate_field is None:
        return " (the payment included)"
    own = payment.value(rule.aggregate_field)
    if own is None:
        return f" (the payment has no {rule.aggregate_field})"
    return f" (the payment's {own} included)"
