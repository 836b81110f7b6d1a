"""`velocity serve` in the foreground, and in the background for `velocity up` / `down`.

What callers rely on:
- ``service_token``: ``VELOCITY_CHECK_TOKEN`` when set; else the token kept in
  ``<data dir>/serve/check-token``, drawn at random (256 bits) the first time and written
  readable by its owner only, so `velocity up`, `velocity serve` and the services that
  call them agree on it without its ever being printed.
- ``CheckService.open`` binds the port before anything is served (a port taken by another
  program is a ``UsageError`` naming ``VELOCITY_CHECK_PORT``) and signs in to Redis as the
  read-only user (the check needs FCALL_RO only); ``run`` serves until SIGTERM or SIGINT,
  finishes the requests in flight, and returns.
- ``service_up`` is idempotent: when this data dir's service runs it only reports it
  (``started=False``); otherwise it starts ``velocity serve`` detached (log and pidfile in
  ``<data dir>/serve``) and returns once it answers ``/healthz`` (200, or 503 while Redis
  holds no rules yet). ``service_down`` stops it (SIGTERM: a graceful stop) and returns
  False when none runs. Neither does anything when ``VELOCITY_CHECK_PORT`` is 0.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn

from velocity.errors import UsageError, VelocityError
from velocity.operating.local_process import log_tail, pidfile_process, process_alive
from velocity.redis.connection import connect, connect_async
from velocity.redis.server import READER_USER
from velocity.serving.app import check_app
from velocity.settings import Settings

TOKEN_FILE = "check-token"
# The background service's command line; the pidfile's process must hold it to be signalled.
SERVE_COMMAND = ("-m", "velocity.cli", "serve")
_MARKER = b"velocity.cli\x00serve"
# The settings the background service needs, passed on as its environment: `velocity up`
# may have been given them otherwise (a config file, a test's overrides).
_PASSED_ON = (
    "data_dir", "redis_url", "redis_reader_password", "redis_key_prefix",
    "check_host", "check_port", "check_token",
)  # fmt: skip
_POLL_SECONDS = 0.1


def service_home(settings: Settings) -> Path:
    """``<data dir>/serve``: the token file, the background service's pidfile and log."""
    return settings.data_dir / "serve"


def token_path(settings: Settings) -> Path:
    return service_home(settings) / TOKEN_FILE


def service_token(settings: Settings) -> tuple[str, Path | None]:
    """(the bearer token, the file it is kept in, or None when VELOCITY_CHECK_TOKEN is it)."""
    if settings.check_token:
        return settings.check_token, None
    path = token_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: of two first starts at once, one draws the token and the other reads it.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text(encoding="utf-8").strip()
        if len(token) < 16:
            raise UsageError(
                f"the check token in {path} is shorter than 16 characters: delete the file "
                "(a new one is drawn) or set VELOCITY_CHECK_TOKEN"
            ) from None
        return token, path
    token = secrets.token_urlsafe(32)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    return token, path


def service_url(settings: Settings) -> str:
    host = settings.check_host
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.check_port}"


class _Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Stop gracefully and return: uvicorn's own handler raises the signal again once
        # stopped, which would end `velocity serve` by the signal instead of exit 0.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: do not wait for requests in flight
        else:
            self.should_exit = True


