"""The check service's parts that need no server: the bearer header, the token kept in the
data dir, the token setting, the reader's URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from velocity.errors import SettingsError, UsageError
from velocity.redis.connection import with_user
from velocity.serving.app import bearer_token
from velocity.serving.service import service_token, service_url, token_path
from velocity.settings import load_settings

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("BEARER abc", "abc"),
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic abc", None),
        ("abc", None),
    ],
)
def test_the_bearer_token_of_a_header(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_without_a_token_setting_one_is_drawn_once_and_kept_for_the_owner(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data", check_token="")
    token, path = service_token(settings)
    assert path == token_path(settings) == tmp_path / "data" / "serve" / "check-token"
    assert len(token) >= 40 and path.read_text() == token + "\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert service_token(settings) == (token, path)  # kept, not drawn again
    other = load_settings(data_dir=tmp_path / "other", check_token="")
    assert service_token(other)[0] != token  # data dirs never share it


def test_a_token_setting_wins_and_no_file_is_written(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data", check_token="sixteen-chars-ok")
    assert service_token(settings) == ("sixteen-chars-ok", None)
    assert not token_path(settings).exists()


def test_a_short_token_is_refused_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VELOCITY_CHECK_TOKEN", "short")
    with pytest.raises(SettingsError, match=r"check_token: .*at least 16 characters"):
        load_settings()
    monkeypatch.delenv("VELOCITY_CHECK_TOKEN")
    settings = load_settings(data_dir=tmp_path / "data", check_token="")
    token_path(settings).parent.mkdir(parents=True)
    token_path(settings).write_text("short\n")
    with pytest.raises(UsageError, match="delete the file"):
        service_token(settings)


def test_the_service_listens_on_loopback_port_9394_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VELOCITY_CHECK_PORT")  # the tests' own 0 (tests/conftest.py)
    settings = load_settings(data_dir=tmp_path)
    assert (settings.check_host, settings.check_port) == ("127.0.0.1", 9394)
    assert service_url(settings) == "http://127.0.0.1:9394"
    assert service_url(settings.model_copy(update={"check_host": "::1"})) == "http://[::1]:9394"


def test_the_readers_url_replaces_the_credentials_and_keeps_the_rest() -> None:
    assert (
        with_user("redis://:p%40ss@10.0.0.5:6391/2", "velocity-reader", "r:d/@")
        == "redis://velocity-reader:r%3Ad%2F%40@10.0.0.5:6391/2"
    )
    assert with_user("rediss://u:p@h:1/0", "a", "b") == "rediss://a:b@h:1/0"
    assert with_user("redis://h:1/0", "a", "b") == "redis://a:b@h:1/0"
