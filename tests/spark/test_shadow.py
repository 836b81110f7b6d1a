"""SHADOW rules on a live stream (SPEC §2): decided exactly as ACTIVE, kept from downstream,
and promoted on the next micro-batch with no alert lost or doubled."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from pyspark.sql import functions as F

from tests.spark.streaming import run_available_now
from tests.spark.test_kafka import alert_ids_on_topic, on_topics
from tests.spark.test_stream import backtest_pairs, first_arrivals, land
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.domain.rules import Rule, RuleState, parse_rules
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.backfill import Backfill
from velocity.spark.backtest import run_backtest
from velocity.spark.stream import StreamJob

pytestmark = [pytest.mark.spark, pytest.mark.redis]

SAMPLE = parse_rules(sample_rules_path().read_text())
# Rule 2 of the sample (SUM by payer and beneficiary) with a lower limit: fires more.
RULE_2 = next(r for r in SAMPLE if isinstance(r, Rule) and r.rule_id == 2)
assert isinstance(RULE_2, Rule)
CANDIDATE_2 = replace(RULE_2, limit=RULE_2.limit / 4, state=RuleState.SHADOW)
# A new rule, tried before it exists: COUNT by beneficiary (a signature of its own).
NEW_20 = parse_rules(
    json.dumps(
        {"ruleId": 20, "ruleState": "SHADOW", "groupingKeyNames": ["beneficiaryId"],
         "aggregatorFunctionType": "COUNT", "limitOperatorType": ">=", "limit": 3,
         "windowMinutes": 30}
    )
)[0]  # fmt: skip


def table_alerts(spark, settings: Settings, *, shadow: bool) -> dict[tuple[int, int, str], dict]:
    """The alerts table's rows, shadow or not, by (ruleId, ruleVersion, transactionId)."""
    rows = (
        tables.read_table(spark, LiveTables.of(settings).alerts)
        .where(F.coalesce(F.col("shadow"), F.lit(False)) == shadow)
        .collect()
    )
    out = {(r["ruleId"], r["ruleVersion"], r["transactionId"]): r.asDict() for r in rows}
    assert len(out) == len(rows), "one alert per (rule version, event)"
    return out


def stream_entries(settings: Settings, stream: str) -> list[dict]:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    return [json.loads(fields["alert"]) for _, fields in client.xrange(stream)]


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_a_shadow_rule_fires_what_it_would_active_and_only_on_its_own_stream(
    spark, data_settings: Settings, kafka_bootstrap: str, in_order_events: Path, tmp_path: Path
) -> None:
    settings = on_topics(data_settings, kafka_bootstrap, partitions=1, kafka_alerts="on")
    job = StreamJob(spark, settings)
    job.rule_store.apply([*SAMPLE, CANDIDATE_2, NEW_20])
    assert {(r.rule_id, r.version, r.state) for r in job.rule_store.in_force()} >= {
        (2, 1, RuleState.ACTIVE),
        (2, 2, RuleState.SHADOW),
        (20, 1, RuleState.SHADOW),
    }
    run_available_now(job, in_order_events)

    # Every rule version fires what it fires alone, ACTIVE: the backtest of the rules in
    # force and the candidates made ACTIVE, each at its version.
    deciding = [
        *(r.with_version(1) for r in SAMPLE if isinstance(r, Rule)),
        CANDIDATE_2.with_state(RuleState.ACTIVE).with_version(2),
        NEW_20.with_state(RuleState.ACTIVE).with_version(1),  # type: ignore[union-attr]
    ]
    settings_bt = settings.model_copy(update={"data_dir": tmp_path / "bt"})
    run_backtest(spark, settings_bt, deciding, str(in_order_events), tmp_path / "bt.jsonl")
    expected = {
        (a["ruleId"], a["ruleVersion"], a["transactionId"]): a
        for a in map(json.loads, (tmp_path / "bt.jsonl").read_text().splitlines())
    }
    live = table_alerts(spark, settings, shadow=False)
    shadow = table_alerts(spark, settings, shadow=True)
    assert {(i, v) for i, v, _ in shadow} == {(2, 2), (20, 1)}, "both candidates fire"
    assert {(i, v) for i, v, _ in live} == {(r.rule_id, 1) for r in deciding[:-2]}
    decided = {**live, **shadow}
    assert decided.keys() == expected.keys()
    for key, alert in expected.items():
        assert (alert["aggregateValue"], alert["windowStart"], alert["alertId"]) == (
            decided[key]["aggregateValue"], decided[key]["windowStart"], decided[key]["alertId"]
        ), key  # fmt: skip

    # Nothing of a candidate reaches the alert stream, the topic or the rule entries
    # downstream services read; its alerts are on the shadow stream, marked.
    # (Only notified alerts are published: the sample rules' cooldowns suppress some.)
    published = stream_entries(settings, settings.alert_stream)
    notified = sorted(a["alertId"] for a in live.values() if not a["suppressed"])
    assert sorted(a["alertId"] for a in published) == notified
    assert not any("shadow" in a for a in published)
    on_topic = alert_ids_on_topic(settings)
    assert sorted(set(on_topic)) == notified
    shadowed = stream_entries(settings, settings.shadow_alert_stream)
    assert sorted(a["alertId"] for a in shadowed) == sorted(
        a["alertId"] for a in shadow.values() if not a["suppressed"]
    )
    assert all(a["shadow"] is True for a in shadowed)
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    assert client.hget(settings.redis_keys.rule_entry(2), "version") == "1"
    assert not client.exists(settings.redis_keys.rule_entry(20))


