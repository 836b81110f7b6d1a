"""A window read's work is bounded whatever its caller sends (SPEC §5a: every function the
read-only user may call): arguments a rule could never have get an error reply naming
the argument, and the widest window a rule may have, over a day of 1 s buckets, reads
through the roll-ups."""

from __future__ import annotations

import json
import random
import re
import time

import pytest
import redis

from tests.integration.test_rollups import T0, G, random_bucket, rows
from velocity.domain.buckets import merge_all
from velocity.domain.rules import MAX_WINDOW_MINUTES, Aggregator
from velocity.domain.windows import aggregate_value, format_aggregate
from velocity.redis import connection, mirror
from velocity.settings import Settings

pytestmark = pytest.mark.redis

WIDEST_MS = MAX_WINDOW_MINUTES * 60_000


def dense_key(settings: Settings, seconds: int) -> tuple[str, dict]:
    """A dense key holding ``seconds`` g = 1 s buckets, with its roll-ups."""
    rng = random.Random(5)
    client = connection.connect(settings)
    name = settings.redis_keys.bucket_hash("sig", '["day"]')
    buckets = {T0 + i * G: random_bucket(rng) for i in range(seconds)}
    mirror.write_bucket_rows(client, settings.redis_keys, rows('["day"]', buckets), G, 86_400)
    assert client.hexists(settings.redis_keys.dense_hash_of(name), "rollups")
    return name, buckets


def window(client: redis.Redis, name: str, *args: str) -> dict:
    return json.loads(client.fcall_ro("velocity_window", 1, name, *args))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("SUM", "1000000000000000", "1000"), "window ms '1000000000000000'"),
        (("SUM", "0", "1000"), "window ms '0'"),
        (("SUM", "-5", "1000"), "window ms '-5'"),
        (("SUM", "60000.5", "1000"), "window ms '60000.5'"),
        (("SUM", str(WIDEST_MS + 1), "1000"), f"window ms '{WIDEST_MS + 1}'"),
        (("MEDIAN", "60000", "1000"), "aggregator 'MEDIAN'"),
        (("SUM", "60000", "7"), "bucket ms '7'"),
        (("SUM", "60000", "1000", "soon"), "at ms 'soon'"),
        (("SUM", "60000", "1000", "1" * 17), f"at ms '{'1' * 17}'"),
        (("SUM", "60000", "60000"), "bucket ms 60000 is not this key's bucket width, 1000"),
    ],
)
def test_arguments_no_rule_could_have_are_refused_naming_them(
    settings: Settings, args: tuple[str, ...], named: str
) -> None:
    name, _ = dense_key(settings, 200)
    client = connection.connect(settings)
    with pytest.raises(redis.ResponseError) as refused:
        window(client, name, *args)
    assert named in str(refused.value)
    assert "velocity_window" in str(refused.value)


def test_the_widest_window_over_a_day_of_seconds_reads_through_the_rollups(
    settings: Settings,
) -> None:
    name, buckets = dense_key(settings, 86_400)
    client = connection.connect(settings)
    at = T0 + 86_400 * G
    client.config_resetstat()
    # Merged pairwise: one bucket at a time copies the growing distinct set 86 400 times.
    level = list(buckets.values())
    while len(level) > 1:
        level = [merge_all(level[i : i + 2]) for i in range(0, len(level), 2)]
    (merged,) = level
    for aggregator in Aggregator:
        got = window(client, name, aggregator.value, str(WIDEST_MS), str(G), str(at))
        value = aggregate_value(merged, aggregator)
        assert got["aggregateValue"] == (None if value is None else format_aggregate(value))
        assert got["eventCount"] == merged.count
    # Each read is one HMGET of the covering blocks, never the whole hash.
    calls = client.info("commandstats")
    assert calls["cmdstat_hmget"]["calls"] == len(Aggregator)
    assert "cmdstat_hgetall" not in calls

    # A check with a rule of the widest window for each aggregator on the key: one HMGET of
    # the roll-ups a rule, and one HGETALL, of the rules.
    rules = {
        str(i): json.dumps(
            {"ruleId": i, "ruleVersion": 1, "outcome": "ALERT", "signatureId": "sig",
             "groupingKeyNames": ["payerId"], "filter": [], "aggregateFieldName": "paymentAmount",
             "aggregatorFunctionType": aggregator.value, "limitOperatorType": ">", "limit": "0",
             "windowMs": WIDEST_MS, "bucketMs": G, "cooldownMs": 0}
        )
        for i, aggregator in enumerate(Aggregator, start=1)
    }  # fmt: skip
    client.hset(settings.redis_keys.check_rules, mapping=rules)
    client.config_resetstat()
    answer = json.loads(check(client, settings, *PAYMENT, "eventTime", str(at), "payerId", "day"))
    assert len(answer["rules"]) == len(Aggregator)
    counted = next(r for r in answer["rules"] if r["ruleId"] == 2)  # COUNT
    assert counted["aggregateValue"] == str(merged.count + 1)
    calls = client.info("commandstats")
    assert calls["cmdstat_hmget"]["calls"] == len(Aggregator)
    assert calls["cmdstat_hgetall"]["calls"] == 1


