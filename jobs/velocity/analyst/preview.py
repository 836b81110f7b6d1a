"""What a rule would have fired over the last hours of accepted events (pure; issue 24).

The preview decides candidate rules, and the versions in force of the same ruleIds,
over a span of the live events table with the backtest's engine: the columnar fan-out
(``velocity.engine.fan_out.keyed_rows``), the kernel (``velocity.engine.kernel``) and
the alert rows and ids (``velocity.engine.records``, ``velocity.domain.alerts``), here on Arrow
in one process, where the backtest runs them in Spark tasks. Invariants:

- the span is ``(end - H hours, end]``, ``end`` the newest accepted eventTime (the
  anchor: a quiet stream still previews its last hour of events, not an empty hour);
- only events inside the span are decided; the events of the window before it are
  history: a signature's rows start at ``floor_g(span.start - W)`` for its widest
  window ``W``, the lower edge of the earliest decided event's window (SPEC §3), so a
  decision equals the backtest's over all the events, restricted to the span;
- rules are decided whatever their ``ruleState`` (a preview asks "if this were ACTIVE");
  an unsaved candidate has version 0, so its alert ids are those of version 0;
- the difference against the version in force is per transactionId: added (the
  candidate fires, the version in force does not), removed, changed value.

Nothing here reads a table: ``velocity.delta.preview_reader`` reads the events and the
rules in force and calls ``decide_span``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.analyst.explain import Explanation, explain_alert
from velocity.domain.alerts import record_of_stored
from velocity.domain.buckets import bucket_start
from velocity.domain.decimals import dumps_json
from velocity.domain.rules import Rule, RuleSignature, RuleState, rule_summary
from velocity.domain.schema import FIELDS_BY_NAME, Event
from velocity.engine.cooldown import notify
from velocity.engine.fan_out import canonical_texts, keyed_rows
from velocity.engine.kernel import Decisions, decide_history, value_texts
from velocity.engine.records import alert_rows
from velocity.errors import UsageError

HOUR_MS = 3_600_000
# Alerts shown with their explanation per rule, and transactions listed per kind of
# difference, unless the caller asks for another number.
SAMPLE_SIZE = 5
DIFF_SHOWN = 10

# The keyed rows as Arrow, as ``velocity.spark.evaluate`` has them from Spark's
# KEYED_SCHEMA (a unit test holds them equal), written out so that the preview imports no
# Spark. The alerts' columns come from the caller (``alert_schema``: the alerts table's,
# which the engine's alert rows fill).
AMOUNT_ARROW = pa.decimal128(26, 8)
KEYED_ARROW = pa.schema(
    [
        pa.field("signature_id", pa.string(), False),
        pa.field("key", pa.string(), False),
        pa.field("eventTime", pa.int64(), False),
        pa.field("transactionId", pa.string(), False),
        pa.field("value", pa.string()),
        pa.field("number", AMOUNT_ARROW),
    ]
)


@dataclass(frozen=True)
class Span:
    """The events decided: eventTime in ``(start, end]``."""

    start: int  # exclusive
    end: int  # inclusive: the newest accepted eventTime

    def to_json(self) -> dict[str, int]:
        return {"start": self.start, "end": self.end}


def span_of(newest_ms: int, hours: float) -> Span:
    """The last ``hours`` (fractions allowed) before and at ``newest_ms``."""
    if not (isinstance(hours, (int, float)) and math.isfinite(hours) and hours > 0):
        raise UsageError(f"hours must be a positive number, got {hours!r}")
    return Span(newest_ms - round(hours * HOUR_MS), newest_ms)


def history_start(span: Span, window_ms: int, width_ms: int) -> int:
    """The oldest eventTime the window of an event of ``span`` can hold: ``floor_g(t - W)``
    is never below ``floor_g(span.start - W)`` for ``t > span.start``."""
    return bucket_start(span.start - window_ms, width_ms)


def read_from(span: Span, rules: Sequence[Rule], width_ms: int) -> int:
    """The oldest eventTime any of ``rules`` needs to decide ``span`` (its widest window)."""
    widest = max(rule.window_ms for rule in rules)
    return history_start(span, widest, width_ms)


def event_fields(rules: Sequence[Rule]) -> list[str]:
    """The events table's columns the fan-out of ``rules``' signatures reads."""
    names: set[str] = set()
    for rule in rules:
        signature = rule.signature
        names.update(signature.grouping_keys)
        names.update(name for name, _ in signature.filter)
        if signature.aggregate_field:
            names.add(signature.aggregate_field)
    return ["eventTime", "transactionId", *sorted(names - {"eventTime", "transactionId"})]


@dataclass(frozen=True)
class Fired:
    """One rule's alerts over a span: its decisions over the keyed rows of its signature."""

    rule: Rule
    keyed: pa.Table  # KEYED_ARROW columns (and ``decide``) of the rule's signature
    decisions: Decisions  # rows index ``keyed``; ``rules`` all 0 (``rule``)

    def __len__(self) -> int:
        return len(self.decisions)

    def table(self) -> pa.Table:
        """transactionId, eventTime, aggregateValue, windowStart: one row per alert."""
        rows = pa.array(self.decisions.rows, pa.int64())
        return pa.table(
            {
                "transactionId": self.keyed.column("transactionId").take(rows),
                "eventTime": self.keyed.column("eventTime").take(rows),
                "aggregateValue": self.decisions.texts(),
                "windowStart": pa.array(self.decisions.window_starts, pa.int64()),
            }
        )

    @cached_property
    def _times(self) -> np.ndarray:
        times = self.keyed.column("eventTime").combine_chunks().to_numpy()
        return np.asarray(times[self.decisions.rows], dtype=np.int64)

    def event_times(self) -> np.ndarray:
        """The eventTime of each alert (made once: millions of alerts are no rarity)."""
        return self._times

    @cached_property
    def suppressed_by(self) -> pa.Array:
        """Per alert, the notified alert that the rule's cooldown suppressed it by (null:
        notified), counted from the span's start (no notification before it is known)."""
        return notify(self.decisions, self.keyed, [self.rule]).suppressed_by

    def notified(self) -> np.ndarray:
        """Which alerts would be notified (published)."""
        return self.suppressed_by.is_null().to_numpy(zero_copy_only=False)

    def alerts(
        self, decision_time: int, alert_schema: pa.Schema, positions: np.ndarray | None = None
    ) -> pa.Table:
        """The alerts table's rows (``alert_schema``) of the alerts at ``positions`` (all
        when None), with the backtest's alert ids."""
        d = self.decisions
        chosen = np.arange(len(d)) if positions is None else np.asarray(positions, dtype=np.int64)
        picked = Decisions(
            d.rows[chosen], d.rules[chosen], d.values[chosen], d.window_starts[chosen]
        )
        by = self.suppressed_by.take(pa.array(chosen, pa.int64()))
        return alert_rows(picked, self.keyed, [self.rule], decision_time, alert_schema, by)

    def records(
        self, decision_time: int, alert_schema: pa.Schema, positions: np.ndarray
    ) -> list[dict[str, Any]]:
        """SPEC §4 records of the alerts at ``positions``."""
        rows = self.alerts(decision_time, alert_schema, positions).to_pylist()
        return [record_of_stored(r) for r in rows]


