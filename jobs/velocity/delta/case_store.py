"""Cases in Delta (SPEC §4a), through delta-rs: the ``cases`` table (one row per case, when
it opened) and the append-only ``case_events`` table (its whole life: ``velocity.analyst.cases``).

The stream's write-behind gathers each flushed group's alerts into cases
(``gather_alerts``) before it appends them, so every alert row carries its ``caseId``;
people assign, close and reopen (``CaseStore.assign`` …). Both append to ``case_events``
conditionally on the version they planned from (``small_tables.append_planned``): a flush
never joins alerts to a case that someone closed after it read the table, it reads again.
A flush redone after a crash finds its own events (by its batch) and reuses them.

A backfill's corrections open or join cases as the stream's alerts do
(``assign_backfill``, then ``record_backfill`` once their rows are appended), and its
retractions of alerts of a case are noted in that case.

Closing a case reviews each of its alerts with the case's verdict in the close's one
commit: its ``closed`` row lists the alerts it reviewed (``review_store.CLOSE_REVIEWS``),
so precision per rule version stays what reviews make it and no crash leaves a case
closed with its alerts unreviewed.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from velocity.analyst.case_queue import CaseCursor, CaseSort
from velocity.analyst.cases import (
    ALERT_TIME_ORDER,
    BACKFILL_ACTOR,
    Case,
    CaseAlert,
    CaseBook,
    CaseEvent,
    CaseEventKind,
    CaseStatus,
    ClosedCase,
    OpenCases,
    alert_spans,
    backfill_case_events,
    case_key_text,
    fold_cases,
    person_event,
    resolve_case_id,
    stream_case_events,
)
from velocity.analyst.reviews import AlertRef, make_review
from velocity.delta.alert_files import case_rows_of_files, pruned_dataset
from velocity.delta.case_snapshot import (
    CaseSnapshotSummary,
    restore_cases,
    snapshot_root,
    write_snapshot,
)
from velocity.delta.file_folds import FOLDS_LOCK, current_table, folded
from velocity.delta.names import ALERT_REVIEWS, ALERTS, CASE_EVENTS, CASES
from velocity.delta.review_store import (
    CLOSE_REVIEWS,
    ReviewStore,
    close_note,
    close_reviews_text,
)
from velocity.delta.small_tables import (
    append_planned,
    create_if_missing,
    open_table,
    read_files,
    read_rows,
    rows_table,
)
from velocity.domain.alerts import AlertKind, stored_outcome
from velocity.domain.rules import Outcome
from velocity.errors import UsageError
from velocity.settings import Settings

CASE_EVENT_ARROW_SCHEMA = pa.schema(
    [
        pa.field("caseId", pa.string()),
        pa.field("caseKey", pa.string()),
        pa.field("event", pa.string()),
        pa.field("at", pa.int64()),
        pa.field("who", pa.string()),
        pa.field("assignee", pa.string()),
        pa.field("verdict", pa.string()),
        pa.field("note", pa.string()),
        pa.field("alerts", pa.int64()),
        pa.field("ruleCounts", pa.string()),  # JSON {"ruleId": count}
        pa.field("amount", pa.string()),  # decimal text
        pa.field("firstAlertAt", pa.int64()),
        pa.field("latestAlertAt", pa.int64()),
        pa.field("batch", pa.int64()),  # the write-behind group's last batch; null: a person's
        # The strongest outcome of the alerts the event brought (ALERT, REVIEW, BLOCK);
        # null for a person's event and in a table of an older Velocity.
        pa.field("outcome", pa.string()),
        # A close's reviews: the alerts it reviewed (``review_store.CLOSE_REVIEWS``); null
        # in every other row. Not read with the events: a case's fold has no need of it.
        pa.field(CLOSE_REVIEWS, pa.string()),
    ]
)
CASE_ARROW_SCHEMA = pa.schema(
    [
        pa.field("caseId", pa.string()),
        pa.field("caseKey", pa.string()),
        pa.field("openedAt", pa.int64()),  # decisionTime of its first alert
        pa.field("batch", pa.int64()),  # null: opened by a backfill
    ]
)
_EVENT_COLUMNS = [n for n in CASE_EVENT_ARROW_SCHEMA.names if n != CLOSE_REVIEWS]
# A case's events as the case book's snapshot keeps them (``case_snapshot``).
_EVENT_SCHEMA = pa.schema([CASE_EVENT_ARROW_SCHEMA.field(n) for n in _EVENT_COLUMNS])
_CORRECTION = AlertKind.CORRECTION.value
_RETRACTION = AlertKind.RETRACTION.value
# The kinds of a backfill's events for its corrections, and for its retractions.
_GATHERED = frozenset({CaseEventKind.OPENED, CaseEventKind.JOINED})
_RETRACTED = frozenset({CaseEventKind.RETRACTED})


class CaseStore:
    """One data dir's cases."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.events_path: Path = settings.table_path(CASE_EVENTS)
        self.cases_path: Path = settings.table_path(CASES)

    def events(self) -> list[CaseEvent]:
        table = open_table(self.events_path)
        return [] if table is None else _events(table)

    def cases(self) -> dict[str, Case]:
        """Every case as of the table's newest version: this process's case book brought up
        to date, or, at its first look, the snapshot maintenance writes
        (``write_snapshot``) and the case events written after it."""
        table = current_table(self.events_path)
        if table is None:
            return {}
        with FOLDS_LOCK:
            return dict(_folded(table, CaseBook, self.settings.data_dir).cases)

    def write_snapshot(self) -> CaseSnapshotSummary | None:
        """Write the case book's snapshot (``velocity.delta.case_snapshot``): every case
        as of the table's newest version, folded from the current snapshot and the case
        events after it. Maintenance runs it; None before the table exists."""
        with FOLDS_LOCK:  # opened inside: no fold of this process is of a newer version
            table = open_table(self.events_path)
            if table is None:
                return None
            files = set(table.file_uris())
            book = _folded(table, CaseBook, self.settings.data_dir)
            root = snapshot_root(self.settings.data_dir)
            return write_snapshot(root, table, files, book.cases, _EVENT_SCHEMA)

    def listed(
        self,
        status: CaseStatus | None = None,
        outcome: Outcome | None = None,
        sort: CaseSort = CaseSort.NEWEST,
    ) -> list[Case]:
        """The cases, newest activity first (or strongest outcome first: ``sort``); only
        those of ``status`` and of strongest outcome ``outcome`` when given."""
        chosen = [
            c
            for c in self.cases().values()
            if (status is None or c.status is status) and (outcome is None or c.outcome is outcome)
        ]
        return sorted(chosen, key=lambda c: CaseCursor.of(c, sort).key, reverse=True)

    def case(self, case_id: str) -> Case:
        found = self.cases().get(case_id)
        if found is None:
            raise UsageError(f"no case {case_id!r} under {self.settings.data_dir}")
        return found

    def resolve(self, given: str) -> str:
        """The id of the one case whose id is ``given`` or starts with it (``8c1f``,
        ``8c1f…``: ``resolve_case_id``); a ``UsageError`` naming the candidates else."""
        return resolve_case_id(given, self.cases(), self.settings.data_dir)

    # --- the stream's write-behind -----------------------------------------------------

    def gather_alerts(self, alerts: pa.Table, events: pa.Table, batch: int) -> pa.Table:
        """The ``alerts`` rows of a flushed group (its ALERT rows), each with the case it
        opens or joins in ``caseId``; the group's case events and new cases committed
        first. ``events``: the group's accepted events (the case key's field and the
        amount of each alerting payment); ``batch``: the group's last batch."""
        field = self.settings.case_key
        picked = _case_alerts(alerts, events, field)
        if not picked:
            return alerts

        def plan(table: DeltaTable) -> tuple[Any, dict[str, str]]:
            index = _open_cases(table)
            mine = index.by_batch.get(batch)
            if mine:  # a redone flush: its events are in already
                return None, {a.alert_id: mine[a.case_key] for a in picked}
            open_cases = index.open_case_of({a.case_key for a in picked})
            now = int(time.time() * 1000)
            rows, case_of = stream_case_events(picked, open_cases, batch, now)
            return _event_rows(rows), case_of

        case_of = append_planned(
            self.events_path, CASE_EVENT_ARROW_SCHEMA, plan, "the group's cases were not written"
        )
        self._record_opened(batch)
        ids = pa.array([case_of.get(a) for a in alerts.column("alertId").to_pylist()], pa.string())
        return alerts.set_column(alerts.schema.get_field_index("caseId"), "caseId", ids)

    def review_late_alerts(self, alerts: pa.Table) -> int:
        """Review a flushed group's ``alerts`` (rows with their ``caseId``) whose case was
        closed after they joined it and before their rows landed: the close reviewed the
        rows it found, not these. Each gets its case's verdict, by whoever closed it; an
        alert reviewed already is left alone (a redone flush, or the close saw it after
        all). Returns how many were reviewed."""
        if alerts.num_rows == 0 or "caseId" not in alerts.column_names:
            return 0
        joined = {c for c in alerts.column("caseId").to_pylist() if c is not None}
        table = open_table(self.events_path) if joined else None
        # The write-behind's own index says which are closed; only a close that raced
        # this flush (rare) reads their closing events.
        if table is None or not (closed_ids := _open_cases(table).closed(sorted(joined))):
            return 0
        cases = fold_cases(e for e in _events(table) if e.case_id in closed_ids)
        closed = {c: cases[c] for c in closed_ids}
        reviews = self._reviews()
        wanted = ["alertId", "kind", "ruleId", "ruleVersion", "decisionTime", "caseId"]
        # A backfill's retraction in a case is no alert to review.
        rows = [r for r in alerts.select(wanted).to_pylist() if r["kind"] != _RETRACTION]
        reviewed = 0
        for case_id, case in sorted(closed.items()):
            closing = next(e for e in reversed(case.history) if e.event is CaseEventKind.CLOSED)
            refs = [AlertRef.of(r) for r in rows if r["caseId"] == case_id]
            reviewed += len(
                reviews.record_all(
                    refs,
                    case.verdict,
                    close_note(case_id, closing.note),
                    closing.who,
                    unreviewed_only=True,
                )
            )
        return reviewed

    def _record_opened(self, batch: int) -> None:
        """The cases the group's events opened, in ``cases`` (once: a redo finds them)."""
        table = open_table(self.events_path)
        self._record_cases([] if table is None else _open_cases(table).opened_by(batch), batch)

    def _record_cases(self, opened: list[tuple[str, str, int]], batch: int | None) -> None:
        """``opened`` ((caseId, caseKey, openedAt) of cases a write-behind group of last
        batch ``batch`` opened, or a backfill: None) in ``cases``, those not there yet."""

        def plan(cases: DeltaTable) -> tuple[Any, None]:
            rows = read_rows(cases, ["caseId", "batch"]) if opened else []
            done = {r["caseId"] for r in rows if batch is None or r["batch"] == batch}
            new = [o for o in opened if o[0] not in done]
            if not new:
                return None, None
            columns: dict[str, list[Any]] = {
                "caseId": [case_id for case_id, _, _ in new],
                "caseKey": [key for _, key, _ in new],
                "openedAt": [opened_at for _, _, opened_at in new],
                "batch": [batch for _ in new],
            }
            return rows_table(CASE_ARROW_SCHEMA, columns), None

        refused = "the opened cases were not written"
        append_planned(self.cases_path, CASE_ARROW_SCHEMA, plan, refused)

    # --- a backfill's amendments ----------------------------------------------------------

    def assign_backfill(self, corrections: pa.Table, payments: pa.Table) -> dict[str, str]:
        """The case each of a backfill's ``corrections`` (its CORRECTION rows, before they
        are appended) opens or joins, by alertId: chosen as the write-behind chooses a
        stream alert's (``stream_case_events``: the open case of its payment's case key,
        or a new one, deterministic in the key and its first alert). Nothing is written:
        ``record_backfill`` commits the cases' events once the rows are in the alerts
        table. ``payments``: the transactionId, case key field and paymentAmount of the
        corrections' payments (``gather_alerts``' ``events``)."""
        picked = _case_alerts(corrections, payments, self.settings.case_key, _CORRECTION)
        table = open_table(self.events_path) if picked else None
        keys = {a.case_key for a in picked}
        open_cases = {} if table is None else _open_cases(table).open_case_of(keys)
        _, case_of = stream_case_events(picked, open_cases, None, 0, BACKFILL_ACTOR)
        return case_of

    def record_backfill(
        self,
        amendments: pa.Table,
        payments: pa.Table,
        counted: Collection[tuple[str, str]] = (),
    ) -> int:
        """The case events of a backfill's ``amendments``, appended to the alerts table
        with their ``caseId`` (``assign_backfill`` chose a correction's; a retraction's is
        the case of the alert it retracts), in one commit: its corrections open or join
        their cases (``backfill_case_events``), its retractions are noted in theirs
        (``retracted``). Then the new cases go into ``cases``, and corrections whose case
        someone closed since they were assigned are reviewed with its verdict
        (``review_late_alerts``, as the write-behind does).

        Once, however often it is called (a backfill's recovery after a crash calls it
        again): an amendment whose case has a backfill's event of its kind spanning its
        decision time already is left out. ``counted``: (caseId, transactionId) of the
        alerts of the corrections' payments in cases already (a payment counts once in a
        case's amount). Returns how many events were written."""
        wanted = ["alertId", "kind", "decisionTime", "caseId"]
        rows = [r for r in amendments.select(wanted).to_pylist() if r["caseId"] is not None]
        if not rows:
            return 0
        case_of = {r["alertId"]: r["caseId"] for r in rows if r["kind"] == _CORRECTION}
        corrections = _case_alerts(amendments, payments, self.settings.case_key, _CORRECTION)
        joining = [(case_of[a.alert_id], a) for a in corrections if a.alert_id in case_of]
        retractions = [
            (r["caseId"], int(r["decisionTime"])) for r in rows if r["kind"] == _RETRACTION
        ]
        known = set(counted)

        def plan(table: DeltaTable) -> tuple[Any, list[CaseEvent]]:
            with FOLDS_LOCK:
                book = _folded(table, CaseBook, self.settings.data_dir).cases
                histories = {
                    c: list(book[c].history)
                    for c in {c for c, _ in joining} | {c for c, _ in retractions}
                    if c in book
                }
                keys = {c: book[c].case_key for c in histories}

            def done(case_id: str, kinds: frozenset[CaseEventKind], decided: int) -> bool:
                return any(
                    e.who == BACKFILL_ACTOR
                    and e.event in kinds
                    and (e.first_alert_at or 0) <= decided <= (e.latest_alert_at or 0)
                    for e in histories.get(case_id, ())
                )

            events = backfill_case_events(
                [(c, a) for c, a in joining if not done(c, _GATHERED, a.decision_time)],
                [
                    (c, keys[c], d)
                    for c, d in retractions
                    if c in keys and not done(c, _RETRACTED, d)
                ],
                histories.keys(),
                int(time.time() * 1000),
                known,
            )
            return (_event_rows(events) if events else None), events

        events = append_planned(
            self.events_path, CASE_EVENT_ARROW_SCHEMA, plan, "the backfill's cases were not written"
        )
        # The cases a backfill opened for these, in ``cases`` (a recovery's too: the
        # crash may have come between the events and these rows).
        mine = {c for c, _ in joining}
        with FOLDS_LOCK:
            cases = self.cases() if mine else {}
            opened = [
                (e.case_id, e.case_key, e.first_alert_at or e.at)
                for c in sorted(mine & cases.keys())
                for e in cases[c].history
                if e.event is CaseEventKind.OPENED and e.who == BACKFILL_ACTOR
            ]
        if opened:
            self._record_cases(opened, None)
        self.review_late_alerts(amendments)
        return len(events)

    # --- people -------------------------------------------------------------------------

    def assign(self, case_id: str, assignee: object, who: object) -> Case:
        return self._change(case_id, CaseEventKind.ASSIGNED, who, assignee=assignee)

    def reopen(self, case_id: str, who: object) -> Case:
        return self._change(case_id, CaseEventKind.REOPENED, who)

    def close(self, case_id: str, verdict: object, note: object, who: object) -> ClosedCase:
        """Close the case with ``verdict`` and review each of its alerts so, in one commit
        to ``case_events``: its ``closed`` row carries the verdict and lists the alerts it
        reviews (those of the case in the alerts table, read after the case's version the
        commit is conditional on; ``review_store``). A crash leaves the case open and its
        alerts as they were, or closed with them reviewed.

        Alerts that joined the case but are still written behind are reviewed so by the
        write-behind as it appends them (``review_late_alerts``); any that landed while
        the close was planned and committed (the flush may have looked before the close
        was in), by the close right after its commit, read from the data files added
        since the plan's read only. Returns the case and how many of its alerts are
        reviewed, how many still being written (``ClosedCase``)."""
        reviews = self._reviews()
        alerts_path = self.settings.table_path(ALERTS)

        def plan(
            table: DeltaTable,
        ) -> tuple[Any, tuple[Case, CaseEvent, list[AlertRef], set[str]]]:
            with FOLDS_LOCK:
                found = _folded(table, CaseBook, self.settings.data_dir).cases.get(case_id)
                history = [] if found is None else list(found.history)
            if found is None:
                raise UsageError(f"no case {case_id!r} under {self.settings.data_dir}")
            case = fold_cases(history)[case_id]
            # The close checked whole before the alerts are read.
            checked = person_event(case, CaseEventKind.CLOSED, who, 0, verdict=verdict, note=note)
            read = current_table(alerts_path)  # its files before the read: none missed after
            files_read = set() if read is None else set(read.file_uris())
            refs = self._reviewable(case_id)
            assert checked.verdict is not None
            for ref in refs:  # each review checked whole too (the store's rules)
                make_review(
                    ref.alert_id, ref, checked.verdict, close_note(case_id, checked.note), who, 0
                )
            # Later than each alert's review so far: the close's is then the latest.
            with FOLDS_LOCK:
                latest = reviews.latest()
                before = [latest[r.alert_id].when for r in refs if r.alert_id in latest]
            now = max([int(time.time() * 1000), *(when + 1 for when in before)])
            event = person_event(case, CaseEventKind.CLOSED, who, now, verdict=verdict, note=note)
            closed = fold_cases([*history, event])[case_id]
            closing = (closed, event, refs, files_read)
            return _event_rows([event], close_reviews_text(refs)), closing

        closed, event, refs, files_read = append_planned(
            self.events_path, CASE_EVENT_ARROW_SCHEMA, plan, f"case {case_id} is unchanged"
        )
        reviewed = len(refs)
        if closed.alerts > reviewed:
            listed = {r.alert_id for r in refs}
            landed = [
                r for r in self._landed_since(case_id, files_read) if r.alert_id not in listed
            ]
            if landed:
                assert event.verdict is not None
                note_text = close_note(case_id, event.note)
                reviews.record_all(
                    landed, event.verdict, note_text, event.who, unreviewed_only=True
                )
            reviewed += len(landed)
        return ClosedCase.of(closed, reviewed)

    def _reviewable(self, case_id: str) -> list[AlertRef]:
        """The case's alerts in the alerts table that a close reviews (not a retraction)."""
        return [r for r in self.alert_refs(case_id) if r.kind != _RETRACTION]

    def _landed_since(self, case_id: str, files_read: set[str]) -> list[AlertRef]:
        """``_reviewable`` of the data files the alerts table gained since ``files_read``
        (a file OPTIMIZE rewrote meanwhile is new too: its rows are read again)."""
        table = current_table(self.settings.table_path(ALERTS))
        if table is None:
            return []
        added = [uri for uri in table.file_uris() if uri not in files_read]
        rows = case_rows_of_files(added, case_id, _REF_COLUMNS).to_pylist()
        return [r for r in map(AlertRef.of, rows) if r.kind != _RETRACTION]

    def _reviews(self) -> ReviewStore:
        return ReviewStore(self.settings.table_path(ALERT_REVIEWS), self.events_path)

    def _change(self, case_id: str, kind: CaseEventKind, who: object, **fields: object) -> Case:
        def plan(table: DeltaTable) -> tuple[Any, Case]:
            with FOLDS_LOCK:
                case = _folded(table, CaseBook, self.settings.data_dir).cases.get(case_id)
                if case is None:
                    raise UsageError(f"no case {case_id!r} under {self.settings.data_dir}")
                event = person_event(case, kind, who, int(time.time() * 1000), **fields)
                return _event_rows([event]), fold_cases([*case.history, event])[case_id]

        return append_planned(
            self.events_path, CASE_EVENT_ARROW_SCHEMA, plan, f"case {case_id} is unchanged"
        )

    # --- a case's alerts ----------------------------------------------------------------

    def alerts(
        self, case_id: str, newest: int | None = None, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """The alerts table's rows of the case in time order (``ALERT_TIME_ORDER``: by
        eventTime, then ruleId); ``newest``: only the last that many of that order;
        ``columns``: only those (and the order's).

        Read from the data files of the write-behind groups that brought the case's alerts
        (the decision times its stream events record, ``alert_spans``), newest group
        first, only until the newest rows are certain: a case's page costs what its newest
        alerts cost, after ten million alerts as after ten thousand."""
        table = current_table(self.settings.table_path(ALERTS))
        if table is None:
            return pa.table({})
        case = self.cases().get(case_id)
        spans = None if case is None else alert_spans(case)
        wanted = None if columns is None else list(dict.fromkeys([*columns, *ALERT_TIME_ORDER]))
        where = pc.field("caseId") == case_id
        if spans is None:
            rows = table.to_pyarrow_dataset().to_table(filter=where, columns=wanted)
        else:
            rows = _rows_of_spans(table, where, spans, newest, wanted)
        rows = rows.sort_by([(name, "ascending") for name in ALERT_TIME_ORDER])
        return rows if newest is None else rows.slice(max(0, rows.num_rows - newest))

    def alert_refs(self, case_id: str) -> list[AlertRef]:
        rows = self.alerts(case_id, columns=_REF_COLUMNS)
        if rows.num_rows == 0:
            return []
        return [AlertRef.of(r) for r in rows.select(_REF_COLUMNS).to_pylist()]


_Fold = TypeVar("_Fold", OpenCases, CaseBook)
_REF_COLUMNS = ["alertId", "kind", "ruleId", "ruleVersion", "decisionTime"]  # an AlertRef's


def _folded(table: DeltaTable, kind: type[_Fold], data_dir: Path | None = None) -> _Fold:
    """``kind`` (every case, or the open ones) as of ``table``'s version, fed only the
    case-events files it has not read yet (``velocity.delta.file_folds``); a file read
    before that is gone (rewritten by hand) makes it read the table whole again. With
    ``data_dir``, the case book's first fold in this process (or after such a rewrite)
    starts from the data dir's case snapshot when it holds (``case_snapshot``)."""

    def feed(fold: _Fold, uris: Sequence[str]) -> None:
        fold.add(CaseEvent.from_row(r) for r in read_files(table, uris, _EVENT_COLUMNS))

    def restore(table: DeltaTable, files: set[str]) -> tuple[set[str], _Fold] | None:
        if data_dir is None or kind is not CaseBook:
            return None
        restored = restore_cases(snapshot_root(data_dir), table, files)
        if restored is None:
            return None
        known, cases = restored
        return known, kind(cases=cases)  # type: ignore[call-arg]

    return folded(table, kind, kind, feed, restore=restore)


def _rows_of_spans(
    table: DeltaTable,
    where: Any,
    spans: list[tuple[int, int, int]],
    newest: int | None,
    columns: list[str] | None,
) -> pa.Table:
    """The rows passing ``where`` in the decision-time ``spans`` (newest first, as
    ``alert_spans``), read from the data files of those decision times only; with
    ``newest``, spans are read newest first until the ``newest`` last rows in time order
    are certain: an unread row's eventTime is at most its decisionTime, so at most the
    newest unread span's latest decision."""

    seen: set[str] = set()

    def read(chunk: list[tuple[int, int, int]]) -> pa.Table:
        # The spans choose the files (by their statistics); ``where`` picks the rows.
        dataset = pruned_dataset(table, "decisionTime", [(a, b) for a, b, _ in chunk])
        rows = dataset.to_table(filter=where, columns=columns)
        if seen:  # spans may share a file: a row read before is not taken again
            fresh = pc.invert(pc.is_in(rows.column("alertId"), pa.array(sorted(seen))))
            rows = rows.filter(fresh)
        seen.update(rows.column("alertId").to_pylist())
        return rows

    if columns is not None and "alertId" not in columns:
        columns = [*columns, "alertId"]
    if newest is None:
        return read(spans)
    parts: list[pa.Table] = []
    done = wanted = 0
    while done < len(spans):
        wanted = max(newest, 2 * wanted)
        end, counted = done, 0
        while end < len(spans) and counted < wanted:
            counted += spans[end][2]
            end += 1
        parts.append(read(spans[done:end]))
        done = end
        found = pa.concat_tables(parts)
        if done < len(spans) and found.num_rows >= newest:
            times = found.column("eventTime").to_numpy()
            # The newest-th row's eventTime: an unread row at or above it could still place.
            threshold = np.partition(times, len(times) - newest)[len(times) - newest]
            if max(b for _, b, _ in spans[done:]) < threshold:
                break
    return pa.concat_tables(parts)


def _open_cases(table: DeltaTable) -> OpenCases:
    """The open cases as of ``table``'s version."""
    return _folded(table, OpenCases)


def ensure_case_tables(settings: Settings) -> None:
    create_if_missing(settings.table_path(CASE_EVENTS), CASE_EVENT_ARROW_SCHEMA)
    create_if_missing(settings.table_path(CASES), CASE_ARROW_SCHEMA)


def _events(table: DeltaTable) -> list[CaseEvent]:
    return [CaseEvent.from_row(r) for r in read_rows(table, _EVENT_COLUMNS)]


def _event_rows(events: Sequence[CaseEvent], reviewed: str | None = None) -> Any:
    """The rows of ``events``; ``reviewed``: a close's reviews (``CLOSE_REVIEWS``)."""
    rows = [{**e.to_row(), CLOSE_REVIEWS: reviewed} for e in events]
    names = CASE_EVENT_ARROW_SCHEMA.names
    return rows_table(CASE_EVENT_ARROW_SCHEMA, {n: [r[n] for r in rows] for n in names})


def _case_alerts(
    alerts: pa.Table, events: pa.Table, field: str, kind: str = AlertKind.ALERT.value
) -> list[CaseAlert]:
    """The group's ALERT rows (a backfill's: its CORRECTION rows, ``kind``) as cases see
    them: each with its payment's case key (an alert whose payment has no value of the
    field joins no case) and amount."""
    payments = {
        tx: (value, amount)
        for tx, value, amount in zip(
            events.column("transactionId").to_pylist(),
            events.column(field).to_pylist(),
            events.column("paymentAmount").to_pylist(),
            strict=True,
        )
    }
    out = []
    wanted = ["alertId", "kind", "ruleId", "transactionId", "decisionTime", "outcome"]
    present = [c for c in wanted if c in alerts.column_names]
    for row in alerts.select(present).to_pylist():
        value, amount = payments.get(row["transactionId"], (None, None))
        if row["kind"] != kind or value is None:
            continue
        out.append(
            CaseAlert(
                alert_id=row["alertId"],
                rule_id=int(row["ruleId"]),
                transaction_id=row["transactionId"],
                decision_time=int(row["decisionTime"]),
                case_key=case_key_text(field, str(value)),
                amount=None if amount is None else Decimal(amount),
                outcome=Outcome(stored_outcome(row)),
            )
        )
    return out
