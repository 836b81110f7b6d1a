"""The pure planning code of the Airflow plugins: command lines, summaries, stream policy."""

from __future__ import annotations

import pytest

from velocity.errors import UsageError
from velocity.settings import Settings
from velocity_airflow.plans import (
    MAINTENANCE_COMMAND,
    QUALITY_SUITES,
    StreamAction,
    StreamHealth,
    backfill_args,
    backfill_form_args,
    decide_stream_action,
    parse_summary,
    rule_choices,
    rule_id_text,
    spark_job,
    stream_args,
    stream_health,
    stream_source,
    stream_status_args,
    stream_stop_args,
    velocity_env,
)


def test_backfill_without_a_range_backfills_the_late_events() -> None:
    assert backfill_args() == ["backfill", "--late"]
    assert backfill_args("", "", []) == ["backfill", "--late"]


def test_backfill_range_from_the_form_pickers_and_rules_sorted_without_repeats() -> None:
    # The picker sends UTC ISO strings; the multi-select sends rule ids as strings.
    assert backfill_args(
        "1970-01-01T00:00:00.000Z", "1970-01-01T00:01:00.000Z", ["3", "1", "3"]
    ) == [
        "backfill",
        "--from",
        "0",
        "--to",
        "60000",
        "--rules",
        "1,3",
    ]
    # Callers other than the form may give epoch ms and int ids; a time without an offset
    # is UTC.
    assert backfill_args(5, 5, [2]) == ["backfill", "--from", "5", "--to", "5", "--rules", "2"]
    assert backfill_args("2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00") == [
        "backfill",
        "--from",
        "1767225600000",
        "--to",
        "1767225600000",
    ]


@pytest.mark.parametrize(
    ("from_time", "to_time", "rule_ids", "names"),
    [
        (
            "2026-01-02T00:00:00Z",
            "2026-01-01T00:00:00Z",
            None,
            "From (2026-01-02T00:00:00Z) is after To",
        ),
        (10, None, None, "give both From and To"),
        (None, "2026-01-01T00:00:00Z", None, "give both From and To"),
        (-1, 5, None, "From must be at or after 1970"),
        (
            "yesterday",
            20,
            None,
            "From must be a date-time like 2026-01-01T00:10:00Z, got 'yesterday'",
        ),
        (0, "1969-12-31T23:59:59Z", None, "To must be at or after 1970"),
        (True, 20, None, "From must be a date-time"),
        (0, 10, ["0"], "Rules[0] must be ≥ 1, got 0"),
        (0, 10, ["x"], "Rules[0] must be an integer"),
        (0, 10, [None], "Rules[0] is empty"),
        (0, 10, 7, "Rules must be a list"),
    ],
)
def test_backfill_rejects_bad_forms_naming_the_field(
    from_time: object, to_time: object, rule_ids: object, names: str
) -> None:
    with pytest.raises(UsageError) as raised:
        backfill_args(from_time, to_time, rule_ids)
    assert names in str(raised.value)


def test_the_form_refuses_fields_it_does_not_have_and_times_just_before_1970() -> None:
    with pytest.raises(UsageError, match="unknown field from_ms, to_ms"):
        backfill_form_args({"from_ms": 1, "to_ms": 2, "rule_ids": None})
    assert backfill_form_args({"from_time": None, "to_time": None, "rule_ids": ["2"]}) == [
        "backfill",
        "--late",
        "--rules",
        "2",
    ]
    # The DAG run's id goes with it: the backfill records its figures under it.
    assert backfill_form_args({"rule_ids": None}, "manual__2026-01-01T00:00:00+00:00") == [
        "backfill",
        "--late",
        "--airflow-run",
        "manual__2026-01-01T00:00:00+00:00",
    ]
    with pytest.raises(UsageError, match="From must be at or after 1970"):
        backfill_args("1969-12-31T23:59:59.9995Z", 5)
    with pytest.raises(UsageError, match="Rules\\[0\\] must be an integer"):
        backfill_args(0, 5, ["²"])


def test_a_rule_id_as_text_is_one_to_eighteen_ascii_digits() -> None:
    assert rule_id_text("42") == 42
    assert rule_id_text("9" * 18) == int("9" * 18)
    for not_an_id in ("", " 42", "+4", "-4", "4.0", "²", "٤", "9" * 19, "12\n"):
        assert rule_id_text(not_an_id) is None, not_an_id


