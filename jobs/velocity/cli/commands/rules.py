"""`velocity rules …`: validate, preview, apply, list, export and change the rules in force.

No Spark unless a change clears the state: the rule store is delta-rs, so a rule change
takes well under 2 s.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from velocity.cli.shared import (
    EXIT_OK,
    export,
    read_rules_file,
    rule_store,
    settings_from,
    spark_session,
)
from velocity.domain.decimals import dumps_json
from velocity.domain.rule_changes import as_candidates, outcome_lines, rule_action, rules_file_text
from velocity.domain.rules import Rule
from velocity.settings import Settings


def validate(args: argparse.Namespace) -> int:
    entries = read_rules_file(args.file)
    print(f"{args.file}: {len(entries)} valid rule entries")
    return EXIT_OK


def preview(args: argparse.Namespace) -> int:
    from velocity.delta import preview_reader
    from velocity.domain.rules import rule_summary

    entries = read_rules_file(args.file)
    result = preview_reader.preview(
        settings_from(args), entries, hours=args.hours, sample_size=args.sample
    )
    if args.json:
        print(result.to_json_text())
        return EXIT_OK
    span = result.span
    print(
        f"last {args.hours:g} h of accepted events: eventTime in ({span.start}, {span.end}], "
        f"anchored on the newest eventTime in the events table; {result.events_in_span} events "
        f"decided, {result.events_read} read (history from {result.read_from} for the widest "
        f"window), {result.seconds:.1f} s"
    )
    for note in result.skipped:
        print(f"skipped: {note}")
    for rule in result.rules:
        base = rule.in_force
        against = (
            "no version in force: every alert is added"
            if base is None
            else f"against v{base.version} in force ({base.state.value}, "
            f"{rule.in_force_alerts} alerts)"
        )
        print(
            f"\nruleId {rule.rule.rule_id} v{rule.rule.version} (unsaved) {rule_summary(rule.rule)}"
        )
        print(f"  {rule.alerts} alerts, {rule.notified} notified; {against}")
        print(
            "  per hour (alerts/notified): "
            + ", ".join(f"{h.alerts}/{h.notified}" for h in rule.per_hour)
            + " (oldest first)"
        )
        diff = rule.diff
        print(
            f"  difference: {diff.added} added, {diff.removed} removed, "
            f"{diff.changed} changed value, {diff.unchanged} the same"
        )
        shown_kinds = (
            ("added", diff.added_shown),
            ("removed", diff.removed_shown),
            ("changed", diff.changed_shown),
        )
        # Without a version in force every alert is added: the sample below shows them.
        for kind, shown in shown_kinds if base is not None else ():
            for entry in shown:
                print(
                    f"    {kind} {entry.transaction_id} at {entry.event_time}: "
                    f"in force {entry.in_force or '-'}, candidate {entry.candidate or '-'}"
                )
        for sample in rule.sample:
            alert = sample.alert
            print(
                f"  alert {alert['alertId']} transaction {alert['transactionId']} key "
                f"{json.dumps(alert['key'])} at {alert['eventTime']}: "
                f"{alert['aggregatorFunctionType']} {alert['aggregateValue']} "
                f"{alert['limitOperatorType']} {alert['limit']}"
            )
            if sample.explanation is None:
                print(f"    {sample.window_events} events in the window (too many to list)")
            else:
                print(f"    {sample.explanation.arithmetic}")
    return EXIT_OK


def _print_rules(rules: Sequence[Rule]) -> None:
    if not rules:
        print("no rules in force")
    for rule in rules:
        # The outcome always (to_json leaves out the default, ALERT): a reader sees it.
        listed = {"version": rule.version, **rule.to_json(), "outcome": rule.outcome.value}
        print(dumps_json(listed))


def apply(args: argparse.Namespace) -> int:
    entries = read_rules_file(args.file)
    settings = settings_from(args)
    result = rule_store(settings).apply(entries)
    for line in outcome_lines(result, entries):
        print(line)
    if result.clear_state:
        _clear_state(settings)
    return EXIT_OK


def shadow(args: argparse.Namespace) -> int:
    """Every rule of FILE as a SHADOW candidate, whatever its ruleState says."""
    candidates = as_candidates(read_rules_file(args.file))
    for line in outcome_lines(rule_store(settings_from(args)).apply(candidates), candidates):
        print(line)
    return EXIT_OK


def _clear_state(settings: Settings) -> None:
    """CLEAR_STATE_ALL: forget every bucket of the live system (rules stay)."""
    from velocity.delta.tables import BUCKETS, table_exists

    spark = spark_session(settings, "velocity-rules")
    path = settings.table_path(BUCKETS)
    if table_exists(spark, path):
        spark.sql(f"DELETE FROM delta.`{path}`")
    print("state cleared: every bucket deleted")


def list_rules(args: argparse.Namespace) -> int:
    store = rule_store(settings_from(args))
    _print_rules(store.history() if args.all else store.in_force())
    return EXIT_OK


def export_rules(args: argparse.Namespace) -> int:
    rules = rule_store(settings_from(args)).in_force()
    return export(rules_file_text([r.to_json() for r in rules]), args.out, f"{len(rules)} rules")


def change(args: argparse.Namespace) -> int:
    """`velocity rules pause|activate|delete|promote|discard ID`: the subcommand names the
    action (one of RULE_ACTIONS)."""
    entries = [rule_action(args.rules_command, args.rule_id)]
    for line in outcome_lines(rule_store(settings_from(args)).apply(entries), entries):
        print(line)
    return EXIT_OK
