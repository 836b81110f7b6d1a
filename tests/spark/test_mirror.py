"""The Redis mirror on a real redis-server: lookups, the alert stream, rebuild and reconcile."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis

from tests.builders import SPEC_ALERT_FIELDS
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.domain.buckets import bucket_from_columns, bucket_start, merge_all, window_start
from velocity.domain.rules import Rule, parse_rules
from velocity.domain.windows import aggregate_value, format_aggregate
from velocity.generate import GenerateOptions, generate_events
from velocity.redis import connection, mirror
from velocity.redis.lock import state_lock
from velocity.settings import Settings
from velocity.spark.evaluate import minute_buckets
from velocity.spark.stream import StreamJob

pytestmark = [pytest.mark.spark, pytest.mark.redis]

RULES = [
    {
        "ruleId": 1,
        "groupingKeyNames": ["payerId", "beneficiaryId"],
        "aggregatorFunctionType": "SUM",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": ">",
        "limit": 20000,
        "windowMinutes": 30,
        "filter": {"paymentType": "CRD"},
    },
    {
        "ruleId": 2,
        "groupingKeyNames": ["payerId"],
        "aggregatorFunctionType": "COUNT",
        "limitOperatorType": ">=",
        "limit": 4,
        "windowMinutes": 10,
        "cooldownMinutes": 5,  # its last notified alert per key lives in the key's hash
    },
    {
        "ruleId": 3,
        "groupingKeyNames": ["payerId"],
        "aggregatorFunctionType": "UNIQUE_COUNT",
        "aggregateFieldName": "ip",
        "limitOperatorType": ">",
        "limit": 2,
        "windowMinutes": 15,
    },
    {
        "ruleId": 4,
        "groupingKeyNames": ["beneficiaryId"],
        "aggregatorFunctionType": "AVG",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": ">",
        "limit": 3000,
        "windowMinutes": 5,
    },
    {
        "ruleId": 5,
        "groupingKeyNames": [],
        "aggregatorFunctionType": "MAX",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": ">=",
        "limit": 90000,
        "windowMinutes": 2,
    },
    {
        "ruleId": 6,
        "groupingKeyNames": ["payerId"],
        "aggregatorFunctionType": "MIN",
        "aggregateFieldName": "paymentAmount",
        "limitOperatorType": "<",
        "limit": 5,
        "windowMinutes": 20,
    },
]


def rules() -> list[Rule]:
    entries = parse_rules(json.dumps([{"ruleState": "ACTIVE", **r} for r in RULES]))
    return [e for e in entries if isinstance(e, Rule)]


@pytest.fixture(scope="module")
def streamed(
    spark, spark_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> StreamJob:
    """One streamed data dir for the module (the flush test runs last, it empties Redis)."""
    tmp_path = tmp_path_factory.mktemp("mirror")
    redis.Redis.from_url(spark_settings.redis_url).flushall()
    data_settings = spark_settings.model_copy(update={"data_dir": tmp_path / "data"})
    events = tmp_path / "events"
    generate_events(
        events,
        GenerateOptions(
            events=1500,
            rate=2.0,
            payers=15,
            files=3,
            spike_fraction=0.05,
            late_fraction=0.0,
            seed=5,
        ),
    )
    for order, path in enumerate(sorted(events.glob("*.jsonl"))):
        os.utime(path, (1_700_000_000 + order, 1_700_000_000 + order))
    job = StreamJob(spark, data_settings)
    job.rule_store.apply(rules())
    query = job.start(events, available_now=True, max_files_per_trigger=1)
    query.awaitTermination()
    job.events_dir = events  # type: ignore[attr-defined]
    return job


def test_lookup_equals_the_delta_buckets(spark, streamed: StreamJob) -> None:
    keys = streamed.settings.redis_keys
    client = streamed.redis
    width = streamed.settings.bucket_width_ms
    # The stream appends a row per bucket and batch; readers merge them.
    buckets = minute_buckets(
        tables.read_table(spark, LiveTables.of(streamed.settings).buckets), width
    ).collect()
    by_hash: dict[tuple[str, str], dict[int, object]] = {}
    for row in buckets:
        by_hash.setdefault((row["signature_id"], row["key"]), {})[row["bucket_start"]] = (
            bucket_from_columns(row.asDict())
        )
    checked = 0
    for rule in streamed.rule_store.in_force():
        signature = rule.signature
        hashes = [k for k in by_hash if k[0] == signature.signature_id]
        assert hashes, f"rule {rule.rule_id} has buckets"
        for _, key in hashes[:5]:
            values = dict(zip(signature.grouping_keys, json.loads(key), strict=True))
            stored = by_hash[(signature.signature_id, key)]
            for start in sorted(stored)[:: max(1, len(stored) // 4)]:
                for at in (start, start + width - 1, start + rule.window_ms):
                    lower = window_start(at, rule.window_ms, width)
                    window = merge_all(
                        b
                        for s, b in stored.items()
                        if lower <= s <= at  # type: ignore[misc]
                    )
                    value = aggregate_value(window, rule.aggregator)
                    expected = None if value is None else format_aggregate(value)
                    got = mirror.lookup(client, keys, rule.rule_id, values, at)
                    assert got == {
                        "ruleId": rule.rule_id,
                        "key": {n: values[n] for n in rule.signature.grouping_keys},
                        "aggregateValue": expected,
                        "windowStart": lower,
                        "windowEnd": at,
                    }, (rule.rule_id, key, at)
                    checked += 1
    assert checked > 50
    assert bucket_start(0, width) == 0


def test_alert_stream_equals_delta_and_replay_adds_nothing(spark, streamed: StreamJob) -> None:
    keys = streamed.settings.redis_keys
    client = streamed.redis
    stream = streamed.settings.alert_stream
    entries = client.xrange(stream)
    published = [json.loads(fields["alert"]) for _, fields in entries]
    stored = tables.read_table(spark, LiveTables.of(streamed.settings).alerts).collect()
    # Rule 2's cooldown suppressed some: recorded, never published.
    assert any(r["suppressed"] for r in stored)
    assert published and sorted(a["alertId"] for a in published) == sorted(
        r["alertId"] for r in stored if not r["suppressed"]
    )
    assert set(published[0]) == SPEC_ALERT_FIELDS
    # A batch committed again (a replay after a crash) writes nothing: no alert, no bucket.
    names = list(client.scan_iter(keys.bucket_hashes))
    buckets = {name: mirror.key_fields(client, name) for name in names}
    with state_lock(client, streamed.settings, "a replay") as lease:
        commit = mirror.stream_commit(
            streamed.settings,
            0,
            None,
            mirror.BucketChanges(),
            ["tx-replayed"],
            [json.dumps(p) for p in published[:3]],
            60,
            lease,
        )
        replay = mirror.send_stream_commit(client, streamed.settings, commit, lease)
    assert replay == -1
    assert client.xlen(stream) == len(entries)
    assert not mirror.read_stream_state(client, streamed.settings, ["tx-replayed"]).seen
    assert buckets == {name: mirror.key_fields(client, name) for name in buckets}


def test_flush_rebuild_and_reconcile(spark, streamed: StreamJob) -> None:
    keys = streamed.settings.redis_keys
    client: redis.Redis = streamed.redis
    assert streamed.mirror.reconcile().clean
    checked = streamed.mirror.reconcile().checked
    assert checked > 0

    def last_notified() -> dict[str, dict[str, str]]:
        names = client.scan_iter(keys.bucket_hashes)
        hashes = {name: mirror.key_fields(client, name) for name in names}
        found = {n: {f: v for f, v in h.items() if f.startswith("n:")} for n, h in hashes.items()}
        return {name: fields for name, fields in found.items() if fields}

    notified = last_notified()
    assert notified and all(set(f) == {"n:2:1"} for f in notified.values())
    client.flushall()
    assert not streamed.mirror.is_current()
    connection.load_functions(client)
    query = streamed.start(streamed.events_dir, available_now=True)  # type: ignore[attr-defined]
    query.awaitTermination()
    assert streamed.mirror.is_current()
    assert client.exists(keys.rule_entry(1))
    drift = streamed.mirror.reconcile()
    assert drift.clean and drift.checked == checked
    # The cooldown's state is rebuilt from the alerts table exactly as the stream left it.
    assert last_notified() == notified

    row = tables.read_table(spark, LiveTables.of(streamed.settings).buckets).first()
    name = keys.bucket_hash(row["signature_id"], row["key"])
    stray = row["bucket_start"] + 1  # inside the horizon; no such bucket in Delta

    def tamper(state: str, start: int, value: str) -> None:  # either layout
        client.fcall("velocity_put_buckets", 1, state, "", "", "", str(start), value)

    tamper(name, row["bucket_start"], "[999,0,null,null,null,[]]")
    tamper(name, stray, "[1,0,null,null,null,[]]")
    tamper(name, 1, "[1,0,null,null,null,[]]")  # below the horizon: expires, no drift
    drift = streamed.mirror.reconcile()
    assert drift.different == [(row["signature_id"], row["key"], row["bucket_start"])]
    assert drift.extra == [(row["signature_id"], row["key"], stray)]
    client.delete(name)
    assert len(streamed.mirror.reconcile().missing) >= 1

    tamper(name, stray, "[1,0,null,null,null,[]]")
    # A state only Redis has (a key Delta never saw) of an active signature is drift too.
    ghost = keys.bucket_hash(row["signature_id"], '["nobody"]')
    tamper(ghost, row["bucket_start"], "[1,0,null,null,null,[]]")
    drift = streamed.mirror.reconcile()
    assert (row["signature_id"], '["nobody"]', row["bucket_start"]) in drift.extra
    found, written = streamed.mirror.repair()
    assert found.extra and written > 0
    assert not client.exists(ghost)
    assert streamed.mirror.reconcile().clean


def test_after_a_stop_longer_than_the_horizon_slack_redis_is_rebuilt(streamed: StreamJob) -> None:
    """Bucket hashes expire on the clock while eventTime stands still in a stop: after a
    stop longer than the lateness + one bucket, Redis no longer counts as current, and the
    next start rebuilds it from Delta."""
    client, settings = streamed.redis, streamed.settings
    progress = settings.redis_keys.stream_progress
    slack_ms = settings.allowed_lateness_ms + settings.bucket_width_ms
    client.hset(progress, "at", int(time.time() * 1000) - slack_ms + 30_000)
    assert streamed.mirror.is_current()
    client.hset(progress, "at", int(time.time() * 1000) - slack_ms - 1_000)
    assert not streamed.mirror.is_current()
    streamed.mirror.rebuild()
    assert streamed.mirror.is_current()
    assert streamed.mirror.reconcile().clean
