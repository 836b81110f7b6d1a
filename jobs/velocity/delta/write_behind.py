"""Delta written behind the stream: each micro-batch's results spooled, appended in groups.

The stream decides a batch in memory and commits it to Redis; Delta, the state of
record, receives the same results a little later (setting ``write_behind_seconds``).
Each batch's rows go first to a spool folder on the data dir (``<data_dir>/spool/stream/
<batch>/<table>.parquet``, made whole by one rename), *before* the batch commits to
Redis. A flush appends every spooled batch up to a committed one to the live tables, one
append per table, and then removes them; before it appends the alerts, it gathers them
into cases (``velocity.delta.case_store``), off the stream's hot path.

The appends are delta-rs commits made in this process (no Spark job): Spark's writer
spent several seconds of the JVM's CPU on each 40 000-event flush (building a DataFrame
from Arrow, encoding Parquet, committing, and compiling code for all of it), delta-rs a
tenth of a second. The tables stay Spark's (created by Spark, reader 1 / writer 2), and
Spark reads what delta-rs appends.

Exactly once:
- a flush first records its group (``flushing.json``), then appends each table in a
  commit that records the transaction (app id ``velocity-stream:<table>``, version = the
  group's last batch), unless the table holds that transaction already: a flush that died
  part-way is redone with the same group, and skips the tables that committed;
- a spooled batch newer than the last committed one is a stale attempt of a batch that
  Spark will replay; the stream discards it before replaying.

Callers hold the data dir's state lock around ``flush``, so the backfill, maintenance and
data quality can flush what the stream has spooled and see every committed batch.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import TableNotFoundError
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from velocity.delta import tables
from velocity.delta.case_store import CaseStore
from velocity.operating.local_process import SpawnedWorkers
from velocity.settings import Settings

APP_ID = "velocity-stream"
# The live tables a micro-batch writes, and their schemas.
SPOOLED_TABLES: Mapping[str, StructType] = {
    name: tables.LIVE_SCHEMAS[name]
    for name in (
        tables.EVENTS,
        tables.QUARANTINE,
        tables.DUPLICATES,
        tables.LATE_EVENTS,
        tables.BUCKETS,
        tables.ALERTS,
    )
}
ARROW_SCHEMAS: Mapping[str, pa.Schema] = {
    name: to_arrow_schema(schema) for name, schema in SPOOLED_TABLES.items()
}
_INTENT = "flushing.json"
# Held (flock) for a whole flush. The state lock should make flushes one at a time, but its
# lease can run out under a slow flush on a loaded machine, and then the stream's flusher and
# a backfill's flushed the same group at once (one found the other had removed the intent:
# FileNotFoundError); a second flusher past a first's new intent could remove it too, and a
# crash then would flush that group again under another version. A file lock holds whatever
# the lease did.
_FLUSH_LOCK = ".flush.lock"


@dataclass(frozen=True)
class Flushed:
    """What one flush appended: the batches and the rows per table."""

    batches: list[int]
    rows: dict[str, int]


class Spool:
    """The spooled micro-batches of one data dir's stream."""

    def __init__(self, settings: Settings) -> None:
        self.root = settings.data_dir / "spool" / "stream"
        self.settings = settings

    def _folder(self, batch_id: int) -> Path:
        return self.root / f"{batch_id:012d}"

    def batches(self) -> list[int]:
        """Spooled batch ids, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())

    def write(
        self, batch_id: int, rows: Mapping[str, pa.Table], meta: Mapping[str, object]
    ) -> None:
        """Spool one batch's rows (every table of ``SPOOLED_TABLES``), all or nothing."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".{batch_id:012d}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for name in SPOOLED_TABLES:
            pq.write_table(rows[name], staging / f"{name}.parquet", compression="none")
        (staging / "meta.json").write_text(json.dumps(meta))
        target = self._folder(batch_id)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)

    def oldest_spooled_at(self) -> float | None:
        """When the oldest batch still spooled was written (epoch seconds; its folder's
        mtime, set by its last file), None when the spool is empty: how far Delta trails."""
        for batch_id in self.batches():
            try:
                return self._folder(batch_id).stat().st_mtime
            except FileNotFoundError:
                continue  # flushed between the listing and the look
        return None

    def meta(self, batch_id: int) -> dict[str, object]:
        return dict(json.loads((self._folder(batch_id) / "meta.json").read_text()))

    def read(self, batch_id: int, name: str) -> pa.Table:
        return pq.read_table(self._folder(batch_id) / f"{name}.parquet", schema=ARROW_SCHEMAS[name])

    def discard_from(self, batch_id: int) -> list[int]:
        """Remove spooled batches ``batch_id`` and later (attempts that never committed)."""
        stale = [b for b in self.batches() if b >= batch_id]
        for b in stale:
            shutil.rmtree(self._folder(b), ignore_errors=True)
        return stale

    def _intent(self) -> list[int] | None:
        path = self.root / _INTENT
        return json.loads(path.read_text()) if path.exists() else None

    @contextmanager
    def _one_flusher(self) -> Iterator[None]:
        """This data dir's flushes one at a time, in every process (``_FLUSH_LOCK``)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / _FLUSH_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            yield

    def flush(self, through: int | None) -> Flushed:
        """Append the spooled batches up to ``through`` (and any unfinished flush) to Delta.

        Idempotent, and safe to repeat after a crash at any point. Hold the state lock;
        flushes wait for each other (``_FLUSH_LOCK``) whatever became of its lease.
        """
        with self._one_flusher():
            return self._flush(through)

    def _flush(self, through: int | None) -> Flushed:
        group = self._intent()
        if group is None:
            group = self._spooled_through(through)
            if not group:
                return Flushed([], {})
            intent = self.root / f".{_INTENT}"
            intent.write_text(json.dumps(group))
            intent.rename(self.root / _INTENT)
        present = [b for b in group if self._folder(b).is_dir()]
        grouped = {}
        for name in SPOOLED_TABLES:
            parts = [self.read(b, name) for b in present]
            grouped[name] = pa.concat_tables(parts) if parts else ARROW_SCHEMAS[name].empty_table()
        rows = append_group(self.settings, grouped, max(group))
        for b in group:
            shutil.rmtree(self._folder(b), ignore_errors=True)
        (self.root / _INTENT).unlink()
        return Flushed(group, rows)

    def has_work(self, through: int | None) -> bool:
        """Whether ``flush(through)`` would append anything (an unfinished flush, or a
        spooled batch up to ``through``)."""
        return self._intent() is not None or bool(self._spooled_through(through))

    def _spooled_through(self, through: int | None) -> list[int]:
        return [b for b in self.batches() if through is not None and b <= through]


def append_group(
    settings: Settings, grouped: Mapping[str, pa.Table], last_batch: int
) -> dict[str, int]:
    """Append one write-behind group's rows (``grouped``: every table of ``SPOOLED_TABLES``)
    to the live tables: the alerts gathered into cases first, then one commit a table that
    records (``velocity-stream:<table>``, ``last_batch``), skipped for a table that holds it
    already. Returns the rows per table. A ``last_batch`` below zero is a group no stream
    batch can be (``bench-page`` fills tables so): it marks no batch committed
    (``velocity.domain.committed`` reads only marks of zero and up), and a stream started
    on the tables appends its own batches after it."""
    # Alerts join cases before they are appended, so each row carries its caseId; a
    # case's rows lie together in the file, so a read of one case skips the others'
    # row groups by their caseId statistics (a case's page, its close).
    cases = CaseStore(settings)
    gathered = cases.gather_alerts(grouped[tables.ALERTS], grouped[tables.EVENTS], last_batch)
    ordered = dict(grouped)
    ordered[tables.ALERTS] = gathered.sort_by(
        [("caseId", "ascending"), ("decisionTime", "ascending"), ("alertId", "ascending")]
    )
    rows: dict[str, int] = {}
    for name, table in ordered.items():
        rows[name] = table.num_rows
        if table.num_rows:
            path = settings.table_path(getattr(tables, name.upper()))
            grouping = ALERT_ROW_GROUPS if name == tables.ALERTS else None
            append_once(path, table, f"{APP_ID}:{name}", last_batch, grouping)
    # A case closed between the join and the append reviewed the rows it found then.
    cases.review_late_alerts(ordered[tables.ALERTS])
    return rows


# The write-behind's flush (``LiveState.flush_spool``), in a process of its own: in the
# stream's, the flush's Python (the cases' join, delta-rs's calls) held the GIL the batch
# thread needs, every round. A flush is safe to repeat after a crash at any point.
SPOOL_FLUSHER = SpawnedWorkers(__name__)


def flush_spool_apart(settings: Settings, through: int | None) -> Flushed:
    """``Spool.flush`` in the flushing process (``SPOOL_FLUSHER``); with nothing to flush
    (a backfill's or a maintenance's usual case), nothing is spawned."""
    if not Spool(settings).has_work(through):
        return Flushed([], {})
    (flushed,) = SPOOL_FLUSHER.run(
        _flush_spool, [settings], [through], workers=1, what="flushing the spool"
    )
    return flushed


def _flush_spool(settings: Settings, through: int | None) -> Flushed:
    return Spool(settings).flush(through)


class InputSpool:
    """The parsed lines of the micro-batches handed over by Spark but not yet committed to
    Redis (``<data_dir>/spool/stream-input/<batch>.arrow``, made whole by one rename).

    The stream decides a batch while Spark reads and parses the next. Spark records a batch
    as done once its function returns, before the batch commits; this input is what a
    restart decides such a batch from, so a crash in between loses nothing. A batch's file
    goes when it has committed."""

    def __init__(self, settings: Settings) -> None:
        self.root = settings.data_dir / "spool" / "stream-input"

    def _path(self, batch_id: int) -> Path:
        return self.root / f"{batch_id:012d}.arrow"

    def batches(self) -> list[int]:
        """The batches whose input waits for their commit, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(int(p.stem) for p in self.root.glob("*.arrow") if p.stem.isdigit())

    def write(self, batch_id: int, lines: pa.Table) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".{batch_id:012d}.{os.getpid()}"
        with pa.OSFile(str(staging), "wb") as sink, pa.ipc.new_file(sink, lines.schema) as out:
            out.write_table(lines)
        staging.rename(self._path(batch_id))

    def read(self, batch_id: int) -> pa.Table:
        with pa.OSFile(str(self._path(batch_id)), "rb") as source:
            return pa.ipc.open_file(source).read_all()

    def remove(self, batch_id: int) -> None:
        self._path(batch_id).unlink(missing_ok=True)


