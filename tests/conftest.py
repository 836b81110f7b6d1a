"""Shared fixtures: one real local Spark session with Delta for the whole run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from velocity.settings import Settings, load_settings


@pytest.fixture(scope="session")
def spark_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return load_settings(
        data_dir=tmp_path_factory.mktemp("velocity-data"),
        spark_master="local[2]",
        spark_shuffle_partitions=2,
        spark_driver_memory="2g",
    )


@pytest.fixture(scope="session")
def spark(spark_settings: Settings) -> Iterator[object]:
    """A real SparkSession (local[2], UI off, 2 shuffle partitions, Delta configured)."""
    from velocity.spark.session import build_spark

    session = build_spark(spark_settings, "velocity-tests")
    yield session
    session.stop()


@pytest.fixture
def data_settings(tmp_path: Path, spark_settings: Settings) -> Settings:
    """Settings whose data dir is this test's own, so tests never share Delta state."""
    return spark_settings.model_copy(update={"data_dir": tmp_path / "data"})
