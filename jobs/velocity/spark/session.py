"""The one way Velocity builds a SparkSession: local or cluster, Delta configured."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from velocity.errors import VelocityError
from velocity.settings import PROJECT_ROOT, Settings, spark_master_on_loopback

LOG4J_CONFIG = PROJECT_ROOT / "infra" / "spark" / "log4j2.properties"

# The JVMs' JIT compiler (setting ``spark_jit``). C1 alone: a micro-batch's planning and
# generated code are new to the JVM again and again, and C2's compiling them was 25 of the
# stream's 47 JVM CPU seconds at 20 000 events/s (thread CPU from /proc), for code no faster
# here. C1 alone also shrinks the JVM's default code cache from 240 MB to 48 MB, which the
# stream filled in about 150 s ("CodeCache is full. Compiler has been disabled."; it levels
# off near 53 MB): from there the JVM interpreted what it had not compiled, and at 1 000
# events/s the alert latency's p99 rose from 1.58 s to 2.17 s over five minutes.
JIT_OPTIONS = {"client": "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m", "tiered": ""}

DELTA_CONFIG = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_jars(settings: Settings) -> list[str]:
    """The Delta JARs fetched into the project cache; a clear error when they are missing."""
    jars = sorted(str(p) for p in settings.jars_dir.glob("*.jar"))
    if not any("delta-spark" in j for j in jars):
        raise VelocityError(
            f"no Delta JARs in {settings.jars_dir}; run `bash infra/fetch_jars.sh` "
            "(or `make setup`) to fetch them once into the project cache"
        )
    return jars


def build_spark(settings: Settings, app_name: str = "velocity") -> SparkSession:
    """A SparkSession with Delta, UTC time, Arrow and the configured master.

    Python workers run this interpreter (PYSPARK_PYTHON), so the workers see the
    same pinned packages as the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if spark_master_on_loopback(settings.spark_master):
        # One machine (local mode, or a cluster on 127.0.0.1): bind the driver to
        # loopback instead of guessing an interface the workers may not reach.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warehouse = settings.data_dir / "spark-warehouse"
    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.jars", ",".join(delta_jars(settings)))
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.executor.memory", settings.spark_executor_memory)
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.default.parallelism", str(settings.spark_shuffle_partitions))
        # VACUUM lists files with this many tasks (10 000 by default: ~36 s of empty tasks
        # per small table on two cores).
        .config(
            "spark.sql.sources.parallelPartitionDiscovery.parallelism",
            str(settings.spark_shuffle_partitions),
        )
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config(
            "spark.driver.extraJavaOptions",
            f"-Dderby.system.home={warehouse} -Dlog4j2.configurationFile=file:{LOG4J_CONFIG} "
            + JIT_OPTIONS[settings.spark_jit],
        )
        .config("spark.executor.extraJavaOptions", JIT_OPTIONS[settings.spark_jit])
    )
    for key, value in DELTA_CONFIG.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.spark_log_level)
    return spark
