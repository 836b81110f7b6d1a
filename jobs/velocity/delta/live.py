"""The live system's Delta state of record, and its one owner (``LiveState``).

The stream, the backfill, maintenance and data quality all read and write the live tables
through ``LiveState``: the tables, the horizon, the g-wide bucket reads, eviction, and the
stream's spooled batches (Delta is written behind the stream). Writers hold the data
dir's state lock (``velocity.redis.lock``) around what they change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from velocity.delta import small_tables, tables
from velocity.delta.rule_store import RuleStore
from velocity.delta.write_behind import Flushed, Spool, flush_spool_apart
from velocity.domain.rule_changes import RuleEpochs, RuleVersion, rule_versions, rule_versions_text
from velocity.domain.rules import Rule
from velocity.domain.windows import horizon_seconds
from velocity.errors import UsageError
from velocity.operating.stream_control import checkpoint_dir
from velocity.settings import Settings
from velocity.spark.evaluate import minute_buckets


@dataclass(frozen=True)
class LiveTables:
    """Where the live system's tables are, under ``<data_dir>/tables``."""

    events: Path
    quarantine: Path
    duplicates: Path
    late_events: Path
    buckets: Path
    alerts: Path
    signatures: Path
    rules: Path
    backfills: Path
    rule_epochs: Path
    # Written by the review store (delta-rs), one small file a review: listed so that
    # maintenance's OPTIMIZE and VACUUM keep it to few files.
    alert_reviews: Path

    @classmethod
    def of(cls, settings: Settings) -> LiveTables:
        return cls(
            **{
                name: settings.table_path(getattr(tables, name.upper()))
                for name in cls.__dataclass_fields__
            }
        )


def newest_event_time(spark: SparkSession, live: LiveTables) -> int | None:
    """The highest accepted eventTime: the clock that seals buckets and sets the horizon."""
    row = tables.read_table(spark, live.events).agg(F.max("eventTime")).first()
    return None if row is None or row[0] is None else int(row[0])


