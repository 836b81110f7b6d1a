"""Read-only views of the live tables for people, without a JVM (delta-rs).

The Airflow page and `velocity explain` answer in well under a second, where a Spark
session takes ten or more to start. Only reads live here. The rules table has one writer,
the rule store (delta-rs too), which also reads it; the stream's tables are written by
Spark.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from velocity.analyst.alert_search import AlertFilter, Cursor
from velocity.analyst.backfill_runs import RecordedRun
from velocity.analyst.cases import mark_retracted
from velocity.analyst.explain import Explanation, explain_alert
from velocity.analyst.reviews import (
    DAY_MS,
    WEEK_MS,
    AlertRef,
    AlertVolume,
    Review,
    VersionPrecision,
    precision_of_versions,
)
from velocity.analyst.reviews import precision_by_version as _precision_by_version
from velocity.analyst.rule_rates import MINUTE_MS, RATE_MINUTES, RuleRate, minute_starts
from velocity.analyst.rule_rates import rule_rates as _rule_rates
from velocity.analyst.shadow_compare import (
    DecisionRow,
    ShadowComparison,
    compare_candidates,
    window_start,
)
from velocity.delta.alert_files import (
    EVER,
    AlertMinutes,
    FileSpan,
    alert_minutes,
    id_ranges,
    pruned_dataset,
)
from velocity.delta.case_store import CaseStore
from velocity.delta.file_folds import FOLDS_LOCK, current_table
from velocity.delta.names import ALERT_REVIEWS, ALERTS, BACKFILLS, EVENTS, RULES
from velocity.delta.review_store import ReviewStore
from velocity.delta.rule_store import RuleStore
from velocity.domain.alerts import AlertKind, stored_outcome
from velocity.domain.decimals import format_decimal
from velocity.domain.rule_changes import RuleBook
from velocity.domain.rules import Rule
from velocity.domain.schema import FIELDS_BY_NAME, RULE_FIELDS, Event, FieldKind, parse_event_line
from velocity.errors import UsageError
from velocity.settings import Settings


class NotWrittenYetError(UsageError):
    """The alert is newer than the events table: the stream has not written it yet."""


def _table(path: Path) -> DeltaTable | None:
    """The table at its newest version, brought up to date from the last look."""
    return current_table(path)


def rule_history(settings: Settings) -> list[Rule]:
    """Every version of every rule, by (ruleId, version); empty before any rule was applied."""
    return RuleStore(settings.table_path(RULES)).history()


def rules_in_force(settings: Settings) -> list[Rule]:
    return RuleStore(settings.table_path(RULES)).in_force()


def _alert_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of the alerts table as its SPEC §4 record (the map column comes as pairs;
    ``"shadow": true`` only for a SHADOW rule's alert, ``"suppressed": true`` only for a
    suppressed one)."""
    flags = ("signature_id", "shadow", "suppressed", "suppressedBy")
    record = {k: v for k, v in row.items() if k not in flags}
    record["outcome"] = stored_outcome(row)  # a row of an older Velocity has none: ALERT
    if row.get("shadow"):
        record["shadow"] = True
    if row.get("suppressed"):  # SPEC §3 cooldown: recorded, not published
        record["suppressed"] = True
        record["suppressedBy"] = row.get("suppressedBy")
    key = row["key"]
    record["key"] = dict(key) if not isinstance(key, dict) else key
    return record


def find_alert(settings: Settings, alert_id: str) -> dict[str, Any]:
    table = _table(settings.table_path(ALERTS))
    if table is None:
        raise UsageError(f"no alerts table under {settings.data_dir}: the stream has not run")
    rows = _by_alert_id(table, alert_id).to_table(filter=pc.field("alertId") == alert_id)
    if rows.num_rows == 0:
        raise UsageError(f"no alert {alert_id!r} in the alerts table under {settings.data_dir}")
    return _alert_record(rows.to_pylist()[0])


def _not_written_yet(settings: Settings, alert: Mapping[str, Any]) -> NotWrittenYetError:
    return NotWrittenYetError(
        f"transaction {alert['transactionId']} of this alert is not in the events table "
        "yet: the stream writes Delta behind Redis (write_behind_seconds "
        f"{settings.write_behind_seconds}); explain it again in a few seconds"
    )