def decide_span(
    events: pa.Table, rules: Sequence[Rule], span: Span, width_ms: int, workers: int = 2
) -> list[Fired]:
    """Each rule's alerts (in ``rules``' order) over the events of ``span``, deciding with
    ``events`` (the events table's ``event_fields`` columns, any order) as history.

    One fan-out, and one kernel call per signature: rules that share one are decided over
    the same sorted rows. Equal to the backtest's alerts over ``events`` whose eventTime
    lies in the span, provided ``events`` holds every event from ``read_from`` on."""
    fired: list[Fired | None] = [None] * len(rules)
    by_signature: dict[RuleSignature, list[int]] = {}
    for index, rule in enumerate(rules):
        by_signature.setdefault(rule.signature, []).append(index)
    lowers = {
        signature: history_start(span, max(rules[i].window_ms for i in indices), width_ms)
        for signature, indices in by_signature.items()
    }
    times = events.column("eventTime")
    inside = pc.and_(
        pc.greater_equal(times, min(lowers.values(), default=span.start)),
        pc.less_equal(times, span.end),
    )
    # One fan-out for every signature (a field's canonical text is made once), its rows
    # signature after signature.
    signatures = list(by_signature)
    everything = keyed_rows(events.filter(inside), signatures, KEYED_ARROW)
    counts = {
        row["values"]: row["counts"]
        for row in pc.value_counts(everything.column("signature_id")).to_pylist()
    }
    slices = []
    offset = 0
    for signature in signatures:
        n = counts.get(signature.signature_id, 0)
        slices.append((signature, everything.slice(offset, n)))
        offset += n

    def decide_one(signature: RuleSignature, keyed: pa.Table) -> None:
        indices = by_signature[signature]
        keyed = keyed.filter(pc.greater_equal(keyed.column("eventTime"), lowers[signature]))
        keyed = keyed.append_column("decide", pc.greater(keyed.column("eventTime"), span.start))
        decisions = decide_history(keyed, [rules[i] for i in indices], width_ms)
        for position, index in enumerate(indices):
            mine = decisions.rules == position
            one = Fired(
                rules[index],
                keyed,
                Decisions(
                    decisions.rows[mine],
                    np.zeros(int(mine.sum()), dtype=np.int64),
                    decisions.values[mine],
                    decisions.window_starts[mine],
                ),
            )
            one.suppressed_by  # noqa: B018 (its cooldown, here in the thread)
            fired[index] = one

    # The kernel's and the cooldown's numpy and Arrow calls release the GIL for their long
    # loops (sorts, searches, prefix sums): signatures decided in threads use both cores.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for done in [pool.submit(decide_one, sig, keyed) for sig, keyed in slices]:
            done.result()
    return [f for f in fired if f is not None]


