"""The cooldown's definition (SPEC §3), one alert at a time: the reference the columnar
``velocity.engine.cooldown`` is held to.

For one rule version and one key, ordered by (eventTime, transactionId): the first alert
is notified; each next one is notified when its eventTime is at least the cooldown after
the eventTime of the last notified one; the others are suppressed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import NamedTuple


class CooledAlert(NamedTuple):
    """An alert as the cooldown sees it: whose (a rule version and a key), and when."""

    group: Hashable
    event_time: int
    transaction_id: str


class LastNotified(NamedTuple):
    event_time: int
    transaction_id: str


def notified_reference(
    alerts: Iterable[CooledAlert],
    cooldown_ms: Mapping[Hashable, int],
    last: Mapping[Hashable, LastNotified] | None = None,
) -> tuple[dict[CooledAlert, str | None], dict[Hashable, LastNotified]]:
    """Each alert's suppressor (the transactionId of the notified alert that suppressed
    it; None: notified), and each group's last notified alert after them, given the last
    one before them (``last``)."""
    state = dict(last or {})
    out: dict[CooledAlert, str | None] = {}
    for alert in sorted(alerts, key=lambda a: (repr(a.group), a.event_time, a.transaction_id)):
        cooldown = cooldown_ms.get(alert.group, 0)
        before = state.get(alert.group)
        if cooldown <= 0 or before is None or alert.event_time >= before.event_time + cooldown:
            out[alert] = None
            if cooldown > 0:
                state[alert.group] = LastNotified(alert.event_time, alert.transaction_id)
        else:
            out[alert] = before.transaction_id
    return out, state
