"""Analysts' reviews of alerts, in the append-only Delta table ``alert_reviews``, and the
reviews of a case's close, in its ``closed`` row of ``case_events``.

Written and read with delta-rs, without a JVM: the page records a review in a fraction of
a second. The table's one writer; rows are only ever appended (a new review of an alert
is a new row, and the latest counts: ``velocity.analyst.reviews``), so it is the history of who
concluded what, and when.

A case's close (``velocity.delta.case_store``) is one commit to ``case_events``: its
``closed`` row carries the verdict and lists the alerts it reviews (``CLOSE_REVIEWS``), so
a close can never be half written (closed, its alerts unreviewed). Each listed alert is
reviewed with the close's verdict and note, by its closer, at its time; this store reads
those reviews beside its own table's (``all``, ``latest``, ``verdicts``), and every
reader of reviews reads them through it.

Each review is checked whole before anything is read or written (``InvalidReviewError``
names the field). Its commit is conditional on the table version it was planned from
(no commit retries): the review's ``when`` is made later than the alert's previous review
in that version, and a commit that another review beat is planned again on top, so
"latest" is never a tie.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa
from arro3.core import Table
from deltalake import DeltaTable

from velocity.analyst.reviews import (
    AlertRef,
    Review,
    ReviewBook,
    Verdict,
    make_review,
    review_time,
)
from velocity.delta.file_folds import FOLDS_LOCK, current_table, folded_together
from velocity.delta.names import CASE_EVENTS
from velocity.delta.small_tables import (
    append_planned,
    open_table,
    read_files,
    read_rows,
    rows_table,
)

# Nullable throughout, as the rules table: a table Spark would create reads the same.
REVIEW_ARROW_SCHEMA = pa.schema(
    [
        pa.field("alertId", pa.string()),
        pa.field("ruleId", pa.int64()),
        pa.field("ruleVersion", pa.int32()),
        pa.field("verdict", pa.string()),
        pa.field("note", pa.string()),
        pa.field("who", pa.string()),
        pa.field("when", pa.int64()),  # epoch ms
    ]
)
_COLUMNS = [f.name for f in REVIEW_ARROW_SCHEMA]
# The column of ``case_events`` in which a ``closed`` row lists the alerts its close
# reviewed: JSON [[alertId, ruleId, ruleVersion], ...]; null in every other row (and in
# the rows of an older Velocity, whose closes appended their reviews to this table).
CLOSE_REVIEWS = "reviewed"
_CLOSE_COLUMNS = ["caseId", "event", "at", "who", "verdict", "note", CLOSE_REVIEWS]


def close_reviews_text(alerts: Iterable[AlertRef]) -> str:
    """The ``CLOSE_REVIEWS`` value of a close that reviews ``alerts``."""
    listed = [[a.alert_id, a.rule_id, a.rule_version] for a in alerts]
    return json.dumps(listed, separators=(",", ":"))


def close_note(case_id: str, note: str | None) -> str:
    """The note of the reviews a close of ``case_id`` with ``note`` makes."""
    return note or f"case {case_id} closed"


class ReviewStore:
    """The reviews in the Delta table at ``path`` (the table's one writer), and those of
    the closes in the ``case_events`` table at ``closes`` (default: beside it, as
    ``Settings.table_path`` lays the tables out)."""

    def __init__(self, path: Path, closes: Path | None = None) -> None:
        self._path = path
        self._closes = closes if closes is not None else path.parent / CASE_EVENTS

    @property
    def path(self) -> Path:
        return self._path

    def all(self) -> list[Review]:
        """Every review ever recorded (a close's too), oldest first; empty before the first."""
        table = open_table(self._path)
        found = [] if table is None else [Review.from_row(r) for r in read_rows(table, _COLUMNS)]
        events = open_table(self._closes)
        if events is not None:
            found.extend(_close_reviews(read_rows(events, _CLOSE_COLUMNS)))
        return sorted(found, key=lambda r: (r.when, r.alert_id))

    def latest(self) -> Mapping[str, Review]:
        """The review that counts for each reviewed alert, by alertId (kept up to date
        file by file: a look reads only the reviews recorded since the last). A read-only
        view of what this process keeps, not a copy: a page looks up the alerts it shows."""
        book = self._current()
        if book is None:
            return {}
        with FOLDS_LOCK:
            return MappingProxyType(book.latest)

    def verdicts(self) -> dict[tuple[int, int], dict[Verdict, int]]:
        """How many alerts' latest reviews give each verdict, per (ruleId, ruleVersion)."""
        book = self._current()
        if book is None:
            return {}
        with FOLDS_LOCK:
            return {v: dict(found) for v, found in book.verdicts.items()}

    def _current(self) -> ReviewBook | None:
        table, events = current_table(self._path), current_table(self._closes)
        if table is None and events is None:
            return None
        return self._book(table, events)

    def _book(self, table: DeltaTable | None, events: DeltaTable | None) -> ReviewBook:
        """The latest reviews as of ``table``'s and ``events``' versions (the reviews
        table's and the closes'), fed only the files not read yet
        (``velocity.delta.file_folds``); hold ``FOLDS_LOCK`` while reading it."""
        mine = str(self._path)

        def feed(book: ReviewBook, path: str, uris: Sequence[str]) -> None:
            if path == mine:
                assert table is not None
                book.add(Review.from_row(r) for r in read_files(table, uris, _COLUMNS))
            else:
                assert events is not None
                book.add(_close_reviews(read_files(events, uris, _CLOSE_COLUMNS)))

        both = {mine: table, str(self._closes): events}
        return folded_together(both, ReviewBook, ReviewBook, feed)

    def record(
        self,
        alert_id: str,
        alert: AlertRef | None,
        verdict: object,
        note: object,
        who: object,
        now_ms: int | None = None,
    ) -> Review:
        """Append one review of ``alert`` (looked up by the caller; None: no such alert) in
        one commit, and return it; nothing is written on any error."""
        review = make_review(alert_id, alert, verdict, note, who, 0)  # before any read

        def plan(table: DeltaTable) -> tuple[Table, Review]:
            with FOLDS_LOCK:
                previous = self._book(table, current_table(self._closes)).latest.get(alert_id)
            now = now_ms if now_ms is not None else int(time.time() * 1000)
            timed = replace(review, when=review_time(now, previous))
            return _rows_table(timed), timed

        # Conditional: a review planned from an older version might be no later than a
        # review of the same alert committed since.
        return append_planned(
            self._path, REVIEW_ARROW_SCHEMA, plan, "no review was recorded — review again"
        )

    def record_all(
        self,
        alerts: Sequence[AlertRef],
        verdict: object,
        note: object,
        who: object,
        *,
        unreviewed_only: bool = False,
    ) -> list[Review]:
        """Review every alert of ``alerts`` alike, in one commit; each review checked whole
        before anything is written. With ``unreviewed_only``, an alert that has a review
        already is skipped (the alerts of a closed case whose rows landed after its
        close: ``CaseStore.review_late_alerts``)."""
        reviews = [make_review(a.alert_id, a, verdict, note, who, 0) for a in alerts]
        if not reviews:
            return []

        def plan(table: DeltaTable) -> tuple[Table | None, list[Review]]:
            with FOLDS_LOCK:
                latest = self._book(table, current_table(self._closes)).latest
                previous = {r.alert_id: latest[r.alert_id] for r in reviews if r.alert_id in latest}
            now = int(time.time() * 1000)
            chosen = [r for r in reviews if not (unreviewed_only and r.alert_id in previous)]
            if not chosen:
                return None, []
            timed = [replace(r, when=review_time(now, previous.get(r.alert_id))) for r in chosen]
            rows = [r.to_json() for r in timed]
            columns = {name: [row[name] for row in rows] for name in _COLUMNS}
            return rows_table(REVIEW_ARROW_SCHEMA, columns), timed

        return append_planned(
            self._path, REVIEW_ARROW_SCHEMA, plan, "no review was recorded — close again"
        )


def _rows_table(review: Review) -> Table:
    row: dict[str, Any] = review.to_json()
    return rows_table(REVIEW_ARROW_SCHEMA, {name: [row[name]] for name in _COLUMNS})


def _close_reviews(rows: Iterable[Mapping[str, Any]]) -> list[Review]:
    """The reviews of the closes among ``case_events`` rows (``CLOSE_REVIEWS``)."""
    found = []
    for row in rows:
        listed = row.get(CLOSE_REVIEWS)
        if row.get("event") != "closed" or not listed:
            continue
        verdict = Verdict(row["verdict"])
        note = close_note(str(row["caseId"]), row.get("note"))
        who, when = str(row["who"]), int(row["at"])
        for alert_id, rule_id, version in json.loads(listed):
            found.append(
                Review(str(alert_id), int(rule_id), int(version), verdict, note, who, when)
            )
    return found
