"""VelocityHook: Velocity's settings for a task, and the velocity commands that need no Spark."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from velocity.domain.rules import Rule
from velocity.settings import Settings, load_settings
from velocity_airflow import VELOCITY_CONN_ID
from velocity_airflow.plans import (
    StreamHealth,
    parse_summary,
    stream_health,
    stream_status_args,
    stream_stop_args,
    velocity_env,
)


@dataclass(frozen=True)
class CommandResult:
    """A finished velocity command: exit code, output, and its JSON summary if it printed one."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    summary: dict[str, Any] | None


class VelocityHook(BaseHook):
    """Velocity's settings from an Airflow connection, or from the environment without one.

    The connection (type ``generic``, id ``velocity_default``) carries Velocity settings
    as extras named like the settings: ``{"data_dir": "/var/lib/velocity",
    "redis_url": "redis://:secret@redis:6379/0"}``. Settings it does not name come from
    the worker's ``VELOCITY_*`` variables and config file, as for the CLI. When the
    connection does not exist the environment alone decides.
    """

    conn_name_attr = "velocity_conn_id"
    default_conn_name = VELOCITY_CONN_ID
    conn_type = "generic"
    hook_name = "Velocity"

    def __init__(
        self, velocity_conn_id: str = VELOCITY_CONN_ID, python: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.velocity_conn_id = velocity_conn_id
        self.python = python or sys.executable
        self._env: dict[str, str] | None = None

    def _connection_extra(self) -> dict[str, Any]:
        try:
            connection = self.get_connection(self.velocity_conn_id)
        except AirflowNotFoundException:
            self.log.info(
                "no connection %r: Velocity settings come from the environment",
                self.velocity_conn_id,
            )
            return {}
        return dict(connection.extra_dejson)

    def velocity_env(self) -> dict[str, str]:
        """``VELOCITY_*`` variables for a velocity process; data dir and Redis URL always set.

        Both are resolved here, so every task of a run, Spark or not, uses the same state.
        """
        if self._env is None:
            extra_env = velocity_env(self._connection_extra(), Settings.model_fields)
            settings = _load_with(extra_env)
            password = settings.redis_address[2]
            if password:
                from airflow.sdk.log import mask_secret

                mask_secret(password)
            self._env = {
                **extra_env,
                "VELOCITY_DATA_DIR": str(settings.data_dir),
                "VELOCITY_REDIS_URL": settings.redis_url,
            }
        return dict(self._env)

    def get_conn(self) -> Settings:
        """The Velocity settings tasks run with."""
        return _load_with(self.velocity_env())

    def run(self, args: Sequence[str], *, timeout: float = 300) -> CommandResult:
        """Run ``velocity <args>`` in a child process with this hook's settings; never raises
        on a non-zero exit (the caller decides what an exit code means)."""
        argv = [self.python, "-P", "-m", "velocity.cli", *[str(a) for a in args]]
        env = {**os.environ, **self.velocity_env()}
        self.log.info("running velocity %s", " ".join(argv[4:]))
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        for line in done.stdout.splitlines():
            self.log.info("%s", line)
        for line in done.stderr.splitlines():
            self.log.info("stderr: %s", line)
        return CommandResult(
            args=list(argv[4:]),
            returncode=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr,
            summary=parse_summary(done.stdout),
        )

    def stream_status(self, stale_seconds: int | None = None) -> StreamHealth:
        """The running stream's health (`velocity stream-status`)."""
        result = self.run(stream_status_args(stale_seconds), timeout=120)
        return stream_health(result.returncode, result.summary)

    def stream_stop(
        self, wait_seconds: float = 120, reason: str | None = None, force: bool = False
    ) -> CommandResult:
        """Ask the running stream to stop after its micro-batch in flight (`velocity
        stream-stop`) and wait up to ``wait_seconds``: exit 0 once it stopped (or none ran),
        1 while it still runs. ``force`` SIGKILLs it after the wait (this host only); the
        next start resumes from the checkpoint."""
        return self.run(stream_stop_args(wait_seconds, reason, force), timeout=wait_seconds + 90)


def _load_with(env: dict[str, str]) -> Settings:
    """Settings as a velocity child process with ``env`` added would load them."""
    overrides = {
        name: env[f"VELOCITY_{name.upper()}"]
        for name in Settings.model_fields
        if f"VELOCITY_{name.upper()}" in env
    }
    return load_settings(**overrides)


def rules_in_force_for_forms() -> list[Rule]:
    """The rules in force, for a trigger form's choices, read when a DAG file is parsed
    (delta-rs: no Spark). Empty when they cannot be read: the form then offers no choices,
    and a run still takes any rule id."""
    from velocity.delta.reader import rules_in_force

    try:
        try:
            settings = VelocityHook().get_conn()
        except Exception:  # no connection access while parsing: the environment's settings
            settings = load_settings()
        return rules_in_force(settings)
    except Exception:
        return []
