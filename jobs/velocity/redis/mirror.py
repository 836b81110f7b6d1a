"""The Redis mirror of the Delta buckets, the alert stream, and the lookup.

Redis is never the only copy: every write here sets absolute values read from Delta
(a replayed batch writes the same values again), and ``rebuild`` refills it from Delta.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, cast

import redis

from velocity.buckets import BucketAggregate, bucket_from_columns
from velocity.errors import UnknownRuleError
from velocity.redis.keys import (
    PREFIX,
    bucket_hash_key,
    bucket_value,
    key_for_lookup,
    parse_bucket_value,
    rule_entry,
    rule_entry_key,
)
from velocity.rules import Rule
from velocity.settings import Settings

# Entries kept in the alert stream at most (approximately: MAXLEN ~).
ALERT_STREAM_MAXLEN = 1_000_000
_PIPELINE_CHUNK = 1000


def connect(settings: Settings) -> redis.Redis:
    """A client of ``VELOCITY_REDIS_URL`` answering str; fails fast instead of retrying."""
    return redis.Redis.from_url(
        settings.redis_url, decode_responses=True, socket_timeout=10, retry_on_timeout=False
    )


def read_hash(client: redis.Redis, name: str) -> dict[str, str]:
    """HGETALL with the synchronous client's type (redis-py types it sync-or-async)."""
    return cast(dict[str, str], client.hgetall(name))


def load_functions(client: redis.Redis) -> None:
    """Load (or replace) the `velocity` Redis Function library; idempotent."""
    code = (resources.files("velocity") / "redis" / "velocity.lua").read_text(encoding="utf-8")
    client.function_load(code, replace=True)


def horizon_seconds(rules: Sequence[Rule], settings: Settings) -> int:
    """How long a (signature, key) hash lives after its last write: the widest active
    window plus the allowed lateness plus one bucket."""
    widest = max((r.window_ms for r in rules), default=0)
    return (widest + settings.allowed_lateness_ms + settings.bucket_width_ms) // 1000 + 1


def write_bucket_rows(
    client: redis.Redis,
    rows: Iterable[Mapping[str, Any]],
    ttl_seconds: int,
    evict_before: int | None = None,
) -> int:
    """HSET each bucket's absolute value and refresh its hash's TTL; returns rows written.

    With ``evict_before``, each written hash also drops its buckets older than that, so a
    busy key never outgrows the horizon (an idle one expires whole by its TTL).
    """
    written = 0
    pipe = client.pipeline(transaction=False)
    for row in rows:
        name = bucket_hash_key(row["signature_id"], row["key"])
        pipe.hset(name, str(row["bucket_start"]), bucket_value(bucket_from_columns(row)))
        pipe.expire(name, ttl_seconds)
        if evict_before is not None:
            pipe.fcall("velocity_evict", 1, name, str(evict_before))
        written += 1
        if written % _PIPELINE_CHUNK == 0:
            pipe.execute()
    pipe.execute()
    return written


def bucket_rows_writer(
    settings: Settings, ttl_seconds: int, evict_before: int | None = None
) -> Any:
    """A ``foreachPartition`` function: each Spark task writes its buckets itself."""

    def write(rows: Iterable[Any]) -> None:
        client = connect(settings)
        try:
            write_bucket_rows(client, (r.asDict() for r in rows), ttl_seconds, evict_before)
        finally:
            client.close()

    return write


def remove_buckets(client: redis.Redis, slots: Iterable[tuple[str, str, int]]) -> None:
    """HDEL the given (signature, key, bucket start) fields."""
    pipe = client.pipeline(transaction=False)
    for signature_id, key, start in slots:
        pipe.hdel(bucket_hash_key(signature_id, key), str(start))
    pipe.execute()


def publish_alerts(
    client: redis.Redis, stream: str, batch_id: int, alerts: Sequence[Mapping[str, Any]]
) -> int:
    """Append one batch's alerts to the stream once (a replayed batch adds nothing)."""
    if not alerts:
        return 0
    payload = [json.dumps(a, separators=(",", ":")) for a in alerts]
    added = client.fcall(
        "velocity_publish", 1, stream, str(batch_id), str(ALERT_STREAM_MAXLEN), *payload
    )
    return int(added)  # type: ignore[arg-type]


