"""Every row a benchmark builds by hand is held to the live table's (or kernel's) schema it
stands in for, so a benchmark cannot drift from the tables it imitates: a field dropped from
a hand-built row, or a type changed in ``velocity.delta.tables``, fails here (issue 54; a
signatures row of four fields once broke `make bench-backfill`)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from benchmarks import backfill, cases, kernel, lookup, preview, window_compare
from deltalake import DeltaTable
from pyspark.sql.pandas.types import to_arrow_schema

from velocity.delta import tables
from velocity.delta.case_store import CASE_EVENT_ARROW_SCHEMA, CaseStore, ensure_case_tables
from velocity.delta.write_behind import ARROW_SCHEMAS
from velocity.domain.rules import Rule, deciding_rules, parse_rules, rules_by_signature
from velocity.domain.schema import EVENT_FIELDS
from velocity.generate import GenerateOptions, generate_events
from velocity.redis.keys import bucket_value, parse_bucket_value
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.evaluate import _KEYED_ARROW

FIRE_OFTEN = Path(__file__).resolve().parents[2] / "benchmarks" / "rules" / "fire_often.json"


def fields(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    """Names and types in order (a table built by pa.table is nullable throughout)."""
    return [(f.name, f.type) for f in schema]


def spark_fields(schema: object) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]  # type: ignore[attr-defined]


def sample_rules(path: Path | None = None) -> list[Rule]:
    text = (path or sample_rules_path()).read_text()
    return deciding_rules([r for r in parse_rules(text) if isinstance(r, Rule)])


@pytest.mark.parametrize("rules_file", [None, FIRE_OFTEN], ids=["sample", "fire-often"])
def test_kernel_keyed_rows_are_the_spark_fan_outs(rules_file: Path | None) -> None:
    rules = sample_rules(rules_file)
    events = kernel.synthetic_events(300, 40, seed=1)
    keyed = kernel.keyed(events, list(rules_by_signature(rules)))
    assert keyed.num_rows > 0
    assert fields(keyed.schema) == fields(_KEYED_ARROW)


def test_raw_lines_are_what_the_text_source_gives_the_parser(tmp_path: Path) -> None:
    lines = preview.raw_lines(pa.array(['{"a": 1}', "x"], pa.string()), tmp_path / "f", 0)
    parsed_arrow = {f.name: f.type for f in to_arrow_schema(tables.PARSED_SCHEMA)}
    assert fields(lines.schema) == [(n, parsed_arrow[n]) for n in lines.column_names]
    assert lines.column_names == ["raw", "source_file", "source_block"]


def test_preview_writes_the_live_events_table_schema(tmp_path: Path) -> None:
    generate_events(
        tmp_path / "lines",
        GenerateOptions(events=200, payers=20, files=1, late_fraction=0.0,
                        duplicate_fraction=0.0, malformed_fraction=0.0),
    )  # fmt: skip
    table = tmp_path / "events"
    written = preview.write_live_events(sorted((tmp_path / "lines").glob("*.jsonl")), table, 80)
    assert written == 200
    stored = DeltaTable(str(table)).schema().to_arrow()
    assert fields(pa.schema(stored)) == fields(ARROW_SCHEMAS["events"])


def test_cases_flush_writes_the_case_events_schema(tmp_path: Path) -> None:
    store = CaseStore(Settings(data_dir=tmp_path))
    ensure_case_tables(store.settings)
    cases._flush(store, cases.OpenCases(), 0, alerts=5, payers=3)
    stored = DeltaTable(str(store.events_path)).schema().to_arrow()
    assert fields(pa.schema(stored)) == fields(CASE_EVENT_ARROW_SCHEMA)


def test_lookup_buckets_are_the_redis_layouts_bucket_values() -> None:
    for i in (0, 1, 88, 996, 12_345):
        text = lookup.bucket_text(i)
        assert bucket_value(parse_bucket_value(text)) == text


def test_window_compare_reads_every_event_field() -> None:
    names = [part.split()[0] for part in window_compare.EVENT_LINE_SCHEMA.split(",")]
    assert names == [f.name for f in EVENT_FIELDS]


@pytest.mark.spark
def test_backfill_rows_are_the_live_tables(spark) -> None:  # type: ignore[no-untyped-def]
    rules = sample_rules()
    signatures = backfill.signature_rows(spark, rules)
    assert signatures.count() == len(rules_by_signature(rules))
    assert spark_fields(signatures.schema) == spark_fields(tables.SIGNATURE_SCHEMA)

    events = spark.createDataFrame([], tables.EVENT_SCHEMA)
    assert spark_fields(backfill.live_events(events).schema) == spark_fields(
        tables.LIVE_EVENT_SCHEMA
    )
    alerts = spark.createDataFrame([], tables.ALERT_SCHEMA)
    assert spark_fields(backfill.kept_alerts(alerts).schema) == spark_fields(tables.ALERT_SCHEMA)


@pytest.mark.timeout(60)
def test_page_fill_groups_are_the_write_behind_s_rows() -> None:
    """bench-page's alerts and events, made column by column, in the spooled tables'
    schemas; each payment's raw line an accepted event of its own columns."""
    from benchmarks import page_fill

    from velocity.domain.schema import Event, parse_event_line

    rows = page_fill.group_rows(3, 100, 50, 7, 1_767_225_600_000, 1.0)
    for name in ("alerts", "events"):
        assert fields(rows[name].schema) == fields(ARROW_SCHEMAS[name])
    assert rows["alerts"].num_rows == 2 * rows["events"].num_rows == 100
    first = rows["events"].slice(0, 1).to_pylist()[0]
    event = parse_event_line(first["raw"])
    assert isinstance(event, Event)
    assert (event.transaction_id, event.event_time) == (first["transactionId"], first["eventTime"])


@pytest.mark.timeout(120)
def test_a_stream_started_on_page_fill_s_groups_appends_its_own_batches_after_them(
    tmp_path: Path,
) -> None:
    """bench-page fills with groups numbered below zero: they mark no batch committed, and
    the stream's batch 0 (its first, on a new checkpoint) is appended and joins the cases
    the fill opened, not taken for a redone flush of a fill's group."""
    from benchmarks import page_fill

    from velocity.delta.live import LiveTables, create_missing_tables
    from velocity.delta.write_behind import Spool, append_group, flushed_batch
    from velocity.domain.committed import known_committed

    settings = Settings(data_dir=tmp_path / "data")
    create_missing_tables(LiveTables.of(settings))
    start = 1_767_225_600_000
    for last_batch, first in ((-2, 0), (-1, 20)):
        append_group(
            settings, page_fill.group_rows(last_batch, first, 20, 7, start, 10.0), last_batch
        )
    assert flushed_batch(settings) == -1
    assert known_committed(None, flushed_batch(settings)) is None
    opened = {c.case_key: c.case_id for c in CaseStore(settings).cases().values()}
    assert len(opened) == 7

    spool = Spool(settings)
    spool.write(0, page_fill.group_rows(0, 40, 20, 7, start, 10.0), {})
    assert spool.flush(0).rows[tables.ALERTS] == 40
    assert flushed_batch(settings) == 0
    alerts = DeltaTable(str(settings.table_path(tables.ALERTS))).to_pyarrow_table()
    assert alerts.num_rows == 120
    stream_rows = [r for r in alerts.to_pylist() if int(r["transactionId"][3:]) >= 40]
    assert {r["caseId"] for r in stream_rows} <= set(opened.values())
    assert all(r["caseId"] for r in stream_rows)
