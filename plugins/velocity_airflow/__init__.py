"""Velocity's Airflow operators and hooks; the DAG files in ``dags/`` only wire them.

Airflow puts the plugins folder on ``sys.path``, so DAGs import ``velocity_airflow``.
Imports point one way: ``dags`` → ``velocity_airflow`` → ``velocity``; the pure
planning code (``velocity_airflow.plans``) imports nothing of Airflow, Spark or Redis.
"""

from __future__ import annotations

from typing import Final

# The Spark connection: its host is the Spark master (``local[2]``, ``spark://host:7077``,
# ``yarn``, ``k8s://…``); infra/airflow.sh creates it.
SPARK_CONN_ID: Final = "velocity_spark"
# Velocity's own settings for the tasks (extras ``data_dir``, ``redis_url``, …).
VELOCITY_CONN_ID: Final = "velocity_default"
# One Spark batch job at a time beside the stream: two cores cannot run more.
SPARK_BATCH_POOL: Final = "velocity_spark"
