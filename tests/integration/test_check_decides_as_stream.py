"""The pre-authorization check decides a payment as the stream later does (SPEC §5a).

Random rules (every aggregator, filters, grouping keys or none, windows, limits of either
sign, cooldowns, outcomes) and random in-order histories, over bucket widths of 1 to 60 s,
on the real redis-server: before each event is committed by the stream's own
decide-and-commit path (``decide_batch``, as test_stream_cooldown drives it), the check of
that event (``velocity_check``, Lua inside Redis) must equal the stream's decision of it for
every rule: fired, aggregateValue, windowStart, and notified for a rule with a cooldown.
Keys pass 128 buckets, so both the packed and the dense layouts (with roll-ups) are read.
Then: checks record nothing.
"""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
import redis

from tests.builders import accepted_rows
from velocity.domain.decimals import dumps_json
from velocity.domain.rules import Rule, parse_rules
from velocity.redis import connection, mirror
from velocity.redis.check import check_payment
from velocity.redis.lock import state_lock
from velocity.settings import Settings, load_settings
from velocity.spark.stream_decide import BatchPlan, batch_keyed_rows, decide_batch

pytestmark = [pytest.mark.redis, pytest.mark.timeout(600)]

AGGREGATORS = ["SUM", "COUNT", "AVG", "MIN", "MAX", "UNIQUE_COUNT"]
OPERATORS = ["=", "!=", ">=", "<=", ">", "<"]
T0 = 1_767_225_600_000


def random_rules(rng: random.Random, count: int) -> list[Rule]:
    entries = []
    for rule_id in range(1, count + 1):
        aggregator = rng.choice(AGGREGATORS)
        entry: dict[str, object] = {
            "ruleId": rule_id,
            "ruleState": "ACTIVE",
            # The first rule's one key holds every event: it goes dense (128 buckets).
            "groupingKeyNames": []
            if rule_id == 1
            else rng.choice(
                [["payerId"], ["payerId", "beneficiaryId"], [], ["ip"], ["paymentType"]]
            ),
            "aggregatorFunctionType": aggregator,
            "limitOperatorType": rng.choice(OPERATORS),
            "windowMinutes": rng.choice([1, 2, 5, 30]),
            "outcome": rng.choice(["ALERT", "REVIEW", "BLOCK"]),
        }
        if aggregator == "UNIQUE_COUNT":
            entry["aggregateFieldName"] = rng.choice(["beneficiaryId", "paymentAmount", "ip"])
        elif aggregator != "COUNT":
            entry["aggregateFieldName"] = "paymentAmount"
        entry["limit"] = (
            rng.choice([1, 2, 3, 5, 8])
            if aggregator in ("COUNT", "UNIQUE_COUNT")
            else rng.choice([-1, 0, Decimal("50.5"), 100, 250, 1000, Decimal("99.99999999")])
        )
        if rule_id == 1:
            entry["windowMinutes"] = 30
        elif rng.random() < 0.4:
            entry["filter"] = rng.choice(
                [{"paymentType": "CRD"}, {"ip": ["10.0.0.1", "10.0.0.2"]}, {"paymentType": ["CSH"]}]
            )
        if rng.random() < 0.5:
            entry["cooldownMinutes"] = rng.choice([1, 2, 10])
        entries.append(entry)
    text = dumps_json(entries)
    return [r.with_version(rng.randint(1, 3)) for r in parse_rules(text) if isinstance(r, Rule)]