def _window_events(settings: Settings, alert: Mapping[str, Any], rule: Rule) -> list[Event]:
    """The accepted events of the alert's key and window that counted when it was decided."""
    stream_alert = alert["kind"] == AlertKind.ALERT
    table = _table(settings.table_path(EVENTS))
    if table is None:
        if stream_alert:
            raise _not_written_yet(settings, alert)
        return []
    where = (pc.field("eventTime") >= alert["windowStart"]) & (
        pc.field("eventTime") <= alert["windowEnd"]
    )
    for name in rule.grouping_keys:
        # Key columns hold canonical strings; an amount column is a decimal: match it exactly
        # on the parsed event instead.
        if FIELDS_BY_NAME[name].kind is not FieldKind.AMOUNT:
            where = where & (pc.field(name) == str(alert["key"][name]))
    columns = ["raw", "transactionId", "eventTime", "stream_batch"]
    window = [(alert["windowStart"], alert["windowEnd"])]
    rows = pruned_dataset(table, "eventTime", window).to_table(filter=where, columns=columns)
    if stream_alert:
        # The stream decided it with the events of its own micro-batch and the earlier ones;
        # its own event is in the window (its time is the upper edge).
        own = rows.filter(
            (pc.field("transactionId") == alert["transactionId"])
            & (pc.field("eventTime") == alert["eventTime"])
        )
        if own.num_rows == 0:
            raise _not_written_yet(settings, alert)
        decided_in = own.column("stream_batch")[0].as_py()
        rows = rows.filter(pc.field("stream_batch") <= decided_in)
    events = []
    for line in rows.column("raw").to_pylist():
        event = parse_event_line(line)
        if isinstance(event, Event):  # accepted events were valid when they arrived
            events.append(event)
    return events


def explain(
    settings: Settings, alert_id: str, alert: Mapping[str, Any] | None = None
) -> Explanation:
    """The explanation of one alert of the live system (``velocity explain``). ``alert``:
    its record when the caller read it already (from the Redis stream, say: the stream
    writes the alerts table behind Redis, so the newest alerts may not be in it yet)."""
    if alert is None:
        alert = find_alert(settings, alert_id)
    versions = {(r.rule_id, r.version): r for r in rule_history(settings)}
    rule = versions.get((alert["ruleId"], alert["ruleVersion"]))
    if rule is None:
        raise UsageError(
            f"alert {alert_id} names ruleId {alert['ruleId']} version {alert['ruleVersion']}, "
            "which the rules table does not hold"
        )
    return explain_alert(alert, rule, _window_events(settings, alert, rule))


_REF_COLUMNS = ["alertId", "kind", "ruleId", "ruleVersion", "decisionTime"]


def review_store(settings: Settings) -> ReviewStore:
    return ReviewStore(settings.table_path(ALERT_REVIEWS))


def alert_ref(settings: Settings, alert_id: str) -> AlertRef | None:
    """What a review needs of the alert ``alert_id`` in the alerts table; None when the
    table does not hold it (yet: the stream writes it behind Redis)."""
    table = _table(settings.table_path(ALERTS))
    if table is None:
        return None
    rows = _by_alert_id(table, alert_id).to_table(
        filter=pc.field("alertId") == alert_id, columns=_REF_COLUMNS
    )
    return AlertRef.of(rows.to_pylist()[0]) if rows.num_rows else None


def _by_alert_id(table: DeltaTable, alert_id: str) -> Any:
    """The dataset of the data files whose alertId fingerprints hold ``alert_id``
    (``alert_files.AlertIdIndex``, by their decision times): the others are never opened.
    A table that needs a reader feature is searched whole."""
    if table.protocol().min_reader_version > 1:
        return table.to_pyarrow_dataset()
    return pruned_dataset(table, "decisionTime", id_ranges(table, alert_id=alert_id))


