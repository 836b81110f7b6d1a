"""VelocitySparkSubmitOperator: a velocity command as a Spark application, local or on a cluster."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from velocity.errors import VelocityError
from velocity_airflow import SPARK_CONN_ID, VELOCITY_CONN_ID
from velocity_airflow.hooks import VelocityHook
from velocity_airflow.plans import spark_job

if TYPE_CHECKING:
    from airflow.sdk import Context


def _cli_path() -> str:
    """jobs/velocity/cli/__main__.py of the installed velocity package (the `velocity`
    command as a script file), found without importing the CLI."""
    spec = importlib.util.find_spec("velocity.cli")
    if spec is None or spec.origin is None:
        raise VelocityError(
            f"velocity is not installed in {sys.executable}; run `make setup` and start "
            "Airflow from the project's .venv (infra/airflow.sh does)"
        )
    return str(Path(spec.origin).with_name("__main__.py"))


class VelocitySparkSubmitOperator(SparkSubmitOperator):
    """Run ``velocity <command>`` through spark-submit, so one DAG drives local mode and a cluster.

    The Spark master comes from the Spark connection (``conn_id``, host = the master URL);
    Velocity's settings (data dir, Redis URL, …) from the Velocity connection. The
    application is the velocity CLI module, run by the project's interpreter on the
    driver and the workers; the task fails when the command exits non-zero, with the
    end of its output (Velocity prints a readable summary) in the error.

    :param command: the velocity arguments, e.g. ``["maintain", "compact"]`` (templated;
        an XComArg from a planning task works too).
    :param python: interpreter for the driver and workers; default: the one running Airflow.
    """

    def __init__(
        self,
        *,
        command: Any,
        conn_id: str = SPARK_CONN_ID,
        velocity_conn_id: str = VELOCITY_CONN_ID,
        python: str | None = None,
        spark_binary: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.python = python or sys.executable
        # spark-submit from the same virtualenv as the interpreter: pyspark installs it there.
        binary = spark_binary or str(Path(self.python).with_name("spark-submit"))
        kwargs.setdefault("name", f"velocity-{kwargs.get('task_id', 'job')}")
        super().__init__(
            application="",
            application_args=command,
            conn_id=conn_id,
            spark_binary=binary,
            **kwargs,
        )
        self.spark_conn_id = conn_id
        self.velocity_conn_id = velocity_conn_id
        self.spark_binary_path = binary
        self._prepared = False

    def _spark_master(self) -> str:
        # The provider's own reading of the Spark connection (URL from conn_type, host and
        # port), so the master Velocity is told is the one spark-submit is given.
        probe = SparkSubmitHook(conn_id=self.spark_conn_id, spark_binary=self.spark_binary_path)
        return str(probe._connection["master"])

    def prepare(self) -> None:
        """Fill in the application, environment, JARs and conf from the two connections.

        Runs once per task instance (after templates are rendered); a second call does nothing.
        """
        if self._prepared:
            return
        # Imported here: pyspark is heavy and DAG files import this module when parsed.
        from velocity.spark.session import LOG4J_CONFIG, delta_jars

        velocity = VelocityHook(self.velocity_conn_id, python=self.python)
        settings = velocity.get_conn()
        job = spark_job(
            list(self.application_args or []),
            master=self._spark_master(),
            python=self.python,
            cli_path=_cli_path(),
            settings_env=velocity.velocity_env(),
            jars=delta_jars(settings),
            driver_memory=settings.spark_driver_memory,
            log4j_config=str(LOG4J_CONFIG) if LOG4J_CONFIG.exists() else None,
        )
        self.application = job.application
        self.application_args = job.application_args
        self.env_vars = {**job.env_vars, **(self.env_vars or {})}
        self.conf = {**job.conf, **(self.conf or {})}
        self.jars = ",".join(j for j in (job.jars, self.jars) if j)
        self._prepared = True

    def spark_submit_command(self) -> list[str]:
        """The spark-submit command line this task runs (no process started)."""
        self.prepare()
        return self._get_hook()._build_spark_submit_command(self.application)

    def execute(self, context: Context) -> None:
        self.prepare()
        super().execute(context)
