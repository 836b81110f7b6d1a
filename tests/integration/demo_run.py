"""`make demo`'s script (infra/demo.sh), shortened, run as a process of its own beside the
suite (``tests/background.py``): ``python -m tests.integration.demo_run FOLDER`` starts the
demo's own Redis and Kafka broker with `velocity up` on ports of its own, runs the demo,
stops them, and writes what the test reads to FOLDER/demo.json: the exit code, each line
with its second, the ports, and the keys of its data dir in its own Redis.

Its services are started just before the demo (whose `velocity up` then finds them
running), so that the Spark JVMs alone start with FAST_JVM (which the broker's JVM refuses
beside its own collector). Its ports come from 1 100-2 000, a range no test fixture or other
run beside the suite draws from (``tests/conftest.py`` lists them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import FAST_JVM
from velocity.operating.local_process import free_loopback_port
from velocity.settings import PROJECT_ROOT, load_settings

DEMO_SH = PROJECT_ROOT / "infra" / "demo.sh"
VELOCITY = str(Path(sys.executable).parent / "velocity")


def run(folder: Path) -> dict[str, object]:
    import redis

    # Five free ports in one draw (draws one by one could return the same port twice):
    # Redis, the broker and its controller, the stream's metrics, the check service.
    first = free_loopback_port((0, 1, 2, 3, 4), low=1_100, high=2_000)
    redis_port, kafka_port, metrics_port, check_port = first, first + 1, first + 3, first + 4
    data_dir = folder / "data"
    # Only the demo's own settings: none of the suite's VELOCITY_* leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VELOCITY_", "DEMO_"))}
    env.update(
        VELOCITY_DATA_DIR=str(data_dir),
        VELOCITY_REDIS_URL=f"redis://:demo-secret@127.0.0.1:{redis_port}/0",
        VELOCITY_KAFKA_BOOTSTRAP=f"127.0.0.1:{kafka_port}",
        VELOCITY_METRICS_PORT=str(metrics_port),
        VELOCITY_CHECK_PORT=str(check_port),  # its `velocity up` starts one
        VELOCITY_SPARK_SHUFFLE_PARTITIONS="2",
        VELOCITY_SPARK_DRIVER_MEMORY="1g",
        DEMO_DIR=str(folder / "demo"),
        DEMO_SECONDS="15",
        DEMO_DRAIN_SECONDS="5",
        DEMO_RATE="300",  # spikes in proportion: a handful of alerts in 15 s
        DEMO_KEYS="2000",
    )
    lines: list[tuple[float, str]] = []
    began = time.monotonic()
    try:
        up = subprocess.run([VELOCITY, "up"], env=env, capture_output=True, text=True, timeout=120)
        if up.returncode != 0:
            return {"status": -1, "lines": [[0.0, up.stdout + up.stderr]]}
        demo = subprocess.Popen(
            ["bash", str(DEMO_SH)],
            env={**env, **FAST_JVM},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append((time.monotonic() - began, line.rstrip("\n")))
        status = demo.wait(timeout=60)
        prefix = load_settings(data_dir=data_dir).redis_keys.prefix
        own_keys = sum(1 for _ in redis.Redis.from_url(env["VELOCITY_REDIS_URL"]).scan_iter(
            match=f"{prefix}:*"))  # fmt: skip
    finally:
        subprocess.run([VELOCITY, "down"], env=env, capture_output=True, timeout=120, check=False)
    return {
        "status": status,
        "lines": lines,
        "kafkaPort": kafka_port,
        "metricsPort": metrics_port,
        "prefix": prefix,
        "ownKeys": own_keys,
    }


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    (folder / "demo.json").write_text(json.dumps(run(folder)))
