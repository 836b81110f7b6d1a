"""Redis window lookup latency (not a test): `make bench-lookup` or
`python -m benchmarks.lookup`.

One round trip of ``velocity_window`` per lookup, from this machine, on a real Redis that
``velocity up`` starts on its own port, for a dense key (a bucket every g) whose hash holds
a 24 h horizon:

- g = 1 s: 86 400 buckets; a 24 h window (every bucket) and a 10-minute window (600);
- g = 60 s: 1 440 buckets; the same two windows.

Side by side with the function as it was at ``--before`` (every lookup read the whole hash,
HGETALL), loaded under other names into the same server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LUA = "jobs/velocity/redis/velocity.lua"


def timings(call: object, runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--port", type=int, default=6394)
    parser.add_argument("--before", default="HEAD~1", help="git revision of the old function")
    args = parser.parse_args()
    import redis

    work = ROOT / "data" / "bench-lookup"
    env = {
        **os.environ,
        "VELOCITY_DATA_DIR": str(work),
        "VELOCITY_REDIS_URL": f"redis://:velocity-bench@127.0.0.1:{args.port}/0",
    }
    velocity = [sys.executable, "-m", "velocity.cli"]
    subprocess.run([*velocity, "up"], env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis.from_url(env["VELOCITY_REDIS_URL"], decode_responses=True)
        client.flushall()
        now = (ROOT / LUA).read_text()
        old = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{args.before}:{LUA}"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        client.function_load(now, replace=True)
        client.function_load(
            old.replace("name=velocity", "name=before").replace('"velocity_', '"before_'),
            replace=True,
        )
        day = 86_400_000
        at = 1_767_225_600_000 + day
        for width in (1_000, 60_000):
            name = f"bench:{{dense-{width}}}:buckets"
            pipe = client.pipeline(transaction=False)
            for start in range(at - day - width, at + 1, width):
                pipe.hset(name, str(start), '[1,1,"12.5","12.5","12.5",[]]')
            pipe.execute()
            for window in (day, 600_000):
                for label, function in (("before", "before_window"), ("now", "velocity_window")):
                    p50, p99 = timings(
                        lambda f=function, w=window, n=name, g=width: client.fcall_ro(
                            f, 1, n, "SUM", str(w), str(g), str(at)
                        ),
                        args.runs,
                    )
                    print(
                        json.dumps(
                            {
                                "g_s": width // 1000,
                                "buckets_in_hash": client.hlen(name),
                                "window_min": window // 60_000,
                                "function": label,
                                "p50_ms": round(p50, 3),
                                "p99_ms": round(p99, 3),
                            }
                        )
                    )
    finally:
        subprocess.run([*velocity, "down"], env=env, check=False, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
