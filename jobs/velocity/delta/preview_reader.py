"""`velocity rules preview` and the page's preview: the live events it needs, read with
delta-rs and Arrow in this process (no Spark session: starting one alone costs more
than the 30 s a preview of an hour at 1 000 events/s may take).

What is read: the events table's data files whose eventTime statistics reach the span
or the history its rules' widest window needs (``velocity.analyst.preview.read_from``), and of
them only the rows in that range and the columns the rules' signatures use. The
deciding is ``velocity.analyst.preview`` (pure).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from pyarrow import fs as pafs

from velocity.analyst.preview import (
    DIFF_SHOWN,
    SAMPLE_SIZE,
    Preview,
    event_fields,
    read_from,
    rule_previews,
    span_of,
)
from velocity.delta.names import EVENTS, RULES
from velocity.delta.rule_store import RuleStore
from velocity.delta.small_tables import open_table
from velocity.domain.rules import Rule, RuleEntry
from velocity.errors import UsageError
from velocity.operating.timing import StepTimer
from velocity.settings import Settings

# The most events a preview reads into memory (about 100 bytes each with the columns a
# rule uses, several times that while deciding): beyond it, it refuses before reading.
MAX_EVENTS = 20_000_000


def _files(table: DeltaTable) -> pa.Table:
    """The table's data files: ``uri``, ``rows``, and each one's eventTime ``low`` and
    ``high`` (null where the file has no statistics)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    n = actions.num_rows
    root = table.table_uri.rstrip("/")

    def stat(name: str) -> pa.ChunkedArray | pa.Array:
        if name in actions.column_names:
            return actions.column(name).cast(pa.int64())
        return pa.nulls(n, pa.int64())

    uris = [p if "://" in p else f"{root}/{p}" for p in actions.column("path").to_pylist()]
    return pa.table(
        {
            "uri": pa.array(uris, pa.string()),
            "rows": stat("num_records"),
            "low": stat("min.eventTime"),
            "high": stat("max.eventTime"),
        }
    )


def _dataset(uris: Sequence[str]) -> ds.Dataset:
    """The Parquet files at ``uris`` on Arrow's own file system (not delta-rs's Python
    file handler, whose threads abort the interpreter at exit: see ``small_tables``)."""
    if not uris:
        return ds.dataset([], format="parquet")
    filesystem, _ = pafs.FileSystem.from_uri(uris[0])
    paths = [unquote(pafs.FileSystem.from_uri(u)[1]) for u in uris]
    return ds.dataset(paths, format="parquet", filesystem=filesystem)


def newest_event_time(table: DeltaTable) -> int | None:
    """The newest eventTime in the table: from the files' statistics, reading the
    eventTime column only of files that have none; None when the table is empty."""
    files = _files(table)
    if files.num_rows == 0:
        return None
    highs = [h for h in files.column("high").to_pylist() if h is not None]
    unknown = files.filter(pc.is_null(files.column("high"))).column("uri").to_pylist()
    if unknown:
        times = _dataset(unknown).to_table(columns=["eventTime"]).column("eventTime")
        if len(times):
            highs.append(int(pc.max(times).as_py()))
    return max(highs) if highs else None