def test_the_rule_choices_are_the_ids_the_form_sends_with_their_rules() -> None:
    from tests.builders import make_rule

    rules = [make_rule(ruleId=2), make_rule(ruleId=7, ruleState="PAUSE", windowMinutes=10)]
    ids, labels = rule_choices(rules)
    assert ids == ["2", "7"]
    assert labels["7"] == (
        "7 · PAUSE · SUM(paymentAmount) > 200000 over 10 min by payerId, beneficiaryId"
    )
    candidate = make_rule(ruleId=7, ruleState="SHADOW", windowMinutes=5).with_version(2)
    ids, labels = rule_choices([*rules, candidate])
    assert ids == ["2", "7"], "a rule and its candidate are one choice"
    assert labels["7"].endswith(
        " | SHADOW v2 · SUM(paymentAmount) > 200000 over 5 min by payerId, beneficiaryId"
    )


def test_stream_args() -> None:
    assert stream_args("/in") == ["stream", "--events", "/in"]
    assert stream_args("/in", "r.json", 30) == [
        "stream",
        "--events",
        "/in",
        "--rules",
        "r.json",
        "--duration",
        "30",
    ]
    with pytest.raises(UsageError, match="events_dir is empty"):
        stream_args("")
    with pytest.raises(UsageError, match="duration_seconds must be ≥ 1"):
        stream_args("/in", None, 0)


def test_stream_args_for_a_kafka_topic() -> None:
    assert stream_args("", None, None, "kafka") == ["stream", "--source", "kafka"]
    assert stream_args("/ignored", "r.json", 30, "kafka", "payments") == [
        "stream", "--source", "kafka", "--topic", "payments", "--rules", "r.json",
        "--duration", "30",
    ]  # fmt: skip
    with pytest.raises(UsageError, match="source must be folder or kafka"):
        stream_args("/in", source="s3")


def test_run_stream_restarts_on_the_source_the_stream_read_last() -> None:
    assert stream_source("auto", None) == ("folder", None)
    assert stream_source("auto", "/data/events") == ("folder", None)
    assert stream_source("auto", "kafka://127.0.0.1:9392/payments") == ("kafka", "payments")
    assert stream_source("folder", "kafka://127.0.0.1:9392/payments") == ("folder", None)
    assert stream_source("kafka", None) == ("kafka", None)


def test_maintenance_runs_every_step_once_in_order_and_repairs() -> None:
    from velocity.cli.commands.maintain import MAINTENANCE_ORDER
    from velocity.cli.main import build_parser

    assert MAINTENANCE_COMMAND == ("maintain", "all")
    assert MAINTENANCE_ORDER == ("compact", "optimize", "vacuum", "evict", "reconcile")
    parsed = build_parser().parse_args(list(MAINTENANCE_COMMAND))
    assert parsed.repair is True and parsed.retention_hours == 168


def test_summary_is_the_last_json_object_line() -> None:
    out = 'starting\n{"a": 1}\nnoise {not json}\n[1, 2]\n{"ok": true, "n": 2}\ntrailer\n'
    assert parse_summary(out) == {"ok": True, "n": 2}
    assert parse_summary("no json here\n[1]\n") is None
    assert parse_summary("") is None


def _health(healthy: bool, verdict: str) -> StreamHealth:
    return StreamHealth(healthy=healthy, verdict=verdict, reason="test")


@pytest.mark.parametrize(
    ("healthy", "verdict", "active", "action"),
    [
        (True, "running", 1, StreamAction.HEALTHY),
        (True, "starting", 0, StreamAction.HEALTHY),
        (False, "stopped", 0, StreamAction.LEAVE_STOPPED),
        (False, "stopped", 1, StreamAction.LEAVE_STOPPED),
        (False, "stalled", 0, StreamAction.STOP_AND_RESTART),
        (False, "stalled", 1, StreamAction.STOP_AND_RESTART),
        (False, "dead", 0, StreamAction.RESTART),
        (False, "failed", 0, StreamAction.RESTART),
        (False, "dead", 1, StreamAction.STARTING),
        (False, "failed", 2, StreamAction.STARTING),
        (False, "absent", 0, StreamAction.NOT_STARTED),
        (False, "absent", 1, StreamAction.STARTING),
    ],
)
def test_stream_policy(healthy: bool, verdict: str, active: int, action: StreamAction) -> None:
    assert decide_stream_action(_health(healthy, verdict), active_runs=active) is action


