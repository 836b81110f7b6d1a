"""What the page needs of the whole alerts table, kept up to date file by file (delta-rs,
``velocity.delta.file_folds``): a look reads only the data files appended since the last.

- ``AlertMinutes``: the alerts per (ruleId, ruleVersion, kind, shadow, suppressed, minute of
  decisionTime), summed over the files read; each file's part is kept apart, so a file
  that OPTIMIZE replaced is taken out and its replacement read. The rule rates and each
  version's alert volumes add these up instead of reading the alerts they count.
- ``AlertIdIndex``: per data file, its decisionTime range and sorted 32-bit fingerprints of
  its alertIds and transactionIds (8 bytes an alert): looking an alert up by id, or a
  payment's alerts, reads the one or two files whose fingerprints hold it, not a column
  of every file. A collision of fingerprints only makes one more file read, never a wrong
  answer.

Each data file's part of each fold is also kept beside the table, in
``<table>/_velocity_file_parts/<format>/<fold>/<data file>.arrow`` (Arrow IPC), written by
the first process that read the file: a data file never changes, so its part never goes
stale, and a fresh process (a restarted api-server, `velocity alerts`) reads the small
parts instead of the data files: 8 bytes an alert for the ids, a row a minute and rule for
the counts. A part missing, unreadable or of another format is made again from its data
file. A folder beginning with ``_`` is not the table's data to Delta (VACUUM leaves it).
Parts of files no longer in the table are removed by the next fresh process's first look.
"""

from __future__ import annotations

import bisect
import logging
import os
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

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


def case_rows_of_files(uris: Sequence[str], case_id: str, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the rows of case ``case_id`` in some of the alerts table's data files
    (``file_uris``): what landed since a read, without reading again what it read."""
    parts = []
    for uri in uris:
        rows = _read_file(uri, [*columns, "caseId"])
        if not pa.types.is_boolean(rows.schema.field("caseId").type):  # nulls: before cases
            parts.append(rows.filter(pc.equal(rows.column("caseId"), case_id)))
    if not parts:
        return pa.table({name: pa.array([], pa.null()) for name in columns})
    return pa.concat_tables(parts, promote_options="permissive").select(list(columns))


_log = logging.getLogger(__name__)
# The parts' format: a change to what a part holds (or to the fingerprint) names a new
# folder, so no process reads a part of another format.
PARTS_FORMAT = "v1"
PARTS_FOLDER = "_velocity_file_parts"


class FileParts:
    """One fold's part of each data file of a local table, kept beside it (see the module
    docstring). Not local (an object store): nothing is kept, every part is made."""

    def __init__(self, table: DeltaTable, fold: str) -> None:
        url = urlparse(table.table_uri)
        local = url.scheme in ("", "file")
        self.root = Path(unquote(url.path)) / PARTS_FOLDER / PARTS_FORMAT / fold if local else None

    @staticmethod
    def _name(uri: str) -> str:
        return unquote(uri.rsplit("/", 1)[-1]) + ".arrow"

    def _path(self, uri: str) -> Path | None:
        return None if self.root is None else self.root / self._name(uri)

    def part(self, uri: str, make: Callable[[str], pa.Table]) -> pa.Table:
        """The kept part of the data file ``uri``, else ``make(uri)``, kept."""
        part = self.read(uri)
        if part is None:
            part = make(uri)
            self.write(uri, part)
        return part

    def forget(self, fold: AlertMinutes | AlertIdIndex, gone: set[str]) -> bool:
        """``file_folds.folded``'s ``forget``: the fold forgets the files, their parts go."""
        self.remove(gone)
        return fold.forget(gone)

    def read(self, uri: str) -> pa.Table | None:
        """The part of the data file ``uri`` (None: not kept, or unreadable)."""
        path = self._path(uri)
        if path is None or not path.exists():
            return None
        try:
            with pa.memory_map(str(path)) as source:
                return pa.ipc.open_file(source).read_all()
        except (OSError, pa.ArrowInvalid) as exc:  # made again from the data file
            _log.warning("file part %s unreadable (%s): read from its data file", path, exc)
            return None

    def write(self, uri: str, part: pa.Table) -> None:
        """Keep ``part`` of the data file ``uri``, whole (a rename) or not at all; a
        failure only costs the next fresh process a read of the data file."""
        path = self._path(uri)
        if path is None:
            return
        staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with pa.OSFile(str(staging), "wb") as sink, pa.ipc.new_file(sink, part.schema) as out:
                out.write_table(part)
            os.replace(staging, path)
        except OSError as exc:
            _log.warning("file part %s not kept: %s", path, exc)
            staging.unlink(missing_ok=True)

    def keep_only(self, uris: Collection[str]) -> None:
        """Remove the parts of data files not among ``uris`` (the table's files now)."""
        if self.root is None or not self.root.is_dir():
            return
        wanted = {self._name(u) for u in uris}
        for path in self.root.iterdir():
            if path.name not in wanted and not path.name.startswith("."):
                path.unlink(missing_ok=True)

    def restore(self, table: DeltaTable, files: set[str]) -> None:
        """``file_folds.folded``'s hook at a fold's start in this process: the parts of
        files gone from the table removed; the fold starts empty (None) and is fed every
        file, mostly from their parts."""
        self.keep_only(files)
        return None

    def remove(self, uris: Collection[str]) -> None:
        for uri in uris:
            path = self._path(uri)
            if path is not None:
                path.unlink(missing_ok=True)