# A payment's fields but its eventTime and payerId, as velocity_check's arguments.
PAYMENT = ("transactionId", "tx-1", "beneficiaryId", "b-1", "paymentAmount", "10.5",
           "paymentType", "CRD")  # fmt: skip


def check(client: redis.Redis, settings: Settings, *args: str) -> str:
    return client.fcall_ro("velocity_check", 1, settings.redis_keys.check_rules, *args)  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"payerId": None}, "payerId is required"),
        ({"payerId": "  "}, "payerId is required"),
        ({"eventTime": "soon"}, "eventTime 'soon' is not a whole number"),
        ({"eventTime": "1" * 17}, "eventTime '11111111111111111' is not a whole number"),
        ({"paymentAmount": "1e3"}, "paymentAmount '1e3' is not a plain decimal"),
        ({"paymentAmount": "-5"}, "paymentAmount '-5' is not a plain decimal"),
        ({"paymentAmount": "1.123456789"}, "paymentAmount '1.123456789' has more than 8"),
        ({"paymentAmount": "1" * 19}, "is outside 0 <= amount < 10^18"),
        ({"paymentType": "XYZ"}, "paymentType 'XYZ' is not one of CRD, CSH"),
        ({"ip": "x" * 1025}, "ip is longer than 1024 bytes"),
        ({f"extra{i}": "1" for i in range(30)}, "arguments name more than 32 fields"),
    ],
)
def test_a_malformed_payment_is_refused_naming_the_field(
    settings: Settings, change: dict[str, str | None], named: str
) -> None:
    client = connection.connect(settings)
    fields = dict(zip(PAYMENT[::2], PAYMENT[1::2], strict=True))
    fields |= {"eventTime": "1767225600000", "payerId": "p-1"}
    fields |= change
    args = [part for name, value in fields.items() if value is not None for part in (name, value)]
    with pytest.raises(redis.ResponseError, match="velocity_check: .*" + re.escape(named)):
        check(client, settings, *args)
    for args in (["payerId"], ["payerId", "p", "payerId", "q"]):
        with pytest.raises(redis.ResponseError, match=r"velocity_check: (arguments|payerId)"):
            check(client, settings, *args)
    assert client.dbsize() == 0  # nothing recorded


def test_a_check_without_published_rules_is_unavailable_not_allowed(settings: Settings) -> None:
    """After a Redis loss the check has nothing to check against: an error, never ALLOW."""
    client = connection.connect(settings)
    with pytest.raises(redis.ResponseError, match=r"velocity_check unavailable: .* holds no rules"):
        check(client, settings, *PAYMENT, "eventTime", "1767225600000", "payerId", "p-1")
    mirror.publish_rules(client, settings.redis_keys, [], settings.bucket_width_ms)
    answer = json.loads(check(client, settings, *PAYMENT, "eventTime", "1", "payerId", "p-1"))
    assert answer == {
        "decision": "ALLOW",
        "rules": [],
        "stateAsOf": {"eventTime": None, "committedAt": None, "batch": None},
    }


def test_a_check_before_the_streams_first_commit_answers_null_freshness(
    settings: Settings,
) -> None:
    """A stream that has started writes its progress's newest eventTime empty until its first
    commit: stateAsOf says null, and the answer stays JSON."""
    client = connection.connect(settings)
    mirror.publish_rules(client, settings.redis_keys, [], settings.bucket_width_ms)
    client.hset(settings.redis_keys.stream_progress, mapping={"newest": "", "layout": "packed"})
    answer = json.loads(check(client, settings, *PAYMENT, "eventTime", "1", "payerId", "p-1"))
    assert answer["stateAsOf"] == {"eventTime": None, "committedAt": None, "batch": None}


def test_a_payment_the_stream_would_quarantine_as_future_is_not_checked(
    settings: Settings,
) -> None:
    """More than VELOCITY_MAX_FUTURE_SECONDS ahead of the clock, or of the newest payment
    committed: the stream quarantines it (future_event_time), so the check refuses it."""
    client = connection.connect(settings)
    mirror.publish_rules(client, settings.redis_keys, [], settings.bucket_width_ms, 3_600_000)
    now = int(time.time() * 1000)
    payment = [*PAYMENT, "payerId", "p-1"]
    json.loads(check(client, settings, *payment, "eventTime", str(now + 3_000_000)))
    with pytest.raises(
        redis.ResponseError,
        match=r"eventTime '\d+' is more than 3600 s ahead "
        r"of the clock: the stream would quarantine it \(future_event_time\)",
    ):
        check(client, settings, *payment, "eventTime", str(now + 3_700_000))
    client.hset(settings.redis_keys.stream_progress, mapping={"newest": now - 7_200_000})
    json.loads(check(client, settings, *payment, "eventTime", str(now - 3_700_000)))
    with pytest.raises(
        redis.ResponseError,
        match=r"more than 3600 s ahead of the newest "
        rf"payment committed \({now - 7_200_000}\)",
    ):
        check(client, settings, *payment, "eventTime", str(now - 3_500_000))
    assert client.exists(settings.redis_keys.stream_progress) == 1
