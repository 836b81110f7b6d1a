"""The stream's own decide-and-commit path equals the complete-data result, cooldowns
included (SPEC §3): the key-partitions of each micro-batch decided in this process as
the stream decides a small batch (``decide_batch``), their hot state and last notified
alerts read from and committed to the real redis-server, batch after batch; against the
backtest's kernel and cooldown over all the events at once. The project's fire-often
rules, each with a cooldown of 1 minute to a day, over few payers, so most keys alert in
every batch. (The sample rules' cooldowns are held on real Spark by the stream, Kafka,
SIGKILL and mirror tests.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.builders import accepted_rows, generated_in_arrival_order
from velocity.domain.rules import Rule, parse_rules
from velocity.engine.cooldown import notify
from velocity.engine.kernel import decide_history
from velocity.engine.records import alert_rows
from velocity.generate import GenerateOptions
from velocity.redis import connection, mirror
from velocity.redis.lock import state_lock
from velocity.settings import Settings
from velocity.spark.evaluate import _ALERT_ARROW
from velocity.spark.stream_decide import BatchPlan, batch_keyed_rows, decide_batch

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
COOLDOWNS = [1, 10, 60, 1440, 5, 30, 10, 120]  # minutes, one per fire-often rule


def fire_often_with_cooldowns() -> list[Rule]:
    entries = json.loads((ROOT / "benchmarks" / "rules" / "fire_often.json").read_text())
    cooled = [{**e, "cooldownMinutes": c} for e, c in zip(entries, COOLDOWNS, strict=True)]
    return [r.with_version(1) for r in parse_rules(json.dumps(cooled)) if isinstance(r, Rule)]


def accepted_in_order(folder: Path) -> pa.Table:
    """The generated lines, parsed and admitted as the stream does, in eventTime order (so
    each key's events arrive in order, where the stream equals the complete-data result)."""
    lines = [line for p in sorted(folder.glob("*.jsonl")) for line in p.read_text().splitlines()]
    return accepted_rows(lines).sort_by(
        [("eventTime", "ascending"), ("transactionId", "ascending")]
    )


def decided(alerts: pa.Table) -> set[tuple[object, ...]]:
    columns = ["ruleId", "transactionId", "aggregateValue", "windowStart", "suppressedBy"]
    return set(zip(*(alerts.column(c).to_pylist() for c in columns), strict=True))


def test_batches_through_redis_equal_the_complete_data_result_with_cooldowns(
    settings: Settings, tmp_path: Path
) -> None:
    events = accepted_in_order(
        generated_in_arrival_order(
            tmp_path / "events",
            GenerateOptions(
                events=3_000, rate=1.0, payers=12, files=1, spike_fraction=0.05,
                late_fraction=0.0, duplicate_fraction=0.0, malformed_fraction=0.0, seed=35,
            ),
        )
    )  # fmt: skip
    rules = fire_often_with_cooldowns()
    signatures = list({r.signature: None for r in rules})
    width = settings.bucket_width_ms
    client = connection.connect(settings)
    streamed = []
    with state_lock(client, settings, "cooldown test") as lease:
        # Seven micro-batches of uneven sizes, cut anywhere (a key's run of equal
        # eventTimes may be split across two).
        cuts = [37, 400, 401, 1_100, 1_900, 2_600]
        for batch, rows in enumerate(np.split(np.arange(events.num_rows), cuts)):
            keyed = batch_keyed_rows(events.take(pa.array(rows)), signatures, None)
            plan = BatchPlan(settings, tuple(rules), 7, None, batch, lease.token, 86_400_000 * 3)
            out = decide_batch(None, keyed, None, plan, partitions=3, in_executors=False)  # type: ignore[arg-type]
            assert not out.missing, "in order: no own bucket needs its history from Delta"
            streamed.append(out.alerts)
            # Only the notified alerts are published.
            assert (
                len(out.published)
                == out.alerts.filter(pa.compute.invert(out.alerts.column("suppressed"))).num_rows
            )
    stream = pa.concat_tables(streamed)

    keyed = batch_keyed_rows(events, signatures, None).drop_columns(["decide"])
    decisions = decide_history(keyed, rules, width)
    by = notify(decisions, keyed, rules).suppressed_by
    complete = alert_rows(decisions, keyed, rules, 7, _ALERT_ARROW, by)

    assert decided(stream) == decided(complete)
    suppressed = complete.filter(complete.column("suppressed"))
    assert 0 < suppressed.num_rows < complete.num_rows
    # Every rule with a cooldown suppressed some, and notified at least once per key.
    assert set(suppressed.column("ruleId").to_pylist()) == {r.rule_id for r in rules}
    # The keys' last notified alerts live in their bucket hashes.
    fields = [
        f
        for name in client.scan_iter(settings.redis_keys.bucket_hashes)
        for f in mirror.key_fields(client, name)
    ]
    assert {f for f in fields if f.startswith("n:")} == {f"n:{r.rule_id}:1" for r in rules}
