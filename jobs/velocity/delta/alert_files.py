"""What the page needs of the whole alerts table, kept up to date file by file (delta-rs,
``velocity.delta.file_folds``): a look reads only the data files appended since the last.

- ``AlertMinutes``: the alerts per (ruleId, ruleVersion, kind, shadow, suppressed, minute of
  decisionTime), summed over the files read; each file's part is kept apart, so a file
  that OPTIMIZE replaced is taken out and its replacement read. The rule rates and each
  version's alert volumes add these up instead of reading the alerts they count.
- ``AlertIdIndex``: per data file, its decisionTime range and sorted 32-bit fingerprints of
  its alertIds and transactionIds (8 bytes an alert): looking an alert up by id, or a
  payment's alerts, reads the one or two files whose fingerprints hold it, not a column
  of every file. Fingerprints are of this process's string hash: a collision only makes
  one more file read, never a wrong answer.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyarrow import fs as pafs

from velocity.analyst.rule_rates import MINUTE_MS
from velocity.delta.file_folds import FOLDS_LOCK, folded

# (ruleId, ruleVersion, kind, shadow, suppressed) of counted alerts; null flags count as
# false (a table of an older Velocity has neither column).
CountKey = tuple[int, int, str, bool, bool]
_COUNTED = ["ruleId", "ruleVersion", "kind", "decisionTime", "shadow", "suppressed"]


def _read_file(uri: str, columns: Sequence[str]) -> pa.Table:
    """``columns`` of one data file; a column the file lacks (added to the table later)
    comes as nulls."""
    filesystem, path = pafs.FileSystem.from_uri(uri)
    with filesystem.open_input_file(unquote(path)) as source:
        parquet = pq.ParquetFile(source)
        present = [c for c in columns if c in parquet.schema_arrow.names]
        table = parquet.read(columns=present, use_threads=False)
    for name in columns:
        if name not in present:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.bool_()))
    return table


def minute_counts(rows: pa.Table) -> list[tuple[CountKey, int, int]]:
    """(key, minute start, alerts) of alert rows with the ``_COUNTED`` columns."""
    if rows.num_rows == 0:
        return []
    decided = rows.column("decisionTime").to_numpy()
    grouped = (
        pa.table(
            {
                "ruleId": rows.column("ruleId"),
                "ruleVersion": rows.column("ruleVersion"),
                "kind": rows.column("kind"),
                "shadow": pc.fill_null(rows.column("shadow"), False),
                "suppressed": pc.fill_null(rows.column("suppressed"), False),
                "minute": pa.array(decided - decided % MINUTE_MS, pa.int64()),
            }
        )
        .group_by(["ruleId", "ruleVersion", "kind", "shadow", "suppressed", "minute"])
        .aggregate([([], "count_all")])
    )
    return [
        (
            (int(r["ruleId"]), int(r["ruleVersion"]), str(r["kind"]), r["shadow"], r["suppressed"]),
            int(r["minute"]),
            int(r["count_all"]),
        )
        for r in grouped.to_pylist()
    ]


@dataclass(frozen=True)
class FileSpan:
    """A data file's rows and the decisionTimes of its first and last decision."""

    rows: int
    first_decision: int
    last_decision: int


@dataclass
class AlertMinutes:
    """Alerts per (``CountKey``, minute), and each file's ``FileSpan``, over the data files
    read so far."""

    by_minute: dict[int, dict[CountKey, int]] = field(default_factory=dict)
    minutes: list[int] = field(default_factory=list)  # by_minute's keys, in order
    parts: dict[str, list[tuple[CountKey, int, int]]] = field(default_factory=dict)
    spans: dict[str, FileSpan] = field(default_factory=dict)

    def add_file(
        self, uri: str, counts: list[tuple[CountKey, int, int]], span: FileSpan | None = None
    ) -> None:
        self.parts[uri] = counts
        if span is not None:
            self.spans[uri] = span
        self._apply(counts, 1)

    def forget(self, uris: set[str]) -> bool:
        for uri in uris:
            self._apply(self.parts.pop(uri, []), -1)
            self.spans.pop(uri, None)
        return True

    def _apply(self, counts: list[tuple[CountKey, int, int]], sign: int) -> None:
        for key, minute, n in counts:
            cell = self.by_minute.get(minute)
            if cell is None:
                cell = self.by_minute[minute] = {}
                bisect.insort(self.minutes, minute)
            cell[key] = cell.get(key, 0) + sign * n
            if not cell[key]:
                del cell[key]
            if not cell:
                del self.by_minute[minute]
                del self.minutes[bisect.bisect_left(self.minutes, minute)]

    def between(
        self, first_minute: int, last_minute: int | None = None
    ) -> Iterator[tuple[CountKey, int, int]]:
        """(key, minute, alerts) of the minutes from ``first_minute`` to ``last_minute``
        (inclusive; None: the newest), oldest first."""
        start = bisect.bisect_left(self.minutes, first_minute)
        end = (
            len(self.minutes)
            if last_minute is None
            else bisect.bisect_right(self.minutes, last_minute)
        )
        for minute in self.minutes[start:end]:
            for key, n in self.by_minute[minute].items():
                yield key, minute, n