def alert_volumes(settings: Settings, now_ms: int) -> dict[tuple[int, int], AlertVolume]:
    """Alerts (ALERT and CORRECTION) per (ruleId, ruleVersion) decided in the last 24 h and
    7 days before ``now_ms``: the whole minutes from the alerts table's per-minute counts,
    kept up to date file by file (``alert_files.AlertMinutes``), and each period's first,
    partial minute counted in the rows of that minute alone."""
    table = _table(settings.table_path(ALERTS))
    if table is None:
        return {}
    week = _raised_since(table, now_ms - WEEK_MS)
    day = _raised_since(table, now_ms - DAY_MS)
    return {
        version: AlertVolume(last_24h=day.get(version, 0), last_7d=count)
        for version, count in week.items()
    }


def _raised_since(table: DeltaTable, since: int) -> dict[tuple[int, int], int]:
    """Alerts that raise something (not RETRACTION) per (ruleId, ruleVersion) decided at
    ``since`` or later."""
    first_whole = since if since % MINUTE_MS == 0 else since - since % MINUTE_MS + MINUTE_MS
    counted: dict[tuple[int, int], int] = {}
    with FOLDS_LOCK:
        for (rule_id, version, kind, _, _), _, n in alert_minutes(table).between(first_whole):
            if kind != AlertKind.RETRACTION.value:
                counted[(rule_id, version)] = counted.get((rule_id, version), 0) + n
    if first_whole > since:
        at = pc.field("decisionTime")
        rows = pruned_dataset(table, "decisionTime", [(since, first_whole - 1)]).to_table(
            filter=(at >= since)
            & (at < first_whole)
            & (pc.field("kind") != AlertKind.RETRACTION.value),
            columns=["ruleId", "ruleVersion"],
        )
        for row in (
            rows.group_by(["ruleId", "ruleVersion"]).aggregate([([], "count_all")]).to_pylist()
        ):
            of = (int(row["ruleId"]), int(row["ruleVersion"]))
            counted[of] = counted.get(of, 0) + int(row["count_all"])
    return {of: n for of, n in counted.items() if n}


def precision_by_version(
    settings: Settings, now_ms: int, reviews: Sequence[Review] | None = None
) -> list[VersionPrecision]:
    """Each rule version's alert volume and review figures (the page's precision table);
    ``reviews``: every review (or the latest ones), when the caller read them already;
    else the reviews' verdicts as the review store keeps them counted."""
    if reviews is None:
        verdicts = review_store(settings).verdicts()
        return precision_of_versions(alert_volumes(settings, now_ms), verdicts)
    return _precision_by_version(alert_volumes(settings, now_ms), reviews)


_DECISION_COLUMNS = [
    "alertId", "kind", "ruleId", "ruleVersion", "transactionId", "decisionTime", "shadow",
]  # fmt: skip


def decision_rows(settings: Settings, rule_ids: Collection[int], since: int) -> list[DecisionRow]:
    """The rows of the alerts table of ``rule_ids`` decided at ``since`` or later (the data
    files of older alerts are skipped by their decisionTime statistics). A table of an older
    Velocity, without the shadow column, reads as having no shadow alerts."""
    table = _table(settings.table_path(ALERTS))
    if table is None or not rule_ids:
        return []
    dataset = pruned_dataset(table, "decisionTime", [(since, EVER)])
    rows = dataset.to_table(
        filter=(pc.field("decisionTime") >= since)
        & pc.field("ruleId").isin(pa.array(sorted(rule_ids), pa.int64())),
        columns=[c for c in _DECISION_COLUMNS if c in dataset.schema.names],
    )
    return [DecisionRow.of(row) for row in rows.to_pylist()]