def read_events(
    table: DeltaTable, columns: Sequence[str], low: int, high: int, max_events: int = MAX_EVENTS
) -> pa.Table:
    """``columns`` of the events with eventTime in ``[low, high]``: files outside by their
    statistics are not opened; Arrow skips row groups and filters rows in the rest.
    ``UsageError`` before reading when the files in range hold more than ``max_events``."""
    where = (pc.field("eventTime") >= low) & (pc.field("eventTime") <= high)
    files = _files(table)
    reach = pc.and_kleene(
        pc.fill_null(pc.greater_equal(files.column("high"), low), True),
        pc.fill_null(pc.less_equal(files.column("low"), high), True),
    )
    kept = files.filter(reach)
    rows = int(pc.sum(pc.fill_null(kept.column("rows"), 0)).as_py() or 0)
    if rows > max_events:
        raise UsageError(
            f"the preview would read up to {rows} events (eventTime {low}..{high}: the span "
            f"and the history its widest window needs), more than {max_events}: preview "
            "fewer hours, or a rule with a shorter window"
        )
    if table.protocol().min_reader_version > 1 or table.metadata().partition_columns:
        # Deletion vectors, column mapping, partitions: delta-rs reads such a table.
        return table.to_pyarrow_dataset().to_table(filter=where, columns=list(columns))
    uris = kept.column("uri").to_pylist()
    if not uris:
        return pa.table({name: pa.array([]) for name in columns})
    return _dataset(uris).to_table(filter=where, columns=list(columns))


def alert_schema() -> pa.Schema:
    """The alerts table's columns as Arrow, the shape the engine's alert rows take
    (pyspark's type conversion only: no JVM)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from velocity.delta.tables import ALERT_SCHEMA

    return to_arrow_schema(ALERT_SCHEMA)


def candidate_rules(entries: Sequence[RuleEntry]) -> tuple[list[Rule], list[str]]:
    """The rules of a rules file to preview, and a note for each entry that is not one
    (a state change or a control names no rule to decide)."""
    rules, skipped = [], []
    for index, entry in enumerate(entries):
        if isinstance(entry, Rule):
            rules.append(entry)
        else:
            skipped.append(f"entry #{index + 1} ({entry}) is not a rule: nothing to preview")
    if not rules:
        raise UsageError("the rules file holds no rule to preview (only state changes or controls)")
    return rules, skipped


def preview(
    settings: Settings,
    entries: Sequence[RuleEntry],
    hours: float = 1.0,
    sample_size: int = SAMPLE_SIZE,
    diff_shown: int = DIFF_SHOWN,
    now_ms: int | None = None,
    max_events: int = MAX_EVENTS,
) -> Preview:
    """What the rules among ``entries`` (``velocity.domain.rules.parse_rules``' output) would have
    fired over the last ``hours`` of the live events table, anchored on its newest
    accepted eventTime, each beside the version in force of its ruleId.

    Reads the events table and the rules table of ``settings.data_dir`` (delta-rs, no
    Spark); writes nothing. ``now_ms``: the alerts' decisionTime (default: the clock).
    ``UsageError`` when there is no events table, it holds no event, or the span and its
    history hold more than ``max_events`` (nothing read then)."""
    timer = StepTimer()
    candidates, skipped = candidate_rules(entries)
    path = settings.table_path(EVENTS)
    table = open_table(path)
    if table is None:
        raise UsageError(f"no events table at {path}: the stream has accepted no event yet")
    newest = newest_event_time(table)
    if newest is None:
        raise UsageError(f"the events table at {path} holds no event yet")
    span = span_of(newest, hours)
    in_force = RuleStore(settings.table_path(RULES)).in_force()
    timer.mark("rules")
    width_ms = settings.bucket_width_ms
    deciding = [*candidates, *(r for r in in_force if r.rule_id in {c.rule_id for c in candidates})]
    low = read_from(span, deciding, width_ms)
    events = read_events(table, event_fields(deciding), low, span.end, max_events)
    timer.mark("read")
    decision_time = now_ms if now_ms is not None else int(time.time() * 1000)
    previews = rule_previews(
        events,
        candidates,
        in_force,
        span,
        width_ms,
        decision_time,
        alert_schema(),
        sample_size,
        diff_shown,
    )
    timer.mark("decide")
    in_span = int(pc.sum(pc.greater(events.column("eventTime"), span.start)).as_py() or 0)
    return Preview(
        span=span,
        hours=hours,
        events_in_span=in_span,
        events_read=events.num_rows,
        read_from=low,
        rules=tuple(previews),
        skipped=tuple(skipped),
        seconds=timer.total,
        step_seconds=timer.steps,
    )