@dataclass(frozen=True)
class HourCount:
    """Alerts of events with eventTime in ``(start, end]``, and how many of them the
    rule's cooldown would notify (all of them without one)."""

    start: int
    end: int
    alerts: int
    notified: int

    def to_json(self) -> dict[str, int]:
        return {
            "start": self.start,
            "end": self.end,
            "alerts": self.alerts,
            "notified": self.notified,
        }


def hourly_counts(
    event_times: np.ndarray, span: Span, notified: np.ndarray | None = None
) -> list[HourCount]:
    """Alerts (and notified alerts: ``notified`` marks them; all when None) per hour of the
    span, oldest first: hours counted back from its end, so the oldest may be part of an
    hour (a fractional ``hours``)."""
    hours = max(1, math.ceil((span.end - span.start) / HOUR_MS))
    back = (span.end - np.asarray(event_times, dtype=np.int64)) // HOUR_MS
    inside = (back >= 0) & (back < hours)
    counts = np.bincount(back[inside], minlength=hours)
    told = counts if notified is None else np.bincount(back[inside & notified], minlength=hours)
    out = []
    for k in reversed(range(hours)):
        out.append(
            HourCount(
                max(span.start, span.end - (k + 1) * HOUR_MS),
                span.end - k * HOUR_MS,
                int(counts[k]),
                int(told[k]),
            )
        )
    return out


@dataclass(frozen=True)
class DiffEntry:
    """One transaction whose decision differs; a value is None where that rule is silent."""

    transaction_id: str
    event_time: int
    candidate: str | None
    in_force: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "transactionId": self.transaction_id,
            "eventTime": self.event_time,
            "candidateValue": self.candidate,
            "inForceValue": self.in_force,
        }