def test_stream_policy_refuses_an_unknown_verdict() -> None:
    with pytest.raises(UsageError, match="'unknown'"):
        decide_stream_action(_health(False, "unknown"), active_runs=0)


def test_stream_health_from_exit_code_and_summary() -> None:
    running = stream_health(0, {"healthy": True, "verdict": "running", "reason": "ok"})
    assert (running.healthy, running.alive, running.verdict) == (True, True, "running")
    stalled = stream_health(1, {"healthy": False, "verdict": "stalled", "reason": "no batch"})
    assert (stalled.healthy, stalled.alive, stalled.reason) == (False, True, "no batch")
    dead = stream_health(1, {"healthy": False, "verdict": "dead", "reason": "pid gone"})
    assert (dead.healthy, dead.alive) == (False, False)
    with pytest.raises(UsageError, match="exited 2"):
        stream_health(2, None)
    with pytest.raises(UsageError, match="without a JSON verdict"):
        stream_health(1, {"reason": "no verdict"})


def test_velocity_env_from_connection_extras() -> None:
    env = velocity_env({"data_dir": "/d", "bucket_seconds": 30}, Settings.model_fields)
    assert env == {"VELOCITY_BUCKET_SECONDS": "30", "VELOCITY_DATA_DIR": "/d"}
    with pytest.raises(UsageError, match=r"unknown Velocity settings \['datadir'\]"):
        velocity_env({"datadir": "/d"}, Settings.model_fields)


def test_spark_job_tells_velocity_the_master_spark_submit_uses() -> None:
    job = spark_job(
        ["maintain", "compact"],
        master="local[2]",
        python="/venv/bin/python",
        cli_path="/src/velocity/cli/__main__.py",
        settings_env={"VELOCITY_DATA_DIR": "/d"},
        jars=["/j/delta-spark.jar", "/j/delta-storage.jar"],
        driver_memory="1g",
        log4j_config="/l/log4j2.properties",
    )
    assert job.application == "/src/velocity/cli/__main__.py"
    assert job.application_args == ["maintain", "compact"]
    assert job.env_vars == {
        "VELOCITY_DATA_DIR": "/d",
        "VELOCITY_SPARK_MASTER": "local[2]",
        "PYSPARK_PYTHON": "/venv/bin/python",
        "PYSPARK_DRIVER_PYTHON": "/venv/bin/python",
        "PYTHONSAFEPATH": "1",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    assert job.conf == {
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=file:/l/log4j2.properties",
    }
    assert job.jars == "/j/delta-spark.jar,/j/delta-storage.jar"
    cluster = spark_job(
        ["stream", "--events", "/in"],
        master="spark://m:7077",
        python="/p",
        cli_path="/c",
        settings_env={},
        jars=[],
        driver_memory="4g",
    )
    assert "SPARK_LOCAL_IP" not in cluster.env_vars
    assert cluster.env_vars["VELOCITY_SPARK_MASTER"] == "spark://m:7077"
    with pytest.raises(UsageError, match="empty velocity command"):
        spark_job(
            [],
            master="local",
            python="p",
            cli_path="c",
            settings_env={},
            jars=[],
            driver_memory="1g",
        )


def test_stream_status_and_stop_args() -> None:
    assert stream_status_args() == ["stream-status"]
    assert stream_status_args(30) == ["stream-status", "--stale-seconds", "30"]
    assert stream_stop_args(60) == ["stream-stop", "--wait", "60"]
    assert stream_stop_args(60, "stalled", force=True) == [
        "stream-stop",
        "--wait",
        "60",
        "--reason",
        "stalled",
        "--force",
    ]


PLANNED_COMMANDS = [
    list(MAINTENANCE_COMMAND),
    *(["quality", "check", "--suite", suite] for suite in QUALITY_SUITES),
    backfill_args(),
    backfill_args(0, 60_000, [4, 1]),
    stream_args("/in", "rules.json", 30),
    stream_status_args(30),
    stream_stop_args(120, "Airflow stop_stream", force=True),
]


@pytest.mark.parametrize("args", PLANNED_COMMANDS, ids=" ".join)
def test_every_planned_command_is_one_velocity_accepts(args: list[str]) -> None:
    """The DAGs' command lines against the real CLI parser: a renamed flag fails here, not
    at 3 a.m. in a scheduled run."""
    from velocity.cli.main import build_parser

    parsed = build_parser().parse_args(args)
    assert callable(parsed.run)
