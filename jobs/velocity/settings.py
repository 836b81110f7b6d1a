"""Velocity's settings: one typed object, from ``VELOCITY_*`` variables and an optional file.

Precedence, highest first: explicit arguments (the CLI's flags), environment
variables ``VELOCITY_<FIELD>``, the TOML file named by ``VELOCITY_CONFIG``
(keys are the field names), the defaults below (the embedded defaults: every
service on this machine, state inside the checkout).
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from velocity.domain.buckets import ALLOWED_BUCKET_SECONDS, bucket_width_ms
from velocity.domain.schema import FIELDS_BY_NAME
from velocity.errors import SettingsError
from velocity.redis.keys import RedisKeys, default_prefix

# The checkout this package runs from (jobs/velocity/settings.py -> checkout).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REDIS_PORT = 6391
DEFAULT_REDIS_PASSWORD = "velocity-local"
DEFAULT_KAFKA_PORT = 9392
DEFAULT_METRICS_PORT = 9391
# Kafka's controller takes DEFAULT_KAFKA_PORT + 1.
DEFAULT_CHECK_PORT = 9394


def local_mode_cores(master: str) -> int | None:
    """The cores of a local-mode master (``local``, ``local[N]``, ``local[*]``,
    ``local[N,F]``); None for any other master."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master.strip())
    if match is None:
        return None
    cores = match.group(1)
    if cores is None:
        return 1
    if cores == "*":
        return os.cpu_count() or 1
    return int(cores)


RETENTION_UNITS_MS = {"m": 60_000, "h": 3_600_000, "d": 86_400_000}
MIN_ALERT_STREAM_ENTRIES = 1000


def alert_retention(text: str) -> str:
    """An alert stream's retention ("1000000" entries, or an age: "90m", "24h", "7d") as
    velocity.lua's alert_trim reads it: "<entries>" or "age:<ms>". ``ValueError`` names
    what is wrong."""
    match = re.fullmatch(r"(\d+)([mhd]?)", text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is neither a number of entries nor an age (a number and m, h or d)"
        )
    number, unit = int(match.group(1)), match.group(2)
    if not unit:
        if number < MIN_ALERT_STREAM_ENTRIES:
            raise ValueError(f"keep at least {MIN_ALERT_STREAM_ENTRIES} entries, not {number}")
        return str(number)
    if number < 1:
        raise ValueError("keep at least 1m of alerts")
    return f"age:{number * RETENTION_UNITS_MS[unit]}"


