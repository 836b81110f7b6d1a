"""Analysts' reviews of alerts, in the append-only Delta table ``alert_reviews``.

Written and read with delta-rs, without a JVM: the page records a review in a fraction of
a second. The table's one writer; rows are only ever appended (a new review of an alert
is a new row, and the latest counts: ``velocity.analyst.reviews``), so it is the history of who
concluded what, and when.

Each review is checked whole before anything is read or written (``InvalidReviewError``
names the field). Its commit is conditional on the table version it was planned from
(no commit retries): the review's ``when`` is made later than the alert's previous review
in that version, and a commit that another review beat is planned again on top, so
"latest" is never a tie.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
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
from velocity.delta.file_folds import FOLDS_LOCK, current_table, folded
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


class ReviewStore:
    """The reviews in the Delta table at ``path`` (the table's one writer)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    @property
    def path(self) -> Path:
        return self._path

    def all(self) -> list[Review]:
        """Every review ever recorded, oldest first; empty before the first."""
        table = open_table(self._path)
        return [] if table is None else _reviews(table)

    def latest(self) -> Mapping[str, Review]:
        """The review that counts for each reviewed alert, by alertId (kept up to date
        file by file: a look reads only the reviews recorded since the last). A read-only
        view of what this process keeps, not a copy: a page looks up the alerts it shows."""
        table = current_table(self._path)
        if table is None:
            return {}
        with FOLDS_LOCK:
            return MappingProxyType(_book(table).latest)

    def verdicts(self) -> dict[tuple[int, int], dict[Verdict, int]]:
        """How many alerts' latest reviews give each verdict, per (ruleId, ruleVersion)."""
        table = current_table(self._path)
        if table is None:
            return {}
        with FOLDS_LOCK:
            return {v: dict(found) for v, found in _book(table).verdicts.items()}

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
                previous = _book(table).latest.get(alert_id)
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
        """Review every alert of ``alerts`` alike (a case closed with its verdict), in one
        commit; each review checked whole before anything is written. With
        ``unreviewed_only``, an alert that has a review already is skipped."""
        reviews = [make_review(a.alert_id, a, verdict, note, who, 0) for a in alerts]
        if not reviews:
            return []

        def plan(table: DeltaTable) -> tuple[Table | None, list[Review]]:
            with FOLDS_LOCK:
                latest = _book(table).latest
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


def _reviews(table: DeltaTable) -> list[Review]:
    rows = read_rows(table, _COLUMNS)
    return sorted((Review.from_row(r) for r in rows), key=lambda r: (r.when, r.alert_id))


def _book(table: DeltaTable) -> ReviewBook:
    """The latest reviews as of ``table``'s version, fed only the files not read yet
    (``velocity.delta.file_folds``); hold ``FOLDS_LOCK`` while reading it."""

    def feed(book: ReviewBook, uris: Sequence[str]) -> None:
        book.add(Review.from_row(r) for r in read_files(table, uris, _COLUMNS))

    return folded(table, ReviewBook, ReviewBook, feed)
