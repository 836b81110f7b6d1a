"""The case book's snapshot: every case as maintenance last folded ``case_events``, so a
fresh process's first look at the cases (``velocity cases``, a restarted api-server)
reads the snapshot and the case-events files written after it, not the whole table.

Under ``<data_dir>/case_book/``:

- ``<version>-<token>/cases.pickle``: every case's figures (status, assignee, counts,
  amount…) without its history, read back by an unpickler that builds nothing but the
  case classes (``_CaseUnpickler``);
- ``<version>-<token>/events.arrow``: every case's events (``case_events`` rows), a case's
  together in history order; Arrow IPC, memory-mapped, so a case's history is read only
  when it is first used (``velocity.analyst.cases.leave_unread``);
- ``CURRENT.json``: the folder in force, the table's id, the version and the data files
  the snapshot folded, counts and checksums. Replaced in one rename once the folder is
  whole: a reader finds the old snapshot or the new one, never half of one.

Correct by construction: a snapshot is the fold of exactly the data files it lists, read
at one version of the table (rows appended while it is written are in later files). A
reader takes it only while every one of those files is still in the table (appends only
add files; OPTIMIZE, VACUUM or a rewrite of the table remove some) and feeds it the files
it does not list, as the process's own fold would be fed (``file_folds.folded``). Else
(no snapshot, another table, files gone, a checksum or format that does not hold) the
reader folds the whole table and says why in a log line.
"""

from __future__ import annotations

import copy
import gc
import io
import json
import logging
import os
import pickle
import shutil
import time
import uuid
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from deltalake import DeltaTable

from velocity.analyst.cases import (
    Case,
    CaseEvent,
    CaseStatus,
    HistorySource,
    held_history,
    leave_unread,
)
from velocity.analyst.reviews import Verdict
from velocity.delta.small_tables import rows_table
from velocity.domain.rules import Outcome
from velocity.errors import VelocityError

log = logging.getLogger("velocity.cases")

FORMAT = 1  # CURRENT.json's "format": a snapshot of another format is not read
CURRENT = "CURRENT.json"
_CASES = "cases.pickle"
_EVENTS = "events.arrow"
# The only classes a snapshot's pickle may build.
_CLASSES: dict[tuple[str, str], Any] = {
    (c.__module__, c.__qualname__): c for c in (Case, CaseStatus, Outcome, Verdict, Decimal)
}


def snapshot_root(data_dir: Path) -> Path:
    return data_dir / "case_book"


@dataclass
class CaseSnapshotSummary:
    """What a refresh wrote: the ``case_events`` version and data files it folded."""

    path: str
    version: int
    files: int
    cases: int
    events: int
    seconds: float


class ArrowHistory:
    """A snapshot's events (``events.arrow``), each case's read when first used."""

    def __init__(self, table: pa.Table, where: Path) -> None:
        self.table, self.where = table, where

    def events(self, case_id: str, first: int, count: int) -> list[CaseEvent]:
        rows = self.table.slice(first, count).to_pylist()
        if len(rows) != count or any(r["caseId"] != case_id for r in rows):
            raise VelocityError(
                f"the case snapshot {self.where} does not hold case {case_id}'s events where "
                "it says; delete that folder (the next look reads every case event)"
            )
        return [CaseEvent.from_row(r) for r in rows]


def _snapshot_events() -> HistorySource:
    """Stands for the snapshot's events in its pickle: unpickled once (later uses are the
    pickle's references to it), as the events of the snapshot being read."""
    raise VelocityError("a case snapshot's events are given by the snapshot that reads them")


class _Writing:
    """The events of the snapshot being written, in its cases' unread histories."""

    def events(self, case_id: str, first: int, count: int) -> list[CaseEvent]:
        raise VelocityError("a snapshot being written has no events to read")

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _snapshot_events, ()


_WRITING = _Writing()


class _CaseUnpickler(pickle.Unpickler):
    """Builds only the case classes (``_CLASSES``): a snapshot is data, never code."""

    def __init__(self, data: bytes, events: HistorySource) -> None:
        super().__init__(io.BytesIO(data))
        self.events = events

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == (__name__, _snapshot_events.__name__):
            return lambda: self.events
        found = _CLASSES.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a case snapshot")
        return found


