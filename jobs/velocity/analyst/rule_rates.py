"""Each rule's alerts per minute over the last minutes, notified and suppressed, and the
share of payments it fires on (pure: ``velocity.delta.reader.alert_minutes`` counts them
in the alerts and events tables).

Invariants:

- Minutes are whole UTC minutes by decisionTime, oldest first; the last is the minute
  ``now`` lies in (still filling).
- A rule's share is the payments it fired on (distinct transactions of its ALERT rows,
  notified or suppressed: a cooldown changes what is notified, not what fires) over the
  payments accepted in the same minutes; None without payments.
- A rule fires "often" when its share is over ``WARN_SHARE``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MINUTE_MS = 60_000
RATE_MINUTES = 10
WARN_SHARE = 0.2


def minute_starts(now_ms: int, minutes: int = RATE_MINUTES) -> list[int]:
    """The starts of the ``minutes`` whole minutes up to the one ``now_ms`` lies in."""
    current = now_ms - now_ms % MINUTE_MS
    return [current - (minutes - 1 - i) * MINUTE_MS for i in range(minutes)]


@dataclass(frozen=True)
class RuleRate:
    """One rule's figures over the minutes (``minute_starts``)."""

    rule_id: int
    minutes: tuple[int, ...]
    notified: tuple[int, ...]  # per minute
    suppressed: tuple[int, ...]
    fired_payments: int
    payments: int

    @property
    def share(self) -> float | None:
        return None if self.payments <= 0 else self.fired_payments / self.payments

    @property
    def fires_often(self) -> bool:
        share = self.share
        return share is not None and share > WARN_SHARE


def rule_rates(
    counts: Iterable[tuple[int, int, bool, int]],
    fired_payments: Mapping[int, int],
    payments: int,
    rule_ids: Iterable[int],
    now_ms: int,
    minutes: int = RATE_MINUTES,
) -> dict[int, RuleRate]:
    """Each of ``rule_ids``' figures from ``counts`` (ruleId, minute start, suppressed,
    alerts), ``fired_payments`` (ruleId → distinct transactions fired on) and
    ``payments`` (accepted in the same minutes); counts outside the minutes are left out,
    and a rule without alerts has zeros."""
    starts = minute_starts(now_ms, minutes)
    index = {start: i for i, start in enumerate(starts)}
    notified: dict[int, list[int]] = {}
    suppressed: dict[int, list[int]] = {}
    for rule_id, minute, is_suppressed, n in counts:
        slot = index.get(minute)
        if slot is None:
            continue
        table = suppressed if is_suppressed else notified
        table.setdefault(rule_id, [0] * minutes)[slot] += n
    return {
        rule_id: RuleRate(
            rule_id=rule_id,
            minutes=tuple(starts),
            notified=tuple(notified.get(rule_id, [0] * minutes)),
            suppressed=tuple(suppressed.get(rule_id, [0] * minutes)),
            fired_payments=int(fired_payments.get(rule_id, 0)),
            payments=payments,
        )
        for rule_id in rule_ids
    }
