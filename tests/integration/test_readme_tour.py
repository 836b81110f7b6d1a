"""The README's five-minute tour, run as written.

The test reads the fenced blocks of the README's "A five-minute tour" section and runs them in
order: so a README that changes to something that does not run fails here. Each shell runs
in a scratch folder with the checkout's `.venv` linked in (the tour's `my_rule.json` lands
there, not in the checkout), with the session's redis-server and a data dir of this test as
`VELOCITY_REDIS_URL` and `VELOCITY_DATA_DIR`: the settings the tour's commands read.

What is not run, and why:
- `make setup`, `make demo` and `make airflow` are long-running targets (minutes each). The
  test checks with `make -n` that each is a Makefile target running the script other tests
  run end to end: setup has run before the suite (`make test` runs it first),
  `infra/demo.sh` runs in tests/integration/test_demo.py, `infra/airflow.sh up` in the browser
  tests. Any other `make` line in the tour fails here.
- In place of the demo's 90-second stream, a bounded one: the streaming job in this process
  (the session's Spark: no new JVM), `available-now` over one file of payments that fire the
  tour's rule 9, so the tour's reads find what the demo leaves in Redis: the rule's entry,
  buckets and alerts. That costs seconds, not the demo's two minutes.
- The reader's shell keeps step 1's `source .venv/bin/activate` through the demo; each script
  here is a new shell, so the one after the demo starts with the activation line the tour
  wrote before it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.spark.streaming import run_available_now
from velocity.settings import PROJECT_ROOT, Settings

README = PROJECT_ROOT / "README.md"
TOUR_HEADING = "## A five-minute tour"
# The tour's make targets, and the script each runs: what the tests that run it end to end run.
LONG_RUNNING = {
    "setup": "infra/setup.sh",
    "demo": "infra/demo.sh",
    "airflow": "infra/airflow.sh up",
}
ACTIVATE = "source .venv/bin/activate"

pytestmark = [pytest.mark.spark, pytest.mark.redis, pytest.mark.timeout(300)]


@dataclass
class Tour:
    """The tour's shell lines before and after `make demo`, its python blocks, its make
    targets."""

    before_demo: list[str]
    after_demo: list[str]
    python: list[str]
    make_targets: list[str]


def tour_section(readme: str) -> str:
    start = readme.index(TOUR_HEADING)
    following = readme.find("\n## ", start + len(TOUR_HEADING))
    return readme[start : following if following >= 0 else len(readme)]


def parse_tour(readme: str) -> Tour:
    """The tour's fenced blocks: bash lines split at `make demo`, `make` lines taken out."""
    tour = Tour([], [], [], [])
    demo_seen = False
    for language, body in re.findall(r"^```(\w*)\n(.*?)^```$", tour_section(readme), re.M | re.S):
        if language == "python":
            tour.python.append(body)
        elif language == "bash":
            for line in body.splitlines():
                words = line.split("#")[0].split()
                if words[:1] == ["make"]:
                    tour.make_targets.extend(words[1:])
                    demo_seen = demo_seen or "demo" in words[1:]
                    continue
                (tour.after_demo if demo_seen else tour.before_demo).append(line)
        # Other blocks (the alert line the demo prints) are output, not commands.
    return tour


def test_the_tour_is_parsed_as_the_readme_writes_it() -> None:
    """The parser itself: a tour without its demo or its Python would run nothing here."""
    tour = parse_tour(README.read_text(encoding="utf-8"))
    assert "demo" in tour.make_targets, "the tour streams the demo with `make demo`"
    commands = [line.split("#")[0].strip() for line in tour.before_demo]
    assert ACTIVATE in commands, tour.before_demo
    assert any("velocity rules apply" in line for line in tour.before_demo)
    assert any("FCALL_RO velocity_window" in line for line in tour.after_demo)
    assert tour.python and all("fcall_ro" in block for block in tour.python)


def test_the_tours_make_targets_run_the_scripts_other_tests_run() -> None:
    tour = parse_tour(README.read_text(encoding="utf-8"))
    for target in tour.make_targets:
        assert target in LONG_RUNNING, (
            f"the tour runs `make {target}`, which this test neither runs nor knows to be "
            f"run elsewhere; run its commands in the tour instead, or add it to LONG_RUNNING "
            f"with the test that runs it"
        )
        dry = subprocess.run(
            ["make", "-n", target], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=30
        )
        assert dry.returncode == 0, dry.stderr
        assert LONG_RUNNING[target] in dry.stdout, (target, dry.stdout)