EVER = 2**62  # an upper bound of any decisionTime or eventTime, for a range left open


def alert_minutes(table: DeltaTable) -> AlertMinutes:
    """The alerts table's ``AlertMinutes`` as of ``table``'s version (hold ``FOLDS_LOCK``
    while reading it)."""

    def feed(fold: AlertMinutes, uris: Sequence[str]) -> None:
        for uri in uris:
            rows = _read_file(uri, _COUNTED)
            span = None
            if rows.num_rows:
                decided = rows.column("decisionTime")
                span = FileSpan(
                    rows.num_rows, int(pc.min(decided).as_py()), int(pc.max(decided).as_py())
                )
            fold.add_file(uri, minute_counts(rows), span)

    return folded(table, AlertMinutes, AlertMinutes, feed, AlertMinutes.forget)


@dataclass(frozen=True)
class FileIds:
    """One data file's decisionTime range and sorted fingerprints of its alertIds and of
    its transactionIds."""

    first_decision: int
    last_decision: int
    alert_ids: np.ndarray
    transaction_ids: np.ndarray


def fingerprint(text: str) -> int:
    return hash(text) & 0xFFFFFFFF


def fingerprints(texts: list[str]) -> np.ndarray:
    prints = np.fromiter((fingerprint(t) for t in texts), np.uint32, len(texts))
    prints.sort()
    return prints


def _holds(prints: np.ndarray, wanted: int) -> bool:
    at = int(np.searchsorted(prints, wanted))
    return at < len(prints) and int(prints[at]) == wanted


@dataclass
class AlertIdIndex:
    """``FileIds`` of each data file read so far."""

    files: dict[str, FileIds] = field(default_factory=dict)

    def add_file(self, uri: str, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        decided = rows.column("decisionTime")
        self.files[uri] = FileIds(
            int(pc.min(decided).as_py()),
            int(pc.max(decided).as_py()),
            fingerprints(rows.column("alertId").to_pylist()),
            fingerprints([str(t) for t in rows.column("transactionId").to_pylist()]),
        )

    def forget(self, uris: set[str]) -> bool:
        for uri in uris:
            self.files.pop(uri, None)
        return True

    def decision_ranges(
        self, alert_id: str | None, transaction_id: str | None
    ) -> list[tuple[int, int]]:
        """The decisionTime ranges of the files that may hold ``alert_id`` (or, with None,
        an alert of ``transaction_id``)."""
        if alert_id is not None:
            wanted, column = fingerprint(alert_id), "alert_ids"
        else:
            wanted, column = fingerprint(str(transaction_id)), "transaction_ids"
        return [
            (f.first_decision, f.last_decision)
            for f in self.files.values()
            if _holds(getattr(f, column), wanted)
        ]


def id_ranges(
    table: DeltaTable, alert_id: str | None = None, transaction_id: str | None = None
) -> list[tuple[int, int]]:
    """The decisionTime ranges of the alerts table's data files that may hold the alert
    ``alert_id`` (or an alert of ``transaction_id``); none: no file does. As of
    ``table``'s version."""

    def feed(fold: AlertIdIndex, uris: Sequence[str]) -> None:
        for uri in uris:
            fold.add_file(uri, _read_file(uri, ["alertId", "transactionId", "decisionTime"]))

    with FOLDS_LOCK:
        index = folded(table, AlertIdIndex, AlertIdIndex, feed, AlertIdIndex.forget)
        return index.decision_ranges(alert_id, transaction_id)


def merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` (inclusive) with overlapping ones joined, in order."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def pruned_dataset(
    table: DeltaTable,
    column: str,
    ranges: Sequence[tuple[int, int]],
    also: Sequence[tuple[str, str, int]] = (),
) -> Any:
    """The table's Arrow dataset of only the data files whose ``column`` statistics may
    fall in one of ``ranges`` (inclusive) and whose statistics may pass each of ``also``
    (``(column, op, value)``), chosen by delta-rs before any fragment is made: the whole
    table's dataset makes one per file, a cost that grows with the table."""
    groups = [[(column, ">=", low), (column, "<=", high), *also] for low, high in merged(ranges)]
    if not groups:  # nothing can match: a predicate no file's statistics pass
        groups = [[(column, "<", -(2**62)), (column, ">", 2**62)]]
    return table.to_pyarrow_dataset(file_pruning_predicate=groups, filesystem=_filesystem(table))


def _filesystem(table: DeltaTable) -> Any:
    """Arrow's own filesystem rooted at a local table (None elsewhere: delta-rs's): scans
    through delta-rs's Python filesystem leave Arrow threads that abort a short command at
    exit (apache/arrow#34314, delta-rs#2184), and read slower."""
    if not table.table_uri.startswith("file://"):
        return None
    filesystem, root = pafs.FileSystem.from_uri(table.table_uri)
    return pafs.SubTreeFileSystem(unquote(root), filesystem)
