"""Settings: VELOCITY_* environment variables, the VELOCITY_CONFIG TOML file, precedence."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from velocity.errors import SettingsError, UsageError
from velocity.redis.keys import default_prefix
from velocity.settings import (
    PROJECT_ROOT,
    Settings,
    alert_retention,
    load_settings,
    local_mode_cores,
    spark_master_on_loopback,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No VELOCITY_* variable of the surrounding shell leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("VELOCITY_"):
            monkeypatch.delenv(name)


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "velocity.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    settings = load_settings()
    assert settings.bucket_seconds == 60
    assert settings.bucket_width_ms == 60_000
    assert settings.allowed_lateness_seconds == 300
    assert settings.allowed_lateness_ms == 300_000
    assert settings.redis_alert_stream == "" and settings.redis_key_prefix == ""
    assert settings.redis_keys.prefix == default_prefix(str(settings.data_dir))
    assert settings.alert_stream == settings.redis_keys.prefix + ":alerts"
    assert settings.data_dir == (PROJECT_ROOT / "data").resolve()
    assert settings.data_dir.is_absolute()


def test_data_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VELOCITY_DATA_DIR", str(tmp_path / "state"))
    settings = load_settings()
    assert settings.data_dir == (tmp_path / "state").resolve()
    assert settings.table_path("alerts") == (tmp_path / "state").resolve() / "tables" / "alerts"


def test_relative_data_dir_is_made_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VELOCITY_DATA_DIR", "rel/data")
    assert load_settings().data_dir == tmp_path.resolve() / "rel" / "data"


@pytest.mark.parametrize("seconds", [1, 2, 5, 10, 15, 20, 30, 60])
def test_bucket_seconds_from_environment(monkeypatch: pytest.MonkeyPatch, seconds: int) -> None:
    monkeypatch.setenv("VELOCITY_BUCKET_SECONDS", str(seconds))
    settings = load_settings()
    assert settings.bucket_seconds == seconds
    assert settings.bucket_width_ms == seconds * 1000


@pytest.mark.parametrize("bad", ["7", "0", "120", "abc"])
def test_bad_bucket_seconds_is_a_settings_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("VELOCITY_BUCKET_SECONDS", bad)
    with pytest.raises(SettingsError, match="bucket_seconds") as caught:
        load_settings()
    assert isinstance(caught.value, UsageError)  # exit code 2


def test_bad_bucket_seconds_message_lists_the_allowed_widths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VELOCITY_BUCKET_SECONDS", "7")
    with pytest.raises(SettingsError, match=r"\[1, 2, 5, 10, 15, 20, 30, 60\]"):
        load_settings()


def test_redis_url_and_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VELOCITY_REDIS_URL", "redis://:s3cret@redis.internal:7000/2")
    settings = load_settings()
    assert settings.redis_url == "redis://:s3cret@redis.internal:7000/2"
    assert settings.redis_address == ("redis.internal", 7000, "s3cret")


def test_percent_encoded_redis_password_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VELOCITY_REDIS_URL", "redis://:p%40ss%3Aword@127.0.0.1:6391/0")
    assert load_settings().redis_address == ("127.0.0.1", 6391, "p@ss:word")


def test_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        f'data_dir = "{tmp_path / "from-file"}"\nbucket_seconds = 10\n'
        'redis_alert_stream = "alerts:file"\n',
    )
    monkeypatch.setenv("VELOCITY_CONFIG", str(config))
    settings = load_settings()
    assert settings.data_dir == (tmp_path / "from-file").resolve()
    assert settings.bucket_seconds == 10
    assert settings.redis_alert_stream == "alerts:file"


def test_environment_overrides_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = write_config(tmp_path, f'data_dir = "{tmp_path / "from-file"}"\nbucket_seconds = 10\n')
    monkeypatch.setenv("VELOCITY_CONFIG", str(config))
    monkeypatch.setenv("VELOCITY_BUCKET_SECONDS", "30")
    settings = load_settings()
    assert settings.bucket_seconds == 30
    assert settings.data_dir == (tmp_path / "from-file").resolve()


def test_explicit_arguments_override_environment_and_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = write_config(tmp_path, "bucket_seconds = 10\n")
    monkeypatch.setenv("VELOCITY_CONFIG", str(config))
    monkeypatch.setenv("VELOCITY_BUCKET_SECONDS", "30")
    assert load_settings(bucket_seconds=5).bucket_seconds == 5
    assert load_settings(bucket_seconds=None).bucket_seconds == 30  # None means "not given"


def test_bad_value_in_config_file_is_a_settings_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VELOCITY_CONFIG", str(write_config(tmp_path, "bucket_seconds = 7\n")))
    with pytest.raises(SettingsError, match="bucket_seconds"):
        load_settings()


def test_unknown_key_in_config_file_is_a_settings_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VELOCITY_CONFIG", str(write_config(tmp_path, "bucket_secs = 10\n")))
    with pytest.raises(SettingsError, match="bucket_secs"):
        load_settings()


def test_missing_config_file_is_a_settings_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.toml"
    monkeypatch.setenv("VELOCITY_CONFIG", str(missing))
    with pytest.raises(SettingsError, match=r"nowhere\.toml"):
        load_settings()


def test_invalid_toml_is_a_settings_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VELOCITY_CONFIG", str(write_config(tmp_path, "bucket_seconds = = 1\n")))
    with pytest.raises(SettingsError, match="TOML"):
        load_settings()


def test_negative_lateness_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VELOCITY_ALLOWED_LATENESS_SECONDS", "-1")
    with pytest.raises(SettingsError, match="allowed_lateness_seconds"):
        load_settings()


def test_two_data_dirs_give_distinct_table_paths(tmp_path: Path) -> None:
    first = Settings(data_dir=tmp_path / "a")
    second = Settings(data_dir=tmp_path / "b")
    assert first.table_path("events") != second.table_path("events")
    assert first.table_path("events").is_relative_to(first.data_dir)


@pytest.mark.parametrize(
    ("master", "on_loopback"),
    [
        ("local[2]", True),
        ("local[*]", True),
        ("spark://127.0.0.1:7077", True),
        ("spark://localhost:7077", True),
        ("spark://spark-master:7077", False),
        ("spark://10.0.0.5:7077", False),
        ("yarn", False),
    ],
)
def test_spark_master_on_loopback(master: str, on_loopback: bool) -> None:
    """The driver binds to loopback exactly when the master runs on this machine."""
    assert spark_master_on_loopback(master) is on_loopback


@pytest.mark.parametrize(
    ("master", "cores"),
    [
        ("local", 1),
        ("local[2]", 2),
        ("local[3,4]", 3),
        ("local[*]", os.cpu_count()),
        ("spark://127.0.0.1:7077", None),
        ("yarn", None),
        ("local-cluster[2,1,1024]", None),
    ],
)
def test_local_mode_cores(master: str, cores: int | None) -> None:
    assert local_mode_cores(master) == cores


def test_the_metrics_port_is_9391_by_default_0_for_none_and_a_real_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().metrics_port == 9391
    monkeypatch.setenv("VELOCITY_METRICS_PORT", "0")
    assert load_settings().metrics_port == 0  # no metrics server
    monkeypatch.setenv("VELOCITY_METRICS_PORT", "70000")
    with pytest.raises(SettingsError, match="metrics_port"):
        load_settings()


@pytest.mark.parametrize(
    ("text", "trim"),
    [("1000000", "1000000"), ("1000", "1000"), ("90m", "age:5400000"), ("24h", "age:86400000"),
     ("7d", "age:604800000"), (" 2h ", "age:7200000")],
)  # fmt: skip
def test_the_alert_streams_retention_is_entries_or_an_age(text: str, trim: str) -> None:
    assert alert_retention(text) == trim
    assert load_settings(redis_alert_stream_retention=text).alert_stream_retention == trim


@pytest.mark.parametrize(
    ("text", "says"),
    [("999", "at least 1000 entries"), ("0m", "at least 1m"), ("24 hours", "neither"),
     ("1.5h", "neither"), ("", "neither")],
)  # fmt: skip
def test_an_alert_stream_retention_that_keeps_too_little_or_reads_as_nothing_is_refused(
    text: str, says: str
) -> None:
    with pytest.raises(SettingsError, match=says):
        load_settings(redis_alert_stream_retention=text)