@pytest.mark.timeout(600)
def test_promote_switches_over_on_the_next_batch_with_no_alert_lost_or_doubled(
    spark, data_settings: Settings, in_order_events: Path, tmp_path: Path
) -> None:
    arriving = tmp_path / "arriving"
    arriving.mkdir()
    files = sorted(in_order_events.glob("*.jsonl"))
    job = StreamJob(spark, data_settings)
    job.rule_store.apply([*SAMPLE, CANDIDATE_2])
    for order, path in enumerate(files[:2]):
        land(path, arriving, order)
    run_available_now(job, arriving)

    outcome = job.rule_store.promote(2)
    assert [(c.rule_id, c.version, c.state) for c in outcome.changes] == [(2, 3, RuleState.ACTIVE)]
    for order, path in enumerate(files[2:], start=2):
        land(path, arriving, order)
    run_available_now(job, arriving)

    before = {e.transaction_id for e in first_arrivals(files[:2])}
    shadow = table_alerts(spark, data_settings, shadow=True)
    live = table_alerts(spark, data_settings, shadow=False)
    assert shadow and {tx for _, _, tx in shadow} <= before, "a candidate until the promote"
    promoted = {tx: a for (i, v, tx), a in live.items() if (i, v) == (2, 3)}
    assert promoted and not set(promoted) & before, "the promoted version from the next batch"
    assert not {tx for (i, v, tx) in live if (i, v) == (2, 1)} - before, "v1 stops there"

    # Shadow then ACTIVE, the candidate fired on every event its backtest does, once.
    fired = [(tx, a["aggregateValue"], a["windowStart"]) for (_, _, tx), a in shadow.items()]
    fired += [(tx, a["aggregateValue"], a["windowStart"]) for tx, a in promoted.items()]
    expected = backtest_pairs(
        spark,
        data_settings,
        [CANDIDATE_2.with_state(RuleState.ACTIVE).with_version(2)],
        in_order_events,
        tmp_path / "bt.jsonl",
    )
    assert sorted(fired) == sorted(
        (tx, value, start) for (_, tx), (value, start, *_) in expected.items()
    )


@pytest.mark.timeout(600)
def test_a_backfill_amends_a_shadow_rule_on_the_shadow_stream_only(
    spark, data_settings: Settings, late_events: Path, tmp_path: Path
) -> None:
    # Rule 5 (COUNT by payer over a day) and a candidate: late events move both counts.
    rule_5 = next(r for r in SAMPLE if isinstance(r, Rule) and r.rule_id == 5)
    assert isinstance(rule_5, Rule)
    candidate_5 = replace(rule_5, limit=rule_5.limit - 5, state=RuleState.SHADOW)
    job = StreamJob(spark, data_settings)
    job.rule_store.apply([rule_5, candidate_5])
    run_available_now(job, late_events)
    backfill = Backfill(spark, data_settings)
    summary = backfill.run_late()
    assert summary is not None
    assert summary.corrections + summary.retractions > 0

    # After it, each version's decisions in effect are its complete-data result.
    versions = [rule_5.with_version(1), candidate_5.with_state(RuleState.ACTIVE).with_version(2)]
    settings_bt = data_settings.model_copy(update={"data_dir": tmp_path / "bt"})
    run_backtest(spark, settings_bt, versions, str(late_events), tmp_path / "bt.jsonl")
    complete = {
        (a["ruleVersion"], a["transactionId"]): (a["aggregateValue"], a["windowStart"])
        for a in map(json.loads, (tmp_path / "bt.jsonl").read_text().splitlines())
    }
    rows = tables.read_table(spark, LiveTables.of(data_settings).alerts).collect()
    net: dict[tuple[int, str], int] = {}
    latest: dict[tuple[int, str], dict] = {}
    for row in sorted((r.asDict() for r in rows), key=lambda r: r["decisionTime"]):
        decision = (row["ruleVersion"], row["transactionId"])
        assert bool(row["shadow"]) == (row["ruleVersion"] == 2), "shadow is the candidate's"
        net[decision] = net.get(decision, 0) + (-1 if row["kind"] == "RETRACTION" else 1)
        if row["kind"] != "RETRACTION":
            latest[decision] = row
    in_effect = {d: (latest[d]["aggregateValue"], latest[d]["windowStart"])
                 for d, n in net.items() if n}  # fmt: skip
    assert in_effect == complete

    # The candidate's amendments went to the shadow stream, the rule in force's to the
    # alert stream: each stream holds its own rule's, none of the other's.
    amendments = {r["alertId"]: r["ruleVersion"] for r in rows if r["kind"] != "ALERT"}
    assert set(amendments.values()) == {1, 2}, "both versions were amended"
    for stream, version in (
        (data_settings.alert_stream, 1),
        (data_settings.shadow_alert_stream, 2),
    ):
        entries = job.redis.xrange(stream)
        amended = [json.loads(f["alert"])["alertId"] for _, f in entries if f.get("backfill")]
        assert sorted(amended) == sorted(i for i, v in amendments.items() if v == version)