def _relative(table: DeltaTable, uri: str) -> str:
    """A data file's path inside the table (the whole URI when it is not under it)."""
    base = table.table_uri.removeprefix("file://").rstrip("/") + "/"
    plain = uri.removeprefix("file://")
    return plain[len(base) :] if plain.startswith(base) else uri


def write_snapshot(
    root: Path,
    table: DeltaTable,
    files: Collection[str],
    cases: Mapping[str, Case],
    events_schema: pa.Schema,
) -> CaseSnapshotSummary:
    """Write ``cases`` (the fold of exactly ``files``, the data files of ``table`` as
    loaded) as the current snapshot under ``root``; older folders are removed."""
    began = time.monotonic()
    ordered = sorted(cases)
    # Each case's events: a slice of an earlier snapshot's events when they were never
    # read (copied as they are), else its history's rows.
    parts: list[pa.Table] = []
    offset_of: dict[int, int] = {}
    rows: list[dict[str, Any]] = []
    starts = np.zeros(len(ordered), dtype=np.int64)
    counts = np.zeros(len(ordered), dtype=np.int64)
    pending: list[tuple[int, int]] = []  # (case's index, first row in ``rows``)
    size = 0
    for i, case_id in enumerate(ordered):
        held = held_history(cases[case_id])
        if type(held) is tuple and len(held) == 3 and isinstance(held[0], ArrowHistory):
            source, first, count = held[0].table, held[1], held[2]
            if id(source) not in offset_of:
                offset_of[id(source)] = size
                parts.append(source.select(events_schema.names).cast(events_schema))
                size += source.num_rows
            starts[i], counts[i] = offset_of[id(source)] + first, count
            continue
        history = cases[case_id].history
        pending.append((i, len(rows)))
        rows.extend(e.to_row() for e in history)
        counts[i] = len(history)
    for i, first in pending:
        starts[i] = size + first
    # Built by arro3 and taken by buffers: pyarrow's conversions import pandas (seconds).
    built = rows_table(events_schema, {f.name: [r[f.name] for r in rows] for f in events_schema})
    parts.append(pa.RecordBatchReader.from_stream(built).read_all())
    combined = pa.concat_tables(parts)
    firsts = np.cumsum(counts) - counts
    # Row r of the snapshot's events is row starts[case] + (r - firsts[case]) of ``combined``.
    taken = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - firsts, counts)
    events = combined.take(
        pa.Array.from_buffers(pa.int64(), len(taken), [None, pa.py_buffer(taken)])
    )

    copies = {}
    for i, case_id in enumerate(ordered):
        kept = copy.copy(cases[case_id])  # its history as held: nothing read
        leave_unread(kept, (_WRITING, int(firsts[i]), int(counts[i])))
        copies[case_id] = kept
    buffer = io.BytesIO()
    pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(copies)
    pickled = buffer.getvalue()

    version = table.version()
    folder = root / f"{version:020d}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    _write_synced(folder / _CASES, pickled)
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, events.schema) as writer:
        writer.write_table(events)
    arrow = sink.getvalue().to_pybytes()
    _write_synced(folder / _EVENTS, arrow)
    current = {
        "format": FORMAT,
        "folder": folder.name,
        "tableId": table.metadata().id,
        "version": version,
        "files": sorted(_relative(table, f) for f in files),
        "cases": len(copies),
        "events": events.num_rows,
        "casesCrc32": zlib.crc32(pickled),
        "eventsCrc32": zlib.crc32(arrow),
        "eventsBytes": len(arrow),
        "writtenAt": int(time.time() * 1000),
    }
    staged = root / f".{CURRENT}.{folder.name}"
    _write_synced(staged, json.dumps(current).encode())
    previous = _folder_named(root)
    os.replace(staged, root / CURRENT)
    _remove_old(root, {folder.name, previous})
    return CaseSnapshotSummary(
        path=str(folder),
        version=version,
        files=len(current["files"]),
        cases=len(copies),
        events=events.num_rows,
        seconds=round(time.monotonic() - began, 3),
    )


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _folder_named(root: Path) -> str | None:
    """The folder ``CURRENT.json`` names (None: none, or unreadable)."""
    try:
        named = json.loads((root / CURRENT).read_text()).get("folder")
    except (OSError, ValueError, AttributeError):
        return None
    return named if isinstance(named, str) else None


