"""`velocity`: the one console script, and the only place that parses arguments.

Exit codes (SPEC §6): 0 success, 2 bad input or usage (the message names what
is wrong), 1 anything else.

Every command is wired here (its arguments, its help, its handler); the handlers live in
``velocity.cli.commands.<group>``, one module per command group, and are imported only
when their command runs (as Airflow's CLI does), so ``velocity --help`` and ``velocity
rules list`` import neither Spark nor the modules of the other commands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from velocity.cli.shared import EXIT_FAILURE, EXIT_USAGE
from velocity.domain.rule_changes import RULE_ACTIONS
from velocity.errors import InvalidRuleError, UsageError, VelocityError
from velocity.settings import load_settings

Handler: TypeAlias = Callable[[argparse.Namespace], int]
_Commands: TypeAlias = "argparse._SubParsersAction[_Parser]"


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (exit 2 with our message) instead of exiting itself."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


@dataclass(frozen=True)
class LazyHandler:
    """A command's handler, ``velocity.cli.commands.<group>.<function>``, imported only when
    its command runs (Airflow's ``lazy_load_command``): building the parser imports no
    command module, so ``velocity --help`` stays cheap."""

    group: str
    function: str

    def handler(self) -> Handler:
        module = importlib.import_module(f"velocity.cli.commands.{self.group}")
        found: Handler = getattr(module, self.function)
        return found

    def __call__(self, args: argparse.Namespace) -> int:
        return self.handler()(args)


def build_parser() -> argparse.ArgumentParser:
    """Every command, its arguments and its handler (imported when the command runs)."""
    parser = _Parser(prog="velocity", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (
        _add_services,
        _add_rules,
        _add_reviews,
        _add_cases,
        _add_generate,
        _add_backtest,
        _add_stream,
        _add_watch,
        _add_alerts,
        _add_lookup,
        _add_check,
        _add_serve,
        _add_explain,
        _add_mirror,
        _add_backfill,
        _add_maintain,
        _add_quality,
    ):
        add(sub)
    return parser


def _add_services(sub: _Commands) -> None:
    """`velocity up` and `velocity down`."""
    sub.add_parser(
        "up",
        help="start the local Redis, Kafka broker and check service (Redis installed if missing)",
    ).set_defaults(run=LazyHandler("services", "up"))
    sub.add_parser(
        "down", help="stop the local Redis, Kafka broker and check service"
    ).set_defaults(run=LazyHandler("services", "down"))


def _add_rules(sub: _Commands) -> None:
    """`velocity rules validate|preview|apply|list|export|shadow` and the changes of one rule."""
    rules = sub.add_parser("rules", help="validate and manage the rules in force")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, parser_class=_Parser)
    validate = rules_sub.add_parser("validate", help="exit 0 when every rule in FILE is valid")
    validate.add_argument("file")
    validate.set_defaults(run=LazyHandler("rules", "validate"))
    preview = rules_sub.add_parser(
        "preview", help="the alerts FILE's rules would have fired over the last hours of events"
    )
    preview.add_argument("file")
    preview.add_argument("--hours", type=float, default=1.0, help="hours before the newest event")
    preview.add_argument("--sample", type=int, default=5, help="alerts shown with explanations")
    preview.add_argument("--json", action="store_true", help="one JSON object")
    preview.set_defaults(run=LazyHandler("rules", "preview"))
    apply = rules_sub.add_parser("apply", help="apply FILE as new rule versions, all or nothing")
    apply.add_argument("file")
    apply.set_defaults(run=LazyHandler("rules", "apply"))
    listing = rules_sub.add_parser("list", help="the rules in force (JSON lines)")
    listing.add_argument("--all", action="store_true", help="every version, deleted ones too")
    listing.set_defaults(run=LazyHandler("rules", "list_rules"))
    export = rules_sub.add_parser("export", help="the rules in force as a re-appliable file")
    export.add_argument("--out", help="write to this file instead of standard output")
    export.set_defaults(run=LazyHandler("rules", "export_rules"))
    shadow = rules_sub.add_parser(
        "shadow", help="add FILE's rules as SHADOW candidates (decided, kept from downstream)"
    )
    shadow.add_argument("file")
    shadow.set_defaults(run=LazyHandler("rules", "shadow"))
    for name, text in RULE_ACTIONS.items():
        change = rules_sub.add_parser(name, help=text)
        change.add_argument("rule_id", type=int, metavar="ID")
        change.set_defaults(run=LazyHandler("rules", "change"))


def _add_reviews(sub: _Commands) -> None:
    reviews = sub.add_parser("reviews", help="analysts' reviews of alerts")
    reviews_sub = reviews.add_subparsers(
        dest="reviews_command", required=True, parser_class=_Parser
    )
    reviews_export = reviews_sub.add_parser(
        "export", help="the latest review of each reviewed alert as JSON lines, oldest first"
    )
    reviews_export.add_argument("--out", help="write to this file (default: standard output)")
    reviews_export.add_argument(
        "--all", action="store_true", help="every review ever recorded, not only the latest"
    )
    reviews_export.set_defaults(run=LazyHandler("reviews", "export_reviews"))


def _add_cases(sub: _Commands) -> None:
    """`velocity cases list|show|assign|close|reopen`."""
    cases = sub.add_parser("cases", help="cases: the alerts of a case key, worked as one")
    cases_sub = cases.add_subparsers(dest="cases_command", required=True, parser_class=_Parser)
    cases_list = cases_sub.add_parser(
        "list", help="the cases, newest activity first (or strongest outcome first)"
    )
    cases_list.add_argument("--status", choices=["open", "assigned", "closed"], type=str.lower)
    cases_list.add_argument(
        "--outcome",
        choices=["ALERT", "REVIEW", "BLOCK"],
        type=str.upper,
        help="only the cases whose strongest outcome is this one",
    )
    cases_list.add_argument(
        "--sort",
        choices=["newest", "oldest", "amount", "alerts", "outcome"],
        default="newest",
        type=str.lower,
        help="newest activity first (default), the case opened longest ago first, the "
        "largest total of its payments first, the most alerts first, or the strongest "
        "outcome first (BLOCK, REVIEW, ALERT)",
    )
    cases_list.add_argument(
        "--json", action="store_true", help="one JSON object a line (times in epoch ms)"
    )
    cases_list.set_defaults(run=LazyHandler("cases", "list_cases"))
    case_id_help = "the case's id, or a unique start of it (8c1f, 8c1f…)"
    cases_show = cases_sub.add_parser(
        "show", help="a case: its alerts in time order and its history"
    )
    cases_show.add_argument("case_id", help=case_id_help)
    cases_show.add_argument(
        "--json", action="store_true", help="one JSON object (times in epoch ms)"
    )
    cases_show.set_defaults(run=LazyHandler("cases", "show"))
    cases_assign = cases_sub.add_parser("assign", help="assign a case to someone")
    cases_assign.add_argument("case_id", help=case_id_help)
    cases_assign.add_argument("assignee")
    cases_close = cases_sub.add_parser(
        "close", help="close a case with a verdict, which reviews each of its alerts"
    )
    cases_close.add_argument("case_id", help=case_id_help)
    cases_close.add_argument(
        "verdict", help="CONFIRMED_FRAUD, FALSE_POSITIVE or NEEDS_REVIEW (any case)"
    )
    cases_close.add_argument("--note", default=None)
    cases_reopen = cases_sub.add_parser("reopen", help="reopen a closed case")
    cases_reopen.add_argument("case_id", help=case_id_help)
    for change_parser, run in (
        (cases_assign, LazyHandler("cases", "assign")),
        (cases_close, LazyHandler("cases", "close")),
        (cases_reopen, LazyHandler("cases", "reopen")),
    ):
        change_parser.add_argument("--who", help="who does it (default: $USER)")
        change_parser.set_defaults(run=run)


def _add_generate(sub: _Commands) -> None:
    generate = sub.add_parser("generate", help="write synthetic events as JSON lines")
    generate.add_argument("--out", help="folder to write the event files into")
    generate.add_argument(
        "--kafka",
        action="store_true",
        help="produce to the events topic instead, over real time (--rate a second)",
    )
    generate.add_argument("--topic", help="--kafka: topic (default VELOCITY_KAFKA_EVENTS_TOPIC)")
    generate.add_argument("--events", type=int, default=100_000, help="number of events")
    generate.add_argument(
        "--rate", type=float, default=100.0, help="events per second of event time"
    )
    generate.add_argument("--keys", type=int, default=1_000, help="number of distinct payers")
    generate.add_argument("--files", type=int, default=4, help="number of files to split into")
    generate.add_argument("--start", type=int, default=None, help="first eventTime (epoch ms)")
    generate.add_argument("--spike-fraction", type=float, help="fraud bursts (default 0.01)")
    generate.add_argument("--late-fraction", type=float, help="late events (default 0.01)")
    generate.add_argument("--duplicate-fraction", type=float, help="repeated ids (default 0.005)")
    generate.add_argument("--malformed-fraction", type=float, help="bad lines (default 0.005)")
    generate.add_argument("--seed", type=int, help="seed for a reproducible run (default: drawn)")
    generate.add_argument("--overwrite", action="store_true", help="replace existing files")
    generate.add_argument(
        "--follow",
        action="store_true",
        help="write over real time: --rate per wall-clock second, eventTime = now",
    )
    generate.add_argument("--interval", type=float, default=1.0, help="--follow: seconds a file")
    generate.add_argument("--duration", type=float, help="--follow: stop after this many seconds")
    generate.set_defaults(run=LazyHandler("generate", "generate"))


def _add_backtest(sub: _Commands) -> None:
    backtest = sub.add_parser(
        "backtest", help="complete-data alerts of rules over events, on Spark"
    )
    backtest.add_argument("--rules", help="rules file (default: the rules in force)")
    backtest.add_argument("--events", required=True, help="JSON-lines file or folder")
    backtest.add_argument("--out", required=True, help="alerts JSON-lines file to write")
    backtest.add_argument("--bucket-seconds", type=int, default=None)
    backtest.add_argument("--summary-json", help="also write the run's summary as JSON here")
    backtest.add_argument(
        "--keep-state",
        action="store_true",
        help="also write the accepted events, the duplicates, the buckets and the alerts as "
        "Delta tables",
    )
    backtest.set_defaults(run=LazyHandler("backtest", "backtest"))


def _add_stream(sub: _Commands) -> None:
    """`velocity stream`, `stream-status` and `stream-stop`."""
    stream = sub.add_parser(
        "stream", help="the streaming job over a folder of JSON lines or a Kafka topic"
    )
    stream.add_argument(
        "--source", choices=["folder", "kafka"], default="folder", help="where events come from"
    )
    stream.add_argument("--events", help="--source folder: the folder event files land in")
    stream.add_argument(
        "--topic", help="--source kafka: the topic (default VELOCITY_KAFKA_EVENTS_TOPIC)"
    )
    stream.add_argument(
        "--starting-offsets",
        choices=["earliest", "latest"],
        default="earliest",
        help="--source kafka: where a new checkpoint starts (an existing one resumes)",
    )
    stream.add_argument("--rules", help="rules file to apply before starting")
    stream.add_argument(
        "--trigger",
        choices=["continuous", "available-now"],
        default="continuous",
        help="available-now: process what is there, then stop",
    )
    stream.add_argument("--bucket-seconds", type=int, default=None)
    stream.add_argument(
        "--max-files-per-trigger", type=int, default=None, help="files per micro-batch at most"
    )
    stream.add_argument("--duration", type=float, help="stop after this many seconds")
    stream.set_defaults(run=LazyHandler("stream", "stream"))
    stream_status = sub.add_parser(
        "stream-status", help="the stream's health as JSON; exit 0 healthy, 1 not"
    )
    stream_status.add_argument(
        "--stale-seconds",
        type=int,
        default=None,
        help="heartbeat older than this is stalled (default VELOCITY_STREAM_STALE_SECONDS)",
    )
    stream_status.set_defaults(run=LazyHandler("stream", "stream_status"))
    stream_stop = sub.add_parser(
        "stream-stop", help="ask the running stream to stop after its micro-batch in flight"
    )
    stream_stop.add_argument("--reason", help="recorded in the request and the status file")
    stream_stop.add_argument(
        "--wait", type=float, default=0, help="wait up to this many seconds for it to stop"
    )
    stream_stop.add_argument(
        "--force",
        action="store_true",
        help="SIGKILL it (this host only) if it has not stopped after --wait",
    )
    stream_stop.set_defaults(run=LazyHandler("stream", "stream_stop"))


def _add_watch(sub: _Commands) -> None:
    watch = sub.add_parser("watch", help="print alerts live from the Redis alert stream")
    watch.add_argument("--duration", type=float, help="stop after this many seconds")
    watch.add_argument("--from-start", action="store_true", help="replay the whole stream first")
    watch.add_argument(
        "--shadow", action="store_true", help="the SHADOW rules' alerts (<alert stream>:shadow)"
    )
    watch.set_defaults(run=LazyHandler("alerts", "watch"))


def _add_alerts(sub: _Commands) -> None:
    alerts = sub.add_parser("alerts", help="export the alerts table as JSON lines")
    alerts.add_argument("--out", required=True)
    alerts.add_argument("--kind", choices=["ALERT", "CORRECTION", "RETRACTION"], type=str.upper)
    alerts.set_defaults(run=LazyHandler("alerts", "export_alerts"))


def _add_check(sub: _Commands) -> None:
    check = sub.add_parser(
        "check", help="which rules in force one payment would fire now (read from Redis)"
    )
    check.add_argument("file", nargs="?", help="one JSON event; standard input when absent or -")
    check.set_defaults(run=LazyHandler("check", "check"))


def _add_serve(sub: _Commands) -> None:
    sub.add_parser(
        "serve", help="the HTTP check service (POST /check, /healthz, /metrics) until stopped"
    ).set_defaults(run=LazyHandler("serve", "serve"))


def _add_lookup(sub: _Commands) -> None:
    lookup = sub.add_parser("lookup", help="a rule's window aggregate for a key, from Redis")
    lookup.add_argument("--rule", type=int, required=True, metavar="ID")
    lookup.add_argument("--key", required=True, help="field=value[,field=value]")
    lookup.add_argument("--at", type=int, default=None, help="as of this time (epoch ms)")
    lookup.set_defaults(run=LazyHandler("mirror", "lookup"))


def _add_explain(sub: _Commands) -> None:
    explain = sub.add_parser(
        "explain", help="the events of an alert's window and the figures that make its value"
    )
    explain.add_argument("alert_id", metavar="ALERT_ID")
    explain.add_argument("--json", action="store_true", help="one JSON object")
    explain.set_defaults(run=LazyHandler("alerts", "explain"))


def _add_mirror(sub: _Commands) -> None:
    """`velocity mirror rebuild|migrate|reconcile`."""
    mirror_cmd = sub.add_parser("mirror", help="the Redis mirror of the Delta buckets")
    mirror_sub = mirror_cmd.add_subparsers(
        dest="mirror_command", required=True, parser_class=_Parser
    )
    mirror_sub.add_parser("rebuild", help="refill Redis from Delta").set_defaults(
        run=LazyHandler("mirror", "rebuild")
    )
    mirror_sub.add_parser(
        "migrate",
        help="pack the key states a Velocity before 0.3 wrote as hashes (once, idempotent)",
    ).set_defaults(run=LazyHandler("mirror", "migrate"))
    reconcile = mirror_sub.add_parser(
        "reconcile", help="compare Redis with Delta; exit 1 on drift unless --repair"
    )
    reconcile.add_argument("--repair", action="store_true", help="rewrite Redis from Delta")
    reconcile.set_defaults(run=LazyHandler("mirror", "reconcile"))


def _add_backfill(sub: _Commands) -> None:
    backfill = sub.add_parser(
        "backfill", help="replay a time range: emit CORRECTION / RETRACTION alerts (SPEC §3)"
    )
    backfill.add_argument("--from", dest="from_ms", type=int, help="first eventTime (epoch ms)")
    backfill.add_argument("--to", dest="to_ms", type=int, help="last eventTime (epoch ms)")
    backfill.add_argument(
        "--late", action="store_true", help="the range of the late events no backfill covered"
    )
    backfill.add_argument("--rules", help="only these rule ids, e.g. 1,4 (default: all ACTIVE)")
    backfill.add_argument(
        "--airflow-run",
        help="the Airflow DAG run that runs this backfill, recorded with it (the Velocity "
        "page links the run's figures to it)",
    )
    backfill.set_defaults(run=LazyHandler("backfill", "backfill"))


def _add_maintain(sub: _Commands) -> None:
    """`velocity maintain compact|optimize|vacuum|evict|reconcile|all`."""
    maintain = sub.add_parser(
        "maintain", help="compact, optimize, vacuum, evict, reconcile (or all of them)"
    )
    maintain_sub = maintain.add_subparsers(dest="step", required=True, parser_class=_Parser)
    maintain_sub.add_parser(
        "compact", help="fold sealed g-wide buckets into hour buckets"
    ).set_defaults(run=LazyHandler("maintain", "maintain"))
    maintain_sub.add_parser("optimize", help="OPTIMIZE every live table").set_defaults(
        run=LazyHandler("maintain", "maintain")
    )
    vacuum = maintain_sub.add_parser("vacuum", help="VACUUM every live table")
    vacuum.add_argument(
        "--retention-hours", type=int, default=168, help="keep files younger (at least 168)"
    )
    vacuum.set_defaults(run=LazyHandler("maintain", "maintain"))
    maintain_sub.add_parser(
        "evict", help="drop Delta and Redis buckets outside the horizon"
    ).set_defaults(run=LazyHandler("maintain", "maintain"))
    reconcile_state = maintain_sub.add_parser(
        "reconcile", help="compare Redis with Delta (exit 1 on drift left)"
    )
    reconcile_state.add_argument("--repair", action="store_true", help="rewrite Redis from Delta")
    reconcile_state.set_defaults(run=LazyHandler("maintain", "maintain"))
    every = maintain_sub.add_parser(
        "all",
        help="every step in order in one Spark session (compact, optimize, vacuum, evict, "
        "reconcile --repair), as the maintain_state DAG runs them; exit 1 if drift is left",
    )
    every.add_argument(
        "--retention-hours", type=int, default=168, help="vacuum: keep files younger (at least 168)"
    )
    every.set_defaults(run=LazyHandler("maintain", "maintain"), repair=True)


def _add_quality(sub: _Commands) -> None:
    """`velocity quality check`."""
    quality = sub.add_parser("quality", help="data-quality suites on the live tables")
    quality_sub = quality.add_subparsers(
        dest="quality_command", required=True, parser_class=_Parser
    )
    quality_check = quality_sub.add_parser(
        "check", help="run the suites; exit 1 with a summary when an expectation fails"
    )
    quality_check.add_argument(
        "--suite",
        action="append",
        choices=["all", "events", "quarantine", "buckets", "alerts"],
        help="suite to run (repeatable; default all)",
    )
    quality_check.add_argument("--run-id", help="name of this run (default: time + random)")
    quality_check.set_defaults(run=LazyHandler("quality", "check"))


def main(argv: Sequence[str] | None = None) -> int:
    # Velocity's own progress lines (one per micro-batch) go to standard error.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("velocity").setLevel(logging.INFO)
    try:
        args = build_parser().parse_args(argv)
        # Loaded before any command runs, so a bad setting fails every command the same way.
        args.settings = load_settings(bucket_seconds=getattr(args, "bucket_seconds", None))
        return int(args.run(args))
    except InvalidRuleError as exc:
        print("invalid rules, nothing applied:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except VelocityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
