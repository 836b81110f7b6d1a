"""Processes on this host: whether one lives, which one a pidfile names, a log's tail,
and the worker processes a stream keeps beside its driver.

Shared by the local services `velocity up` manages (Redis, the Kafka broker), the
stream's health check, and the stream (``SpawnedWorkers``). Standard library only.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import random
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

log = logging.getLogger("velocity.stream")


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


def run_ahead(pid: int, nice: int, realtime: int = 0) -> str:
    """Give process ``pid`` (0: this thread, before it starts others) the scheduling
    niceness ``nice`` when that is higher priority than it has, and with ``realtime`` (1-99)
    the round-robin real-time priority: a server whose callers wait for it (Redis, the
    check service) runs ahead of batch work on the same cores. At nice -10 a sleeper still
    woke over 2 ms late on 0.4-1 % of its wake-ups beside the stream; a real-time thread
    preempts any other at once. Its children (Redis's AOF rewrite) start at the normal
    policy. Returns what it has, in words ("real-time 10, nice -10"), or why it kept its own
    (raising a priority needs root or CAP_SYS_NICE)."""
    try:
        current = os.getpriority(os.PRIO_PROCESS, pid)
        if nice < current:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
            current = nice
    except PermissionError:
        return f"nice {current}: raising it to {nice} needs root or CAP_SYS_NICE"
    except OSError as exc:
        return f"niceness unchanged ({exc.strerror})"
    if realtime <= 0:
        return f"nice {current}"
    try:
        policy = os.SCHED_RR | os.SCHED_RESET_ON_FORK
        os.sched_setscheduler(pid, policy, os.sched_param(realtime))
    except PermissionError:
        return f"nice {current}: real-time {realtime} needs root or CAP_SYS_NICE"
    except OSError as exc:
        return f"nice {current}: real-time unchanged ({exc.strerror})"
    return f"real-time {realtime}, nice {current}"


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


class SpawnedWorkers:
    """Worker processes spawned once and kept, for work that must not share the
    caller's GIL. Spawned, not forked: the caller runs a JVM gateway and threads, which a
    fork would copy mid-flight. Each process imports ``module`` (where the work lives) as
    it starts, before the first real call. The work must be safe to run again: work whose
    process died (the OOM killer, an operator) runs again, once, in new processes."""

    def __init__(self, module: str) -> None:
        self._module = module
        self._pool: ProcessPoolExecutor | None = None
        self._workers = 0
        self._guard = threading.Lock()

    def start(self, workers: int) -> None:
        """At least ``workers`` processes, spawned now, not awaited: each imports its
        module (seconds) while the caller starts, not in its first call."""
        self._ready(workers)

    def run(
        self, work: Callable[..., Any], *arguments: Iterable[Any], workers: int, what: str
    ) -> list[Any]:
        """``work`` over ``arguments`` (as ``map``), in order, on at least ``workers``
        processes; ``what`` names the work in the warning when a process died."""
        columns = [list(a) for a in arguments]
        pool = self._ready(workers)
        try:
            return list(pool.map(work, *columns))
        except BrokenProcessPool:
            log.warning("a process %s died: running it again in a new one", what)
            self._forget(pool)
            return list(self._ready(workers).map(work, *columns))

    def pids(self) -> list[int]:
        """The processes' ids (for tests and operators)."""
        with self._guard:
            return [] if self._pool is None else list(self._pool._processes)

    def _forget(self, pool: ProcessPoolExecutor) -> None:
        with self._guard:
            if self._pool is pool:
                self._pool, self._workers = None, 0
        pool.shutdown(wait=False, cancel_futures=True)

    def _ready(self, workers: int) -> ProcessPoolExecutor:
        with self._guard:
            if self._pool is None or self._workers < workers:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(workers, mp_context=context)
                self._workers = workers
                # A call a process, sent at once, spawns them all.
                for _ in range(workers):
                    self._pool.submit(_imported, self._module)
            return self._pool


def _imported(module: str) -> int:
    importlib.import_module(module)
    return os.getpid()


def free_loopback_port(offsets: tuple[int, ...], low: int, high: int) -> int:
    """A first port P, drawn from [low, high), such that P + each offset is free on
    loopback. Callers draw from ranges below Linux's ephemeral one (32768 up), each kind of
    service a range of its own: a service binds its ports seconds after this check (a JVM
    starts first), and an outgoing connection would otherwise take one meanwhile."""
    for _ in range(100):
        first = random.randrange(low, high)
        try:
            for offset in offsets:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", first + offset))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no free loopback ports at offsets {offsets} in [{low}, {high})")
