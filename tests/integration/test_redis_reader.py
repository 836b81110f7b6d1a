"""The read-only Redis user for downstream services, on the real redis-server that
`velocity up` configures: it reads windows, rule entries and alerts, and nothing else."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import redis

from velocity.redis import connection
from velocity.redis.keys import RedisKeys
from velocity.redis.server import READER_USER
from velocity.settings import Settings

pytestmark = pytest.mark.redis
EVIL_LIBRARY = "#!lua name=evil\nredis.register_function('e', function() return 1 end)"


def reader_of(redis_url: str) -> redis.Redis:
    """A client of the session's server signed in as the read-only user."""
    parts = urlsplit(redis_url)
    return redis.Redis(
        host=parts.hostname,
        port=parts.port,
        username=READER_USER,
        password=Settings.model_fields["redis_reader_password"].default,
        decode_responses=True,
    )


def test_the_reader_reads_and_cannot_change_anything(redis_url: str) -> None:
    owner = redis.Redis.from_url(redis_url, decode_responses=True)
    connection.load_functions(owner)
    keys = RedisKeys("velocity:test", "/srv/velocity")  # the session server: velocity:*
    bucket = keys.bucket_hash("feedc0de", '["p-1"]')
    state = '1767225600000\t[2,2,"30.5","10","20.5",[]]\n'  # a packed key state
    owner.set(bucket, state)
    owner.hset(keys.rule_entry(901), mapping={"signatureId": "feedc0de", "windowMs": "600000"})
    owner.xadd(keys.alert_stream, {"alert": "{}", "batch": "0"})
    reader = reader_of(redis_url)

    window = reader.fcall_ro("velocity_window", 1, bucket, "SUM", "600000", "60000",
                             "1767225630000")  # fmt: skip
    assert '"aggregateValue":"30.5"' in str(window)
    assert reader.hgetall(keys.rule_entry(901))["signatureId"] == "feedc0de"
    assert reader.get(bucket) == state  # a reader of the raw state (docs/serving/redis.md)
    assert reader.xrange(keys.alert_stream)

    forbidden = [
        lambda: reader.set("velocity:x", "1"),
        lambda: reader.hset(bucket, "1", "x"),
        lambda: reader.delete(bucket),
        lambda: reader.xadd(keys.alert_stream, {"alert": "{}"}),
        lambda: reader.flushall(),
        lambda: reader.flushdb(),
        lambda: reader.function_load(EVIL_LIBRARY, replace=True),
        lambda: reader.function_flush(),
        lambda: reader.fcall("velocity_evict", 1, bucket, "9999999999999"),
        lambda: reader.config_set("maxmemory", "1"),
        lambda: reader.get("other:key"),
        lambda: reader.keys("*"),
        lambda: reader.acl_setuser(READER_USER, enabled=True, commands=["+@all"]),
    ]
    for attempt in forbidden:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    assert owner.get(bucket) == state


def test_the_reader_checks_a_payment_and_cannot_run_the_streams_reads(redis_url: str) -> None:
    """The pre-authorization check is the reader's (FCALL_RO); the stream's reads, whose
    work grows with their arguments, are not: FCALL_RO refuses a Function without
    no-writes."""
    owner = redis.Redis.from_url(redis_url, decode_responses=True)
    connection.load_functions(owner)
    keys = RedisKeys("velocity:test", "/srv/velocity")
    bucket = keys.bucket_hash("feedc0de", '["p-1"]')
    owner.set(bucket, '1767225600000\t[2,2,"30.5","10","20.5",[]]\n')
    rule = (
        '{"ruleId":901,"ruleVersion":2,"outcome":"BLOCK","signatureId":"feedc0de",'
        '"groupingKeyNames":["payerId"],"filter":[],"aggregateFieldName":"paymentAmount",'
        '"aggregatorFunctionType":"SUM","limitOperatorType":">","limit":"40",'
        '"windowMs":600000,"bucketMs":60000,"cooldownMs":0}'
    )
    owner.hset(keys.check_rules, mapping={"901": rule})
    reader = reader_of(redis_url)
    payment = ["transactionId", "tx-1", "eventTime", "1767225630000", "payerId", "p-1",
               "beneficiaryId", "b-1", "paymentAmount", "10", "paymentType", "CRD"]  # fmt: skip
    answer = reader.fcall_ro("velocity_check", 1, keys.check_rules, *payment)
    assert '"decision":"BLOCK"' in str(answer) and '"aggregateValue":"40.5"' in str(answer)
    for function, args in (
        ("velocity_read_keys", [bucket, f'["{bucket}"]']),
        ("velocity_stream_read", [keys.stream_progress, keys.buckets_epoch, keys.mirror_marker,
                                  '{"s":[],"sp":"x","sh":1000}']),
    ):  # fmt: skip
        with pytest.raises(redis.ResponseError, match="write flag"):
            reader.fcall_ro(function, 1 if len(args) == 2 else 3, *args)