def flushed_batch(settings: Settings) -> int | None:
    """The newest batch the write-behind has appended to Delta (None: none): the highest
    transaction version the spooled tables record. A batch is flushed once it committed to
    Redis, so a Redis whose progress is behind it lost committed batches (see
    ``velocity.domain.committed``). A delta-rs look at each table's log (tens of ms): for a
    start, not for every batch."""
    versions = []
    for name in SPOOLED_TABLES:
        try:
            table = DeltaTable(str(settings.table_path(getattr(tables, name.upper()))))
        except TableNotFoundError:
            continue
        versions.append(table.transaction_version(f"{APP_ID}:{name}"))
    return max((v for v in versions if v is not None), default=None)


# Rows a Parquet row group of the alerts table holds at most: a write-behind group's file
# (tens of thousands of alerts in a storm) in several, each with its own statistics.
ALERT_ROW_GROUPS = WriterProperties(max_row_group_size=8_192)


def append_once(
    path: Path,
    rows: pa.Table,
    app_id: str,
    version: int,
    writer_properties: WriterProperties | None = None,
) -> None:
    """Append ``rows`` to the Delta table at ``path`` in one commit that records
    (``app_id``, ``version``); nothing when the table has that transaction (or a later
    one) already. The caller holds the state lock: no other writer commits meanwhile."""
    table = DeltaTable(str(path))
    done = table.transaction_version(app_id)
    if done is not None and done >= version:
        return
    commit = CommitProperties(app_transactions=[Transaction(app_id, version)])
    if writer_properties is None:
        write_deltalake(table, rows, mode="append", commit_properties=commit)
    else:
        write_deltalake(
            table,
            rows,
            mode="append",
            writer_properties=writer_properties,
            commit_properties=commit,
        )
