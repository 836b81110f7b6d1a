"""An alert storm, written as the stream writes one, for the browser test of the queue under
load (``python -m tests.browser.storm --seconds 60 --rate 2000 --rules 31,32 --out F``,
with the deployment's ``VELOCITY_*`` settings).

Why not the stream itself: on the suite's two shared cores the Spark stream beside Airflow
and a browser does not hold 2 000 payments a second for a minute (``make bench-stream``
with the fire-often rules: about 1 000 a second kept up, alone), and the test is of the
page, not of the stream. So this process plays the stream's part at the storm's rate, with
the stream's own formats and code where it has them:

- payments of ``--payers`` payers at ``--rate`` a second, each a row of the live events
  table (its raw JSON line, its batch, its ingest time);
- the ``--rules`` in force and ACTIVE (re-read every second: a pause from the page stops
  their alerts, as the stream's next micro-batch would) are COUNT rules by payerId that
  fire on every payment; each payment's alert carries its window's count by SPEC §3 (the
  bucket-floored lower edge, every event of the batch at or before its time), and the
  rule's cooldown decides notified or suppressed by
  ``velocity.domain.cooldown_reference``'s reference;
- the notified alerts are published to the Redis alert stream (the stream's XADD: field
  ``alert`` with the SPEC §4 record, ``batch``), the suppressed never;
- every ``write_behind_seconds`` the events and every alert (notified and suppressed,
  ``suppressedBy``) are appended to Delta, the alerts gathered into their payers' cases
  first by ``CaseStore.gather_alerts`` (the stream's write-behind does the same), in a
  thread, so the publishing goes on meanwhile.

Prints (and writes to ``--out``) a JSON summary: payments, alerts, notified, suppressed,
seconds, alerts a second.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from bisect import bisect_left
from collections import deque
from decimal import Decimal
from pathlib import Path
from typing import Any

# Far from any batch id of the stream (its write-behind groups and its events' batches).
BATCH_BASE = 1_000_000_000


def _window_count(times: deque[int], start: int) -> int:
    """Events of one payer (times ascending, the newest now) at ``start`` or later."""
    return len(times) - bisect_left(times, start)


class Storm:
    def __init__(self, rate: int, payers: int, rule_ids: list[int]) -> None:
        import redis

        from velocity.delta.names import RULES
        from velocity.delta.rule_store import RuleStore
        from velocity.settings import load_settings

        self.settings = load_settings()
        self.redis = redis.Redis.from_url(self.settings.redis_url)
        self.rules_store = RuleStore(self.settings.table_path(RULES))
        self.rate, self.rule_ids = rate, rule_ids
        self.payers = [f"storm-{n:04d}" for n in range(payers)]
        self.random = random.Random(35)
        self.times: dict[str, deque[int]] = {p: deque() for p in self.payers}
        self.last_notified: dict[Any, Any] = {}
        self.events: list[dict[str, Any]] = []
        self.alerts: list[dict[str, Any]] = []
        self.counts = {"payments": 0, "alerts": 0, "notified": 0, "suppressed": 0}
        self.flushes: list[threading.Thread] = []
        self.flushed = 0
        self.rules: list[Any] = []
        self.rules_read = 0.0
        self.errors: list[str] = []

    def active_rules(self, now: float) -> list[Any]:
        from velocity.domain.rules import RuleState

        if now - self.rules_read >= 1.0:
            self.rules_read = now
            self.rules = [
                r
                for r in self.rules_store.in_force()
                if r.rule_id in self.rule_ids and r.state is RuleState.ACTIVE
            ]
        return self.rules

    def tick(self, batch: int, now_ms: int, n: int) -> None:
        """``n`` payments at ``now_ms``, decided, published and spooled."""
        from velocity.domain.alerts import AlertKind, alert_ids
        from velocity.domain.cooldown_reference import CooledAlert, notified_reference
        from velocity.domain.decimals import format_decimal

        width = self.settings.bucket_seconds * 1000
        payments = []
        for _ in range(n):
            self.counts["payments"] += 1
            payer = self.random.choice(self.payers)
            tx = f"storm-{self.counts['payments']:07d}"
            amount = Decimal(self.random.randrange(100, 500_000)) / 100
            payments.append((tx, payer, amount))
            self.times[payer].append(now_ms)
        for tx, payer, amount in payments:
            event = {
                "transactionId": tx, "eventTime": now_ms, "payerId": payer,
                "beneficiaryId": "storm-b", "paymentAmount": str(amount), "paymentType": "CRD",
            }  # fmt: skip
            self.events.append(
                {
                    **event,
                    "paymentAmount": amount,
                    "ip": None,
                    "deviceId": None,
                    "action": None,
                    "raw": json.dumps(event),
                    "source_file": "storm",
                    "source_block": batch,
                    "line_seq": len(self.events),
                    "ingest_time": now_ms,
                    "stream_batch": BATCH_BASE + batch,
                }
            )
        pipe = self.redis.pipeline(transaction=False)
        for rule in self.active_rules(time.time()):
            start = now_ms - rule.window_ms
            start -= start % width
            cooled = [
                CooledAlert((rule.rule_id, rule.version, p), now_ms, tx) for tx, p, _ in payments
            ]
            by, self.last_notified = notified_reference(
                cooled,
                {a.group: rule.cooldown_ms for a in cooled},
                self.last_notified,
            )
            ids = alert_ids(
                rule.rule_id, rule.version, AlertKind.ALERT, [t for t, _, _ in payments]
            )
            for (tx, payer, _), alert, one_id in zip(payments, cooled, ids, strict=True):
                count = _window_count(self.times[payer], start)
                record = {
                    "alertId": one_id,
                    "kind": "ALERT", "ruleId": rule.rule_id, "ruleVersion": rule.version,
                    "transactionId": tx, "key": {"payerId": payer}, "eventTime": now_ms,
                    "aggregatorFunctionType": "COUNT", "aggregateValue": str(count),
                    "limitOperatorType": rule.operator.value, "limit": format_decimal(rule.limit),
                    "windowStart": start, "windowEnd": now_ms, "decisionTime": now_ms,
                }  # fmt: skip
                suppressor = by[alert]
                self.counts["alerts"] += 1
                if suppressor is None:
                    self.counts["notified"] += 1
                    pipe.xadd(
                        self.settings.alert_stream,
                        {"alert": json.dumps(record), "batch": str(BATCH_BASE + batch)},
                        maxlen=1_000_000,
                        approximate=True,
                    )
                else:
                    self.counts["suppressed"] += 1
                self.alerts.append(
                    {
                        **record,
                        "key": [("payerId", payer)],
                        "signature_id": rule.signature.signature_id,
                        "shadow": False,
                        "suppressed": suppressor is not None,
                        "suppressedBy": suppressor,
                        "caseId": None,
                    }
                )
        pipe.execute()
        horizon = now_ms - 2 * max((r.window_ms for r in self.rules), default=60_000) - width
        for _, payer, _ in payments:
            times = self.times[payer]
            while times and times[0] < horizon:
                times.popleft()

    def flush(self, wait: bool = False) -> None:
        """Append what was spooled to Delta behind Redis, in a thread (``wait``: then wait)."""
        events, alerts, self.events, self.alerts = self.events, self.alerts, [], []
        self.flushed += 1
        # A group id of this run's own (a second run's groups are not "redone" flushes).
        group = 2 * BATCH_BASE + int(time.time() * 10)
        # One flush writes at a time, in order, as the stream's state lock has it: two that
        # overlap (a slow one on a loaded machine, then the last) would commit the same
        # transaction id at once, and one fail.
        previous = self.flushes[-1] if self.flushes else None
        worker = threading.Thread(
            target=self._write, args=(events, alerts, group, previous), daemon=True
        )
        worker.start()
        self.flushes.append(worker)
        if wait:
            for done in self.flushes:
                done.join()

    def _write(
        self,
        events: list[dict[str, Any]],
        alerts: list[dict[str, Any]],
        group: int,
        previous: threading.Thread | None = None,
    ) -> None:
        import pyarrow as pa
        from deltalake import write_deltalake

        from velocity.delta import tables
        from velocity.delta.case_store import CaseStore
        from velocity.delta.write_behind import ARROW_SCHEMAS, append_once

        if previous is not None:
            previous.join()
        try:
            event_rows = pa.Table.from_pylist(events, ARROW_SCHEMAS["events"])
            alert_rows = pa.Table.from_pylist(alerts, ARROW_SCHEMAS["alerts"])
            gathered = CaseStore(self.settings).gather_alerts(alert_rows, event_rows, group)
            for name, rows in (("events", event_rows), ("alerts", gathered)):
                path = self.settings.table_path(getattr(tables, name.upper()))
                if not (path / "_delta_log").is_dir():  # a data dir the stream never wrote
                    write_deltalake(str(path), rows.slice(0, 0))
                if rows.num_rows:
                    append_once(path, rows, f"velocity-storm:{name}", group)
        except Exception as exc:  # the summary says so, and the process fails
            import traceback

            self.errors.append(f"flush {group}: {exc!r}\n{traceback.format_exc()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=int, default=2000, help="payments a second")
    parser.add_argument("--payers", type=int, default=1000)
    parser.add_argument("--rules", default="31,32", help="ruleIds that fire on every payment")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    storm = Storm(args.rate, args.payers, [int(r) for r in args.rules.split(",")])
    started = time.time()
    next_flush = started + storm.settings.write_behind_seconds
    batch = 0
    while True:
        now = time.time()
        if now - started >= args.seconds:
            break
        due = int(args.rate * (now - started)) - storm.counts["payments"]
        if due < args.rate // 20:  # batches of about 50 ms, as a stream's micro-batches
            time.sleep(0.01)
            continue
        batch += 1
        storm.tick(batch, int(now * 1000), min(due, args.rate))
        if now >= next_flush:
            next_flush += storm.settings.write_behind_seconds
            storm.flush()
    seconds = time.time() - started
    storm.flush(wait=True)
    summary = {
        **storm.counts,
        "seconds": round(seconds, 2),
        "alertsPerSecond": round(storm.counts["alerts"] / seconds, 1),
        "notifiedPerSecond": round(storm.counts["notified"] / seconds, 1),
        "batches": batch,
        "flushes": storm.flushed,
        "flushedSeconds": round(time.time() - started - seconds, 2),
        "errors": storm.errors,
    }
    text = json.dumps(summary)
    print(text, flush=True)
    if args.out is not None:
        args.out.write_text(text)
    if storm.errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
