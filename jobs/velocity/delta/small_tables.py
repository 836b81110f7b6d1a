"""Small Delta tables that people write through delta-rs (no JVM): open, create, read,
and append conditionally.

The rule store and the review store each own one such table; each plans its rows from
the table's current version and commits them only on that version
(``append_planned``); what they share is here.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from arro3.core import Array, DataType, Table
from deltalake import CommitProperties, DeltaTable, Schema, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from pyarrow import fs as pafs

from velocity.errors import VelocityError

T = TypeVar("T")
# Each attempt loses only to a commit that landed between its read and its write; ten in a
# row means something keeps writing the table.
_APPEND_ATTEMPTS = 10


def open_table(path: Path) -> DeltaTable | None:
    """The table at ``path``, or None before it was created."""
    try:
        return DeltaTable(str(path))
    except TableNotFoundError:
        return None


def create_if_missing(path: Path, schema: pa.Schema) -> DeltaTable:
    """The table, created empty unless it is there (safe to call repeatedly, and
    concurrently: of two creators one commits version 0, the other opens it). A table made
    by an earlier Velocity gets the nullable columns of ``schema`` it lacks, so a data dir
    survives an upgrade that adds one (as ``case_events.outcome`` was)."""
    table = open_table(path)
    if table is not None:
        return _with_columns(table, path, schema)
    try:
        return DeltaTable.create(str(path), schema, mode="ignore")
    except DeltaError:
        table = open_table(path)
        if table is None:
            raise
        return table


def _with_columns(table: DeltaTable, path: Path, schema: pa.Schema) -> DeltaTable:
    present = {f.name for f in table.schema().fields}
    missing = [f for f in schema if f.name not in present and f.nullable]
    if not missing:
        return table
    # Another writer may have added them first: then read what it committed.
    with contextlib.suppress(DeltaError):
        table.alter.add_columns(Schema.from_arrow(pa.schema(missing)).fields)
    reopened = open_table(path)
    if reopened is None:
        raise VelocityError(f"{path} vanished while its columns were added")
    return reopened


def rows_table(schema: pa.Schema, columns: Mapping[str, Sequence[Any]]) -> Table:
    """Rows to append, a list of values per column of ``schema``, built with arro3
    (pyarrow would import pandas to build them: a second of a short command)."""
    arrays = [Array(columns[f.name], DataType.from_arrow(f.type)) for f in schema]
    return Table.from_arrays(arrays, schema=schema)


def read_rows(table: DeltaTable, columns: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of the table's loaded snapshot, its data files read one by one.

    Not ``to_pyarrow_table``: its dataset scan costs ~1 s to set up and leaves Arrow
    threads that abort the interpreter at exit (apache/arrow#34314, delta-rs#2184): a
    `velocity rules` command would exit 134. Plain files suffice while the table needs
    no reader feature (deletion vectors, column mapping: reader version 2 and up); one
    that does is read by delta-rs itself.
    """
    if table.protocol().min_reader_version > 1:
        # A column the table lacks (one added since it was made) is left out, as a data
        # file without it leaves it out below.
        present = {f.name for f in table.schema().fields}
        wanted = [c for c in columns if c in present]
        rows: list[dict[str, Any]] = table.to_pyarrow_table(columns=wanted).to_pylist()
        return rows
    return read_files(table, table.file_uris(), columns)


def read_files(
    table: DeltaTable, uris: Sequence[str], columns: Sequence[str]
) -> list[dict[str, Any]]:
    """The rows of some of the table's data files (``file_uris``), as ``read_rows``."""
    if table.protocol().min_reader_version > 1:
        raise VelocityError(f"{table.table_uri} needs a reader feature; read it whole")
    found: list[dict[str, Any]] = []
    for uri in uris:
        # delta-rs gives percent-encoded URIs (a data dir with a space in its path).
        filesystem, path = pafs.FileSystem.from_uri(uri)
        with filesystem.open_input_file(unquote(path)) as source:
            part = pq.ParquetFile(source).read(columns=list(columns), use_threads=False)
        found.extend(part.to_pylist())
    return found


def append_planned(
    path: Path,
    schema: pa.Schema,
    plan: Callable[[DeltaTable], tuple[Table | None, T]],
    refused: str,
) -> T:
    """Append the rows ``plan`` makes from the table's current version, in one commit that
    lands only on that version; when another commit landed first, read, plan and commit
    again. ``plan`` returns (rows or None for nothing to write, the caller's result); an
    error it raises writes nothing. ``refused``: the message when every attempt lost."""
    for attempt in range(_APPEND_ATTEMPTS):
        table = create_if_missing(path, schema)
        rows, result = plan(table)
        if rows is None:
            return result
        try:
            # No retries: delta-rs would rebase the append onto whatever version is newest
            # (two appends never conflict for it), committing rows planned from an older
            # snapshot. Fail, read, plan again.
            write_deltalake(
                table, rows, mode="append", commit_properties=CommitProperties(max_commit_retries=0)
            )
        except CommitFailedError:
            time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
            continue
        return result
    raise VelocityError(f"{path} changed under each of {_APPEND_ATTEMPTS} attempts: {refused}")