def spark_master_on_loopback(master: str) -> bool:
    """Whether the Spark master runs on this machine: local mode or a loopback URL."""
    host = master.partition("://")[2].rpartition(":")[0]
    return master.startswith("local") or host in {"127.0.0.1", "localhost"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VELOCITY_", extra="forbid")

    data_dir: Path = Field(
        default=PROJECT_ROOT / "data",
        description="Root of every Delta table and checkpoint; two data dirs never share state.",
    )
    redis_url: str = Field(
        default=f"redis://:{DEFAULT_REDIS_PASSWORD}@127.0.0.1:{DEFAULT_REDIS_PORT}/0",
        description="Redis that mirrors the aggregates; `velocity up` starts this one locally. "
        "redis+cluster://:PASSWORD@HOST:PORT/0 names a Redis Cluster by any of its masters.",
    )
    redis_reader_password: str = Field(
        default="velocity-reader-local",
        min_length=8,
        description="Password of the read-only Redis user `velocity-reader` that `velocity up` "
        "creates for downstream services (lookups, rule entries, the alert stream).",
    )
    redis_key_prefix: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9:._-]*$",
        description="Every Redis key of this data dir starts with this and a colon "
        "(empty: velocity:<digest of the data dir>, so data dirs never share keys).",
    )
    redis_alert_stream: str = Field(
        default="",
        description="Redis stream that receives every alert of the rules in force (empty: "
        "<key prefix>:alerts); SHADOW rules' alerts go to the same name plus ':shadow'.",
    )
    redis_alert_stream_retention: str = Field(
        default="1000000",
        description="What the Redis alert stream (and its ':shadow' twin) keeps: a number of "
        "entries (at least 1000; trimmed approximately, as XADD MAXLEN ~ trims) or an age with "
        "a unit, m, h or d (at least 1m; '24h': entries older than a day are trimmed, XADD "
        "MINID ~). Trimmed alerts stay in the alerts table (`velocity alerts`); a consumer "
        "whose saved entry id is older than the stream's first entry has missed some.",
    )
    bucket_seconds: int = Field(
        default=60, description=f"Bucket width g in seconds; one of {list(ALLOWED_BUCKET_SECONDS)}."
    )
    allowed_lateness_seconds: int = Field(
        default=300, ge=0, description="Watermark = highest eventTime seen minus this."
    )
    max_future_seconds: int = Field(
        default=24 * 3600,
        ge=1,
        description="An event more than this far ahead of the newest accepted eventTime (and, "
        "in the stream, of the clock) is quarantined as future_event_time.",
    )
    eviction_every_seconds: float = Field(
        default=600.0,
        ge=0.0,
        description="The stream's write-behind deletes Delta buckets older than the horizon at "
        "most this often (0: at every flush). Reads skip them anyway; each deletion is a Delta "
        "transaction that rewrites files, and `velocity maintain evict` also runs hourly.",
    )
    dedup_horizon_seconds: int = Field(
        default=7 * 24 * 3600,
        ge=1,
        description="The stream drops an event whose transactionId it accepted this long ago "
        "or less (kept in Redis by horizon-long spans, so for up to twice as long).",
    )
    stream_max_bytes_per_trigger: int = Field(
        default=8_000_000,
        ge=0,
        description="A micro-batch of the folder source reads new files up to about this many "
        "bytes (at least one file; 0: no cap; `--max-files-per-trigger` replaces it). A "
        "backlog then runs as batches of bounded time instead of one that grows.",
    )
    stream_archive_dir: Path | None = Field(
        default=None,
        description="The folder source moves each file here once the micro-batch that read it "
        "has committed (Spark's cleanSource=archive; the file keeps its full path beneath it). "
        "Unset, files stay where they landed, and Spark lists every one of them at each poll "
        "for new files (every 10 ms while idle): the listing's CPU grows with the folder. "
        "Must not lie inside the events folder.",
    )
    write_behind_seconds: float = Field(
        default=30.0,
        ge=0.0,
        description="The stream appends its decided batches to the Delta tables at most this "
        "long after it committed them to Redis (0: at every micro-batch).",
    )
    stream_decide_partitions: int = Field(
        default=0,
        ge=0,
        description="The stream decides a micro-batch in this many key-partitions, one Spark "
        "task each (0: the cores of local mode, else Spark's default parallelism): one task a "
        "core runs them in one wave; twice as many left the first half's results waiting.",
    )
    stream_overlap: bool = Field(
        default=True,
        description="The stream decides and commits a micro-batch while Spark reads and "
        "parses the next (each batch's parsed input is spooled first, so a crash in between "
        "loses nothing); false: one batch at a time. The available-now trigger always runs "
        "one at a time.",
    )
    stream_executor_min_rows: int = Field(
        default=50_000,
        ge=0,
        description="A micro-batch with fewer keyed rows (events times matching signatures) "
        "is decided by the same kernel in processes beside the driver, one a key-partition, "
        "started with the stream: a Spark job costs 0.5-1 s a batch, the kernel about 16 µs "
        "a keyed row, so two executors win only above about 60 000 (0: always in the "
        "executors, and no such processes).",
    )
    stream_stale_seconds: int = Field(
        default=120,
        ge=1,
        description="stream-status calls a RUNNING stream stalled when its heartbeat is older.",
    )
    stream_heartbeat_seconds: int = Field(
        default=10,
        ge=1,
        description="An idle stream refreshes its status file this often "
        "(spark.sql.streaming.noDataProgressEventInterval).",
    )
    metrics_port: int = Field(
        default=DEFAULT_METRICS_PORT,
        ge=0,
        le=65535,
        description="`velocity stream` serves its metrics in Prometheus's text format on "
        "127.0.0.1:PORT (0: no metrics server); a port taken by another program stops the "
        "start, so a scrape never reads another stream's figures.",
    )
    check_host: str = Field(
        default="127.0.0.1",
        description="Address `velocity serve` (the HTTP check service) listens on; loopback by "
        "default. 0.0.0.0 or a host's address serves other machines: put TLS in front of it.",
    )
    check_port: int = Field(
        default=DEFAULT_CHECK_PORT,
        ge=0,
        le=65535,
        description="Port of `velocity serve`, the HTTP check service (POST /check, GET "
        "/healthz, GET /metrics), which `velocity up` starts too (0: `up` starts none).",
    )
    serving_nice: int = Field(
        default=-10,
        ge=-20,
        le=19,
        description="Scheduling niceness of the local Redis `velocity up` starts and of `velocity "
        "serve`: checks and lookups wait for them, so on cores shared with Spark they run ahead "
        "of it (0: as any process). Raising a priority needs root or CAP_SYS_NICE; without it "
        "they keep their own, and `velocity up` says so.",
    )
    serving_realtime: int = Field(
        default=10,
        ge=0,
        le=99,
        description="Round-robin real-time priority of the local Redis `velocity up` starts and "
        "of `velocity serve` (0: none, their niceness only): at nice -10 beside the stream a "
        "sleeper still woke over 2 ms late on 0.4-1 % of its wake-ups, which is a check's p99; "
        "a real-time thread preempts Spark at once. Their children (Redis's AOF rewrite) start "
        "at the normal policy. Needs root or CAP_SYS_NICE; without it they keep their niceness, "
        "and `velocity up` says so.",
    )
    check_token: str = Field(
        default="",
        description="Bearer token every POST /check must present (at least 16 characters). "
        "Empty: `velocity serve` uses the token in <data dir>/serve/check-token, drawn at random "
        "(256 bits, readable by its owner only) the first time, and prints that file's path.",
    )
    quality_max_quarantine_rate: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Data quality fails when quarantined lines exceed this share of all lines "
        "(quarantine / (events + duplicates + quarantine)).",
    )
    kafka_bootstrap: str = Field(
        default=f"127.0.0.1:{DEFAULT_KAFKA_PORT}",
        description="Kafka bootstrap servers (HOST:PORT[,...]). A loopback address is the "
        "local broker `velocity up` starts (its controller on PORT+1); any other is used as "
        "it is and never started; empty: no Kafka.",
    )
    kafka_events_topic: str = Field(
        default="velocity.events",
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Topic `velocity stream --source kafka` reads and `generate --kafka` writes.",
    )
    kafka_alerts_topic: str = Field(
        default="velocity.alerts",
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Topic that receives every alert, correction and retraction (SPEC §4 JSON, "
        "keyed by alertId, at least once).",
    )
    kafka_alerts: str = Field(
        default="auto",
        pattern=r"^(auto|on|off)$",
        description="Publish alerts to the alerts topic: auto = when the stream reads Kafka "
        "(and the backfill of a data dir whose stream does); on = always; off = never.",
    )
    kafka_partitions: int = Field(
        default=4, ge=1, description="Partitions of the topics `velocity up` creates."
    )
    kafka_max_offsets_per_trigger: int = Field(
        default=100_000,
        ge=1,
        description="A micro-batch of the Kafka source reads at most this many messages, so "
        "a backlog runs as batches of bounded time.",
    )
    kafka_delivery_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        description="How long publishing an alert may wait for the broker (it retries "
        "meanwhile, e.g. through a broker restart) before the micro-batch fails.",
    )
    kafka_home: Path = Field(
        default=PROJECT_ROOT / ".cache" / "kafka",
        description="Folder of the Kafka broker JARs fetched by infra/fetch_jars.sh.",
    )
    case_key: str = Field(
        default="payerId",
        description="The event field whose value gathers alerts into cases (SPEC §4a): every "
        "alert of a payment joins the open case of that payment's value of this field.",
    )
    spark_master: str = Field(default="local[*]", description="Spark master URL.")
    spark_shuffle_partitions: int = Field(
        default=4, ge=1, description="spark.sql.shuffle.partitions; a few per core."
    )
    spark_driver_memory: str = Field(default="4g", description="spark.driver.memory.")
    spark_executor_memory: str = Field(
        default="2g",
        description="spark.executor.memory on a cluster (in local mode the driver does the "
        "work and this is unused).",
    )
    jars_dir: Path = Field(
        default=PROJECT_ROOT / ".cache" / "jars",
        description="Folder of the Delta and Spark-Kafka JARs fetched by infra/fetch_jars.sh "
        "(spark.jars).",
    )
    spark_log_level: str = Field(default="ERROR", description="Spark's own log level.")
    spark_jit: str = Field(
        default="client",
        pattern=r"^(client|tiered)$",
        description="The JIT compiler of Spark's JVMs (the driver's, and the executors' on a "
        "cluster): client = C1 only, with tiered's 240 MB code cache (C1 alone defaults to 48 MB, "
        "which a stream fills in minutes); tiered = the JVM's default, C1 then C2. Spark plans and "
        "generates code for every micro-batch, and C2 spent half the stream's JVM CPU "
        "compiling it (docs/benchmarks.md).",
    )

    @field_validator("bucket_seconds")
    @classmethod
    def _bucket_seconds_allowed(cls, value: int) -> int:
        bucket_width_ms(value)
        return value

    @field_validator("redis_alert_stream_retention")
    @classmethod
    def _retention_readable(cls, value: str) -> str:
        alert_retention(value)
        return value.strip()

    @field_validator("case_key")
    @classmethod
    def _case_key_declared(cls, value: str) -> str:
        if value not in FIELDS_BY_NAME:
            raise ValueError(f"{value!r} is not an event field; one of {sorted(FIELDS_BY_NAME)}")
        return value

    @field_validator("check_token")
    @classmethod
    def _token_long_enough(cls, value: str) -> str:
        if value and len(value) < 16:
            raise ValueError(
                "a check token needs at least 16 characters (empty: one drawn at random is "
                "kept in <data dir>/serve/check-token)"
            )
        return value

    @field_validator("data_dir", "jars_dir", "kafka_home", "stream_archive_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()

    @property
    def bucket_width_ms(self) -> int:
        return bucket_width_ms(self.bucket_seconds)

    @property
    def redis_keys(self) -> RedisKeys:
        """The names of this data dir's Redis keys (``velocity.redis.keys``)."""
        prefix = self.redis_key_prefix or default_prefix(str(self.data_dir))
        return RedisKeys(prefix, str(self.data_dir))

    @property
    def alert_stream(self) -> str:
        """The Redis stream of alerts: ``redis_alert_stream``, or ``<prefix>:alerts``."""
        return self.redis_alert_stream or self.redis_keys.alert_stream

    @property
    def alert_stream_retention(self) -> str:
        """``redis_alert_stream_retention`` as velocity.lua's alert_trim reads it:
        "<entries>" or "age:<ms>"."""
        return alert_retention(self.redis_alert_stream_retention)

    @property
    def shadow_alert_stream(self) -> str:
        """The Redis stream of SHADOW rules' alerts (SPEC §2): ``<alert stream>:shadow``,
        so ``<prefix>:alerts:shadow`` by default. Nothing downstream reads it."""
        return f"{self.alert_stream}:shadow"

    @property
    def allowed_lateness_ms(self) -> int:
        return self.allowed_lateness_seconds * 1000

    @property
    def max_future_ms(self) -> int:
        return self.max_future_seconds * 1000

    @property
    def redis_cluster(self) -> bool:
        """Whether ``redis_url`` names a Redis Cluster (``redis+cluster://``)."""
        return urlsplit(self.redis_url).scheme == "redis+cluster"

    @cached_property
    def redis_address(self) -> tuple[str, int, str | None]:
        """(host, port, password) of ``redis_url``."""
        parts = urlsplit(self.redis_url)
        password = unquote(parts.password) if parts.password is not None else None
        return parts.hostname or "127.0.0.1", parts.port or 6379, password

    def table_path(self, name: str) -> Path:
        return self.data_dir / "tables" / name


def loopback_address(host: str) -> str | None:
    """The address to bind for a loopback ``host`` (localhost is 127.0.0.1), else None."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return str(address) if address.is_loopback else None


def _config_file_values() -> dict[str, Any]:
    path = os.environ.get("VELOCITY_CONFIG")
    if not path:
        return {}
    try:
        with open(path, "rb") as handle:
            values = tomllib.load(handle)
    except FileNotFoundError as exc:
        raise SettingsError(f"VELOCITY_CONFIG names {path!r}, which does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"VELOCITY_CONFIG file {path!r} is not valid TOML: {exc}") from exc
    # Environment variables win over the file.
    return {k: v for k, v in values.items() if f"VELOCITY_{k.upper()}" not in os.environ}


def load_settings(**overrides: Any) -> Settings:
    """Settings from the file, the environment and ``overrides`` (None values are ignored)."""
    values = _config_file_values()
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SettingsError(f"bad setting (VELOCITY_* or config file): {problems}") from exc
