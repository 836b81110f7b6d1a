"""The `velocity` console script as a user runs it: real processes, exit codes, messages."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import SPEC_ALERT_FIELDS
from tests.conftest import FAST_JVM, free_port_pair
from velocity.kafka.topics import cluster_id_of
from velocity.resources import sample_rules_path

VELOCITY = str(Path(sys.executable).parent / "velocity")


def run(*args: str, data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VELOCITY, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "VELOCITY_DATA_DIR": str(data_dir), **env},
        timeout=600,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_rules_validate_ok_and_bad(tmp_path: Path) -> None:
    ok = run("rules", "validate", str(sample_rules_path()), data_dir=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "8 valid" in ok.stdout

    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            [
                {
                    "ruleId": 7,
                    "ruleState": "ACTIVE",
                    "groupingKeyNames": ["cardId"],
                    "aggregatorFunctionType": "SUM",
                    "aggregateFieldName": "ip",
                    "limitOperatorType": ">",
                    "limit": 5,
                    "windowMinutes": 0,
                },
                {
                    "ruleId": 8,
                    "ruleState": "ACTIVE",
                    "groupingKeyNames": [],
                    "aggregatorFunctionType": "COUNT",
                    "limitOperatorType": "about",
                    "limit": 5,
                    "windowMinutes": 5,
                },
            ]
        )
    )
    result = run("rules", "validate", str(bad), data_dir=tmp_path)
    assert result.returncode == 2
    for field in (
        "groupingKeyNames[0]",
        "aggregateFieldName",
        "windowMinutes",
        "limitOperatorType",
    ):
        assert f"'{field}'" in result.stderr, result.stderr
    assert "ruleId 8" in result.stderr and "ruleId 7" in result.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert (
        run("rules", "validate", str(tmp_path / "missing.json"), data_dir=tmp_path).returncode == 2
    )
    assert run("frobnicate", data_dir=tmp_path).returncode == 2
    bad_setting = run(
        "rules",
        "validate",
        str(sample_rules_path()),
        data_dir=tmp_path,
        VELOCITY_BUCKET_SECONDS="7",
    )
    assert bad_setting.returncode == 2 and "bucket_seconds" in bad_setting.stderr
    # A malformed payment is named and nothing is checked (no Redis is reached).
    payment = tmp_path / "payment.json"
    fields = {"transactionId": "t", "eventTime": 1, "payerId": "p", "beneficiaryId": "b"}
    payment.write_text(json.dumps(fields | {"paymentAmount": -3, "paymentType": "CRD"}))
    for bad in (
        run("check", str(payment), data_dir=tmp_path),
        run("check", "-", data_dir=tmp_path),
    ):
        assert bad.returncode == 2, bad.stderr
    assert "paymentAmount" in run("check", str(payment), data_dir=tmp_path).stderr


@pytest.mark.spark
def test_rules_apply_is_all_or_nothing_and_backtest_uses_rules_in_force(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert run("rules", "apply", str(sample_rules_path()), data_dir=data).returncode == 0

    mixed = tmp_path / "mixed.json"
    sample = json.loads(sample_rules_path().read_text())
    mixed.write_text(json.dumps([sample[0] | {"limit": 1}, sample[1] | {"windowMinutes": -1}]))
    rejected = run("rules", "apply", str(mixed), data_dir=data)
    assert rejected.returncode == 2 and "'windowMinutes'" in rejected.stderr

    paused = run("rules", "pause", "4", data_dir=data)
    assert paused.returncode == 0 and "ruleId 4: version 2 PAUSE" in paused.stdout
    assert run("rules", "delete", "99", data_dir=data).returncode == 2

    listed = run("rules", "list", data_dir=data)
    in_force = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["ruleId"], r["version"]) for r in in_force] == [
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 2),
        (5, 1),
        (6, 1),
        (7, 1),
        (8, 1),
    ]
    assert in_force[0]["limit"] == 200000, "the rejected file changed nothing"

    events = tmp_path / "events"
    generated = run(
        "generate",
        "--out",
        str(events),
        "--events",
        "3000",
        "--keys",
        "30",
        "--rate",
        "2",
        "--seed",
        "5",
        "--malformed-fraction",
        "0.01",
        data_dir=data,
    )
    assert generated.returncode == 0, generated.stderr
    out = tmp_path / "alerts.jsonl"
    backtest = run(
        "backtest", "--events", str(events), "--out", str(out), data_dir=data, **FAST_JVM
    )
    assert backtest.returncode == 0, backtest.stderr
    assert "quarantined" in backtest.stdout and str(out) in backtest.stdout
    alerts = [json.loads(line) for line in out.read_text().splitlines()]
    assert alerts, "the sample rules fire on generated spikes"
    # SPEC §4's fields, plus the cooldown's two on a suppressed alert (rules 4, 5, 7).
    suppressed = {"suppressed", "suppressedBy"}
    assert all(set(a) - suppressed == SPEC_ALERT_FIELDS for a in alerts)
    assert all(a["suppressed"] is True for a in alerts if "suppressed" in a)
    assert 4 not in {a["ruleId"] for a in alerts}, "a paused rule raises no alert"
    assert {a["ruleVersion"] for a in alerts} == {1}

    exported = run("rules", "export", data_dir=data)
    assert [r["ruleId"] for r in json.loads(exported.stdout)] == [1, 2, 3, 4, 5, 6, 7, 8]
    activated = run("rules", "activate", "4", data_dir=data)
    assert activated.returncode == 0 and "ruleId 4: version 3 ACTIVE" in activated.stdout


@pytest.mark.redis
@pytest.mark.kafka
def test_up_prints_redis_url_and_kafka_bootstrap_and_down_stops_both(tmp_path: Path) -> None:
    url = f"redis://:cli-secret@127.0.0.1:{free_port()}/0"
    bootstrap = f"127.0.0.1:{free_port_pair()}"
    env = {"VELOCITY_REDIS_URL": url, "VELOCITY_KAFKA_BOOTSTRAP": bootstrap}
    try:
        up = run("up", data_dir=tmp_path, **env)
        assert up.returncode == 0, up.stderr
        lines = [line.strip() for line in up.stdout.splitlines()]
        assert url in lines and f"bootstrap.servers={bootstrap}" in lines
        import redis

        assert redis.Redis.from_url(url).ping() is True
        again = run("up", data_dir=tmp_path, **env)
        assert again.returncode == 0 and "kafka 4.1.1 already running" in again.stdout
        assert cluster_id_of(bootstrap, timeout_seconds=10) is not None
    finally:
        down = run("down", data_dir=tmp_path, **env)
    assert down.returncode == 0, down.stderr
    assert "kafka stopped" in down.stdout and "redis stopped" in down.stdout
    assert cluster_id_of(bootstrap, timeout_seconds=2) is None