@dataclass
class CheckService:
    """The service, bound and signed in, not yet serving."""

    settings: Settings
    token_file: Path | None
    _socket: socket.socket
    _server: _Server

    @classmethod
    def open(cls, settings: Settings) -> CheckService:
        if settings.check_port == 0:
            raise UsageError("VELOCITY_CHECK_PORT is 0 (no check service): set a port to serve")
        token, token_file = service_token(settings)
        listening = _bind(settings.check_host, settings.check_port)
        user = (READER_USER, settings.redis_reader_password)
        client = connect(settings, user=user)
        waiting = None if settings.redis_cluster else connect_async(settings, user=user)
        app = check_app(client, settings.redis_keys, token, async_client=waiting)
        config = uvicorn.Config(
            app,
            lifespan="off",
            access_log=False,
            log_level="warning",
            server_header=False,
            timeout_graceful_shutdown=10,
        )
        return cls(settings, token_file, listening, _Server(config))

    @property
    def url(self) -> str:
        return service_url(self.settings)

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT (in the main thread), then return."""
        # A full collection walks every object the imports made (about 64 000: 15-30 ms,
        # each a check's p99 at 2 000 checks/s); frozen, it walks only what serving makes.
        gc.collect()
        gc.freeze()
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._socket.close()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as exc:
        listening.close()
        raise UsageError(
            f"the check service cannot listen on {host}:{port}: {exc.strerror} (another "
            "program has the port?): set VELOCITY_CHECK_PORT to a free one, or "
            "VELOCITY_CHECK_HOST to an address of this machine"
        ) from exc
    listening.listen(2048)
    listening.set_inheritable(True)
    return listening


# -- in the background, for `velocity up` / `velocity down` -----------------------------------


@dataclass(frozen=True)
class ServiceStatus:
    url: str
    pid: int | None
    started: bool
    """True when this call started the service, False when it was already running."""
    token_file: Path | None
    """Where the token is kept; None when VELOCITY_CHECK_TOKEN is it."""
    log_path: Path


def _pid_path(settings: Settings) -> Path:
    return service_home(settings) / "serve.pid"


def _log_path(settings: Settings) -> Path:
    return service_home(settings) / "serve.log"


def service_up(settings: Settings, *, timeout_seconds: float = 30.0) -> ServiceStatus | None:
    """Start `velocity serve` in the background unless it runs; None when the port is 0."""
    if settings.check_port == 0:
        return None
    service_home(settings).mkdir(parents=True, exist_ok=True)
    _, token_file = service_token(settings)  # drawn here, so `up` can say where it is
    pid = pidfile_process(_pid_path(settings), _MARKER)
    if pid is not None:
        _await_answer(settings, lambda: None if process_alive(pid) else "exited", timeout_seconds)
        return ServiceStatus(service_url(settings), pid, False, token_file, _log_path(settings))
    environment = dict(os.environ)
    for name in _PASSED_ON:
        environment[f"VELOCITY_{name.upper()}"] = str(getattr(settings, name) or "")
    with open(_log_path(settings), "ab") as log:
        process = subprocess.Popen(
            [sys.executable, *SERVE_COMMAND],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=environment,
            start_new_session=True,  # outlives `velocity up`, like the daemonised Redis
        )  # fmt: skip
    _pid_path(settings).write_text(f"{process.pid}\n")

    def exited() -> str | None:
        return None if process.poll() is None else f"exited with {process.returncode}"

    _await_answer(settings, exited, timeout_seconds)
    return ServiceStatus(service_url(settings), process.pid, True, token_file, _log_path(settings))


def service_down(settings: Settings, *, timeout_seconds: float = 15.0) -> bool:
    """Stop the background service; True if one was stopped, False if none ran."""
    pid_path = _pid_path(settings)
    pid = pidfile_process(pid_path, _MARKER)
    if pid is None:
        pid_path.unlink(missing_ok=True)  # stale, if anything
        return False
    os.kill(pid, signal.SIGTERM)  # requests in flight are answered first
    deadline = time.monotonic() + timeout_seconds
    while process_alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
        time.sleep(_POLL_SECONDS)
    pid_path.unlink(missing_ok=True)
    return True


def _probe_url(settings: Settings) -> str:
    """``/healthz`` as this machine reaches it (a service on every address answers on
    loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.check_host, settings.check_host)
    return f"{service_url(settings.model_copy(update={'check_host': host}))}/healthz"


def _answers(url: str) -> bool:
    """Whether an HTTP server answers ``url`` (any status: 503 is the service up while Redis
    holds no rules)."""
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _await_answer(
    settings: Settings, exited: Callable[[], str | None], timeout_seconds: float
) -> None:
    url = _probe_url(settings)
    deadline = time.monotonic() + timeout_seconds
    while not _answers(url):
        ended = exited()
        if ended is not None:
            with contextlib.suppress(FileNotFoundError):
                _pid_path(settings).unlink()
            raise VelocityError(
                f"the check service {ended} while starting{log_tail(_log_path(settings))}"
            )
        if time.monotonic() > deadline:
            raise VelocityError(
                f"the check service started but did not answer {url} within "
                f"{timeout_seconds:g}s{log_tail(_log_path(settings))}"
            )
        time.sleep(_POLL_SECONDS)
