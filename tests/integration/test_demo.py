"""`make demo`'s script (infra/demo.sh) end to end, shortened: its own Redis and Kafka broker
started by `velocity up` on free ports, beside the session's Redis and broker (another copy
on other ports), a tmp data dir; it exits 0, shows alerts as they arrive, and the example
consumer reads them from the broker the settings name.

The demo's services are its own rather than the session's: `velocity up` adopts only the
Redis and broker of its data dir and refuses others, and starting both costs ~6 s. The test
starts them just before the demo (whose `velocity up` finds them running), so that the Spark
JVMs alone start with FAST_JVM."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import (
    FAST_JVM,
    free_check_port,
    free_metrics_port,
    free_port,
    free_port_pair,
)
from velocity.settings import PROJECT_ROOT, load_settings

DEMO_SH = PROJECT_ROOT / "infra" / "demo.sh"
VELOCITY = str(Path(sys.executable).parent / "velocity")

pytestmark = [
    pytest.mark.spark,
    pytest.mark.redis,
    pytest.mark.kafka,
    pytest.mark.timeout(600),
]


@pytest.mark.usefixtures("kafka_bootstrap")  # the other copy's broker, running beside
def test_demo_exits_zero_beside_another_copy(tmp_path: Path, redis_url: str) -> None:
    import redis

    redis_port, kafka_port, metrics_port = free_port(), free_port_pair(), free_metrics_port()
    # Only the demo's own settings: none of this run's VELOCITY_* leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VELOCITY_", "DEMO_"))}
    env.update(
        VELOCITY_DATA_DIR=str(tmp_path / "data"),
        VELOCITY_REDIS_URL=f"redis://:demo-secret@127.0.0.1:{redis_port}/0",
        VELOCITY_KAFKA_BOOTSTRAP=f"127.0.0.1:{kafka_port}",
        VELOCITY_METRICS_PORT=str(metrics_port),
        VELOCITY_CHECK_PORT=str(free_check_port()),  # its `velocity up` starts one
        VELOCITY_SPARK_SHUFFLE_PARTITIONS="2",
        VELOCITY_SPARK_DRIVER_MEMORY="1g",
        DEMO_DIR=str(tmp_path / "demo"),
        DEMO_SECONDS="15",
        DEMO_DRAIN_SECONDS="5",
        DEMO_RATE="300",  # spikes in proportion: a handful of alerts in 15 s
        DEMO_KEYS="2000",
    )
    lines: list[tuple[float, str]] = []
    began = time.monotonic()
    try:
        # The demo's `velocity up` then finds its services running, and FAST_JVM (which the
        # broker's JVM refuses beside its own collector) reaches the Spark JVMs only.
        up = subprocess.run([VELOCITY, "up"], env=env, capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
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
    finally:
        subprocess.run([VELOCITY, "down"], env=env, capture_output=True, timeout=120, check=False)
    output = "\n".join(line for _, line in lines)
    assert status == 0, output

    # It said what it waited for, then showed alerts live.
    assert "waiting for the stream to start" in output, output
    assert "the stream's first micro-batch is done" in output, output
    assert f"its metrics, for Prometheus: http://127.0.0.1:{metrics_port}/metrics" in output
    alert_times = [at for at, line in lines if re.match(r"rule +\d+ ", line)]
    assert alert_times, output
    seen = re.search(r"^(\d+) alerts seen on ", output, re.MULTILINE)
    assert seen and int(seen.group(1)) == len(alert_times), output
    # The alerts in Delta but those a cooldown suppressed, and those the example consumer
    # read from the demo's broker (not the one on the default port, not the session's): the
    # same alerts.
    in_delta = re.search(r"^alerts in Delta: (\d+) \((\d+) suppressed ", output, re.MULTILINE)
    handled = re.search(
        rf"^(\d+) alerts handled from velocity\.alerts at 127\.0\.0\.1:{kafka_port},",
        output,
        re.MULTILINE,
    )
    assert in_delta and handled, output
    notified = int(in_delta.group(1)) - int(in_delta.group(2))
    assert int(handled.group(1)) == notified >= len(alert_times), output
    # Its last line: what still runs (here all of it ran before the demo: the test's
    # `velocity up`) and how to stop it.
    assert lines[-1][1] == (
        "still running: Redis, the Kafka broker and the check service, which ran before the "
        "demo (the tour's next steps read Redis); `velocity down` (or `make down`) stops them"
    ), output
    # The session's Redis (the other copy's) holds no key of the demo's data dir.
    prefix = load_settings(data_dir=tmp_path / "data").redis_keys.prefix
    assert not list(redis.Redis.from_url(redis_url).scan_iter(match=f"{prefix}:*")), prefix
    print(
        f"demo: exit 0 in {lines[-1][0]:.0f} s, first alert shown at {alert_times[0]:.0f} s, "
        f"{len(alert_times)} alerts shown, {in_delta.group(1)} in Delta"
    )
