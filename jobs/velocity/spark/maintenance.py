"""Keeping the live state small and fast: compaction, OPTIMIZE, VACUUM, eviction, reconcile.

Every step is idempotent (a second run changes nothing) and safe while the stream runs:
the steps that rewrite buckets hold the state lock (``velocity.redis.lock``) that the
stream holds for each micro-batch, and the other tables are only appended to by the
stream, which never conflicts with OPTIMIZE or VACUUM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from velocity.delta import tables
from velocity.delta.case_store import CaseStore
from velocity.delta.live import LiveState, LiveTables, newest_event_time
from velocity.domain.rules import deciding_rules
from velocity.errors import UsageError
from velocity.redis import connection, mirror
from velocity.redis.lock import state_lock
from velocity.settings import Settings
from velocity.spark.evaluate import HOUR_MS, hour_buckets, minute_buckets
from velocity.spark.redis_state import RedisState

log = logging.getLogger("velocity.maintenance")

# Delta's own floor: VACUUM below 7 days can delete files a lagging reader still needs.
MIN_VACUUM_RETENTION_HOURS = 168


@dataclass
class CompactionSummary:
    sealed_before: int | None = None
    hours_written: int = 0
    rows_before: int = 0
    rows_after: int = 0
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0


@dataclass
class TableFiles:
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


@dataclass
class EvictionSummary:
    cutoff: int | None = None
    bucket_rows_before: int = 0
    bucket_rows_after: int = 0
    redis_buckets_dropped: int = 0
    redis_hashes_dropped: int = 0


@dataclass
class ReconcileSummary:
    checked: int = 0
    missing: int = 0
    different: int = 0
    extra: int = 0
    repaired: bool = False
    clean_after: bool = True
    details: dict[str, Any] = field(default_factory=dict)


def compact_buckets(spark: SparkSession, settings: Settings) -> CompactionSummary:
    """Fold the sealed g-wide buckets into hour buckets (with their parts), in one commit.

    Sealed: the whole hour lies below the watermark (newest eventTime − allowed lateness),
    so only late events still reach it, and those land as g-wide rows that the next run
    folds in. Readers expand hours back into their parts (``minute_buckets``), so lookups,
    evaluation and backfill see exactly the same buckets before and after. Idempotent.
    """
    began = time.monotonic()
    live = LiveTables.of(settings)
    width = settings.bucket_width_ms
    summary = CompactionSummary()
    summary.bytes_before, summary.files_before = tables.table_size(spark, live.buckets)
    client = connection.connect(settings)
    with state_lock(client, settings, "compaction") as lease:
        buckets = tables.read_table(spark, live.buckets)
        summary.rows_before = summary.rows_after = buckets.count()
        newest = newest_event_time(spark, live)
        if newest is not None:
            watermark = newest - settings.allowed_lateness_ms
            sealed_before = watermark - watermark % HOUR_MS
            summary.sealed_before = sealed_before
            # An hour needs folding when it holds more than one row (g-wide buckets, or an
            # hour row and the late deltas beside it); one row is already as small as it gets.
            hour = F.col("bucket_start") - F.pmod(F.col("bucket_start"), F.lit(HOUR_MS))
            pending = (
                buckets.where(F.col("bucket_start") < sealed_before)
                .groupBy("signature_id", "key", hour.alias("hour_start"))
                .count()
                .where(F.col("count") > 1)
            )
            oldest = pending.agg(F.min("hour_start")).first()
            if oldest is not None and oldest[0] is not None:
                first_hour = int(oldest[0])
                span = f"bucket_start >= {first_hour} AND bucket_start < {sealed_before}"
                in_span = buckets.where(span)
                hours = hour_buckets(minute_buckets(in_span, width), width).persist()
                try:
                    summary.hours_written = hours.where(F.col("bucket_width_ms") == HOUR_MS).count()
                    lease.check()  # the fold took past the lease: another writer may be in
                    (
                        hours.write.format("delta")
                        .mode("overwrite")
                        .option("replaceWhere", span)
                        .save(str(live.buckets))
                    )
                finally:
                    hours.unpersist()
                summary.rows_after = tables.read_table(spark, live.buckets).count()
    client.close()
    summary.bytes_after, summary.files_after = tables.table_size(spark, live.buckets)
    summary.seconds = round(time.monotonic() - began, 3)
    return summary


def optimize_tables(
    spark: SparkSession, settings: Settings, names: Sequence[str] | None = None
) -> dict[str, TableFiles]:
    """OPTIMIZE (bin-packing) every live table (or those ``names``); returns files and
    bytes before and after. Every table's pass (no ``names``) then refreshes the case
    book's snapshot (``CaseStore.write_snapshot``), after any compaction: a fresh
    process's first look at the cases reads it and only the case events written since.

    The buckets table is rewritten under the state lock (the stream MERGEs into it); the
    others are append-only for the stream, and appends never conflict with OPTIMIZE.
    """
    live = LiveTables.of(settings)
    result: dict[str, TableFiles] = {}
    client = connection.connect(settings)
    for name in names or list(LiveTables.__dataclass_fields__):
        path = getattr(live, name)
        if not tables.table_exists(spark, path):
            continue
        figures = TableFiles()
        figures.bytes_before, figures.files_before = tables.table_size(spark, path)
        if figures.files_before <= 1:  # nothing to bin-pack: no Spark job for nothing
            figures.bytes_after, figures.files_after = figures.bytes_before, figures.files_before
            result[name] = figures
            continue
        if name == "buckets":
            with state_lock(client, settings, "optimize buckets"):
                spark.sql(f"OPTIMIZE delta.`{path}`")
        else:
            spark.sql(f"OPTIMIZE delta.`{path}`")
        figures.bytes_after, figures.files_after = tables.table_size(spark, path)
        result[name] = figures
    client.close()
    if names is None:
        written = CaseStore(settings).write_snapshot()
        if written is not None:
            log.info(
                "case snapshot: %d cases as of case_events version %d (%d files) in %.1f s: %s",
                written.cases, written.version, written.files, written.seconds, written.path,
            )  # fmt: skip
    return result


def vacuum_tables(
    spark: SparkSession, settings: Settings, retention_hours: int
) -> dict[str, TableFiles]:
    """VACUUM every live table, keeping files younger than ``retention_hours``.

    Refuses less than 168 hours: below Delta's own floor a lagging reader (or a stream
    restarted from an older checkpoint) could lose files it still needs.
    """
    if retention_hours < MIN_VACUUM_RETENTION_HOURS:
        raise UsageError(
            f"VACUUM retention {retention_hours} h is below the safe floor of "
            f"{MIN_VACUUM_RETENTION_HOURS} h; give --retention-hours {MIN_VACUUM_RETENTION_HOURS}"
            " or more"
        )
    live = LiveTables.of(settings)
    result: dict[str, TableFiles] = {}
    for name in LiveTables.__dataclass_fields__:
        path = getattr(live, name)
        if not tables.table_exists(spark, path):
            continue
        figures = TableFiles()
        files = _data_files(path)
        figures.bytes_before, figures.files_before = _size_of(files)
        figures.bytes_after, figures.files_after = figures.bytes_before, figures.files_before
        if _vacuum_may_delete(path, files, retention_hours):
            spark.sql(f"VACUUM delta.`{path}` RETAIN {retention_hours} HOURS")
            figures.bytes_after, figures.files_after = _size_of(_data_files(path))
        result[name] = figures
    return result


def _data_files(path: Path) -> list[Path]:
    """The data files under a table folder, referenced or not."""
    return [p for p in path.rglob("*.parquet") if "_delta_log" not in p.parts]


def _size_of(files: list[Path]) -> tuple[int, int]:
    """(bytes, files)."""
    return sum(p.stat().st_size for p in files), len(files)


def _vacuum_may_delete(path: Path, files: list[Path], retention_hours: int) -> bool:
    """Whether VACUUM could delete one of ``files`` (the table folder's data files): one
    the table's version does not reference, written before the retention (VACUUM deletes
    nothing younger, whatever its tombstone says). Most hours none is, and a VACUUM that
    finds nothing still costs a Spark job of a second or more a table; a table delta-rs
    cannot read is VACUUMed as before."""
    try:
        referenced = {
            Path(unquote(urlparse(uri).path)).resolve() for uri in DeltaTable(str(path)).file_uris()
        }
    except (DeltaError, OSError):
        return True
    horizon = time.time() - retention_hours * 3600
    return any(f.resolve() not in referenced and f.stat().st_mtime < horizon for f in files)


# velocity_evict calls (and DELs of retired signatures' states) sent in one round trip.
EVICT_CALLS_A_ROUND = 1000


def evict_state(spark: SparkSession, settings: Settings) -> EvictionSummary:
    """Drop Delta buckets and Redis buckets outside the horizon, and the Redis hashes of
    signatures no longer active. Idempotent.

    The horizon is the stream's: the widest active window + allowed lateness + one bucket
    behind the newest eventTime.
    """
    state = LiveState(spark, settings)
    live = state.live
    client = connection.connect(settings)
    connection.load_functions(client)
    summary = EvictionSummary()
    summary.bucket_rows_before = summary.bucket_rows_after = tables.read_table(
        spark, live.buckets
    ).count()
    # Read the rules and the newest eventTime, and act on Delta and Redis, inside one hold
    # of the lock: a rule widened (and its signature rebuilt) in between must not lose
    # the buckets its build just wrote.
    with state_lock(client, settings, "eviction") as lease:
        rules = deciding_rules(state.rule_store.in_force())
        newest = newest_event_time(spark, live)
        if newest is None or not rules:
            return summary
        lease.check()
        summary.cutoff = state.evict(rules, newest)
        active_signatures = {r.signature.signature_id for r in rules}
        states = list(mirror.bucket_hashes(client, settings.redis_keys))
        # Pipelined, a chunk a round trip (a call a key: the step took 59 s at 1.1M keys
        # against 38 s, 2026-11-29).
        for first in range(0, len(states), EVICT_CALLS_A_ROUND):
            pipe = client.pipeline(transaction=False)
            for name, slot in states[first : first + EVICT_CALLS_A_ROUND]:
                if slot[0] in active_signatures:
                    pipe.fcall("velocity_evict", 1, name, str(summary.cutoff))
                else:  # the state string and a dense key's hash beside it
                    pipe.delete(name, settings.redis_keys.dense_hash_of(name))
            for (_, slot), answer in zip(
                states[first : first + EVICT_CALLS_A_ROUND], pipe.execute(), strict=True
            ):
                if slot[0] in active_signatures:
                    summary.redis_buckets_dropped += int(answer)
                else:
                    summary.redis_hashes_dropped += int(answer > 0)
    summary.bucket_rows_after = tables.read_table(spark, live.buckets).count()
    return summary


def reconcile_state(spark: SparkSession, settings: Settings, repair: bool) -> ReconcileSummary:
    """Compare the Redis mirror with the Delta buckets; with ``repair``, rewrite Redis from
    Delta and drop what only Redis had, then compare again."""
    client = connection.connect(settings)
    connection.load_functions(client)
    redis_state = RedisState(LiveState(spark, settings), client)
    drift, _ = redis_state.repair() if repair else (redis_state.reconcile(), 0)
    summary = ReconcileSummary(
        checked=drift.checked,
        missing=len(drift.missing),
        different=len(drift.different),
        extra=len(drift.extra),
        clean_after=drift.clean,
        details={
            "missing": [list(s) for s in drift.missing[:5]],
            "different": [list(s) for s in drift.different[:5]],
            "extra": [list(s) for s in drift.extra[:5]],
        },
    )
    if repair and not drift.clean:
        summary.repaired = True
        summary.clean_after = redis_state.reconcile().clean
    return summary