@dataclass(frozen=True)
class AlertDiff:
    """The candidate's alerts against the version in force's, per transactionId: counts,
    and the first ``shown`` transactions of each kind by eventTime."""

    added: int
    removed: int
    changed: int
    unchanged: int
    added_shown: tuple[DiffEntry, ...] = ()
    removed_shown: tuple[DiffEntry, ...] = ()
    changed_shown: tuple[DiffEntry, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "addedShown": [e.to_json() for e in self.added_shown],
            "removedShown": [e.to_json() for e in self.removed_shown],
            "changedShown": [e.to_json() for e in self.changed_shown],
        }


def diff_alerts(candidate: pa.Table, in_force: pa.Table, shown: int = DIFF_SHOWN) -> AlertDiff:
    """``candidate`` against ``in_force`` (each: transactionId, eventTime, aggregateValue;
    one row per transaction), compared by transactionId."""
    left = candidate.select(["transactionId", "eventTime", "aggregateValue"]).rename_columns(
        ["transactionId", "candidateTime", "candidateValue"]
    )
    right = in_force.select(["transactionId", "eventTime", "aggregateValue"]).rename_columns(
        ["transactionId", "inForceTime", "inForceValue"]
    )
    joined = left.join(right, "transactionId", join_type="full outer")
    has_candidate = joined.column("candidateValue").is_valid()
    has_in_force = joined.column("inForceValue").is_valid()
    both = joined.filter(pc.and_(has_candidate, has_in_force))
    # Both sides are ``format_decimal`` text (no exponent, no trailing zeros): equal
    # text is an equal value.
    differs = pc.not_equal(both.column("candidateValue"), both.column("inForceValue"))
    added = joined.filter(pc.invert(has_in_force))
    removed = joined.filter(pc.invert(has_candidate))
    changed = both.filter(differs)

    def first(rows: pa.Table, time: str) -> tuple[DiffEntry, ...]:
        ordered = rows.sort_by([(time, "ascending"), ("transactionId", "ascending")])
        return tuple(
            DiffEntry(r["transactionId"], r[time], r["candidateValue"], r["inForceValue"])
            for r in ordered.slice(0, shown).to_pylist()
        )

    return AlertDiff(
        added=added.num_rows,
        removed=removed.num_rows,
        changed=changed.num_rows,
        unchanged=both.num_rows - changed.num_rows,
        added_shown=first(added, "candidateTime"),
        removed_shown=first(removed, "inForceTime"),
        changed_shown=first(changed, "candidateTime"),
    )


def diff_fired(candidate: Fired, in_force: Fired | None, shown: int = DIFF_SHOWN) -> AlertDiff:
    """``diff_alerts`` of two rules' alerts; when both were decided over the same keyed
    rows (one signature), compared by row (one per transaction there) with numpy, not
    by a join on transactionId (seconds for millions of alerts)."""
    if in_force is None:
        times = candidate.event_times()
        return AlertDiff(
            added=len(candidate),
            removed=0,
            changed=0,
            unchanged=0,
            added_shown=_entries(candidate, _first(times, shown), None),
        )
    if in_force.keyed is not candidate.keyed:
        return diff_alerts(candidate.table(), in_force.table(), shown)
    mine, theirs = candidate.decisions, in_force.decisions
    _, at_mine, at_theirs = np.intersect1d(mine.rows, theirs.rows, return_indices=True)
    differs = mine.values[at_mine] != theirs.values[at_theirs]
    only_mine = np.setdiff1d(np.arange(len(mine)), at_mine, assume_unique=True)
    only_theirs = np.setdiff1d(np.arange(len(theirs)), at_theirs, assume_unique=True)
    mine_times, their_times = candidate.event_times(), in_force.event_times()
    changed_mine, changed_theirs = at_mine[differs], at_theirs[differs]
    first_changed = _first(mine_times[changed_mine], shown)
    return AlertDiff(
        added=len(only_mine),
        removed=len(only_theirs),
        changed=int(differs.sum()),
        unchanged=int((~differs).sum()),
        added_shown=_entries(candidate, only_mine[_first(mine_times[only_mine], shown)], None),
        removed_shown=_entries(
            in_force, only_theirs[_first(their_times[only_theirs], shown)], None, swap=True
        ),
        changed_shown=_entries(
            candidate,
            changed_mine[first_changed],
            (in_force, changed_theirs[first_changed]),
        ),
    )


