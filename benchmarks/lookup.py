"""Redis window lookup latency (not a test): `make bench-lookup` or
`python -m benchmarks.lookup`.

One round trip of ``velocity_window`` per lookup, from this machine, on a real Redis that
``velocity up`` starts on its own port, for a dense key (a bucket every g, each with a
decimal amount) whose hash holds the whole horizon:

- g = 1 s: 86 400 buckets; a 24 h window (every bucket) and a 10-minute window (600);
- g = 60 s: 43 200 buckets; a 30-day window, a 24 h one and a 10-minute one;
- g = 60 s: 100 buckets, a 1 h window: a packed key (one string), as nearly every key is.

Each lookup is at a random time in the last hour (a window's edges fall anywhere in the
roll-up blocks), for SUM (exact decimal sums) and UNIQUE_COUNT. Side by side with the
function as it was at ``--before``, loaded under other names into the same server and
reading a copy of the hash written with plain HSETs (the hash it knew; a revision with
roll-ups reads the dense key's hash itself, which it kept under the state key's name).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from benchmarks import figures as figures_file

ROOT = Path(__file__).resolve().parents[1]
LUA = "jobs/velocity/redis/velocity.lua"
DAY = 86_400_000
CASES = [  # (g ms, horizon ms, windows ms)
    (1_000, DAY, [DAY, 600_000]),
    (60_000, 30 * DAY, [30 * DAY, DAY, 600_000]),
    (60_000, 100 * 60_000, [3_600_000]),  # a key of 100 buckets: packed (fewer than 128)
]


def timings(call: object, runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def bucket_text(i: int) -> str:
    """One event of a decimal amount, and one of 50 distinct values, in the stream's own
    layout (``velocity.redis.keys.bucket_value``: decimals trimmed)."""
    from velocity.domain.buckets import BucketAggregate
    from velocity.redis.keys import bucket_value

    amount = Decimal(f"{i % 997}.{i % 89:02d}")
    return bucket_value(BucketAggregate(1, 1, amount, amount, amount, frozenset({f"m{i % 50}"})))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--port", type=int, default=6394)
    parser.add_argument(
        "--before", default="ee2a6d2", help="git revision of the old function (before roll-ups)"
    )
    parser.add_argument("--work-dir", type=Path, default=ROOT / "data" / "bench-lookup")
    figures_file.add_option(parser)
    args = parser.parse_args()
    import redis

    work = args.work_dir
    figures: dict[str, Any] = {"before": args.before, "lookups": []}
    env = {
        **os.environ,
        "VELOCITY_DATA_DIR": str(work),
        "VELOCITY_REDIS_URL": f"redis://:velocity-bench@127.0.0.1:{args.port}/0",
        "VELOCITY_KAFKA_BOOTSTRAP": "",  # `velocity up` starts no broker: nothing reads one
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
        rng = random.Random(1)
        p50, p99 = timings(client.ping, args.runs)  # the floor: a round trip doing nothing
        figures["ping"] = {"call": "PING", "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}
        print(json.dumps(figures["ping"]))
        end = 1_767_225_600_000 + 40 * DAY
        for width, horizon, windows in CASES:
            plain, rolled = f"bench:{{plain-{width}}}:buckets", f"bench:{{rolled-{width}}}:buckets"
            starts = range(end - horizon - width, end + 1, width)
            pipe = client.pipeline(transaction=False)
            for i, start in enumerate(starts):
                pipe.hset(plain, str(start), bucket_text(i))
                if i % 2000 == 1999:
                    pipe.execute()
            pipe.execute()
            pairs = [str(x) for i, s in enumerate(starts) for x in (s, bucket_text(i))]
            for at in range(0, len(pairs), 20_000):  # as a rebuild writes them
                chunk = pairs[at : at + 20_000]
                client.fcall("velocity_put_buckets", 1, rolled, str(width), "", "", *chunk)
            for window in windows:
                for aggregator in ("SUM", "UNIQUE_COUNT"):
                    # A revision with roll-ups reads the dense hash as now; one before, or a
                    # key with too few buckets to be dense, the plain hash it knew.
                    dense = "ROLLUP_SIZES" in old and len(starts) >= 128
                    before_reads = rolled.removesuffix(":buckets") + ":dense" if dense else plain
                    for label, function, name in (
                        ("before", "before_window", before_reads),
                        ("now", "velocity_window", rolled),
                    ):
                        p50, p99 = timings(
                            lambda f=function, n=name, w=window, g=width, a=aggregator: (
                                client.fcall_ro(
                                    f, 1, n, a, str(w), str(g), str(end - rng.randrange(3_600_000))
                                )
                            ),
                            args.runs if window < DAY or label == "now" else min(args.runs, 20),
                        )
                        figures["lookups"].append(
                            {
                                "g_s": width // 1000,
                                "buckets": len(starts),
                                "window_min": window // 60_000,
                                "aggregator": aggregator,
                                "function": label,
                                "p50_ms": round(p50, 3),
                                "p99_ms": round(p99, 3),
                            }
                        )
                        print(json.dumps(figures["lookups"][-1]), flush=True)
        figures_file.write(args.figures, figures)
    finally:
        subprocess.run([*velocity, "down"], env=env, check=False, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