def publish_backfill(
    client: redis.Redis, stream: str, alerts: Sequence[Mapping[str, Any]]
) -> int:
    """Append a backfill's CORRECTION and RETRACTION records to the alert stream.

    Unlike a micro-batch, a backfill publishes at least once (a rerun after a crash may
    repeat an entry); consumers drop repeats by ``alertId``, which is deterministic.
    """
    if not alerts:
        return 0
    payload = [json.dumps(a, separators=(",", ":")) for a in alerts]
    added = 0
    for start in range(0, len(payload), _PIPELINE_CHUNK):
        chunk = payload[start : start + _PIPELINE_CHUNK]
        added += int(
            client.fcall(  # type: ignore[arg-type]
                "velocity_publish_backfill", 1, stream, str(ALERT_STREAM_MAXLEN), *chunk
            )
        )
    return added


def publish_rules(client: redis.Redis, rules: Sequence[Rule], bucket_ms: int) -> None:
    """Make ``velocity:rule:<id>`` describe exactly the given rules (others are removed)."""
    wanted = {rule_entry_key(r.rule_id): rule_entry(r, bucket_ms) for r in rules}
    present = set(client.scan_iter(match=f"{PREFIX}:rule:*", count=1000))
    pipe = client.pipeline(transaction=False)
    for name in present - set(wanted):
        pipe.delete(name)
    for name, entry in wanted.items():
        pipe.delete(name)
        pipe.hset(name, mapping=entry)
    pipe.execute()


def lookup(
    client: redis.Redis, rule_id: int, key_values: Mapping[str, str], at_ms: int | None = None
) -> dict[str, Any]:
    """The window aggregate of (rule, key) as of ``at_ms`` (None: the server's now)."""
    entry = read_hash(client, rule_entry_key(rule_id))
    if not entry:
        raise UnknownRuleError(
            f"ruleId {rule_id} is not published in Redis: it is not in force, or the stream "
            "has not run since Redis was emptied (`velocity mirror rebuild` refills it)"
        )
    names = json.loads(entry["groupingKeyNames"])
    bucket_key = key_for_lookup(entry, key_values)
    args = [entry["aggregatorFunctionType"], entry["windowMs"], entry["bucketMs"]]
    if at_ms is not None:
        args.append(str(at_ms))
    result = json.loads(client.fcall("velocity_window", 1, bucket_key, *args))  # type: ignore[arg-type]
    return {
        "ruleId": rule_id,
        "key": {n: str(key_values[n]) for n in names},
        "aggregateValue": result["aggregateValue"],
        "windowStart": result["windowStart"],
        "windowEnd": result["windowEnd"],
    }


@dataclass
class Drift:
    """Differences between Redis and Delta for the buckets Redis should hold."""

    checked: int = 0
    missing: list[tuple[str, str, int]] = field(default_factory=list)
    different: list[tuple[str, str, int]] = field(default_factory=list)
    extra: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.missing or self.different or self.extra)


def compare_buckets(
    client: redis.Redis, rows: Iterable[Mapping[str, Any]], since: int | None = None
) -> Drift:
    """Compare Delta bucket rows with Redis, hash by hash (rows grouped by signature and key).

    Redis buckets older than ``since`` are not drift: the stream's own eviction trails the
    horizon by up to a batch, and such buckets expire with their hash.
    """
    drift = Drift()
    by_hash: dict[tuple[str, str], dict[int, BucketAggregate]] = {}
    for row in rows:
        by_hash.setdefault((row["signature_id"], row["key"]), {})[row["bucket_start"]] = (
            bucket_from_columns(row)
        )
    for (signature_id, key), expected in by_hash.items():
        stored = read_hash(client, bucket_hash_key(signature_id, key))
        got = {int(start): parse_bucket_value(value) for start, value in stored.items()}
        for start, aggregate in expected.items():
            drift.checked += 1
            if start not in got:
                drift.missing.append((signature_id, key, start))
            elif got[start] != aggregate:
                drift.different.append((signature_id, key, start))
        extra = (s for s in set(got) - set(expected) if since is None or s >= since)
        drift.extra.extend((signature_id, key, s) for s in sorted(extra))
    return drift