def _first(times: np.ndarray, shown: int) -> np.ndarray:
    """Positions of the ``shown`` earliest ``times``, earliest first."""
    if len(times) > shown:
        kept = np.argpartition(times, shown - 1)[:shown] if shown > 0 else np.array([], int)
    else:
        kept = np.arange(len(times))
    return kept[np.argsort(times[kept], kind="stable")]


def _entries(
    fired: Fired,
    positions: np.ndarray,
    other: tuple[Fired, np.ndarray] | None,
    swap: bool = False,
) -> tuple[DiffEntry, ...]:
    """DiffEntries of ``fired``'s alerts at ``positions`` (its value as the candidate's,
    or with ``swap`` as the version in force's), ``other``'s values beside them."""
    rows = fired.decisions.rows[positions]
    ids = fired.keyed.column("transactionId").take(pa.array(rows, pa.int64())).to_pylist()
    times = fired.event_times()[positions].tolist()
    values = value_texts(fired.decisions.values[positions]).to_pylist()
    others = (
        value_texts(other[0].decisions.values[other[1]]).to_pylist()
        if other is not None
        else [None] * len(ids)
    )
    out = []
    for tx, time, value, theirs in zip(ids, times, values, others, strict=True):
        if swap:
            out.append(DiffEntry(tx, time, theirs, value))
        else:
            out.append(DiffEntry(tx, time, value, theirs))
    return tuple(out)


def sample_positions(event_times: np.ndarray, size: int) -> np.ndarray:
    """Up to ``size`` alerts spread evenly over the span (by eventTime, then position):
    the first, the last and evenly between; deterministic."""
    n = len(event_times)
    if n == 0 or size <= 0:
        return np.array([], dtype=np.int64)
    times = np.asarray(event_times)
    if size >= n:
        return np.argsort(times, kind="stable")
    ranks = np.unique(np.linspace(0, n - 1, size).round().astype(np.int64))
    # Only the chosen ranks need their place: a partition, not a sort of every alert.
    # Ties at a rank resolve to some alert of that eventTime (deterministic for an input).
    return np.argpartition(times, ranks)[ranks]


# A sampled alert's window is recounted in Python (``explain_alert``, some µs an event): a
# window of more events than this (a key such as ``action`` over 24 h holds a third of
# all events) is sampled with its event count but without the recount.
EXPLAINED_EVENTS = 5_000


@dataclass(frozen=True)
class SampleAlert:
    """A sampled alert (SPEC §4 record), the events of its window that count (the rule's
    key and filter), and why it fired (None: more than ``EXPLAINED_EVENTS`` of them)."""

    alert: Mapping[str, Any]
    window_events: int
    explanation: Explanation | None

    def to_json(self) -> dict[str, Any]:
        return {
            "alert": dict(self.alert),
            "windowEvents": self.window_events,
            "explanation": None if self.explanation is None else self.explanation.to_json(),
        }


def window_rows(events: pa.Table, alert: Mapping[str, Any], rule: Rule) -> pa.Table:
    """The rows of ``events`` in the alert's window and key that pass the rule's filter."""
    times = events.column("eventTime")
    where = pc.and_(
        pc.greater_equal(times, alert["windowStart"]), pc.less_equal(times, alert["windowEnd"])
    )
    rows = events.filter(where)
    for name in rule.grouping_keys:
        rows = rows.filter(
            pc.is_in(rows.column(name), value_set=_field_values(rows, name, [alert]))
        )
    for name, allowed in rule.signature.filter:
        # A text column is canonical text already; only the amount is made so.
        texts = canonical_texts(rows, name) if FIELDS_BY_NAME[name].numeric else rows.column(name)
        rows = rows.filter(pc.is_in(texts, value_set=pa.array(allowed, pa.string())))
    return rows