def shadow_comparisons(
    settings: Settings,
    now_ms: int,
    history: Sequence[Rule] | None = None,
    reviews: Sequence[Review] | None = None,
) -> list[ShadowComparison]:
    """Each standing shadow candidate beside its rule in force over the last 24 h before
    ``now_ms`` (``velocity.analyst.shadow_compare``); ``history`` (every rule version) and
    ``reviews`` (every review, or the latest ones): when the caller read them already."""
    store = RuleStore(settings.table_path(RULES))
    book = RuleBook.of(store.history() if history is None else history)
    if not book.candidates:
        return []
    applied = store.applied_times()
    since = min(
        window_start(now_ms, applied.get((rule_id, candidate.version)))
        for rule_id, candidate in book.candidates.items()
    )
    rows = decision_rows(settings, book.candidates.keys(), since)
    if reviews is None:
        with FOLDS_LOCK:  # a copy while no other look feeds the reviews
            reviews = list(review_store(settings).latest().values())
    return compare_candidates(book, rows, reviews, applied, now_ms)


# The alerts table's columns of a SPEC §4 record (not the stream's signature_id).
_RECORD_COLUMNS = [
    "alertId", "kind", "ruleId", "ruleVersion", "transactionId", "key", "eventTime",
    "aggregatorFunctionType", "aggregateValue", "limitOperatorType", "limit", "windowStart",
    "windowEnd", "decisionTime", "outcome", "shadow",
]  # fmt: skip
# Each span below a page's boundary holds this many times the rows of the one before (in
# the data files' statistics), until the page is full or the table is read.
_SPAN_GROWTH = 8


@dataclass(frozen=True)
class TableAlerts:
    """A page's candidates from the alerts table, newest first; ``more``: the table holds
    further matching alerts; ``newest``: its newest decisionTime (None: no alerts)."""

    alerts: list[dict[str, Any]]
    more: bool
    newest: int | None


def newest_alerts(
    settings: Settings, query: AlertFilter, before: Cursor | None, limit: int
) -> TableAlerts:
    """The ``limit`` newest alerts of the alerts table that pass ``query`` and lie below
    ``before`` (by decisionTime, then alertId), read with delta-rs and Arrow.

    The filter is pushed into the scan. The search reads back in decisionTime spans below
    the boundary, each chosen from the data files' statistics to hold a number of rows
    (the page's, then 8 times more each time) rather than a length of time: the first
    page reads the newest file or two whether a storm put a million alerts in the last
    hour or a quiet week put a thousand, and a filter reads back as far as it needs to
    find a page of matches. Each span is read once."""
    table = _table(settings.table_path(ALERTS))
    if table is None:
        return TableAlerts([], False, None)
    with FOLDS_LOCK:  # each data file's rows and decision times, read once
        minutes = alert_minutes(table)
        if not minutes.spans:
            return TableAlerts([], False, None)
        newest = max(f.last_decision for f in minutes.spans.values())
        # A rule or kind asked for: only the files that hold its alerts, by their counts.
        files = _files_holding(minutes, query)
    where = _alert_predicate(query, before)
    # Files whose eventTimes lie outside from/to are skipped by their statistics.
    also = [("eventTime", ">=", query.from_ms)] if query.from_ms is not None else []
    also += [("eventTime", "<=", query.to_ms)] if query.to_ms is not None else []
    # A table of an older Velocity has no shadow column until the stream adds it.
    present = {f.name for f in table.schema().fields}
    columns = [c for c in _RECORD_COLUMNS if c in present]
    if query.transaction_id is not None and table.protocol().min_reader_version == 1:
        # Only the files whose transactionId fingerprints hold it.
        held = id_ranges(table, transaction_id=query.transaction_id)
        rows = pruned_dataset(table, "decisionTime", held, also).to_table(
            filter=where, columns=columns
        )
    else:
        top = before.decision_time if before is not None else EVER
        at = pc.field("decisionTime")
        parts, found, upper = [], 0, top
        for lower in _spans_below(files, top, limit + 1):
            scoped = where if lower is None else where & (at >= lower)
            if upper != top:
                scoped = scoped & (at < upper)
            low = -EVER if lower is None else lower
            span = [
                (max(f.first_decision, low), min(f.last_decision, upper))
                for f in files
                if f.first_decision <= upper and f.last_decision >= low
            ]
            part = pruned_dataset(table, "decisionTime", span, also).to_table(
                filter=scoped, columns=columns
            )
            parts.append(part)
            found += part.num_rows
            if found > limit or lower is None:
                break
            upper = lower
        rows = pa.concat_tables(parts)
    newest_first = rows.sort_by([("decisionTime", "descending"), ("alertId", "descending")])
    records = [_alert_record(r) for r in newest_first.slice(0, limit + 1).to_pylist()]
    return TableAlerts(records[:limit], len(records) > limit, newest)