def _minute_table(rows: pa.Table) -> pa.Table:
    """Alert rows with the ``_COUNTED`` columns, counted by ``CountKey`` and minute: a data
    file's part of ``AlertMinutes``."""
    decided = rows.column("decisionTime").to_numpy()
    return (
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


def _counts_of(part: pa.Table) -> list[tuple[CountKey, int, int]]:
    return [
        (
            (int(r["ruleId"]), int(r["ruleVersion"]), str(r["kind"]), r["shadow"], r["suppressed"]),
            int(r["minute"]),
            int(r["count_all"]),
        )
        for r in part.to_pylist()
    ]


def minute_counts(rows: pa.Table) -> list[tuple[CountKey, int, int]]:
    """(key, minute start, alerts) of alert rows with the ``_COUNTED`` columns."""
    if rows.num_rows == 0:
        return []
    return _counts_of(_minute_table(rows))


def _span_metadata(rows: pa.Table) -> dict[bytes, bytes]:
    """The data file's rows and first and last decisionTime, as a part's metadata."""
    if rows.num_rows == 0:
        return {b"rows": b"0"}
    decided = rows.column("decisionTime")
    first, last = pc.min(decided).as_py(), pc.max(decided).as_py()
    return {b"rows": str(rows.num_rows).encode(), b"first": str(first).encode(),
            b"last": str(last).encode()}  # fmt: skip


def _span_of(part: pa.Table) -> FileSpan | None:
    meta = part.schema.metadata or {}
    if int(meta.get(b"rows", b"0")) == 0:
        return None
    return FileSpan(int(meta[b"rows"]), int(meta[b"first"]), int(meta[b"last"]))


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

    parts = FileParts(table, "alert_minutes")

    def made(uri: str) -> pa.Table:
        rows = _read_file(uri, _COUNTED)
        return _minute_table(rows).replace_schema_metadata(_span_metadata(rows))

    def feed(fold: AlertMinutes, uris: Sequence[str]) -> None:
        for uri in uris:
            part = parts.part(uri, made)
            fold.add_file(uri, _counts_of(part), _span_of(part))

    return folded(table, AlertMinutes, AlertMinutes, feed, parts.forget, parts.restore)


@dataclass(frozen=True)
class FileIds:
    """One data file's decisionTime range and sorted fingerprints of its alertIds and of
    its transactionIds."""

    first_decision: int
    last_decision: int
    alert_ids: np.ndarray
    transaction_ids: np.ndarray


_POLY = np.uint64(0x100000001B3)  # a polynomial hash's base: FNV-1's 64-bit prime
_MIX = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))  # MurmurHash3's fmix64
_POWERS = np.cumprod(np.full(256, _POLY, np.uint64), dtype=np.uint64)  # grown as needed


def _prints(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 32-bit fingerprint of each text's UTF-8 bytes, the same in every process (kept
    in the file parts): a polynomial hash of the bytes, mixed. Unsorted; nulls as ''."""
    global _POWERS
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    texts = pc.fill_null(texts.cast(pa.string()), "")
    count = len(texts)
    offsets = np.frombuffer(texts.buffers()[1], np.int32)[texts.offset : texts.offset + count + 1]
    data = np.frombuffer(texts.buffers()[2] or b"", np.uint8)[offsets[0] : offsets[-1]]
    starts = (offsets[:-1] - offsets[0]).astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    longest = int(lengths.max(initial=0))
    if longest > len(_POWERS):
        _POWERS = np.cumprod(np.full(longest, _POLY, np.uint64), dtype=np.uint64)
    position = np.arange(len(data), dtype=np.int64) - np.repeat(starts, lengths)
    sums = np.zeros(count, np.uint64)
    filled = lengths > 0
    if filled.any():
        weighted = data.astype(np.uint64) * _POWERS[position]
        sums[filled] = np.add.reduceat(weighted, starts[filled])
    h = sums ^ lengths.astype(np.uint64)
    for multiplier in _MIX:
        h ^= h >> np.uint64(33)
        h *= multiplier
    h ^= h >> np.uint64(33)
    return (h & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def fingerprint(text: str) -> int:
    return int(_prints(pa.array([text]))[0])


def fingerprints(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    prints = _prints(texts)
    prints.sort()
    return prints


def _holds(prints: np.ndarray, wanted: int) -> bool:
    at = int(np.searchsorted(prints, wanted))
    return at < len(prints) and int(prints[at]) == wanted


@dataclass
class AlertIdIndex:
    """``FileIds`` of each data file read so far."""

    files: dict[str, FileIds] = field(default_factory=dict)

    def add_file(self, uri: str, part: pa.Table) -> None:
        """``part``: the data file's ``id_part``."""
        span = _span_of(part)
        if span is None:
            return
        self.files[uri] = FileIds(
            span.first_decision,
            span.last_decision,
            part.column("alert_ids").to_numpy(),
            part.column("transaction_ids").to_numpy(),
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

    parts = FileParts(table, "alert_ids")

    def made(uri: str) -> pa.Table:
        return id_part(_read_file(uri, ["alertId", "transactionId", "decisionTime"]))

    def feed(fold: AlertIdIndex, uris: Sequence[str]) -> None:
        for uri in uris:
            fold.add_file(uri, parts.part(uri, made))

    with FOLDS_LOCK:
        index = folded(table, AlertIdIndex, AlertIdIndex, feed, parts.forget, parts.restore)
        return index.decision_ranges(alert_id, transaction_id)


def id_part(rows: pa.Table) -> pa.Table:
    """A data file's part of ``AlertIdIndex``: the sorted fingerprints of its alertIds and
    of its transactionIds, its span in the metadata."""
    return pa.table(
        {
            "alert_ids": fingerprints(rows.column("alertId")),
            "transaction_ids": fingerprints(rows.column("transactionId")),
        }
    ).replace_schema_metadata(_span_metadata(rows))


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
