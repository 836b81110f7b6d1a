"""`make demo`'s script (infra/demo.sh) end to end, shortened: its own Redis and Kafka broker
started by `velocity up` on ports of its own, beside the suite's Redis and broker (another
copy on other ports), a data dir of its own; it exits 0, shows alerts as they arrive, and the
example consumer reads them from the broker the settings name.

The demo runs as a process of its own beside the suite (``tests/integration/demo_run.py``,
after the bench smoke and the short soak: ``tests/background.py``), where its minute and a
half of JVMs and waiting cost the suite's own tests little; this test, run last, reads how
it went."""

from __future__ import annotations

import json
import re

import pytest

from tests.background import run_of, start_demo

pytestmark = [
    pytest.mark.spark,
    pytest.mark.redis,
    pytest.mark.kafka,
    pytest.mark.timeout(2100),  # the smoke and the soak before it, when still running
]


def test_demo_exits_zero_on_ports_of_its_own(request: pytest.FixtureRequest) -> None:
    run = run_of(request, "demo", start_demo)
    code = run.wait(timeout=2000)
    assert code == 0, f"the demo's runner exited {code}:\n{run.tail()}"
    result = json.loads((run.folder / "demo.json").read_text())
    lines = [(at, line) for at, line in result["lines"]]
    output = "\n".join(line for _, line in lines)
    assert result["status"] == 0, output

    # It said what it waited for, then showed alerts live.
    assert "waiting for the stream to start" in output, output
    assert "the stream's first micro-batch is done" in output, output
    metrics_port, kafka_port = result["metricsPort"], result["kafkaPort"]
    assert f"its metrics, for Prometheus: http://127.0.0.1:{metrics_port}/metrics" in output
    alert_times = [at for at, line in lines if re.match(r"rule +\d+ ", line)]
    assert alert_times, output
    seen = re.search(r"^(\d+) alerts seen on ", output, re.MULTILINE)
    assert seen and int(seen.group(1)) == len(alert_times), output
    # The alerts in Delta but those a cooldown suppressed, and those the example consumer
    # read from the demo's broker (not the one on the default port, not the suite's): the
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
    # Its last line: what still runs (here all of it ran before the demo: the runner's
    # `velocity up`) and how to stop it.
    assert lines[-1][1] == (
        "still running: Redis, the Kafka broker and the check service, which ran before the "
        "demo (the tour's next steps read Redis); `velocity down` (or `make down`) stops them"
    ), output
    # Its state went to the Redis its settings name.
    assert result["ownKeys"] > 0, result["prefix"]
    print(
        f"demo: exit 0 in {lines[-1][0]:.0f} s, first alert shown at {alert_times[0]:.0f} s, "
        f"{len(alert_times)} alerts shown, {in_delta.group(1)} in Delta"
    )
