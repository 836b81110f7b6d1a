"""Processes on this host: whether one lives, which one a pidfile names, a log's tail.

Shared by the local services `velocity up` manages (Redis, the Kafka broker) and the
stream's health check. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie (an exited child of
    this process is reaped on the way)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        # /proc/<pid>/stat: "pid (comm) S ..."; comm may hold spaces, the state follows ")".
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    if stat.rpartition(")")[2].split()[:1] != ["Z"]:
        return True
    # In containers an exited daemon may stay a zombie when PID 1 does not reap it; one
    # this process started (the broker of `velocity up` in a test) is reaped here.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return False


def pidfile_process(pid_path: Path, marker: bytes) -> int | None:
    """The live process the pidfile names, if its command line holds ``marker``: a
    recycled pid may belong to another program, which must never be signalled."""
    try:
        pid = int(pid_path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if not process_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if marker in cmdline else None


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a service's log, to end an error message with ("" if none)."""
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"\n{path} ends with:\n" + "\n".join(tail) if tail else ""