def _payments(folder: Path, now_ms: int) -> None:
    """Three card payments of 20 000 from p-tour within three minutes (the third makes the
    tour's rule 9 fire: 60 000 > 50 000 in 10 minutes), and two small ones of p-other. Their
    eventTimes are minutes before now, so a window read as of now (the tour's reads) holds
    them."""
    lines = [
        {"transactionId": f"tour-{n}", "eventTime": now_ms - (4 - n) * 60_000,
         "payerId": "p-tour", "beneficiaryId": "b-7", "paymentAmount": 20000,
         "paymentType": "CRD"}
        for n in range(3)
    ] + [
        {"transactionId": f"other-{n}", "eventTime": now_ms - (3 - n) * 60_000,
         "payerId": "p-other", "beneficiaryId": "b-8", "paymentAmount": "12.50",
         "paymentType": "CSH"}
        for n in range(2)
    ]  # fmt: skip
    lines.sort(key=lambda event: event["eventTime"])
    hidden = folder / ".events-000000.jsonl"
    hidden.write_text("".join(json.dumps(event) + "\n" for event in lines), encoding="utf-8")
    hidden.rename(folder / "events-000000.jsonl")  # land it whole, as writers should


def _bash(lines: list[str], cwd: Path, env: dict[str, str]) -> str:
    script = "set -eu\n" + "\n".join(lines) + "\n"
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done.stdout


def test_the_tour_runs_as_written(spark: object, data_settings: Settings, tmp_path: Path) -> None:
    from velocity.spark.stream import StreamJob

    tour = parse_tour(README.read_text(encoding="utf-8"))
    reader_home = tmp_path / "reader"  # the tour's working folder
    reader_home.mkdir()
    (reader_home / ".venv").symlink_to(PROJECT_ROOT / ".venv")
    # Only this data dir's settings: none of the run's VELOCITY_* leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VELOCITY_", "DEMO_"))}
    env.update(
        VELOCITY_DATA_DIR=str(data_settings.data_dir),
        VELOCITY_REDIS_URL=data_settings.redis_url,
        VELOCITY_KAFKA_BOOTSTRAP="",
        VELOCITY_METRICS_PORT="0",
    )

    # 1. Write a rule: validated and applied to this data dir's rules table.
    shown = _bash(tour.before_demo, reader_home, env)
    assert "my_rule.json: 1 valid rule entries" in shown, shown
    listed = [json.loads(line) for line in shown.splitlines() if line.startswith("{")]
    assert [(rule["ruleId"], rule["ruleState"]) for rule in listed] == [(9, "ACTIVE")], shown

    # 2. The demo's stream, bounded: what is in one folder, then stop.
    events = tmp_path / "events"
    events.mkdir()
    _payments(events, int(time.time() * 1000))
    job = StreamJob(spark, data_settings.model_copy(update={"metrics_port": 0}))
    try:
        assert run_available_now(job, events) == 1
    finally:
        job.close()

    # 3 and 4. The alerts, the rule's entry and a window, read from Redis as the tour reads them.
    shown = _bash([ACTIVATE, *tour.after_demo], reader_home, env)
    assert '"payerId":"p-tour"' in shown and "1 alerts seen" in shown, shown
    assert "signatureId" in shown and "groupingKeyNames" in shown, shown
    lines = shown.splitlines()
    assert "string" in lines, shown  # a key's state is a packed string (TYPE), not a hash
    windows = [json.loads(line) for line in lines if line.startswith('{"aggregateValue"')]
    windows += [json.loads(line) for line in lines if line.startswith('{"ruleId"')]
    assert len(windows) == 2, shown  # FCALL_RO velocity_window, then velocity lookup
    assert windows[0]["aggregateValue"] == windows[1]["aggregateValue"] in {"60000", "25"}, shown
    assert windows[1]["ruleId"] == 9, shown
    # 5. The check of one more payment of the payer, by `velocity check` and FCALL_RO.
    checks = [json.loads(line) for line in lines if line.startswith('{"decision"')]
    assert len(checks) == 2 and checks[0]["rules"] == checks[1]["rules"], shown
    tour_rule = next(r for r in checks[0]["rules"] if r["ruleId"] == 9)
    fired = windows[0]["aggregateValue"] == "60000"  # p-tour's window, else p-other's
    assert tour_rule["fired"] is fired and tour_rule["outcome"] == "REVIEW", shown
    assert checks[0]["decision"] == ("REVIEW" if fired else "ALLOW"), shown
    assert checks[0]["stateAsOf"]["batch"] == 0, shown

    for block in tour.python:
        done = subprocess.run(
            [str(PROJECT_ROOT / ".venv" / "bin" / "python"), "-"],
            input=block,
            cwd=reader_home,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{block}\n--- stderr\n{done.stderr}"
        assert "p-tour" in done.stdout and '"aggregateValue":"60000"' in done.stdout, done.stdout
