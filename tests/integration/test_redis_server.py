"""The local Redis of `velocity up` / `velocity down`: pure config checks, then the real server.

The server tests run Debian's real redis-server (installed with apt-get when missing) on a
free port under a temporary data dir; fakeredis would hide the 7.0 limits (DESIGN.md).
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from velocity.errors import UsageError, VelocityError
from velocity.redis import server as server_module
from velocity.redis.server import (
    LocalRedis,
    ensure_redis_server,
    install_commands,
    local_redis,
    parse_server_version,
    redis_down,
    redis_up,
    render_config,
    server_command,
)
from velocity.settings import Settings

# Characters that need quoting in redis.conf and percent-encoding in the URL.
PASSWORD = 'pa ss"w\\rd@/:1'


def settings_for(data_dir: Path, url: str) -> Settings:
    return Settings(data_dir=data_dir, redis_url=url)


def url_for(port: int, password: str = PASSWORD, host: str = "127.0.0.1") -> str:
    return f"redis://:{quote(password, safe='')}@{host}:{port}/0"


# -- pure: no server ------------------------------------------------------------------------


def test_local_redis_reads_the_url_and_places_files_under_the_data_dir(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, url_for(6400))
    server = local_redis(settings)
    assert server == LocalRedis(
        "127.0.0.1", 6400, PASSWORD, 0, tmp_path.resolve() / "redis",
        "velocity-reader-local", settings.redis_keys.prefix,
    )  # fmt: skip
    assert server.url == url_for(6400)
    assert redis.connection.parse_url(server.url)["password"] == PASSWORD


def test_localhost_binds_the_ipv4_loopback(tmp_path: Path) -> None:
    server = local_redis(settings_for(tmp_path, "redis://:pw@localhost:6401/2"))
    assert (server.host, server.port, server.db) == ("127.0.0.1", 6401, 2)
    assert server.url == "redis://:pw@127.0.0.1:6401/2"
    assert local_redis(settings_for(tmp_path, "redis://:pw@[::1]:6401/0")).url == (
        "redis://:pw@[::1]:6401/0"
    )


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis://:pw@10.1.2.3:6391/0", "not a loopback address"),
        ("redis://:pw@redis.example.com:6391/0", "not a loopback address"),
        ("redis://:pw@0.0.0.0:6391/0", "not a loopback address"),
        ("redis://127.0.0.1:6391/0", "has no password"),
        ("rediss://:pw@127.0.0.1:6391/0", "must start with redis://"),
        ("redis://:pw@127.0.0.1:6391/x", "names database 'x'"),
    ],
)
def test_urls_that_up_cannot_manage_are_usage_errors(
    tmp_path: Path, url: str, fragment: str
) -> None:
    with pytest.raises(UsageError, match=fragment) as raised:
        local_redis(settings_for(tmp_path, url))
    assert ":pw@" not in str(raised.value)  # the password is never echoed


def test_up_refuses_a_remote_host_before_touching_anything(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="only manage a local Redis"):
        redis_up(settings_for(tmp_path, "redis://:pw@192.0.2.10:6391/0"))
    assert not (tmp_path / "redis").exists()


def test_render_config(tmp_path: Path) -> None:
    server = LocalRedis("127.0.0.1", 6402, PASSWORD, 0, tmp_path / "redis")
    home = tmp_path / "redis"
    lines = render_config(server).splitlines()
    for expected in [
        "bind 127.0.0.1",
        "port 6402",
        "protected-mode yes",
        'requirepass "pa ss\\"w\\\\rd@/:1"',
        "daemonize yes",
        f'pidfile "{home}/redis.pid"',
        f'logfile "{home}/redis.log"',
        f'dir "{home}"',
        "appendonly yes",
        'save ""',
    ]:
        assert expected in lines
    assert sum(line.startswith("bind ") for line in lines) == 1
    reader = [line for line in lines if line.startswith("user ")]
    assert len(reader) == 1 and reader[0].startswith('user velocity-reader on ">')
    assert "%R~velocity:*" in reader[0] and "-@all" in reader[0] and "+fcall_ro" in reader[0]


def test_render_config_refuses_control_characters(tmp_path: Path) -> None:
    server = LocalRedis("127.0.0.1", 6402, "pw\nport 1", 0, tmp_path)
    with pytest.raises(UsageError, match="control character"):
        render_config(server)


def test_server_command(tmp_path: Path) -> None:
    server = LocalRedis("127.0.0.1", 6402, "pw", 0, tmp_path / "redis")
    assert server_command(Path("/usr/bin/redis-server"), server) == [
        "/usr/bin/redis-server",
        str(tmp_path / "redis" / "redis.conf"),
    ]


def test_install_commands() -> None:
    apt = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
    assert install_commands(is_root=True, has_sudo=False) == [
        [*apt, "update"],
        [*apt, "install", "-y", "redis-server"],
    ]
    assert install_commands(is_root=False, has_sudo=True)[1] == [
        "sudo",
        "-n",
        *apt,
        "install",
        "-y",
        "redis-server",
    ]
    with pytest.raises(VelocityError, match="needs root"):
        install_commands(is_root=False, has_sudo=False)


def test_parse_server_version() -> None:
    text = "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d"
    assert parse_server_version(text) == (7, 0, 15)
    assert parse_server_version("something else") is None


def test_ensure_installs_with_apt_get_only_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    found: list[Path | None] = [None, Path("/usr/bin/redis-server")]
    ran: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="Redis server v=7.0.15", stderr="")

    monkeypatch.setattr(server_module, "find_redis_server", lambda: found.pop(0))
    monkeypatch.setattr(server_module.os, "geteuid", lambda: 0)
    assert ensure_redis_server(run=fake_run) == Path("/usr/bin/redis-server")
    assert [c[-2:] for c in ran] == [
        ["apt-get", "update"],
        ["-y", "redis-server"],
        ["/usr/bin/redis-server", "--version"],
    ]

    ran.clear()
    monkeypatch.setattr(server_module, "find_redis_server", lambda: Path("/opt/redis-server"))
    assert ensure_redis_server(run=fake_run) == Path("/opt/redis-server")
    assert ran == [["/opt/redis-server", "--version"]]


def test_ensure_refuses_redis_older_than_7(monkeypatch: pytest.MonkeyPatch) -> None:
    def old(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 0, stdout="Redis server v=6.2.14", stderr="")

    monkeypatch.setattr(server_module, "find_redis_server", lambda: Path("/usr/bin/redis-server"))
    with pytest.raises(VelocityError, match=r"needs Redis >= 7\.0"):
        ensure_redis_server(run=old)


# -- the real server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_binary() -> Path:
    """The real redis-server, installed with apt-get (after apt-get update) when missing."""
    return ensure_redis_server()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def local(tmp_path: Path, redis_binary: Path) -> Iterator[Settings]:
    settings = settings_for(tmp_path / "data", url_for(free_port()))
    yield settings
    redis_down(settings)  # never leave a server behind, even when the test failed


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def process_gone(pid: int) -> bool:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat_line.rsplit(")", 1)[1].split()[0] == "Z"  # an unreaped zombie has exited


@pytest.mark.redis
def test_up_ping_idempotent_down(local: Settings) -> None:
    port = local_redis(local).port
    status = redis_up(local)
    assert status.started is True
    assert status.url == url_for(port)
    assert status.version is not None and status.version.startswith("7.")
    # It runs ahead of batch work on shared cores (raising a priority needs root).
    assert status.pid is not None
    if os.geteuid() == 0:
        assert os.getpriority(os.PRIO_PROCESS, status.pid) == local.serving_nice
        assert os.sched_getscheduler(status.pid) == os.SCHED_RR | os.SCHED_RESET_ON_FORK
        assert os.sched_getparam(status.pid).sched_priority == local.serving_realtime
        assert status.priority == f"real-time {local.serving_realtime}, nice {local.serving_nice}"
    else:
        assert "needs root or CAP_SYS_NICE" in status.priority

    client = redis.Redis.from_url(status.url)
    assert client.ping() is True
    # No retries: redis-py would otherwise back off for seconds on the refusal.
    once = Retry(NoBackoff(), 0)
    with pytest.raises(redis.exceptions.AuthenticationError, match="Authentication required"):
        redis.Redis(host="127.0.0.1", port=port, retry=once).ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, password="wrong", retry=once).ping()
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("bind") == {"bind": "127.0.0.1"}
    assert client.config_get("protected-mode") == {"protected-mode": "yes"}
    client.set("velocity:test", "kept")
    client.close()

    config = Path(status.config_path)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    again = redis_up(local)
    assert again.started is False
    assert again.pid == status.pid
    assert again.url == status.url

    assert redis_down(local) is True
    assert not port_open(port)
    assert status.pid is not None and process_gone(status.pid)
    assert redis_down(local) is False

    # Persistence: the data dir keeps the data across down and up.
    restarted = redis_up(local)
    assert restarted.started is True
    with redis.Redis.from_url(restarted.url) as client:
        assert client.get("velocity:test") == b"kept"
    assert redis_down(local) is True


@pytest.mark.redis
def test_another_data_dir_on_the_same_port_is_refused(local: Settings, tmp_path: Path) -> None:
    redis_up(local)
    other = settings_for(tmp_path / "other", local.redis_url)
    with pytest.raises(UsageError, match="belongs to another data dir"):
        redis_up(other)
    with pytest.raises(UsageError, match="belongs to another data dir"):
        redis_down(other)
    with redis.Redis.from_url(local.redis_url) as client:
        assert client.ping() is True


@pytest.mark.redis
def test_a_server_refusing_the_password_is_left_alone(local: Settings) -> None:
    redis_up(local)
    wrong = local.model_copy(
        update={"redis_url": local.redis_url.replace(quote(PASSWORD, safe=""), "other")}
    )
    with pytest.raises(UsageError, match="refuses the password"):
        redis_up(wrong)
    with pytest.raises(UsageError, match="refuses the password"):
        redis_down(wrong)
    with redis.Redis.from_url(local.redis_url) as client:
        assert client.ping() is True