def random_events(rng: random.Random, count: int, width_ms: int) -> list[dict[str, object]]:
    """In eventTime order; equal eventTimes now and then; a few payers, so keys go dense."""
    events, t = [], T0 + rng.randrange(width_ms)
    for i in range(count):
        t += rng.choice([0, width_ms // 3, width_ms, width_ms, 2 * width_ms + 13, 3 * width_ms])
        event: dict[str, object] = {
            "transactionId": f"tx-{i:05d}",
            "eventTime": t,
            "payerId": rng.choice(["p1", "p2", 7]),
            "beneficiaryId": rng.choice(["b1", "b/2", 'b"3', "b\u00e94"]),
            "paymentAmount": rng.choice(
                [1, 20, Decimal("0.5"), Decimal("99.99999999"), 250, Decimal("120.10"), 0]
            ),
            "paymentType": rng.choice(["CRD", "CSH"]),
        }
        if rng.random() < 0.7:
            event["ip"] = rng.choice(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        events.append(event)
    return events


def accepted(events: list[dict[str, object]]) -> pa.Table:
    return accepted_rows([dumps_json(e) for e in events])


def stream_decisions(alerts: pa.Table) -> dict[int, tuple[str, int, bool]]:
    """ruleId -> (aggregateValue, windowStart, notified) of one event's alerts."""
    rows = alerts.select(["ruleId", "aggregateValue", "windowStart", "suppressed"]).to_pylist()
    return {r["ruleId"]: (r["aggregateValue"], r["windowStart"], not r["suppressed"]) for r in rows}


def check_decisions(answer: dict, rules: list[Rule]) -> dict[int, tuple[str, int, bool]]:
    cooled = {r.rule_id for r in rules if r.cooldown_minutes}
    return {
        r["ruleId"]: (
            r["aggregateValue"],
            r["windowStart"],
            r["notified"] if r["ruleId"] in cooled else True,
        )
        for r in answer["rules"]
        if r["fired"]
    }


def stream_step(
    settings: Settings, rules: list[Rule], token: str, batch: int, events: pa.Table
) -> pa.Table:
    signatures = list({r.signature: None for r in rules})
    keyed = batch_keyed_rows(events, signatures, None)
    plan = BatchPlan(settings, tuple(rules), 7, None, batch, token, 86_400_000 * 3)
    out = decide_batch(None, keyed, None, plan, partitions=2, in_executors=False)  # type: ignore[arg-type]
    assert not out.missing, "in order: no own bucket needs its history from Delta"
    return out.alerts


def checks_equal_the_streams_decisions(
    settings: Settings, rules: list[Rule], events: list[dict[str, object]]
) -> tuple[int, int]:
    """Before each event is committed by the stream, its check equals the stream's decision
    of it; (rules evaluated, rules fired) over all events."""
    table = accepted(events)
    assert table.num_rows == len(events)
    client = connection.connect(settings)
    keys = settings.redis_keys
    mirror.publish_rules(client, keys, rules, settings.bucket_width_ms)
    outcome_of = {r.rule_id: r.outcome.value for r in rules}
    compared = fired = 0
    with state_lock(client, settings, "check test") as lease:
        for i, event in enumerate(events):
            answer = check_payment(client, keys, event)
            alerts = stream_step(settings, rules, lease.token, i, table.slice(i, 1))
            expected = stream_decisions(alerts)
            assert check_decisions(answer, rules) == expected, (i, event, answer)
            strongest = max(
                (outcome_of[r] for r in expected),
                key=["ALERT", "REVIEW", "BLOCK"].index,
                default="ALERT",
            )
            assert answer["decision"] == {"ALERT": "ALLOW"}.get(strongest, strongest)
            compared += len(answer["rules"])
            fired += len(expected)
    return compared, fired


@pytest.mark.parametrize(("seed", "bucket_seconds"), [(1, 1), (3, 20), (4, 60)])
def test_the_check_of_each_event_equals_the_streams_decision_of_it(
    redis_url: str, tmp_path: Path, seed: int, bucket_seconds: int
) -> None:
    rng = random.Random(seed)
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    connection.load_functions(client)
    settings = load_settings(
        data_dir=tmp_path / "data", redis_url=redis_url, bucket_seconds=bucket_seconds
    )
    rules = random_rules(rng, 8)
    # 240 events take a key past 128 one-second buckets (dense); fewer do at wider widths.
    events = random_events(rng, 240 if bucket_seconds == 1 else 120, settings.bucket_width_ms)
    compared, fired = checks_equal_the_streams_decisions(settings, rules, events)
    assert fired > 10 and compared - fired > 10, (fired, compared)
    if bucket_seconds == 1:  # wider buckets are evicted before a key holds 128
        keys = settings.redis_keys
        assert list(client.scan_iter(f"{keys.prefix}:*:dense")), "some key went dense"


def test_checks_record_nothing(redis_url: str, tmp_path: Path) -> None:
    """A stream run after many checks decides exactly what it would have without them, and
    Redis holds exactly the same keys and values."""
    rng = random.Random(9)
    rules = random_rules(rng, 8)
    events = random_events(rng, 120, 1000)
    table = accepted(events)
    snapshots = []
    for with_checks in (False, True):
        client = redis.Redis.from_url(redis_url)
        client.flushall()
        connection.load_functions(client)
        settings = load_settings(data_dir=tmp_path / "data", redis_url=redis_url, bucket_seconds=1)
        client = connection.connect(settings)
        mirror.publish_rules(client, settings.redis_keys, rules, settings.bucket_width_ms)
        decided = []
        with state_lock(client, settings, "check test") as lease:
            for batch, start in enumerate(range(0, len(events), 40)):
                if with_checks:
                    for event in events:  # every event, the later ones before they arrive
                        check_payment(client, settings.redis_keys, event)
                decided.append(
                    stream_step(settings, rules, lease.token, batch, table.slice(start, 40))
                )
        alerts = pa.concat_tables(decided).drop_columns(["alertId", "decisionTime"])
        raw = redis.Redis.from_url(redis_url)  # values as bytes
        state = {
            name: raw.dump(name)
            for name in client.scan_iter(f"{settings.redis_keys.prefix}:*")
            if ":lock:" not in name and not name.endswith(":alerts")
        }
        snapshots.append((alerts.to_pylist(), state))
    (alerts_without, state_without), (alerts_with, state_with) = snapshots
    assert alerts_with == alerts_without
    assert set(state_with) == set(state_without)
    progress = settings.redis_keys.stream_progress
    assert {n: v for n, v in state_with.items() if n != progress} == {
        n: v for n, v in state_without.items() if n != progress
    }
