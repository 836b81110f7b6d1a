"""What each Velocity task runs, decided without Airflow, Spark or Redis.

Everything here is pure: the DAGs' parameters become ``velocity`` command lines,
a command's stdout becomes its JSON summary, a health report becomes the stream
DAG's next action, and a Spark master plus Velocity's settings become the
environment of a spark-submit. The operators and hooks only carry these out.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from velocity.domain.rules import Rule, rule_summary
from velocity.errors import UsageError
from velocity.operating.stream_control import KafkaSource
from velocity.settings import spark_master_on_loopback

# maintain_state's one task: every `velocity maintain` step in its order (MAINTENANCE_ORDER)
# in one spark-submit, one JVM and Spark session where a task a step started five, a quarter
# of a minute each on two cores. Each step is idempotent, so a retry runs them all again.
MAINTENANCE_COMMAND: Final = ("maintain", "all")

QUALITY_SUITES: Final = ("all", "events", "quarantine", "buckets", "alerts")


def parse_summary(stdout: str) -> dict[str, Any] | None:
    """The command's JSON summary: the last stdout line that is a JSON object, else None.

    Velocity commands print one JSON summary; lines before it (progress, banners) are
    skipped, so a command that also prints text still yields its summary.
    """
    for line in reversed(stdout.splitlines()):
        text = line.strip()
        if not (text.startswith("{") and text.endswith("}")):
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _optional_int(name: str, value: object, minimum: int) -> int | None:
    if value is None or value == "":
        return None
    # bool is an int in Python; a form never means True as a time or rule id.
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer ≥ {minimum} or empty, got {value!r}")
    if value < minimum:
        raise UsageError(f"{name} must be ≥ {minimum}, got {value}")
    return value


def stream_args(
    events_dir: str,
    rules_file: str | None = None,
    duration_seconds: int | None = None,
    source: str = "folder",
    topic: str | None = None,
) -> list[str]:
    """``velocity stream`` for a folder of JSON lines (``events_dir``) or, with ``source``
    kafka, the events topic (``topic``, else the setting); without a duration it runs
    until stopped."""
    if source == "kafka":
        args = ["stream", "--source", "kafka", *(["--topic", topic] if topic else [])]
    elif source != "folder":
        raise UsageError(f"source must be folder or kafka, got {source!r}")
    elif not events_dir:
        raise UsageError("events_dir is empty; name the folder of JSON lines the stream reads")
    else:
        args = ["stream", "--events", events_dir]
    if rules_file:
        args += ["--rules", rules_file]
    seconds = _optional_int("duration_seconds", duration_seconds, 1)
    if seconds is not None:
        args += ["--duration", str(seconds)]
    return args


def stream_source(chosen: str, last: str | None) -> tuple[str, str | None]:
    """(source, topic) for run_stream: the chosen source, or with ``auto`` the one the
    data dir's stream last read (``last``, from its status file), so a restart by
    check_stream reads what its checkpoint read; folder when it never ran."""
    if chosen != "auto":
        return chosen, None
    kafka = KafkaSource.from_text(last)
    return ("folder", None) if kafka is None else ("kafka", kafka.topic)


def stream_status_args(stale_seconds: int | None = None) -> list[str]:
    """``velocity stream-status``, optionally with its own staleness limit."""
    seconds = _optional_int("stale_seconds", stale_seconds, 1)
    return (
        ["stream-status"] if seconds is None else ["stream-status", "--stale-seconds", str(seconds)]
    )


def stream_stop_args(
    wait_seconds: float, reason: str | None = None, force: bool = False
) -> list[str]:
    """``velocity stream-stop`` that waits ``wait_seconds`` for the stream to stop."""
    args = ["stream-stop", "--wait", str(wait_seconds)]
    if reason:
        args += ["--reason", reason]
    return [*args, "--force"] if force else args


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The backfill form's fields; a conf naming anything else is a mistake, not a wish.
BACKFILL_FIELDS = ("from_time", "to_time", "rule_ids")


def event_time_ms(name: str, value: object) -> int | None:
    """A form's date-time as epoch milliseconds: ISO 8601 (``2026-01-01T00:10:00.000Z``,
    the trigger form's picker; without an offset it is UTC), or epoch ms as an integer
    for scripts; None when empty. Raises UsageError naming the field."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise UsageError(f"{name} must be at or after 1970-01-01T00:00:00Z, got {value}")
        return value
    if not isinstance(value, str):
        raise UsageError(f"{name} must be a date-time like 2026-01-01T00:10:00Z, got {value!r}")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise UsageError(
            f"{name} must be a date-time like 2026-01-01T00:10:00Z, got {value!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    # Integer arithmetic: a float timestamp would round 23:59:59.9995 before 1970 to 0.
    ms = (moment - _EPOCH) // timedelta(milliseconds=1)
    if ms < 0:
        raise UsageError(f"{name} must be at or after 1970-01-01T00:00:00Z, got {value!r}")
    return ms


def backfill_args(
    from_time: object = None, to_time: object = None, rule_ids: object = None
) -> list[str]:
    """``velocity backfill`` for the backfill form: an event-time range (both ends
    inclusive), or ``--late`` when both are empty; only the chosen rules, or all.

    Raises UsageError naming the bad field: an unreadable or pre-1970 time, only one end
    of the range, From after To, or rule ids that are not positive integers.
    """
    start = event_time_ms("From", from_time)
    end = event_time_ms("To", to_time)
    if (start is None) != (end is None):
        raise UsageError(
            "give both From and To, or neither to backfill the recorded late events; "
            f"got From={from_time!r}, To={to_time!r}"
        )
    if start is not None and end is not None and start > end:
        raise UsageError(f"From ({from_time}) is after To ({to_time}); swap them")
    if start is None:
        args = ["backfill", "--late"]
    else:
        args = ["backfill", "--from", str(start), "--to", str(end)]
    if rule_ids is None or rule_ids == []:
        return args
    if not isinstance(rule_ids, list | tuple):
        raise UsageError(f"Rules must be a list of rule ids, got {rule_ids!r}")
    ids: list[int] = []
    for index, value in enumerate(rule_ids):
        # The form's multi-select sends ids as strings.
        parsed = rule_id_text(value.strip()) if isinstance(value, str) else None
        rule_id = _optional_int(f"Rules[{index}]", value if parsed is None else parsed, 1)
        if rule_id is None:
            raise UsageError(f"Rules[{index}] is empty; remove it or give a rule id ≥ 1")
        if rule_id not in ids:
            ids.append(rule_id)
    return [*args, "--rules", ",".join(str(i) for i in sorted(ids))]


def rule_id_text(text: str) -> int | None:
    """The rule id a form field or a URL gives as text; None unless it is 1 to 18 ASCII
    digits (no sign, no "²", nothing past a 64-bit id)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def backfill_form_args(params: Mapping[str, object], run_id: str | None = None) -> list[str]:
    """``backfill_args`` of a run's params, and ``--airflow-run`` with the DAG run's id (the
    backfill records it, and the Velocity page finds the run's figures by it); a conf field
    the form does not have (say an old script's ``from_ms``) is refused rather than
    silently ignored."""
    unknown = sorted(set(params) - set(BACKFILL_FIELDS))
    if unknown:
        raise UsageError(
            f"unknown field {', '.join(unknown)}: the backfill form takes From (from_time), "
            "To (to_time) and Rules (rule_ids)"
        )
    args = backfill_args(params.get("from_time"), params.get("to_time"), params.get("rule_ids"))
    return [*args, "--airflow-run", run_id] if run_id else args


def rule_choices(rules: Sequence[Rule]) -> tuple[list[str], dict[str, str]]:
    """The backfill form's rule multi-select: ids (as the form sends them) and their labels.
    A ruleId with a SHADOW candidate is one choice (a backfill of it replays both)."""
    labels: dict[str, str] = {}
    for rule in rules:
        rule_id = str(rule.rule_id)
        if rule_id in labels:
            labels[rule_id] += f" | {rule.state.value} v{rule.version} · {rule_summary(rule)}"
        else:
            labels[rule_id] = f"{rule_id} · {rule.state.value} · {rule_summary(rule)}"
    return list(labels), labels


class StreamAction(StrEnum):
    """What check_stream does after reading the stream's health."""

    HEALTHY = "healthy"  # starting or running: nothing to do
    LEAVE_STOPPED = "leave_stopped"  # it stopped because it was asked to (stop_stream, --duration)
    NOT_STARTED = "not_started"  # it never ran with this data dir: starting it is run_stream's job
    STARTING = "starting"  # a run_stream run is queued or under way: wait for the next check
    RESTART = "restart"  # dead or failed: start run_stream, which resumes from the checkpoint
    STOP_AND_RESTART = "stop_and_restart"  # stalled: ask it to stop, then start run_stream


# `velocity stream-status` verdicts (velocity.operating.health) that mean a stream process
# may be alive.
ALIVE_VERDICTS: Final = frozenset({"starting", "running", "stalled"})


@dataclass(frozen=True)
class StreamHealth:
    """The stream's health as `velocity stream-status` reports it."""

    healthy: bool
    verdict: str
    reason: str
    summary: Mapping[str, Any] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.verdict in ALIVE_VERDICTS


def stream_health(returncode: int, summary: Mapping[str, Any] | None) -> StreamHealth:
    """Read `velocity stream-status`: exit 0 healthy, 1 not, with its JSON verdict and reason."""
    if returncode not in (0, 1) or not summary or not isinstance(summary.get("verdict"), str):
        raise UsageError(
            f"velocity stream-status exited {returncode} without a JSON verdict "
            f"(expected exit 0 or 1 and a JSON line with 'verdict'); got {summary!r}"
        )
    return StreamHealth(
        healthy=returncode == 0,
        verdict=str(summary["verdict"]),
        reason=str(summary.get("reason", "")),
        summary=dict(summary),
    )


def decide_stream_action(health: StreamHealth, *, active_runs: int) -> StreamAction:
    """check_stream's policy, from the verdict and the run_stream runs queued or running.

    healthy → nothing. ``stopped`` → leave it: someone or something asked (stop_stream,
    `velocity stream-stop`, a duration). ``stalled`` → stop it, then start again.
    ``dead`` / ``failed`` → start run_stream (it resumes from the checkpoint) unless a
    run is already queued or running, and ``absent`` → nothing (a stream that never ran
    is started by run_stream, not by a health check). Any other verdict is an error.
    """
    if health.healthy:
        return StreamAction.HEALTHY
    match health.verdict:
        case "stopped":
            return StreamAction.LEAVE_STOPPED
        case "stalled":
            return StreamAction.STOP_AND_RESTART
        case "dead" | "failed":
            return StreamAction.STARTING if active_runs > 0 else StreamAction.RESTART
        case "absent":
            return StreamAction.STARTING if active_runs > 0 else StreamAction.NOT_STARTED
    raise UsageError(
        f"stream-status verdict {health.verdict!r} ({health.reason}) is not one check_stream "
        "knows; look at <data dir>/status/stream.json"
    )


def velocity_env(extra: Mapping[str, Any], known: Collection[str]) -> dict[str, str]:
    """``VELOCITY_<NAME>`` variables from a connection's extras named like Velocity settings.

    Unknown names are refused (a typo such as ``datadir`` would otherwise be ignored and
    the task would silently use the default data dir).
    """
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise UsageError(
            f"connection extra names unknown Velocity settings {unknown}; "
            f"use the settings' names: {sorted(known)}"
        )
    return {f"VELOCITY_{name.upper()}": str(value) for name, value in sorted(extra.items())}


@dataclass(frozen=True)
class SparkJob:
    """One spark-submit of the velocity CLI: what SparkSubmitOperator is given."""

    application: str
    application_args: list[str]
    env_vars: dict[str, str]
    conf: dict[str, str]
    jars: str


def spark_job(
    command: Sequence[str],
    *,
    master: str,
    python: str,
    cli_path: str,
    settings_env: Mapping[str, str],
    jars: Sequence[str],
    driver_memory: str,
    log4j_config: str | None = None,
) -> SparkJob:
    """The spark-submit of ``velocity <command>`` on ``master``.

    The driver and the Python workers run ``python`` (the project's interpreter, with
    the locked packages); VELOCITY_SPARK_MASTER repeats the master so that Velocity's
    session builder, which sets ``.master`` from its settings, agrees with spark-submit.
    The Delta JARs and the driver memory go to spark-submit itself: in client mode the
    driver JVM is already running when the application builds its session.
    """
    if not command:
        raise UsageError("empty velocity command; name a subcommand, e.g. ['maintain', 'compact']")
    env = {
        **settings_env,
        "VELOCITY_SPARK_MASTER": master,
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
        # spark-submit runs cli/__main__.py as a script, so Python would put its folder
        # (jobs/velocity/cli/) first on sys.path, where the CLI's own modules (main,
        # shared, commands) would pass for top-level ones. PYTHONSAFEPATH (3.11+) leaves
        # it off: the script imports the installed velocity package like any caller.
        "PYTHONSAFEPATH": "1",
    }
    if spark_master_on_loopback(master):
        # One machine (local mode or a cluster on 127.0.0.1): bind Spark to loopback
        # instead of guessing an interface.
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
    conf = {"spark.driver.memory": driver_memory}
    if log4j_config:
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j_config}"
    return SparkJob(
        application=cli_path,
        application_args=[str(a) for a in command],
        env_vars=env,
        conf=conf,
        jars=",".join(jars),
    )