def _field_values(rows: pa.Table, name: str, alerts: Sequence[Mapping[str, Any]]) -> pa.Array:
    """The alerts' key values of ``name`` as values of its column: a text column holds
    canonical text already (compared as it is), the amount by its exact value."""
    values = sorted({str(a["key"][name]) for a in alerts})
    if FIELDS_BY_NAME[name].numeric:
        return pa.array([Decimal(v) for v in values]).cast(rows.schema.field(name).type)
    return pa.array(values, pa.string())


def event_objects(rows: pa.Table) -> list[Event]:
    """``rows`` (events-table columns) as accepted events, every field they hold as its
    canonical text; fields not read are absent, and the amount 0 when not read (no rule
    of the preview counts it then)."""
    fields = [n for n in rows.column_names if n in FIELDS_BY_NAME and n != "eventTime"]
    texts = {n: canonical_texts(rows, n).to_pylist() for n in fields}
    amounts = (
        rows.column("paymentAmount").to_pylist() if "paymentAmount" in rows.column_names else None
    )
    ids = rows.column("transactionId").to_pylist()
    out = []
    for i, event_time in enumerate(rows.column("eventTime").to_pylist()):
        amount = amounts[i] if amounts is not None else Decimal(0)
        out.append(Event(ids[i], event_time, amount, {n: texts[n][i] for n in fields}))
    return out


def samples(
    events: pa.Table,
    records: Sequence[Mapping[str, Any]],
    rule: Rule,
    explained_events: int = EXPLAINED_EVENTS,
) -> tuple[SampleAlert, ...]:
    """Each of ``rule``'s alert ``records`` with the events of its window in ``events``
    and, unless they are more than ``explained_events``, ``explain_alert`` of them. One
    pass over ``events`` keeps the rows of the records' keys and windows; each record's
    window is cut from those (a 24 h window is the whole of ``events``)."""
    if not records:
        return ()
    times = events.column("eventTime")
    near = events.filter(
        pc.and_(
            pc.greater_equal(times, min(r["windowStart"] for r in records)),
            pc.less_equal(times, max(r["windowEnd"] for r in records)),
        )
    )
    for name in rule.grouping_keys:
        near = near.filter(
            pc.is_in(near.column(name), value_set=_field_values(near, name, records))
        )
    out = []
    for record in records:
        rows = window_rows(near, record, rule)
        explanation = (
            explain_alert(record, rule, event_objects(rows))
            if rows.num_rows <= explained_events
            else None
        )
        out.append(SampleAlert(record, rows.num_rows, explanation))
    return tuple(out)


@dataclass(frozen=True)
class RulePreview:
    """One candidate rule over the span, beside the version in force of its ruleId."""

    rule: Rule  # the candidate as previewed (version 0: not saved)
    in_force: Rule | None  # the version in force of the ruleId (ACTIVE or PAUSE), if any
    alerts: int
    per_hour: tuple[HourCount, ...]
    in_force_alerts: int  # 0 without a version in force, or when it is PAUSE
    in_force_per_hour: tuple[HourCount, ...]
    sample: tuple[SampleAlert, ...]
    diff: AlertDiff
    notified: int = 0  # of ``alerts``, those its cooldown would notify
    in_force_notified: int = 0

    def to_json(self) -> dict[str, Any]:
        in_force = self.in_force
        return {
            "rule": {"version": self.rule.version, **self.rule.to_json()},
            "summary": rule_summary(self.rule),
            "inForce": None
            if in_force is None
            else {"version": in_force.version, **in_force.to_json()},
            "alerts": self.alerts,
            "notified": self.notified,
            "perHour": [h.to_json() for h in self.per_hour],
            "inForceAlerts": self.in_force_alerts,
            "inForceNotified": self.in_force_notified,
            "inForcePerHour": [h.to_json() for h in self.in_force_per_hour],
            "sample": [e.to_json() for e in self.sample],
            "diff": self.diff.to_json(),
        }