def _files_holding(minutes: AlertMinutes, query: AlertFilter) -> list[FileSpan]:
    """Each data file's span, its rows those of ``query``'s rule and kind (all its rows
    when it names neither); a file without one of them is left out."""
    if query.rule_id is None and query.kind is None:
        return list(minutes.spans.values())
    held = []
    for uri, span in minutes.spans.items():
        rows = sum(
            n
            for (rule_id, _, kind, _, _), _, n in minutes.parts.get(uri, [])
            if (query.rule_id is None or rule_id == query.rule_id)
            and (query.kind is None or kind == query.kind.value)
        )
        if rows:
            held.append(FileSpan(rows, span.first_decision, span.last_decision))
    return held


def _spans_below(files: Sequence[FileSpan], top: int, rows: int) -> list[int | None]:
    """The lower decisionTime bounds of growing spans at or below ``top``: the first takes
    the data files (newest first by their last decision) holding at least ``rows`` rows,
    each next one 8 times as many; the last is None (the rest of the table)."""
    below = sorted(
        ((f.last_decision, f.first_decision, f.rows) for f in files if f.first_decision <= top),
        reverse=True,
    )
    bounds: list[int | None] = []
    wanted, held, lowest = rows, 0, None
    for _, low, n in below:
        held += n
        lowest = low if lowest is None else min(lowest, low)
        if held >= wanted and (not bounds or lowest < bounds[-1]):  # type: ignore[operator]
            bounds.append(lowest)
            wanted *= _SPAN_GROWTH
    return [*bounds, None]


def _alert_predicate(query: AlertFilter, before: Cursor | None) -> pc.Expression:
    """``query`` and the page boundary as an Arrow filter on the alerts table."""
    terms = []
    if query.rule_id is not None:
        terms.append(pc.field("ruleId") == query.rule_id)
    if query.kind is not None:
        terms.append(pc.field("kind") == query.kind.value)
    if query.transaction_id is not None:
        terms.append(pc.field("transactionId") == query.transaction_id)
    if query.from_ms is not None:
        terms.append(pc.field("eventTime") >= query.from_ms)
    if query.to_ms is not None:
        terms.append(pc.field("eventTime") <= query.to_ms)
    for part in query.key:
        names = (part.field,) if part.field is not None else RULE_FIELDS
        terms.append(
            reduce(
                lambda a, b: a | b,
                (
                    pc.map_lookup(pc.field("key"), pa.scalar(n), "first") == part.value
                    for n in names
                ),
            )
        )
    if before is not None:
        at = pc.field("decisionTime")
        terms.append(
            (at < before.decision_time)
            | ((at == before.decision_time) & (pc.field("alertId") < before.alert_id))
        )
    return reduce(lambda a, b: a & b, terms, pc.scalar(True))


def recorded_backfills(settings: Settings) -> list[RecordedRun]:
    """Every run the ``backfills`` table records (written by each run when it finishes),
    without the ids of its alerts; empty before the first run. A table recorded before
    lock_seconds, airflow_run_id or the late counts existed reads them as None."""
    table = _table(settings.table_path(BACKFILLS))
    if table is None:
        return []
    present = {f.name for f in table.schema().fields}
    wanted = [c for c in _BACKFILL_COLUMNS if c in present]
    rows = table.to_pyarrow_dataset().to_table(columns=wanted).to_pylist()
    return [RecordedRun.from_row(row) for row in rows]


_BACKFILL_COLUMNS = [
    "run_id", "from_ms", "to_ms", "rule_ids", "late_through_batch", "events_evaluated",
    "corrections", "retractions", "started_at", "finished_at", "lock_seconds",
    "airflow_run_id", "late_events", "out_of_order_events",
]  # fmt: skip


