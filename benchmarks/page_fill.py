"""Tables as a long-running stream leaves them, for `make bench-page` (not a test).

``fill`` writes ``alerts`` alerts through the stream's own write-behind append
(``append_group``: each group's events and alerts appended in one delta-rs commit a table,
the alerts gathered into cases first), so the alerts, events, case_events and cases tables
have the stream's layout, one data file a group. The groups are numbered below zero,
numbers no stream batch has: a stream started on the filled tables (``bench-page`` with
the stream beside) appends its own batches after them, as a stream running for weeks
would. The scenario is the storm of
issue 51: ``payers`` payers, rule 1 firing on every payment and its twin rule 2 with a
10-minute cooldown (most of its alerts suppressed), ``alerts_per_second`` alerts a second
of decisionTime ending at ``now_ms``, a write-behind group every 30 s of it. About one
alert in a hundred is reviewed (a closed case's alerts are), and the Redis alert stream
holds the newest notified alerts (ids at their decisionTime, as the stream publishes) and
the rules in force.
The signatures table and the case book's snapshot are left as a running stream and the
hourly maintenance leave them. The rows are made column by column with Arrow: 10M alerts
in minutes, not hours.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from velocity.delta.case_store import CaseStore
from velocity.delta.live import LiveTables, create_missing_tables
from velocity.delta.names import ALERT_REVIEWS, RULES
from velocity.delta.review_store import REVIEW_ARROW_SCHEMA
from velocity.delta.rule_store import RuleStore
from velocity.delta.small_tables import create_if_missing
from velocity.delta.write_behind import ARROW_SCHEMAS, SPOOLED_TABLES, append_group
from velocity.domain.alerts import AlertKind, alert_ids
from velocity.domain.rules import parse_rules
from velocity.engine.records import alert_lines
from velocity.settings import Settings

# The storm's two rules (issue 51): one fires on every payment, its twin with a cooldown;
# and a third that seldom fires. Ids from ``first_rule`` on: 1, 2, 3 unless a deployment's
# own rules hold those (the browser test's fill: ``VELOCITY_BROWSER_STORED_ALERTS``).


def storm_rules_text(first_rule: int = 1) -> str:
    return json.dumps(
        [
            {"ruleId": first_rule, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
             "aggregatorFunctionType": "COUNT", "limitOperatorType": ">=", "limit": 1,
             "windowMinutes": 10},
            {"ruleId": first_rule + 1, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
             "aggregatorFunctionType": "COUNT", "limitOperatorType": ">=", "limit": 1,
             "windowMinutes": 10, "cooldownMinutes": 10},
            {"ruleId": first_rule + 2, "ruleState": "ACTIVE", "groupingKeyNames": ["payerId"],
             "aggregateFieldName": "paymentAmount", "aggregatorFunctionType": "SUM",
             "limitOperatorType": ">", "limit": 1000000, "windowMinutes": 1440},
        ]
    )  # fmt: skip


RULES_TEXT = storm_rules_text()
GROUP_SECONDS = 30  # the stream's write-behind default
REVIEWED_ONE_IN = 100


@dataclass(frozen=True)
class Filled:
    alerts: int
    payments: int
    groups: int
    oldest_decision: int
    newest_decision: int
    reviews: int
    stream_entries: int
    seconds: float


def _texts(prefix: str, numbers: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pa.array(numbers).cast(pa.string()), "")


def group_rows(
    group: int,
    first_payment: int,
    payments: int,
    payers: int,
    start_ms: int,
    step_ms: float,
    first_rule: int = 1,
) -> dict[str, pa.Table]:
    """One write-behind group: ``payments`` payments from the ``first_payment``-th on, each
    firing the storm's first two rules, decided ``step_ms`` apart from ``start_ms``."""
    n = np.arange(first_payment, first_payment + payments, dtype=np.int64)
    decided = (start_ms + (n * step_ms)).astype(np.int64)
    payer = (n * 7919) % payers
    tx = _texts("bp-", n)
    payer_ids = _texts("p-", payer)
    beneficiary_ids = _texts("b-", n % 5000)
    event_time = decided - 200
    amount = pa.array([Decimal("12.50")] * payments, ARROW_SCHEMAS["events"].field(
        "paymentAmount").type)  # fmt: skip
    raw = pc.binary_join_element_wise(
        '{"transactionId":"', tx, '","eventTime":', pa.array(event_time).cast(pa.string()),
        ',"payerId":"', payer_ids, '","beneficiaryId":"', beneficiary_ids,
        '","paymentAmount":"12.50","paymentType":"CRD"}', "",
    )  # fmt: skip
    nulls = pa.nulls(payments, pa.string())
    events = pa.table(
        {
            "transactionId": tx,
            "eventTime": event_time,
            "payerId": payer_ids,
            "beneficiaryId": beneficiary_ids,
            "paymentAmount": amount,
            "paymentType": pa.array(["CRD"] * payments),
            "ip": nulls,
            "deviceId": nulls,
            "action": nulls,
            "raw": raw,
            "source_file": pa.array([f"bench{group}.jsonl"] * payments),
            "source_block": pa.array(np.zeros(payments, np.int64)),
            "line_seq": pa.array(n - first_payment),
            "ingest_time": event_time + 100,
            "stream_batch": pa.array(np.full(payments, group, np.int64)),
        }
    ).cast(ARROW_SCHEMAS["events"])
    texts = tx.to_pylist()
    key_type = ARROW_SCHEMAS["alerts"].field("key").type
    keys = pa.MapArray.from_arrays(
        pa.array(np.arange(payments + 1, dtype=np.int32)),
        pa.array(["payerId"] * payments),
        payer_ids,
    ).cast(key_type)
    parts = []
    for rule_id in (first_rule, first_rule + 1):
        # The twin's cooldown: a payer's alert notified about once in ten.
        suppressed = np.zeros(payments, bool) if rule_id == first_rule else (n // payers) % 10 != 0
        parts.append(
            pa.table(
                {
                    "alertId": pa.array(alert_ids(rule_id, 1, AlertKind.ALERT, texts)),
                    "kind": pa.array(["ALERT"] * payments),
                    "ruleId": pa.array(np.full(payments, rule_id, np.int64)),
                    "ruleVersion": pa.array(np.ones(payments, np.int32)),
                    "transactionId": tx,
                    "key": keys,
                    "eventTime": event_time,
                    "aggregatorFunctionType": pa.array(["COUNT"] * payments),
                    "aggregateValue": pa.array(["1"] * payments),
                    "limitOperatorType": pa.array([">="] * payments),
                    "limit": pa.array(["1"] * payments),
                    "windowStart": event_time - 600_000 - event_time % 60_000,
                    "windowEnd": event_time,
                    "decisionTime": decided,
                    "signature_id": pa.array(["bench-signature"] * payments),
                    "shadow": pa.array(np.zeros(payments, bool)),
                    "suppressed": pa.array(suppressed),
                    "suppressedBy": pc.if_else(pa.array(suppressed), tx, nulls),
                    "caseId": nulls,
                    "outcome": pa.array(["ALERT"] * payments),
                }
            ).cast(ARROW_SCHEMAS["alerts"])
        )
    rows = {name: ARROW_SCHEMAS[name].empty_table() for name in SPOOLED_TABLES}
    rows["events"] = events
    rows["alerts"] = pa.concat_tables(parts)
    return rows


def _reviews(alerts: pa.Table, now_ms: int) -> pa.Table:
    chosen = alerts.filter(pc.equal(pc.bit_wise_and(alerts.column("decisionTime"), 127), 0))
    count = chosen.num_rows
    return pa.table(
        {
            "alertId": chosen.column("alertId"),
            "ruleId": chosen.column("ruleId"),
            "ruleVersion": chosen.column("ruleVersion"),
            "verdict": pa.array(["FALSE_POSITIVE"] * count),
            "note": pa.array(["bench"] * count),
            "who": pa.array(["bench"] * count),
            "when": pa.array(np.full(count, now_ms, np.int64)),
        }
    ).cast(REVIEW_ARROW_SCHEMA)


def fill(
    settings: Settings,
    alerts: int,
    payers: int = 3_000,
    alerts_per_second: float = 2_000.0,
    now_ms: int | None = None,
    stream_entries: int = 50_000,
    progress: Any = None,
    first_rule: int = 1,
) -> Filled:
    """Write ``alerts`` alerts (two a payment) as the stream's write-behind does, ending at
    ``now_ms``; the newest ``stream_entries`` notified ones on the Redis alert stream (none
    where a stream published already: the entries' ids are their decisionTimes, older
    than its)."""
    from velocity.redis import connection, mirror

    began = time.monotonic()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    create_missing_tables(LiveTables.of(settings))
    rules = RuleStore(settings.table_path(RULES))
    rules.apply(parse_rules(storm_rules_text(first_rule)))
    _record_signatures(settings, rules)
    # The rules in Redis as the stream publishes them: the page's window lookup reads them.
    writer = connection.connect(settings)
    connection.load_functions(writer)
    mirror.publish_rules(
        writer, settings.redis_keys, list(rules.in_force()), settings.bucket_width_ms
    )
    payments = max(1, alerts // 2)
    step_ms = 2_000.0 / alerts_per_second  # two alerts a payment
    start_ms = now_ms - int(payments * step_ms)
    per_group = max(1, int(GROUP_SECONDS * 1000 / step_ms))
    total_groups = -(-payments // per_group)
    reviews = create_if_missing(settings.table_path(ALERT_REVIEWS), REVIEW_ARROW_SCHEMA)
    reviewed = groups = 0
    newest_alerts: list[pa.Table] = []
    kept = 0
    for group, first in enumerate(range(0, payments, per_group)):
        count = min(per_group, payments - first)
        # Below zero, counting up to -1: each group's mark newer than the last.
        last_batch = group - total_groups
        rows = group_rows(last_batch, first, count, payers, start_ms, step_ms, first_rule)
        append_group(settings, rows, last_batch)
        review_rows = _reviews(rows["alerts"], now_ms)
        if review_rows.num_rows:
            write_deltalake(reviews, review_rows, mode="append")
            reviewed += review_rows.num_rows
        notified = rows["alerts"].filter(pc.invert(rows["alerts"].column("suppressed")))
        newest_alerts.append(notified)
        kept += notified.num_rows
        while newest_alerts and kept - newest_alerts[0].num_rows >= stream_entries:
            kept -= newest_alerts.pop(0).num_rows
        groups += 1
        if progress is not None:
            progress(groups, first + count, payments)
    published = _publish(writer, settings.alert_stream, newest_alerts, stream_entries)
    # The case book's snapshot, as the hourly maintenance leaves it: a restarted
    # api-server's first look reads it, not every case event (velocity.delta.case_snapshot).
    CaseStore(settings).write_snapshot()
    return Filled(
        alerts=payments * 2,
        payments=payments,
        groups=groups,
        oldest_decision=start_ms,
        newest_decision=int(start_ms + (payments - 1) * step_ms),
        reviews=reviewed,
        stream_entries=published,
        seconds=round(time.monotonic() - began, 1),
    )


def _record_signatures(settings: Settings, rules: RuleStore) -> None:
    """The signatures table as a stream deciding these rules leaves it (built through the
    fill's last group, -1): a stream started on the filled tables decides at once, as one
    restarted on weeks of its own would, instead of first building every signature's
    buckets from the filled events (minutes with 10M alerts)."""
    from velocity.delta import tables
    from velocity.delta.live import append_live_rows
    from velocity.domain.rules import deciding_rules, rules_by_signature
    from velocity.spark.signature_builds import signature_records

    deciding = deciding_rules(rules.in_force())
    widest = max((r.window_ms for r in deciding), default=0)
    rows = signature_records(list(rules_by_signature(deciding)), deciding, widest, -1)
    append_live_rows(LiveTables.of(settings), tables.SIGNATURES, rows)


def _publish(client: Any, stream: str, parts: list[pa.Table], limit: int) -> int:
    """The newest ``limit`` of ``parts``' alerts on the alert stream, in decision order, each
    entry's id at its decisionTime (as the stream publishes right after deciding)."""
    if not parts:
        return 0
    alerts = pa.concat_tables(parts).sort_by("decisionTime")
    alerts = alerts.slice(max(0, alerts.num_rows - limit))
    lines = alert_lines(alerts).to_pylist()
    times = alerts.column("decisionTime").to_pylist()
    pipe = client.pipeline(transaction=False)
    last, seq = -1, 0
    for n, (line, at) in enumerate(zip(lines, times, strict=True)):
        seq = seq + 1 if at == last else 0
        last = at
        pipe.xadd(stream, {"alert": line}, id=f"{at}-{seq}")
        if n % 5_000 == 4_999:
            pipe.execute()
    pipe.execute()
    return len(lines)
