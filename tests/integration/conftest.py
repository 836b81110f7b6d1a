"""Fixtures of the tests that need Redis alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from velocity.redis import connection
from velocity.settings import Settings, load_settings


@pytest.fixture
def settings(redis_url: str, tmp_path: Path) -> Settings:
    """A data dir on the session's Redis, emptied, with the Functions loaded."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    connection.load_functions(client)
    return load_settings(data_dir=tmp_path / "data", redis_url=redis_url)
