"""What the machine does to a process that asks for the CPU little and often, the way Redis,
`velocity serve` and the check generators do: ``python -m benchmarks.stall_probe …``, run by
`make bench-check` (``benchmarks.check``) beside them; not a command for people.

At the priority they run at, it sleeps a millisecond at a time and notes how late it woke.
A wake-up late by several milliseconds is a stall no Redis call caused: the kernel ran
something else (or the machine's host did), and every check due meanwhile waits as long.
The benchmark sets these beside each load's check latencies, so a tail the machine made is
told from one Velocity made.

With ``--redis URL`` it also sends Redis a PING after each wake-up (one connection, the
same priority): a PING late while the sleeper woke on time is Redis not answering, though
no call of its own was slow (the slow log) and nothing stalled the machine.

Protocol (as ``benchmarks.check_load``): prints ``ready``, reads the start (epoch seconds)
from standard input, probes for ``--seconds``, writes JSON to ``--out``: ``wakes`` a second
(one list a whole second from the start), every wake-up ``late`` by more than
``--report-ms`` as [seconds from the start, ms], and every PING ``slow_pings`` (answered
after more than ``--report-ms``) the same way.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

from benchmarks.check_load import RedisDoor, connect
from velocity.operating.local_process import run_ahead

SLEEP_SECONDS = 0.001


def redis_pinger(url: str) -> socket.socket:
    """A connection to Redis, signed in as the URL's user (as the check generator's)."""
    return connect(RedisDoor(url, ""), timeout=5).sock


def ping(sock: socket.socket) -> None:
    sock.sendall(b"*1\r\n$4\r\nPING\r\n")
    answer = b""
    while not answer.endswith(b"\r\n"):
        answer += sock.recv(64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--report-ms", type=float, default=1.0)
    parser.add_argument("--nice", type=int, default=-10)
    parser.add_argument("--realtime", type=int, default=10)
    parser.add_argument("--redis", metavar="URL", help="also PING this Redis after each wake-up")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(f"stall probe: {run_ahead(0, args.nice, args.realtime)}", file=sys.stderr, flush=True)
    pinger = redis_pinger(args.redis) if args.redis else None
    print("ready", flush=True)
    start_epoch = float(sys.stdin.readline())
    start = time.monotonic() + (start_epoch - time.time())
    time.sleep(max(0.0, start - time.monotonic()))
    wakes = [0] * (int(args.seconds) + 1)
    late: list[tuple[float, float]] = []
    slow_pings: list[tuple[float, float]] = []
    end = start + args.seconds
    now = time.monotonic()
    while now < end:
        time.sleep(SLEEP_SECONDS)
        woke = time.monotonic()
        lateness = (woke - now - SLEEP_SECONDS) * 1000
        wakes[int(woke - start) if woke < end else -1] += 1
        if lateness > args.report_ms:
            late.append((round(now - start, 4), round(lateness, 2)))
        if pinger is not None:
            ping(pinger)
            answered = time.monotonic()
            if (answered - woke) * 1000 > args.report_ms:
                slow_pings.append((round(woke - start, 4), round((answered - woke) * 1000, 2)))
            woke = answered
        now = woke
    args.out.write_text(json.dumps({"wakes": wakes, "late": late, "slow_pings": slow_pings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
