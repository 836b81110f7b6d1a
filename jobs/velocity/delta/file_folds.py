"""What a Delta table says, kept up to date by reading each data file once (delta-rs).

The tables people look at only ever grow by appends (the stream's write-behind, the case
and review stores), so a reader that remembers which data files it has read, and what
they said, reads only the files added since at its next look: a look costs what was
appended since the last one, not the table's whole history. The case queue (every case's
fold) was the first such reader; the page's rule rates, alert volumes, alert lookups by
id and latest reviews are others (``velocity.delta.alert_files``, ``review_store``).

A fold is fed the table's new files in path order (``feed``). When a file it read is
gone (OPTIMIZE or a rewrite replaced it), a fold that keeps each file's part apart
forgets those files' parts (``forget`` returns True) and reads the new ones; any other
fold starts again from every file, or from a snapshot of itself written by another
process (``restore``: the case book's, ``velocity.delta.case_snapshot``) and the files
the snapshot has not read. One lock guards every fold of this process (the
page's worker threads share them): hold ``FOLDS_LOCK`` while a fold is fed or read.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

FOLDS_LOCK = threading.RLock()
# Per table and kind of fold: the data files read so far and the fold.
_FOLDS: dict[tuple[object, object], tuple[set[str], Any]] = {}

F = TypeVar("F")


def _cannot_forget(fold: Any, gone: set[str]) -> bool:
    return False


def folded(
    table: DeltaTable,
    kind: object,
    start: Callable[[], F],
    feed: Callable[[F, Sequence[str]], None],
    forget: Callable[[F, set[str]], bool] = _cannot_forget,
    restore: Callable[[DeltaTable, set[str]], tuple[set[str], F] | None] | None = None,
) -> F:
    """The fold ``kind`` of ``table`` as of its loaded version: ``start()`` fed (``feed``)
    only the data files (``file_uris``) it has not read yet, in path order. A fold this
    process has not made yet (or cannot keep) is ``restore(table, files)`` when that gives
    one: (the files it has read, all among ``files``; the fold of exactly those)."""
    with FOLDS_LOCK:
        files = set(table.file_uris())
        known, fold = _FOLDS.get((table.table_uri, kind), (set(), None))
        gone = known - files
        if fold is None or (gone and not forget(fold, gone)):
            restored = None if restore is None else restore(table, files)
            known, fold = (set(), start()) if restored is None else restored
        new = sorted(files - known)
        if new:
            feed(fold, new)
        _FOLDS[(table.table_uri, kind)] = (files, fold)
        return fold


def folded_together(
    tables: Mapping[str, DeltaTable | None],
    kind: object,
    start: Callable[[], F],
    feed: Callable[[F, str, Sequence[str]], None],
) -> F:
    """The fold ``kind`` of several tables at once, as ``folded`` of one: ``tables`` by
    their paths (None: not created yet), each as of its loaded version; ``feed(fold,
    path, uris)`` is given each table's data files the fold has not read yet, in path
    order. A file gone from any of them starts the fold again from every file of all."""
    with FOLDS_LOCK:
        files = {
            path: set() if table is None else set(table.file_uris())
            for path, table in tables.items()
        }
        key = (tuple(sorted(tables)), kind)
        every = set().union(*files.values())
        known, fold = _FOLDS.get(key, (set(), None))
        if fold is None or known - every:
            known, fold = set(), start()
        for path, mine in files.items():
            new = sorted(mine - known)
            if new:
                feed(fold, path, new)
        _FOLDS[key] = (every, fold)
        return fold


# The tables read here, each brought up to date at every look (``update_incremental``
# reads only the commits since: opening a table anew replays its checkpoint and every
# commit after it, tens of ms for a table of a few hundred files).
_OPEN: dict[str, DeltaTable] = {}
_OPEN_LOCK = threading.Lock()
# Let them go before the interpreter ends: a table still held then takes its runtime's
# threads down mid-exit ("terminate called without an active exception", exit 134).
atexit.register(_OPEN.clear)


def current_table(path: Path) -> DeltaTable | None:
    """The table at ``path`` at its newest version, for reading (None before it was
    created); the object is this process's, shared: never write through it."""
    key = str(path)
    with _OPEN_LOCK:
        table = _OPEN.get(key)
        if table is not None:
            try:
                table.update_incremental()
                return table
            except (DeltaError, OSError):  # rewritten from scratch, or gone: open it anew
                _OPEN.pop(key, None)
        try:
            table = DeltaTable(key)
        except TableNotFoundError:
            return None
        _OPEN[key] = table
        return table


def forget_table(path: Path) -> None:
    """Let go of this process's folds and open table of the table at ``path``: its next
    look is the first look of a fresh process (tests)."""
    plain = str(path).rstrip("/")
    with FOLDS_LOCK, _OPEN_LOCK:
        _OPEN.pop(str(path), None)
        for key in list(_FOLDS):
            uri = key[0]
            if isinstance(uri, str) and uri.removeprefix("file://").rstrip("/") == plain:
                del _FOLDS[key]