@dataclass(frozen=True)
class Preview:
    """What the rules of a file would have fired over ``span`` of the live events."""

    span: Span
    hours: float
    events_in_span: int
    events_read: int  # the span and the history before it that the widest window needs
    read_from: int  # the oldest eventTime read
    rules: tuple[RulePreview, ...]
    skipped: tuple[str, ...] = ()  # entries of the file that are not rules (state changes)
    seconds: float = 0.0
    step_seconds: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "span": self.span.to_json(),
            "anchor": "the newest accepted eventTime in the events table",
            "hours": self.hours,
            "eventsInSpan": self.events_in_span,
            "eventsRead": self.events_read,
            "readFrom": self.read_from,
            "rules": [r.to_json() for r in self.rules],
            "skipped": list(self.skipped),
            "seconds": round(self.seconds, 3),
            "stepSeconds": {k: round(v, 3) for k, v in self.step_seconds.items()},
        }

    def to_json_text(self) -> str:
        return dumps_json(self.to_json())


def baseline(in_force: Sequence[Rule], rule_id: int) -> Rule | None:
    """The version in force of ``rule_id``: its ACTIVE or PAUSE version, or None. The
    rule store's ``in_force`` also lists standing SHADOW candidates (issue 24, part 1):
    a candidate is not the version in force, so any state but those two is passed over."""
    found = [
        r for r in in_force
        if r.rule_id == rule_id and r.state in (RuleState.ACTIVE, RuleState.PAUSE)
    ]  # fmt: skip
    return max(found, key=lambda r: r.version) if found else None


def same_decisions(one: Rule, other: Rule) -> bool:
    """Whether two rules decide alike: equal but for their version and state."""
    return one.with_version(0).with_state(RuleState.ACTIVE) == other.with_version(0).with_state(
        RuleState.ACTIVE
    )


def rule_previews(
    events: pa.Table,
    candidates: Sequence[Rule],
    in_force: Sequence[Rule],
    span: Span,
    width_ms: int,
    decision_time: int,
    alert_schema: pa.Schema,
    sample_size: int = SAMPLE_SIZE,
    diff_shown: int = DIFF_SHOWN,
) -> list[RulePreview]:
    """Each candidate's preview over ``span``: ``events`` as ``decide_span`` takes them,
    ``in_force`` the rules in force (the baselines are picked by ruleId; a PAUSE version
    fires nothing, so against it every alert is added)."""
    baselines = [baseline(in_force, c.rule_id) for c in candidates]
    active = [
        (i, c, b) for i, (c, b) in enumerate(zip(candidates, baselines, strict=True))
        if b is not None and b.state is RuleState.ACTIVE
    ]  # fmt: skip
    # A version in force that decides as the candidate does (the same rule but for its
    # version and state) fires the same alerts: decided once.
    deciding = [b for _, c, b in active if not same_decisions(c, b)]
    fired = decide_span(events, [*candidates, *deciding], span, width_ms)
    by_baseline = {id(b): f for b, f in zip(deciding, fired[len(candidates) :], strict=True)}
    for i, _, b in active:
        if id(b) not in by_baseline:
            by_baseline[id(b)] = Fired(b, fired[i].keyed, fired[i].decisions)
    out = []
    for candidate, mine, base in zip(candidates, fired[: len(candidates)], baselines, strict=True):
        theirs = by_baseline.get(id(base))
        times = mine.event_times()
        their_times = theirs.event_times() if theirs is not None else np.array([], np.int64)
        told = mine.notified()
        their_told = theirs.notified() if theirs is not None else np.array([], bool)
        positions = sample_positions(times, sample_size)
        out.append(
            RulePreview(
                rule=candidate,
                in_force=base,
                alerts=len(mine),
                per_hour=tuple(hourly_counts(times, span, told)),
                in_force_alerts=len(their_times),
                in_force_per_hour=tuple(hourly_counts(their_times, span, their_told)),
                notified=int(told.sum()),
                in_force_notified=int(their_told.sum()),
                sample=samples(
                    events, mine.records(decision_time, alert_schema, positions), candidate
                ),
                diff=diff_fired(mine, theirs, diff_shown),
            )
        )
    return out