def _remove_old(root: Path, keep: Collection[str | None]) -> None:
    """Remove the snapshot folders but those in ``keep``: the one just written, and the
    one current until now (a reader that read ``CURRENT.json`` just before it was
    replaced still finds what it names; the next refresh removes it)."""
    for folder in root.iterdir():
        if folder.is_dir() and folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)
        elif folder.name.startswith(f".{CURRENT}."):  # staged by a refresh that crashed
            folder.unlink(missing_ok=True)


def restore_cases(
    root: Path, table: DeltaTable, files: set[str]
) -> tuple[set[str], dict[str, Case]] | None:
    """(the data files the snapshot under ``root`` folded, every case as it left them)
    when the snapshot is one of ``table`` whose files are all still among ``files`` (the
    table's as loaded); None, said in a log line, when it is missing or unusable."""
    try:
        current = json.loads((root / CURRENT).read_text())
    except FileNotFoundError:
        log.info(
            "no case snapshot under %s yet (maintenance writes one): every case event read", root
        )
        return None
    except (OSError, ValueError) as exc:
        log.warning("case snapshot %s unreadable (%s): every case event read", root / CURRENT, exc)
        return None
    by_relative = {_relative(table, f): f for f in files}
    reason = _unusable(current, table, by_relative)
    if reason is not None:
        log.warning("case snapshot under %s not used: %s; every case event read", root, reason)
        return None
    folder = root / str(current["folder"])
    try:
        cases = _load(folder, current)
    except (OSError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            pickle.UnpicklingError, pa.ArrowException) as exc:  # fmt: skip
        log.warning("case snapshot %s is corrupt (%s): every case event read", folder, exc)
        return None
    return {by_relative[f] for f in current["files"]}, cases


def _unusable(current: Any, table: DeltaTable, by_relative: Mapping[str, str]) -> str | None:
    """Why the snapshot ``current`` describes cannot stand for ``table``'s files, if so."""
    if not isinstance(current, dict) or current.get("format") != FORMAT:
        return (
            f"format {current.get('format') if isinstance(current, dict) else None!r}, not {FORMAT}"
        )
    if current.get("tableId") != table.metadata().id:
        return "it is of another case_events table (recreated since)"
    if not isinstance(current.get("version"), int) or current["version"] > table.version():
        return (
            f"it is of version {current.get('version')}, newer than the table's {table.version()}"
        )
    if not isinstance(current.get("files"), list):
        return "it does not list the data files it folded"
    gone = [f for f in current["files"] if f not in by_relative]
    if gone:
        return (
            f"{len(gone)} of the data files it folded are gone (compacted, vacuumed or "
            f"rewritten since version {current['version']})"
        )
    return None


def _load(folder: Path, current: Mapping[str, Any]) -> dict[str, Case]:
    mapped = pa.memory_map(str(folder / _EVENTS)).read_buffer()
    if mapped.size != current["eventsBytes"] or zlib.crc32(mapped) != current["eventsCrc32"]:
        raise ValueError(f"{_EVENTS} is not the file written ({mapped.size} bytes)")
    events = ipc.open_file(mapped).read_all()
    if events.num_rows != current["events"]:
        raise ValueError(f"{_EVENTS} holds {events.num_rows} events, not {current['events']}")
    pickled = (folder / _CASES).read_bytes()
    if zlib.crc32(pickled) != current["casesCrc32"]:
        raise ValueError(f"{_CASES} is not the file written ({len(pickled)} bytes)")
    # Collections while 150,000 cases are built would cost as much as building them, and
    # the first ones after would go through every case: they are frozen out of them (no
    # case refers to itself, so reference counts still free them when they go).
    collecting = gc.isenabled()
    gc.disable()
    try:
        cases = _CaseUnpickler(pickled, ArrowHistory(events, folder)).load()
    finally:
        if collecting:
            gc.freeze()
            gc.enable()
    if not isinstance(cases, dict) or len(cases) != current["cases"]:
        raise ValueError(f"{_CASES} does not hold the {current['cases']} cases it should")
    return cases