def _nullable(value: Any) -> Any:
    """A Spark schema's JSON with every field, array element and map value nullable."""
    if isinstance(value, dict):
        return {
            k: True if k in ("nullable", "containsNull", "valueContainsNull") else _nullable(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_nullable(v) for v in value]
    return value


def created_schema(schema: StructType) -> pa.Schema:
    """``schema`` as the Arrow schema of the table Spark creates from a DataFrame of it:
    nullable throughout (Delta drops NOT NULL from a DataFrame's schema)."""
    return to_arrow_schema(StructType.fromJson(_nullable(schema.jsonValue())))


def ensure_live_tables(spark: SparkSession, live: LiveTables) -> None:
    """Create every live table that is missing (idempotent, and safe beside another
    creator). The rules table is the rule store's, created by it.

    A missing table is created empty by delta-rs, as Spark would create it from an empty
    DataFrame (``created_schema``; the same schema and protocol as Spark reads them):
    the nine took 20-45 s as Spark jobs on two cores, the most of a new data dir's stream
    start, and take 0.1 s so. A table there already gets the nullable columns it lacks
    (``tables.create_if_missing``), so a data dir survives an upgrade that adds one.
    """
    for name in create_missing_tables(live):
        tables.create_if_missing(spark, getattr(live, name), tables.LIVE_SCHEMAS[name])


def create_missing_tables(live: LiveTables) -> list[str]:
    """Create every missing live table, empty, with delta-rs (no JVM: a writer of rows as
    the stream writes them, a benchmark's or a test's, needs no Spark); returns the names
    of the tables there already that lack a nullable column, which only Spark adds."""
    older = []
    for name, schema in tables.LIVE_SCHEMAS.items():
        path = getattr(live, name)
        if name == tables.RULES:
            RuleStore(path).create_if_missing()
            continue
        table = small_tables.open_table(path)
        if table is None:
            small_tables.create_if_missing(path, created_schema(schema))
            continue
        present = {field.name for field in table.schema().fields}
        if any(f.nullable and f.name not in present for f in schema.fields):
            older.append(name)
    return older


def last_committed_batch(settings: Settings) -> int | None:
    """The newest micro-batch the stream's checkpoint records as done (None: none yet)."""
    commits = checkpoint_dir(settings.data_dir) / "commits"
    done = [int(p.name) for p in commits.glob("[0-9]*")] if commits.is_dir() else []
    return max(done, default=None)


def refuse_another_bucket_width(buckets: DataFrame, settings: Settings) -> None:
    """Raise ``UsageError`` when ``buckets`` holds g-wide rows of another width than
    ``VELOCITY_BUCKET_SECONDS``: read as this width they would be relabelled, and every
    window of every rule would be wrong."""
    other = (
        buckets.where(
            F.col("parts").isNull() & (F.col("bucket_width_ms") != settings.bucket_width_ms)
        )
        .select("bucket_width_ms")
        .first()
    )
    if other is not None:
        raise UsageError(
            f"the buckets of {settings.data_dir} are {other[0] // 1000} seconds wide but "
            f"VELOCITY_BUCKET_SECONDS is {settings.bucket_seconds}: run with "
            f"VELOCITY_BUCKET_SECONDS={other[0] // 1000}, or start a new VELOCITY_DATA_DIR"
        )


def append_live_rows(live: LiveTables, name: str, rows: list[tuple[Any, ...]]) -> None:
    """Append ``rows`` (tuples in the schema's column order) to live table ``name`` in one
    delta-rs commit (``LiveState.append_rows``; bench-page's fill without a Spark session)."""
    schema = to_arrow_schema(tables.LIVE_SCHEMAS[name])
    columns = {f.name: [row[i] for row in rows] for i, f in enumerate(schema)}
    write_deltalake(str(getattr(live, name)), pa.table(columns, schema=schema), mode="append")


class LiveState:
    """One data dir's live tables (created when missing), its rule store and the stream's
    spool. Bucket reads see g-wide buckets whatever compaction did."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark = spark
        self.settings = settings
        self.live = LiveTables.of(settings)
        self.rule_store = RuleStore(self.live.rules)
        ensure_live_tables(spark, self.live)
        if not self.unwritten("buckets"):
            refuse_another_bucket_width(self.read("buckets"), settings)
        self.spool = Spool(settings)
        self._flush_mutex = threading.RLock()  # flushes_held's holder may flush itself
        self._recorded_versions: tuple[RuleVersion, ...] | None = None

    def rule_epochs(self) -> RuleEpochs:
        rows = [] if self.unwritten("rule_epochs") else self.read("rule_epochs").collect()
        return RuleEpochs.of_rows(
            (r["from_batch"], r["recorded_at"], r["rule_versions"]) for r in rows
        )

    def record_rule_versions(self, batch_id: int, rules: list[Rule]) -> None:
        """Record that the stream decides ``batch_id`` (and on) with ``rules``' versions,
        unless they are those recorded last. The stream calls it for every batch it
        decides, under the state lock."""
        versions = rule_versions(rules)
        if self._recorded_versions is None:
            self._recorded_versions = self.rule_epochs().newest()
        if versions == self._recorded_versions:
            return
        row = (batch_id, int(time.time() * 1000), rule_versions_text(versions))
        self.append_rows(tables.RULE_EPOCHS, [row])
        self._recorded_versions = versions

    def append_rows(self, name: str, rows: list[tuple[Any, ...]]) -> None:
        """Append ``rows`` (tuples in the schema's column order) to live table ``name`` in
        one delta-rs commit: milliseconds, where Spark's append of a few rows is a job of
        seconds (and, in a new stream, its JVM's first Delta write: ~10 s on two cores).
        The caller holds the state lock, like every writer of the live tables."""
        append_live_rows(self.live, name, rows)

    def read(self, name: str) -> DataFrame:
        return tables.read_table(self.spark, getattr(self.live, name))

    def unwritten(self, name: str) -> bool:
        """Whether live table ``name`` holds nothing yet: its log has only its first
        version, which adds no file (as ``ensure_live_tables`` creates it). Milliseconds,
        where a query of even an empty table is a Spark job of seconds on two cores (and the
        JVM's first look at a table's log too): a new data dir's stream start would make
        several."""
        log = getattr(self.live, name) / "_delta_log"
        # A second version, or a checkpoint (the log's cleanup may have taken version 1):
        # the common case, a stat or two and no log read.
        if (log / f"{1:020d}.json").exists() or (log / "_last_checkpoint").exists():
            return False
        table = small_tables.open_table(log.parent)
        return table is not None and table.version() == 0 and not table.file_uris()

    def newest_event_time(self) -> int | None:
        if self.unwritten("events"):
            return None
        return newest_event_time(self.spark, self.live)

    def flush_spool(self, through: int | None) -> Flushed:
        """Append the stream's spooled batches up to ``through`` to the live tables (one
        flush at a time in this process; hold the state lock against the others)."""
        with self._flush_mutex:
            return flush_spool_apart(self.settings, through)

    @contextmanager
    def flushes_held(self) -> Iterator[None]:
        """No flush of this process while held (the stream's background flusher waits): a
        DELETE of buckets whose predicate matches rows a concurrent flush appends fails
        with Delta's ConcurrentAppendException. A rule paused from the page while the
        write-behind appended its signature's buckets failed the stream so."""
        with self._flush_mutex:
            yield

    def horizon_cutoff(self, rules: list[Rule]) -> int | None:
        """The oldest bucket start the state keeps: newest eventTime − horizon (None: no
        events or no rules)."""
        newest = self.newest_event_time()
        if newest is None or not rules:
            return None
        return newest - horizon_seconds(rules, self.settings) * 1000

    def window_buckets(
        self, buckets: DataFrame, since: int | None = None, keys: DataFrame | None = None
    ) -> DataFrame:
        """``buckets`` as g-wide buckets, only those starting at ``since`` or later and of
        the (signature, key) pairs in ``keys``; rows are pruned before hours are expanded."""
        if since is not None:
            buckets = buckets.where(F.col("bucket_start") + F.col("bucket_width_ms") > since)
        if keys is not None:
            buckets = buckets.join(keys, ["signature_id", "key"], "left_semi")
        minutes = minute_buckets(buckets, self.settings.bucket_width_ms)
        return minutes if since is None else minutes.where(F.col("bucket_start") >= since)

    def buckets_in_horizon(self, rules: list[Rule]) -> DataFrame:
        """g-wide buckets the state keeps: those starting within the widest window +
        lateness + one bucket of the newest eventTime (the "widest window" state of the
        Flink design) — the cutoff every eviction of Delta and Redis uses, at its latest."""
        buckets = self.read("buckets")
        cutoff = self.horizon_cutoff(rules)
        if cutoff is None:
            return self.window_buckets(buckets.limit(0))
        return self.window_buckets(buckets, since=cutoff)

    def evict(self, rules: list[Rule], newest_event_time: int) -> int:
        """Delete Delta buckets that start before the horizon; returns that cutoff.

        The horizon is the widest active window + allowed lateness + one bucket behind
        the newest eventTime already decided (``newest_event_time``; for the stream, that
        of the earlier batches): no window of a non-late event still to come reaches
        below it, and it shrinks when the widest rule goes. Idempotent.
        """
        cutoff = newest_event_time - horizon_seconds(rules, self.settings) * 1000
        # A compacted hour goes when its last g-wide bucket starts before the cutoff.
        last_part = f"bucket_start + bucket_width_ms - {self.settings.bucket_width_ms}"
        self.spark.sql(f"DELETE FROM delta.`{self.live.buckets}` WHERE {last_part} < {cutoff}")
        return cutoff