def rule_rates(
    settings: Settings, rule_ids: Collection[int], now_ms: int, minutes: int = RATE_MINUTES
) -> dict[int, RuleRate]:
    """Each of ``rule_ids``' ALERT rows per minute over the last ``minutes`` (by
    decisionTime; notified and suppressed, a SHADOW candidate's left out) and the share of
    the payments accepted in those minutes (the events table's ingest_time) it fired on.
    Both tables are written behind Redis (``write_behind_seconds``), so the newest minutes
    fill in late.

    The alerts are counted from the alerts table's per-minute counts, kept up to date file
    by file (``alert_files.AlertMinutes``), not read: the stream decides a payment once,
    so a rule's ALERT rows are of distinct payments, and the payments it fired on are its
    rows. The payments are counted in the events files of those minutes (the older ones
    are skipped by their statistics)."""
    since = minute_starts(now_ms, minutes)[0]
    counts: list[tuple[int, int, bool, int]] = []
    fired: dict[int, int] = {}
    alerts = _table(settings.table_path(ALERTS))
    if alerts is not None:
        with FOLDS_LOCK:
            for key, minute, n in alert_minutes(alerts).between(since):
                rule_id, _, kind, shadow, suppressed = key
                if kind != AlertKind.ALERT.value or shadow:
                    continue
                counts.append((rule_id, minute, suppressed, n))
                fired[rule_id] = fired.get(rule_id, 0) + n
    payments = 0
    events = _table(settings.table_path(EVENTS))
    if events is not None:
        recent = pruned_dataset(events, "ingest_time", [(since, EVER)])
        payments = recent.count_rows(filter=pc.field("ingest_time") >= since)
    return _rule_rates(counts, fired, payments, rule_ids, now_ms, minutes)


def case_alerts(
    settings: Settings, case_id: str, newest: int | None = None
) -> list[dict[str, Any]]:
    """The case's alerts in the alerts table as SPEC §4 records (``suppressed`` when so),
    in time order (``CaseStore.alerts``; ``newest``: only the last that many); empty before
    the stream has written any. A backfill's retraction of an alert of the case is among
    them, and the alert it retracts is marked ``"retracted": true`` (``mark_retracted``)."""
    rows = CaseStore(settings).alerts(case_id, newest)
    if rows.num_rows == 0:
        return []
    wanted = [*_RECORD_COLUMNS, "suppressed", "suppressedBy"]
    columns = [c for c in wanted if c in rows.schema.names]
    return mark_retracted([_alert_record(r) for r in rows.select(columns).to_pylist()])


_PAYMENT_COLUMNS = [
    "transactionId", "eventTime", "payerId", "beneficiaryId", "paymentAmount", "paymentType",
]  # fmt: skip


def case_payments(
    settings: Settings,
    key: Mapping[str, str],
    transaction_ids: Collection[str],
    event_times: Collection[int] = (),
) -> list[dict[str, Any]]:
    """The accepted events of ``transaction_ids`` (a case's payments) of the case ``key``
    (its field narrows the scan), by eventTime; amounts as decimal text. Those the stream
    has not written to Delta yet are missing. ``event_times``: the payments' eventTimes
    (their alerts carry them): the scan then skips every data file outside them."""
    table = _table(settings.table_path(EVENTS))
    if table is None or not transaction_ids:
        return []
    where = pc.field("transactionId").isin(pa.array(sorted(transaction_ids), pa.string()))
    dataset = table.to_pyarrow_dataset()
    if event_times:
        dataset = pruned_dataset(table, "eventTime", [(min(event_times), max(event_times))])
    for name, value in key.items():
        if name in FIELDS_BY_NAME and FIELDS_BY_NAME[name].kind is not FieldKind.AMOUNT:
            where = where & (pc.field(name) == str(value))
    rows = dataset.to_table(filter=where, columns=_PAYMENT_COLUMNS)
    seen: dict[str, dict[str, Any]] = {}
    ordered = rows.sort_by([("eventTime", "ascending"), ("transactionId", "ascending")])
    for row in ordered.to_pylist():
        row["paymentAmount"] = format_decimal(row["paymentAmount"])
        seen.setdefault(row["transactionId"], row)
    return list(seen.values())
