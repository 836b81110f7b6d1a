"""VelocitySparkSubmitOperator's spark-submit command (compared as lists, as the Spark
provider's own tests do) and VelocityHook's settings and commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.dags.conftest import ROOT

from velocity.errors import UsageError
from velocity.settings import load_settings

VENV_BIN = Path(sys.executable).parent


def _velocity_connection(monkeypatch: pytest.MonkeyPatch, **extra: object) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_VELOCITY_DEFAULT",
        json.dumps({"conn_type": "generic", "extra": json.dumps(extra)}),
    )


def test_spark_submit_command_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from velocity_airflow.operators import VelocitySparkSubmitOperator

    _velocity_connection(
        monkeypatch,
        data_dir=str(tmp_path),
        redis_url="redis://:pw@127.0.0.1:1/0",
        spark_driver_memory="1g",
    )
    operator = VelocitySparkSubmitOperator(task_id="compact", command=["maintain", "compact"])
    jars = ",".join(sorted(str(p) for p in load_settings().jars_dir.glob("*.jar")))
    log4j = ROOT / "infra" / "spark" / "log4j2.properties"

    assert operator.spark_submit_command() == [
        str(VENV_BIN / "spark-submit"),
        "--master",
        "local[2]",
        "--conf",
        "spark.driver.memory=1g",
        "--conf",
        f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:{log4j}",
        "--jars",
        jars,
        "--name",
        "velocity-compact",
        str(ROOT / "jobs" / "velocity" / "cli" / "__main__.py"),
        "maintain",
        "compact",
    ]
    assert "delta-spark" in jars
    assert operator.env_vars == {
        "VELOCITY_DATA_DIR": str(tmp_path),
        "VELOCITY_REDIS_URL": "redis://:pw@127.0.0.1:1/0",
        "VELOCITY_SPARK_DRIVER_MEMORY": "1g",
        "VELOCITY_SPARK_MASTER": "local[2]",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONSAFEPATH": "1",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def test_spark_submit_command_cluster_master_from_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from velocity_airflow.operators import VelocitySparkSubmitOperator

    _velocity_connection(monkeypatch, data_dir=str(tmp_path))
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CLUSTER",
        json.dumps({"conn_type": "spark", "host": "spark://spark-master", "port": 7077}),
    )
    operator = VelocitySparkSubmitOperator(
        task_id="backfill",
        command=["backfill", "--late"],
        conn_id="spark_cluster",
        python="/opt/velocity/bin/python",
        conf={"spark.executor.memory": "2g"},
    )
    command = operator.spark_submit_command()

    assert command[:3] == [
        "/opt/velocity/bin/spark-submit",
        "--master",
        "spark://spark-master:7077",
    ]
    cli = ROOT / "jobs" / "velocity" / "cli" / "__main__.py"
    assert command[-3:] == [str(cli), "backfill", "--late"]
    assert "spark.executor.memory=2g" in command
    assert operator.env_vars["VELOCITY_SPARK_MASTER"] == "spark://spark-master:7077"
    assert operator.env_vars["PYSPARK_PYTHON"] == "/opt/velocity/bin/python"
    assert "SPARK_LOCAL_IP" not in operator.env_vars
    # A second prepare (execute after a command preview) adds nothing twice.
    assert operator.spark_submit_command() == command


def test_hook_settings_from_the_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from velocity_airflow.hooks import VelocityHook

    _velocity_connection(monkeypatch, data_dir=str(tmp_path), bucket_seconds=30)
    hook = VelocityHook()
    assert hook.get_conn().data_dir == tmp_path
    assert hook.get_conn().bucket_seconds == 30
    assert hook.velocity_env()["VELOCITY_DATA_DIR"] == str(tmp_path)


def test_hook_settings_from_the_environment_without_a_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from velocity_airflow.hooks import VelocityHook

    monkeypatch.delenv("AIRFLOW_CONN_VELOCITY_DEFAULT", raising=False)
    monkeypatch.setenv("VELOCITY_DATA_DIR", str(tmp_path / "from-env"))
    assert VelocityHook().get_conn().data_dir == tmp_path / "from-env"


def test_hook_refuses_a_misspelt_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from velocity_airflow.hooks import VelocityHook

    _velocity_connection(monkeypatch, datadir=str(tmp_path))
    with pytest.raises(UsageError, match="datadir"):
        VelocityHook().get_conn()


def test_hook_runs_a_command_with_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from velocity_airflow.hooks import VelocityHook

    _velocity_connection(monkeypatch, data_dir=str(tmp_path / "data"))
    result = VelocityHook().run(
        ["generate", "--out", str(tmp_path / "events"), "--events", "12", "--seed", "3"]
    )
    assert result.returncode == 0, result.stderr
    assert result.summary is not None and result.summary["lines"] == 12
    bad = VelocityHook().run(["rules", "validate", str(tmp_path / "missing.json")])
    assert bad.returncode != 0


def test_a_failed_command_fails_the_task_with_its_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What check_quality relies on: exit 1 fails the task and the error ends with the
    command's own summary. A stand-in spark-submit prints like velocity and exits 1."""
    from airflow.sdk.exceptions import AirflowException

    from velocity_airflow.operators import VelocitySparkSubmitOperator

    _velocity_connection(monkeypatch, data_dir=str(tmp_path / "data"))
    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'echo "args: $*"\n'
        'echo "quality FAILED: 1 of 9 expectations failed"\n'
        'echo "  quarantine: rate 0.31 above 0.05"\n'
        "exit 1\n"
    )
    fake.chmod(0o755)
    operator = VelocitySparkSubmitOperator(
        task_id="quality",
        command=["quality", "check", "--suite", "all"],
        spark_binary=str(fake),
    )
    with pytest.raises(AirflowException) as raised:
        operator.execute(context={})  # type: ignore[arg-type]
    message = str(raised.value)
    assert "Error code is: 1" in message
    assert "quality FAILED: 1 of 9 expectations failed" in message
    assert "quarantine: rate 0.31 above 0.05" in message
    assert "quality check --suite all" in message
