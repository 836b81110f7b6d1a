"""Where the suite's CPU goes: each process's CPU (BSD process accounting) charged to the
test that was running when it started, or to the run beside the suite it descends from.

The suite is CPU-bound on two cores (the runs beside it included), so its wall time falls
only with the CPU it spends: this says where that is. Three steps, as root:

    apt-get install -y acct && accton /var/log/account/pacct
    SUITE_CPU_LOG=/tmp/tests.log PYTEST_ADDOPTS="-p tools.suite_cpu" make test
    accton off && python -m tools.suite_cpu /tmp/tests.log /var/log/account/pacct

Loaded as a pytest plugin (``-p tools.suite_cpu``) it writes, as each test starts and ends,
the time, pytest's own CPU and the CPU of the session's Spark JVM (the oldest java process
under pytest), so the report charges those two per test as well."""

from __future__ import annotations

import argparse
import bisect
import collections
import datetime
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

HZ = os.sysconf("SC_CLK_TCK")


# --- the plugin ------------------------------------------------------------------------


@dataclass
class _Tracker:
    log: IO[str]
    jvm: int | None = None


def _proc_stat(pid: int) -> tuple[int, int, int]:
    """(ppid, CPU ticks, start ticks) of a live process."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[19])


def _session_jvm(me: int) -> int | None:
    """The oldest java process at most four levels under ``me``."""
    procs: dict[int, tuple[int, int, int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
                procs[int(entry)] = (*_proc_stat(int(entry)), comm)
            except OSError:
                continue

    def under(pid: int) -> bool:
        for _ in range(4):
            pid = procs.get(pid, (0, 0, 0, ""))[0]
            if pid == me:
                return True
        return False

    javas = sorted((v[2], pid) for pid, v in procs.items() if v[3] == "java" and under(pid))
    return javas[0][1] if javas else None


_tracker: _Tracker | None = None


def _mark(kind: str, nodeid: str) -> None:
    global _tracker
    if _tracker is None:
        _tracker = _Tracker(open(os.environ.get("SUITE_CPU_LOG", "suite-cpu.log"), "a"))  # noqa: SIM115
    jvm_cpu = -1.0
    try:
        if _tracker.jvm is None or not Path(f"/proc/{_tracker.jvm}").exists():
            _tracker.jvm = _session_jvm(os.getpid())
        if _tracker.jvm is not None:
            jvm_cpu = _proc_stat(_tracker.jvm)[1] / HZ
    except OSError:
        _tracker.jvm = None
    own = os.times()
    _tracker.log.write(
        f"{time.time():.2f} {kind} {nodeid} {own.user + own.system:.2f} {jvm_cpu:.2f}\n"
    )
    _tracker.log.flush()


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _mark("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _mark("end", nodeid)


# --- the report ------------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    command: str
    cpu: float  # seconds, user + system
    elapsed: float
    pid: int
    ppid: int
    started: float  # epoch seconds


def processes(pacct: Path) -> list[Process]:
    out = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True, check=True)
    found = []
    for line in out.stdout.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 15:
            continue
        started = datetime.datetime.strptime(f[14], "%a %b %d %H:%M:%S %Y")
        found.append(
            Process(
                command=f[0],
                cpu=(float(f[2]) + float(f[3])) / 100,  # accounting's ticks: AHZ, 100 a second
                elapsed=float(f[4]) / 100,
                pid=int(f[9]),
                ppid=int(f[10]),
                started=started.replace(tzinfo=datetime.UTC).timestamp(),
            )
        )
    return found


def most(cpu: dict[str, float], rows: int) -> list[tuple[str, float]]:
    return sorted(cpu.items(), key=lambda item: -item[1])[:rows]


def report(test_log: Path, pacct: Path, rows: int) -> None:
    procs = processes(pacct)
    by_pid: dict[int, list[Process]] = collections.defaultdict(list)
    for p in procs:
        by_pid[p.pid].append(p)

    def parent(p: Process) -> Process | None:
        # Pids are reused within a run: the parent is the one alive when the child started.
        for q in by_pid.get(p.ppid, []):
            if q.started - 1 <= p.started <= q.started + q.elapsed + 1:
                return q
        return None

    # "<time> <start|end> <test id, may hold spaces> <pytest's CPU> <the JVM's CPU>"
    marks = []
    for line in test_log.read_text().splitlines():
        at, kind, rest = line.split(" ", 2)
        nodeid, own_cpu, jvm_cpu = rest.rsplit(" ", 2)
        marks.append((at, kind, nodeid, own_cpu, jvm_cpu))
    starts = [(float(m[0]), m[2]) for m in marks if m[1] == "start"]
    times = [t for t, _ in starts]
    first = times[0] if times else 0.0

    def test_at(moment: float) -> str:
        """The test running at ``moment`` ("" before the first)."""
        i = bisect.bisect_right(times, moment) - 1
        return starts[i][1] if i >= 0 else ""

    pytest_proc = max((p for p in procs if p.command == "python"), key=lambda p: p.elapsed)

    charged: dict[str, float] = collections.defaultdict(float)
    commands: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float)
    )
    for p in procs:
        chain = [p]
        while (up := parent(chain[-1])) is not None and up != pytest_proc:
            chain.append(up)
        top = chain[-1]
        # A run beside the suite: a Python child of pytest's that outlives any one test.
        beside = parent(top) == pytest_proc and top.elapsed > 60 and top.command == "python"
        if p == pytest_proc:
            key = "pytest itself"
        elif p.command == "java" and p.elapsed > 600:
            # The session's Spark JVM, a session's broker or cluster (their parent is init
            # by the time they exit: accounting records the parent at exit).
            key = f"a JVM of the session, from {test_at(p.started) or 'the start'}"
        elif beside:
            since = top.started - first
            key = f"beside the suite: pid {top.pid}, ran {top.elapsed:.0f} s from {since:.0f} s"
        else:
            key = test_at(p.started) or "before the tests (setup, lint, docs)"
        charged[key] += p.cpu
        commands[key][p.command] += p.cpu

    total = sum(charged.values())
    print(f"CPU of the run: {total / 60:.1f} core-minutes")
    for key, cpu in most(charged, rows):
        top_commands = ", ".join(f"{c} {s:.0f}" for c, s in most(commands[key], 3))
        print(f"{cpu:8.1f} s  {key}  [{top_commands}]")
    by_file: dict[str, float] = collections.defaultdict(float)
    for key, cpu in charged.items():
        by_file[key.split("::")[0]] += cpu
    print("\nby file:")
    for key, cpu in most(by_file, rows):
        print(f"{cpu:8.1f} s  {key}")
    # The session JVM's and pytest's own CPU per test (the plugin's columns).
    jvm: dict[str, float] = collections.defaultdict(float)
    own: dict[str, float] = collections.defaultdict(float)
    opened: dict[str, tuple[float, float]] = {}
    for m in marks:
        if m[1] == "start":
            opened[m[2]] = (float(m[3]), float(m[4]))
        elif m[2] in opened:
            own_before, jvm_before = opened.pop(m[2])
            own[m[2]] += float(m[3]) - own_before
            if jvm_before >= 0 and float(m[4]) >= jvm_before:
                jvm[m[2]] += float(m[4]) - jvm_before
    print(f"\nthe session's Spark JVM, by test (of {sum(jvm.values()) / 60:.1f} core-minutes):")
    for key, cpu in most(jvm, rows):
        print(f"{cpu:8.1f} s  {key}")
    print(f"\npytest's own CPU, by test (of {sum(own.values()) / 60:.1f} core-minutes):")
    for key, cpu in most(own, rows // 2):
        print(f"{cpu:8.1f} s  {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_log", type=Path, help="the plugin's log (SUITE_CPU_LOG)")
    parser.add_argument("pacct", type=Path, help="the accounting file accton wrote")
    parser.add_argument("--rows", type=int, default=40)
    args = parser.parse_args()
    report(args.test_log, args.pacct, args.rows)


if __name__ == "__main__":
    main()
