"""Small Delta tables that people write through delta-rs (no JVM): open, create, read.

The rule store and the review store each own one such table and commit to it
conditionally (``max_commit_retries=0``: a commit fails rather than land on a version it
was not planned from); what they share is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from pyarrow import fs as pafs


def open_table(path: Path) -> DeltaTable | None:
    """The table at ``path``, or None before it was created."""
    try:
        return DeltaTable(str(path))
    except TableNotFoundError:
        return None


def create_if_missing(path: Path, schema: pa.Schema) -> DeltaTable:
    """The table, created empty unless it is there (safe to call repeatedly, and
    concurrently: of two creators one commits version 0, the other opens it)."""
    table = open_table(path)
    if table is not None:
        return table
    try:
        return DeltaTable.create(str(path), schema, mode="ignore")
    except DeltaError:
        table = open_table(path)
        if table is None:
            raise
        return table


def read_rows(table: DeltaTable, columns: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of the table's loaded snapshot, its data files read one by one.

    Not ``to_pyarrow_table``: its dataset scan costs ~1 s to set up and leaves Arrow
    threads that abort the interpreter at exit (apache/arrow#34314, delta-rs#2184): a
    `velocity rules` command would exit 134. Plain files suffice while the table needs
    no reader feature (deletion vectors, column mapping: reader version 2 and up); one
    that does is read by delta-rs itself.
    """
    if table.protocol().min_reader_version > 1:
        rows: list[dict[str, Any]] = table.to_pyarrow_table(columns=list(columns)).to_pylist()
        return rows
    found: list[dict[str, Any]] = []
    for uri in table.file_uris():
        # delta-rs gives percent-encoded URIs (a data dir with a space in its path).
        filesystem, path = pafs.FileSystem.from_uri(uri)
        with filesystem.open_input_file(unquote(path)) as source:
            part = pq.ParquetFile(source).read(columns=list(columns), use_threads=False)
        found.extend(part.to_pylist())
    return found
