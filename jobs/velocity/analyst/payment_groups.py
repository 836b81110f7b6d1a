"""A case's alerts grouped by payment and paged (pure: no Spark, Delta, Redis or Airflow;
the alerts come from ``velocity.delta.reader.case_alerts``).

Invariants:

- One group a payment (its transactionId): its alerts in the order the case store gives
  them (time order: eventTime, then ruleId).
- Payments newest first by (eventTime, transactionId), a total order, so a page boundary
  (``PaymentCursor``) is exact: the next page holds the payments below it.
- A page is drawn from the case's newest alerts read so far; a payment at the oldest
  eventTime read may have older alerts not read yet, so it is listed only once every
  alert is read or a later read brings it whole (``payment_page`` returns None: read
  more).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from velocity.analyst.alert_search import InvalidFilterError

PAYMENTS_PAGE_SIZE = 50  # payments a case's page lists unless asked otherwise
PAYMENTS_PAGE_MAX = 200
# The URL fields of a case's alerts' pages.
PAYMENT_PAGE_FIELDS = ("alerts_before", "alerts_limit")


@dataclass(frozen=True, order=True)
class PaymentCursor:
    """A page boundary: the (eventTime, transactionId) of the last payment listed."""

    event_time: int
    transaction_id: str

    def text(self) -> str:
        return f"{self.event_time}_{self.transaction_id}"


def parse_payment_cursor(text: str) -> PaymentCursor:
    moment, sep, tx = text.strip().partition("_")
    if not (sep and tx and moment.isascii() and moment.isdigit() and len(moment) <= 19):
        raise InvalidFilterError(
            "alerts_before", f"{text!r} is not a page boundary (<eventTime>_<transactionId>)"
        )
    return PaymentCursor(int(moment), tx)


def parse_payment_limit(text: str | None) -> int:
    if not text:
        return PAYMENTS_PAGE_SIZE
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= PAYMENTS_PAGE_MAX:
        raise InvalidFilterError(
            "alerts_limit", f"{text!r} is not a number from 1 to {PAYMENTS_PAGE_MAX}"
        )
    return int(text)


@dataclass
class PaymentGroup:
    """A payment of the case and its alerts, in time order."""

    transaction_id: str
    event_time: int
    alerts: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def place(self) -> PaymentCursor:
        return PaymentCursor(self.event_time, self.transaction_id)


@dataclass(frozen=True)
class PaymentPage:
    """Payments newest first; ``older``: the next page's boundary, None at the last."""

    payments: Sequence[PaymentGroup]
    older: PaymentCursor | None


def group_by_payment(alerts: Sequence[Mapping[str, Any]]) -> list[PaymentGroup]:
    """The alerts (time order) gathered by transactionId, each group in time order."""
    groups: dict[str, PaymentGroup] = {}
    for alert in alerts:
        tx = str(alert.get("transactionId"))
        group = groups.get(tx)
        if group is None:
            group = groups[tx] = PaymentGroup(tx, int(alert.get("eventTime") or 0))
        group.alerts.append(alert)
    return list(groups.values())


def payment_page(
    alerts: Sequence[Mapping[str, Any]],
    all_read: bool,
    before: PaymentCursor | None = None,
    limit: int = PAYMENTS_PAGE_SIZE,
) -> PaymentPage | None:
    """The first ``limit`` payments below ``before``, newest first, of ``alerts`` (the
    case's newest alerts, in time order; ``all_read``: every alert of the case). None when
    that cannot be told without older alerts: read more and ask again."""
    groups = group_by_payment(alerts)
    oldest = min((g.event_time for g in groups), default=0)
    whole = [g for g in groups if all_read or g.event_time > oldest]
    below = sorted(
        (g for g in whole if before is None or g.place < before),
        key=lambda g: g.place,
        reverse=True,
    )
    if not all_read and len(below) < limit:
        return None
    shown = below[:limit]
    # Not all read: the payment at the oldest eventTime read lies below this page too.
    older = shown[-1].place if shown and (len(below) > limit or not all_read) else None
    return PaymentPage(shown, older)


def read_payment_page(
    read: Any, before: PaymentCursor | None, limit: int, first: int = 0
) -> PaymentPage:
    """The page, from ``read(n)`` (the case's newest ``n`` alerts, in time order), reading
    4 times more each time the page cannot be told yet: the first page costs about its own
    alerts; a page further down, the alerts above it too."""
    wanted = first or 4 * (limit + 1)
    while True:
        alerts = read(wanted)
        page = payment_page(alerts, len(alerts) < wanted, before, limit)
        if page is not None:
            return page
        wanted *= 4
