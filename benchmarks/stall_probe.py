"""What the machine does to a process that asks for the CPU little and often, the way Redis,
`velocity serve` and the check generators do: ``python -m benchmarks.stall_probe …``, run by
`make bench-check` (``benchmarks.check``) beside them; not a command for people.

At the niceness they run at, it sleeps a millisecond at a time and notes how late it woke.
A wake-up late by several milliseconds is a stall no Redis call caused: the kernel ran
something else (or the machine's host did), and every check due meanwhile waits as long.
The benchmark sets these beside each load's check latencies, so a tail the machine made is
told from one Velocity made.

Protocol (as ``benchmarks.check_load``): prints ``ready``, reads the start (epoch seconds)
from standard input, probes for ``--seconds``, writes JSON to ``--out``: ``wakes`` a second
(one list a whole second from the start) and every wake-up ``late`` by more than
``--report-ms`` as [seconds from the start, ms].
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from velocity.operating.local_process import run_ahead

SLEEP_SECONDS = 0.001


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--report-ms", type=float, default=1.0)
    parser.add_argument("--nice", type=int, default=-10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(f"stall probe: {run_ahead(0, args.nice)}", file=sys.stderr, flush=True)
    print("ready", flush=True)
    start_epoch = float(sys.stdin.readline())
    start = time.monotonic() + (start_epoch - time.time())
    time.sleep(max(0.0, start - time.monotonic()))
    wakes = [0] * (int(args.seconds) + 1)
    late: list[tuple[float, float]] = []
    end = start + args.seconds
    now = time.monotonic()
    while now < end:
        time.sleep(SLEEP_SECONDS)
        woke = time.monotonic()
        lateness = (woke - now - SLEEP_SECONDS) * 1000
        wakes[int(woke - start) if woke < end else -1] += 1
        if lateness > args.report_ms:
            late.append((round(now - start, 4), round(lateness, 2)))
        now = woke
    args.out.write_text(json.dumps({"wakes": wakes, "late": late}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
