"""`velocity cases …`: list, show, assign, close and reopen cases (the alerts of a case key,
worked as one).

Text output gives times as ISO-8601 UTC (``2026-11-28T10:15:02.123Z``); ``--json`` keeps
them as epoch milliseconds. A case is named by its id or any unique start of it (``8c1f``,
``8c1f…``: ``CaseStore.resolve``)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from velocity.cli.shared import EXIT_OK, settings_from
from velocity.domain.decimals import dumps_json
from velocity.domain.times import iso_utc
from velocity.settings import Settings


def _case_store(settings: Settings) -> Any:
    from velocity.delta.case_store import CaseStore

    return CaseStore(settings)


def _case_line(case: Any) -> str:
    rules = " ".join(f"r{rule}×{n}" for rule, n in sorted(case.rule_counts.items()))
    key = ",".join(f"{k}={v}" for k, v in case.key.items())
    who = f" {case.assignee}" if case.assignee else ""
    verdict = f" {case.verdict.words}" if case.verdict else ""
    return (
        f"{case.case_id}  {case.outcome.value}  {case.status.value}{who}{verdict}  {key}  "
        f"{case.alerts} alerts ({rules})  amount {case.amount}  latest alert "
        f"{iso_utc(case.latest_alert_at)}"
    )


def list_cases(args: argparse.Namespace) -> int:
    from velocity.analyst.case_queue import CaseSort
    from velocity.analyst.cases import CaseStatus
    from velocity.domain.rules import Outcome

    status = None if args.status is None else CaseStatus(args.status.lower())
    outcome = None if args.outcome is None else Outcome(args.outcome)
    listed = _case_store(settings_from(args)).listed(status, outcome, CaseSort(args.sort))
    for case in listed:
        print(dumps_json(case.to_json()) if args.json else _case_line(case))
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    from velocity.analyst.cases import mark_retracted
    from velocity.domain.alerts import record_of_stored

    store = _case_store(settings_from(args))
    case_id = store.resolve(args.case_id)
    case = store.case(case_id)
    # In time order; a backfill's retraction beside the alert it retracts, marked so.
    alerts = mark_retracted([record_of_stored(r) for r in store.alerts(case_id).to_pylist()])
    if args.json:
        print(dumps_json({**case.to_json(history=True), "alertRecords": alerts}))
        return EXIT_OK
    print(_case_line(case))
    for alert in alerts:
        flag = " (suppressed)" if alert.get("suppressed") else ""
        flag += " (retracted)" if alert.get("retracted") else ""
        kind = "alert" if alert["kind"] == "ALERT" else alert["kind"].lower()
        print(
            f"  {iso_utc(alert['eventTime'])} {kind} {alert['alertId']} {alert['outcome']} "
            f"rule {alert['ruleId']} v{alert['ruleVersion']} tx {alert['transactionId']} "
            f"{alert['aggregatorFunctionType']} "
            f"{alert['aggregateValue']} {alert['limitOperatorType']} {alert['limit']}{flag}"
        )
    for event in case.history:
        detail = event.assignee or (event.verdict.words if event.verdict else "") or ""
        alerts_part = f" {event.alerts} alerts" if event.alerts else ""
        print(
            f"  {iso_utc(event.at)} {event.event.value} by {event.who}{alerts_part} "
            f"{detail}".rstrip()
        )
    return EXIT_OK


def _who(args: argparse.Namespace) -> str:
    return str(args.who or os.environ.get("USER") or "cli")


def assign(args: argparse.Namespace) -> int:
    store = _case_store(settings_from(args))
    case = store.assign(store.resolve(args.case_id), args.assignee, _who(args))
    print(_case_line(case))
    return EXIT_OK


def close(args: argparse.Namespace) -> int:
    store = _case_store(settings_from(args))
    case = store.close(store.resolve(args.case_id), args.verdict, args.note, _who(args))
    print(_case_line(case))
    # Reviews committed; alerts still written behind are reviewed so as they land.
    pending = f", {case.being_written} more being written" if case.being_written else ""
    print(f"{case.reviewed} alerts reviewed as {case.verdict.words}{pending}")
    return EXIT_OK


def reopen(args: argparse.Namespace) -> int:
    store = _case_store(settings_from(args))
    case = store.reopen(store.resolve(args.case_id), _who(args))
    print(_case_line(case))
    return EXIT_OK
