"""The local Redis server behind `velocity up` / `velocity down` (the embedded default).

What callers rely on:
- ``redis_up`` is idempotent: when this data dir's server already answers on the configured
  address it only reports it (``started=False``). Otherwise it installs redis-server from
  Debian's packages if it is missing, writes ``<data_dir>/redis/redis.conf`` (bound to the
  loopback address only, ``requirepass``, protected mode, AOF + RDB persistence in the same
  folder), starts it daemonised and returns once it answers PING with the password.
- ``redis_down`` stops that server (SHUTDOWN, which persists the data; SIGTERM to the pidfile's
  process when the server does not answer) and waits until it is gone; it returns False and
  does nothing when no server is running.
- Only a local server is managed: a ``VELOCITY_REDIS_URL`` whose host is not a loopback
  address, that has no password, or that is not ``redis://`` is a ``UsageError``. A server on
  the port that belongs to another data dir, or that refuses the password, is never adopted
  or stopped (two data dirs never share state).
- The pure part (``local_redis``, ``render_config``, ``server_command``, ``install_commands``,
  ``parse_server_version``) needs no server and no network.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from velocity.errors import UsageError, VelocityError
from velocity.operating.local_process import log_tail, pidfile_process, process_alive, run_ahead
from velocity.settings import Settings, loopback_address

MIN_VERSION = (7, 0, 0)  # Redis Functions, which the mirror relies on
_FALLBACK_BINARIES = (Path("/usr/bin/redis-server"), Path("/usr/local/bin/redis-server"))
_POLL_SECONDS = 0.05

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


READER_USER = "velocity-reader"
READER_COMMANDS = " ".join(
    f"+{command}"
    for command in (
        "fcall_ro", "time", "get", "hget", "hgetall", "hmget", "hexists", "exists", "type",
        "xrange", "xrevrange", "xread", "xlen", "xinfo|stream", "ping", "echo",
        "client|setname", "hello", "select",
    )
)  # fmt: skip
# A cluster client asks a master for the slot map and the command table before it can
# route a single read.
CLUSTER_READER_COMMANDS = (
    "+cluster|slots +cluster|shards +cluster|nodes +cluster|info +command +readonly +asking"
)


@dataclass(frozen=True)
class LocalRedis:
    """Where the local server listens and keeps its files (all under ``home``)."""

    host: str
    """Loopback address the server binds to, and clients connect to."""
    port: int
    password: str
    db: int
    home: Path
    """``<data_dir>/redis``: config, pidfile, log, RDB and AOF."""
    reader_password: str = "velocity-reader-local"
    """Password of ``READER_USER``, the read-only user for downstream services."""
    key_prefix: str = "velocity"
    """The data dir's Redis key prefix: ``READER_USER`` reads keys under it only."""

    @property
    def config_path(self) -> Path:
        return self.home / "redis.conf"

    @property
    def pid_path(self) -> Path:
        return self.home / "redis.pid"

    @property
    def log_path(self) -> Path:
        return self.home / "redis.log"

    @property
    def url(self) -> str:
        """``redis://:PASSWORD@HOST:PORT/DB``, the password percent-encoded as redis-py expects."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://:{quote(self.password, safe='')}@{host}:{self.port}/{self.db}"


@dataclass(frozen=True)
class RedisStatus:
    """A running local server, as ``redis_up`` found or started it."""

    url: str
    pid: int | None
    version: str | None
    started: bool
    """True when this call started the server, False when it was already running."""
    config_path: Path
    log_path: Path
    priority: str = ""
    """Its scheduling priority in words, set when this call started it (``run_ahead``)."""


def local_redis(settings: Settings) -> LocalRedis:
    """The local server described by ``settings.redis_url`` and ``settings.data_dir``.

    Raises ``UsageError`` when the URL is not ``redis://``, its host is not a loopback address
    (``up`` only manages a server on this machine) or it has no password.
    """
    url = settings.redis_url
    parts = urlsplit(url)
    shown = _redact(url)
    if parts.scheme != "redis":
        raise UsageError(
            f"VELOCITY_REDIS_URL {shown} must start with redis:// for the local server "
            "that `velocity up` manages (TLS and unix sockets are for servers you run yourself; "
            "a Redis Cluster on this machine is `bash infra/redis-cluster.sh up`)"
        )
    host = (parts.hostname or "").lower()
    bind = loopback_address(host)
    if bind is None:
        raise UsageError(
            f"VELOCITY_REDIS_URL {shown} points at host {host or '(none)'!r}, which is not a "
            "loopback address; `velocity up`/`down` only manage a local Redis. Use "
            "127.0.0.1 in VELOCITY_REDIS_URL, or run and manage that server yourself"
        )
    try:
        port = parts.port or 6379
    except ValueError as exc:
        raise UsageError(f"VELOCITY_REDIS_URL {shown} has an invalid port: {exc}") from exc
    password = unquote(parts.password) if parts.password else ""
    if not password:
        raise UsageError(
            f"VELOCITY_REDIS_URL {shown} has no password; the local server always requires one: "
            "use the form redis://:PASSWORD@127.0.0.1:PORT/0"
        )
    db_text = parts.path.lstrip("/") or "0"
    if not db_text.isdigit():
        raise UsageError(f"VELOCITY_REDIS_URL {shown} names database {db_text!r}; use a number")
    return LocalRedis(
        bind, port, password, int(db_text), settings.data_dir / "redis",
        settings.redis_reader_password, settings.redis_keys.prefix,
    )  # fmt: skip


def render_config(server: LocalRedis) -> str:
    """The redis.conf text for ``server``. Raises ``UsageError`` for unquotable values."""
    home = server.home
    lines = [
        "# Written by `velocity up` on every start; change VELOCITY_REDIS_URL or",
        "# VELOCITY_DATA_DIR instead of editing this file.",
        f"bind {server.host}",
        f"port {server.port}",
        "protected-mode yes",
        f"requirepass {_config_quote('password', server.password)}",
        reader_user_config(server.reader_password, server.key_prefix),
        "daemonize yes",
        "supervised no",
        f"pidfile {_config_quote('pidfile', str(server.pid_path))}",
        f"logfile {_config_quote('logfile', str(server.log_path))}",
        "loglevel notice",
        f"dir {_config_quote('dir', str(home))}",
        # The AOF is what a restart loads, and its base is an RDB image: periodic RDB
        # snapshots beside it made nothing safer, and each forked the whole server (a core
        # for seconds, pages copied on write) every minute of a busy stream.
        "appendonly yes",
        "appendfsync everysec",
        'save ""',
    ]
    return "\n".join(lines) + "\n"


def server_command(binary: Path | str, server: LocalRedis) -> list[str]:
    """The command line that starts the server from its config file (it daemonises itself)."""
    return [str(binary), str(server.config_path)]


def install_commands(*, is_root: bool, has_sudo: bool) -> list[list[str]]:
    """``apt-get update`` then ``apt-get install -y redis-server``, non-interactive.

    Uses ``sudo -n`` when not root; raises ``VelocityError`` when neither is available.
    """
    if is_root:
        prefix: list[str] = []
    elif has_sudo:
        prefix = ["sudo", "-n"]
    else:
        raise VelocityError(
            "redis-server is not installed and installing it needs root: run "
            "`sudo apt-get install -y redis-server`, then `velocity up` again"
        )
    apt = [*prefix, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
    return [[*apt, "update"], [*apt, "install", "-y", "redis-server"]]


def parse_server_version(text: str) -> tuple[int, int, int] | None:
    """The version in ``redis-server --version`` output (``Redis server v=7.0.15 ...``)."""
    match = re.search(r"\bv=(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def find_redis_server() -> Path | None:
    """redis-server on PATH, else in /usr/bin or /usr/local/bin; None when absent."""
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    return next((p for p in _FALLBACK_BINARIES if os.access(p, os.X_OK)), None)


def ensure_redis_server(*, run: Runner = subprocess.run) -> Path:
    """Path of redis-server, installing it with apt-get first when it is missing.

    Raises ``VelocityError`` when it cannot be installed or is older than Redis 7.0.
    """
    binary = find_redis_server()
    if binary is None:
        if shutil.which("apt-get") is None:
            raise VelocityError(
                "redis-server is not on PATH or in /usr/bin and there is no apt-get to install "
                "it: install Redis >= 7.0 and put redis-server on PATH"
            )
        commands = install_commands(
            is_root=os.geteuid() == 0, has_sudo=shutil.which("sudo") is not None
        )
        for command in commands:
            _run_checked(run, command, timeout=900, what="installing redis-server")
        binary = find_redis_server()
        if binary is None:
            raise VelocityError(
                "apt-get installed redis-server but it is not on PATH or in /usr/bin"
            )
    result = _run_checked(
        run, [str(binary), "--version"], timeout=30, what="redis-server --version"
    )
    version = parse_server_version(result.stdout)
    if version is not None and version < MIN_VERSION:
        raise VelocityError(
            f"{binary} is Redis {'.'.join(map(str, version))}; Velocity needs Redis >= 7.0 "
            "(Functions): install a newer redis-server"
        )
    return binary


def redis_up(settings: Settings, *, timeout_seconds: float = 15.0) -> RedisStatus:
    """Start the local Redis for ``settings`` unless it already runs; see the module docstring."""
    server = local_redis(settings)
    running = _running_status(server, started=False)
    if running is not None:
        return running
    binary = ensure_redis_server()
    server.home.mkdir(parents=True, exist_ok=True)
    # The config holds the password: readable by the owner only.
    server.home.chmod(0o700)
    _write_private(server.config_path, render_config(server))
    command = server_command(binary, server)
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise VelocityError(
            f"redis-server did not start (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-800:]}{log_tail(server.log_path)}"
        )
    deadline = time.monotonic() + timeout_seconds
    while True:
        status = _running_status(server, started=True)
        if status is not None:
            if status.pid is not None:
                status = replace(
                    status,
                    priority=run_ahead(
                        status.pid, settings.serving_nice, settings.serving_realtime
                    ),
                )
            return status
        if time.monotonic() > deadline:
            raise VelocityError(
                f"redis-server started but did not answer PING on {server.host}:{server.port} "
                f"within {timeout_seconds:g}s{log_tail(server.log_path)}"
            )
        time.sleep(_POLL_SECONDS)


def redis_down(settings: Settings, *, timeout_seconds: float = 15.0) -> bool:
    """Stop the local Redis for ``settings``; True if one was stopped, False if none ran."""
    server = local_redis(settings)
    pid: int | None = None
    if _probe(server) is _Probe.OURS:
        import redis

        client = _client(server)
        try:
            pid = int(client.info("server")["process_id"])
            client.shutdown()
        except redis.exceptions.RedisError as exc:
            raise VelocityError(
                f"Redis on {server.host}:{server.port} refused to shut down: {exc}"
                f"{log_tail(server.log_path)}"
            ) from exc
        finally:
            client.close()
    else:
        pid = pidfile_process(server.pid_path, b"redis-server")
        if pid is None:
            server.pid_path.unlink(missing_ok=True)  # stale, if anything
            return False
        os.kill(pid, signal.SIGTERM)  # SIGTERM makes Redis persist and exit, like SHUTDOWN
    deadline = time.monotonic() + timeout_seconds
    while process_alive(pid) or _probe(server) is not _Probe.DOWN:
        if time.monotonic() > deadline:
            raise VelocityError(
                f"Redis on {server.host}:{server.port} (pid {pid}) did not stop within "
                f"{timeout_seconds:g}s{log_tail(server.log_path)}"
            )
        time.sleep(_POLL_SECONDS)
    return True


# -- internals --------------------------------------------------------------------------------


class _Probe(Enum):
    DOWN = "down"
    OURS = "ours"


def _client(server: LocalRedis) -> Any:
    import redis  # the redis client is only needed when a server is involved
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis(
        host=server.host,
        port=server.port,
        password=server.password,
        db=server.db,
        socket_connect_timeout=1.0,
        socket_timeout=5.0,
        decode_responses=True,
        # Probes must answer at once: redis-py's default retries with backoff would turn
        # "nothing listens" (and the closed connection after SHUTDOWN) into seconds of waiting.
        retry=Retry(NoBackoff(), 0),
    )


def _probe(server: LocalRedis) -> _Probe:
    """DOWN when nothing listens; OURS when this data dir's server answers with the password.

    Raises ``UsageError`` for anything else on the port, which is never adopted or stopped.
    """
    import redis

    where = f"{server.host}:{server.port}"
    client = _client(server)
    try:
        client.ping()
        served_dir = client.config_get("dir").get("dir")
    except redis.exceptions.AuthenticationError as exc:
        raise UsageError(
            f"a Redis already listens on {where} and refuses the password of VELOCITY_REDIS_URL "
            f"({exc}); stop it or choose another port in VELOCITY_REDIS_URL"
        ) from exc
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return _Probe.DOWN
    except redis.exceptions.RedisError as exc:
        raise UsageError(
            f"something other than this data dir's Redis answers on {where} ({exc}); "
            "stop it or choose another port in VELOCITY_REDIS_URL"
        ) from exc
    finally:
        client.close()
    if served_dir is None or not _same_path(Path(served_dir), server.home):
        raise UsageError(
            f"the Redis on {where} keeps its data in {served_dir}, not in {server.home}: it "
            "belongs to another data dir. Stop it there, or choose another port in "
            "VELOCITY_REDIS_URL"
        )
    return _Probe.OURS


def _running_status(server: LocalRedis, *, started: bool) -> RedisStatus | None:
    if _probe(server) is not _Probe.OURS:
        return None
    client = _client(server)
    try:
        info = client.info("server")
    finally:
        client.close()
    return RedisStatus(
        url=server.url,
        pid=int(info["process_id"]) if "process_id" in info else None,
        version=str(info.get("redis_version")) if "redis_version" in info else None,
        started=started,
        config_path=server.config_path,
        log_path=server.log_path,
    )


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def reader_user_config(password: str, key_prefix: str, *, cluster: bool = False) -> str:
    """The redis.conf line of ``READER_USER``. Downstream services read as this user:
    window lookups through the no-writes Function (FCALL_RO), rule entries, the alert
    stream, under ``key_prefix``; nothing else. Raises ``UsageError`` for unquotable values."""
    commands = f"{READER_COMMANDS} {CLUSTER_READER_COMMANDS}" if cluster else READER_COMMANDS
    return (
        f"user {READER_USER} on {_config_quote('reader password', '>' + password)}"
        f" resetkeys {_config_quote('key prefix', f'%R~{key_prefix}:*')}"
        f" resetchannels -@all {commands}"
    )


def _config_quote(name: str, value: str) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise UsageError(
            f"the Redis {name} contains a control character; use printable characters only"
        )
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _write_private(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temp, path)


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return repr(url)
    return repr(url.replace(f":{parts.password}@", ":***@", 1))


def _run_checked(
    run: Runner, command: Sequence[str], *, timeout: float, what: str
) -> subprocess.CompletedProcess[str]:
    try:
        result = run(list(command), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VelocityError(f"{what}: `{' '.join(command)}` failed: {exc}") from exc
    if result.returncode != 0:
        output = (result.stderr or result.stdout or "").strip()[-1500:]
        raise VelocityError(
            f"{what}: `{' '.join(command)}` exited with {result.returncode}: {output}"
        )
    return result
