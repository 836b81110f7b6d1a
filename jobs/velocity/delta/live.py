"""The live system's Delta state of record, and its one owner (``LiveState``).

The stream, the backfill, maintenance and data quality all read and write the live tables
through ``LiveState``: the tables, the horizon, the g-wide bucket reads, eviction, and the
stream's spooled batches (Delta is written behind the stream). Writers hold the data
dir's state lock (``velocity.redis.lock``) around what they change.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from velocity.delta import tables
from velocity.delta.rule_store import RuleStore
from velocity.delta.write_behind import Flushed, Spool
from velocity.errors import UsageError
from velocity.redis.mirror import horizon_seconds
from velocity.rule_changes import RuleEpochs, RuleVersion, rule_versions, rule_versions_text
from velocity.rules import Rule
from velocity.settings import Settings
from velocity.spark.evaluate import minute_buckets
from velocity.stream_control import checkpoint_dir


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


def ensure_live_tables(spark: SparkSession, live: LiveTables) -> None:
    """Create every live table that is missing (idempotent). The rules table is the rule
    store's (delta-rs), created by it."""
    for name, schema in tables.LIVE_SCHEMAS.items():
        if name == tables.RULES:
            RuleStore(live.rules).create_if_missing()
        else:
            tables.create_if_missing(spark, getattr(live, name), schema)


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


class LiveState:
    """One data dir's live tables (created when missing), its rule store and the stream's
    spool. Bucket reads see g-wide buckets whatever compaction did."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark = spark
        self.settings = settings
        self.live = LiveTables.of(settings)
        self.rule_store = RuleStore(self.live.rules)
        ensure_live_tables(spark, self.live)
        refuse_another_bucket_width(self.read("buckets"), settings)
        self.spool = Spool(settings)
        self._flush_mutex = threading.Lock()
        self._recorded_versions: tuple[RuleVersion, ...] | None = None

    def rule_epochs(self) -> RuleEpochs:
        rows = self.read("rule_epochs").collect()
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
        self.spark.createDataFrame([row], tables.RULE_EPOCH_SCHEMA).write.format("delta").mode(
            "append"
        ).save(str(self.live.rule_epochs))
        self._recorded_versions = versions

    def read(self, name: str) -> DataFrame:
        return tables.read_table(self.spark, getattr(self.live, name))

    def newest_event_time(self) -> int | None:
        return newest_event_time(self.spark, self.live)

    def flush_spool(self, through: int | None) -> Flushed:
        """Append the stream's spooled batches up to ``through`` to the live tables (one
        flush at a time in this process; hold the state lock against the others)."""
        with self._flush_mutex:
            return self.spool.flush(through)

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
