"""Pre-authorization check benchmark (not a test): `make bench-check` or
`python -m benchmarks.check`.

Measured from outside, as a payment service would see it (issue 50's targets: p99 <= 2 ms
through the Redis Function, <= 5 ms through HTTP, at 2 000 checks/s while the stream runs at
1 000 payments/s):

- the stream runs as `make bench-stream` runs it (``benchmarks.stream``: in-order events
  generated once, files landed one a second at ``--rate``, every expected alert timed from
  its file's landing to its entry on ``velocity:alerts``, one never published counting as
  infinitely late);
- after ``--warmup-seconds`` (the stream's first batches, its JIT: their alerts count for no
  load), its landing time is cut into blocks of ``--block-seconds``, taken in turn by each load:
  none, the Function, HTTP (when `velocity serve` is built), so the stream's alert latency
  without the checks' load and with it come from the same run, interleaved (drift over the run
  falls on every load alike); an alert belongs to the block its payment's file landed in;
- in its blocks, an open-loop generator (``benchmarks.check_load``, a process of its own)
  sends ``--check-rate`` checks a second: ``FCALL_RO velocity_check`` as the read-only user,
  or ``POST /check`` with the bearer token, one round trip each on pipeline-free
  connections, each payment drawn from the file landing at that moment (the stream's payers,
  beneficiaries, devices and times). Latency from the check's scheduled time to its answer;
  one that errors or is not answered counts as infinitely late;
- Redis's CPU per check: INFO cpu (``used_cpu_sys`` + ``used_cpu_user``) over a load's blocks
  less the stream's own (the rate of the blocks without checks), over the checks; and INFO
  commandstats' ``cmdstat_fcall_ro`` (calls, µs) over the same blocks;
- then, the stream stopped and its state left in Redis, the sustained rate: checks at
  ``--ramp`` rates (doubling) for ``--step-seconds`` each until the p99 passes 2 ms, the
  generator a second process once one cannot send fast enough (two at most: the machine has
  two cores). Each step says whether Redis, the generator or the machine limited it.

``--rules`` runs each rule file in turn (default: the 8 sample rules, then
benchmarks/rules/fire_often.json, whose rule 103 is keyed by ``action``, a field of three
values: every check reads one of three hot keys holding a day of buckets).
"""

from __future__ import annotations

import argparse
import bisect
import importlib.util
import itertools
import json
import math
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from benchmarks import figures as figures_file
from benchmarks.stream import (
    PYTHON,
    ROOT,
    RULES,
    Dataset,
    cpu_seconds,
    percentile,
    prepared_dataset,
    redis_client,
    redis_cpu,
    redis_service,
    run_design,
)

FIRE_OFTEN = ROOT / "benchmarks" / "rules" / "fire_often.json"
RULE_FILES = {"sample": RULES, "fire-often": FIRE_OFTEN}
TARGET_MS = {"function": 2.0, "http": 5.0}
LOADS = ("none", "function", "http")
# Of a generator's CPU, what counts as its whole core; the same for Redis's one thread.
BUSY = 0.85
# A lane (a connection of a generator) sends at most this many checks a second, so its
# schedule slips only once a round trip takes over 4 ms: more lanes at higher rates.
LANE_RATE = 250
# Redis's latency monitor records what stalled it longer than this (ms): forks, the disk.
LATENCY_EVENT_MS = 5
# Redis's slow log keeps the calls that held it longer than this (µs) while checks run.
SLOW_US = 1000
# A wake-up of the stall probe (benchmarks.stall_probe) this late (ms) is a stall of the
# machine's: a check due then waits as long whatever Redis does.
STALL_MS = 2.0
# --at-end (the ramp) draws from the payments of the last files only (their keys, fewer to parse).
RAMP_FILES = 20


def ms(value: float) -> float | str:
    return "inf" if math.isinf(value) else round(value, 3)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def http_missing() -> str | None:
    """Why the HTTP service cannot be measured in this checkout, or None when it can."""
    from velocity.settings import Settings

    if importlib.util.find_spec("velocity.serving.service") is None or (
        "check_port" not in Settings.model_fields
    ):
        return "not built yet: this checkout has no `velocity serve`"
    return None


@dataclass
class Generated:
    """What one load's generator processes answered."""

    latencies_ms: list[float] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)
    fired: int = 0
    evaluated: int = 0
    state_seen: list[tuple[int, int]] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # a process's
    wall_seconds: list[float] = field(default_factory=list)

    def add(self, result: dict[str, Any]) -> None:
        self.latencies_ms += [math.inf if x is None else x for x in result["latencies_ms"]]
        self.send_lag_ms += result["send_lag_ms"]
        for mine, theirs in (
            (self.errors, result["errors"]),
            (self.decisions, result["decisions"]),
        ):
            for name, count in theirs.items():
                mine[name] = mine.get(name, 0) + count
        self.fired += result["fired"]
        self.evaluated += result["evaluated"]
        self.state_seen += [(a, b) for a, b in result.get("state_seen", [])]
        self.cpu_seconds.append(result["cpu_seconds"])
        self.wall_seconds.append(result["wall_seconds"])

    @property
    def unanswered(self) -> int:
        return sum(1 for x in self.latencies_ms if math.isinf(x))

    @property
    def generator_cores(self) -> float:
        """The busiest generator process's CPU over its sending time, in cores."""
        pairs = zip(self.cpu_seconds, self.wall_seconds, strict=True)
        return max((cpu / wall for cpu, wall in pairs if wall), default=0.0)

    def figures(self) -> dict[str, Any]:
        checks = len(self.latencies_ms)
        answered = checks - self.unanswered
        return {
            "checks": checks,
            "unanswered": self.unanswered,
            "errors": self.errors,
            "p50_ms": ms(percentile(self.latencies_ms, 0.5)),
            "p99_ms": ms(percentile(self.latencies_ms, 0.99)),
            "max_ms": ms(max(self.latencies_ms, default=math.inf)),
            "send_lag_p99_ms": ms(percentile(self.send_lag_ms, 0.99)),
            "decisions": self.decisions,
            "rules_evaluated_per_check": round(self.evaluated / answered, 2) if answered else 0,
            "rules_fired_per_check": round(self.fired / answered, 2) if answered else 0,
            "generator_cores": round(self.generator_cores, 2),
        }


class Generators:
    """``benchmarks.check_load`` processes, ready to send (their payments parsed, their
    connections open) once started."""

    def __init__(
        self, door: list[str], rate: float, windows: list[tuple[float, float]],
        files: list[Path], seconds_per_file: float, lanes: int, processes: int, work: Path,
        env: dict[str, str], at_end: bool = False,
    ) -> None:  # fmt: skip
        work.mkdir(parents=True, exist_ok=True)
        lanes = min(64, max(lanes, math.ceil(rate / LANE_RATE / processes)))
        self.outs = [work / f"generator-{i}.json" for i in range(processes)]
        self.logs = [work / f"generator-{i}.log" for i in range(processes)]
        self.processes = []
        for i in range(processes):
            command = [
                PYTHON, "-m", "benchmarks.check_load", *door, "--rate", str(rate),
                *[f"--window={a}:{b}" for a, b in windows], "--files", *map(str, files),
                "--seconds-per-file", str(seconds_per_file), "--lanes", str(lanes),
                "--of", str(processes), "--index", str(i), "--out", str(self.outs[i]),
                *(["--at-end"] if at_end else []),
            ]  # fmt: skip
            self.outs[i].unlink(missing_ok=True)
            self.processes.append(
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=self.logs[i].open("w"),
                    text=True,
                    start_new_session=True,
                )
            )
        for i, process in enumerate(self.processes):
            if cast(IO[str], process.stdout).readline().strip() != "ready":
                self.close()
                tail = " | ".join(self.logs[i].read_text().strip().splitlines()[-3:])
                raise RuntimeError(f"a check generator did not start ({self.logs[i]}): {tail}")

    def start(self, at_epoch: float) -> None:
        for process in self.processes:
            stdin = cast(IO[str], process.stdin)
            stdin.write(f"{at_epoch!r}\n")
            stdin.flush()

    def results(self, timeout: float) -> Generated:
        generated = Generated()
        for i, process in enumerate(self.processes):
            if process.wait(timeout=timeout):
                raise RuntimeError(f"a check generator exited {process.returncode}: {self.logs[i]}")
            generated.add(json.loads(self.outs[i].read_text()))
        return generated

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()


class StallProbe:
    """``benchmarks.stall_probe``, a process at the serving niceness that sleeps a
    millisecond at a time through the run and notes how late it woke."""

    def __init__(self, seconds: float, work: Path, redis_url: str) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.out, self.log = work / "stall-probe.json", work / "stall-probe.log"
        self.out.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [PYTHON, "-m", "benchmarks.stall_probe", "--seconds", str(seconds),
             "--report-ms", str(STALL_MS / 2), "--redis", redis_url, "--out", str(self.out)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.open("w"),
            text=True, start_new_session=True,
        )  # fmt: skip
        if cast(IO[str], self.process.stdout).readline().strip() != "ready":
            raise RuntimeError(f"the stall probe did not start: {self.log}")

    def start(self, at_epoch: float) -> None:
        stdin = cast(IO[str], self.process.stdin)
        stdin.write(f"{at_epoch!r}\n")
        stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        if self.process.wait(timeout=timeout):
            raise RuntimeError(f"the stall probe exited {self.process.returncode}: {self.log}")
        result: dict[str, Any] = json.loads(self.out.read_text())
        return result

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()


def machine_stalls(probe: dict[str, Any], windows: list[tuple[float, float]]) -> dict[str, Any]:
    """The stall probe's wake-ups in ``windows`` (seconds from the start): how many, how many
    were over ``STALL_MS`` late (and the share of them), the latest, and the time it spent
    stalled over ``STALL_MS`` a second."""
    wakes = sum(sum(probe["wakes"][int(a) : int(b)]) for a, b in windows)
    late = [ms for at, ms in probe["late"] if any(a <= at < b for a, b in windows)]
    stalled = [x for x in late if x > STALL_MS]
    seconds = sum(b - a for a, b in windows)
    pings = [ms for at, ms in probe["slow_pings"] if any(a <= at < b for a, b in windows)]
    return {
        "pings_over_2ms": sum(1 for x in pings if x > STALL_MS),
        "ping_max_ms": round(max(pings, default=0.0), 1),
        "probe_wakes": wakes,
        "probe_stalls": len(stalled),
        "probe_stall_share": round(len(stalled) / wakes, 5) if wakes else 0.0,
        "probe_stall_max_ms": round(max(late, default=0.0), 1),
        "probe_stalled_ms_per_s": round(sum(stalled) / seconds, 2) if seconds else 0.0,
    }


class CheckService:
    """`velocity serve` of the stream's data dir and Redis, on a port of the benchmark's."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.token = secrets.token_urlsafe(24)
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.process = subprocess.Popen(
            [PYTHON, "-m", "velocity.cli", "serve"],
            env={**env, "VELOCITY_CHECK_PORT": str(port), "VELOCITY_CHECK_TOKEN": self.token},
            stdout=subprocess.DEVNULL, stderr=log.open("w"), start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = " | ".join(log.read_text().strip().splitlines()[-3:])
                raise RuntimeError(f"velocity serve exited {self.process.returncode}: {tail}")
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=2).close()
                return
            except urllib.error.HTTPError:  # 503 until the stream publishes the rules
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"velocity serve did not answer /healthz in 60 s: {log}")

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid) or 0.0

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)


def slow_calls(client: Any) -> list[tuple[str, float, str]]:
    """The calls Redis's slow log kept since the last look, (command, ms, the call as the
    log keeps it: its first 32 arguments, each cut at 128 bytes); the log emptied."""
    try:
        entries = client.slowlog_get(10_000)
        client.slowlog_reset()
    except Exception:  # a Redis that refuses SLOWLOG: no diagnosis, the figures stand
        return []
    calls = []
    for entry in entries:
        command = entry.get("command", b"")
        text = command.decode(errors="replace") if isinstance(command, bytes) else command
        words = text.split()
        name = " ".join(words[:2] if words[:1] in (["FCALL"], ["FCALL_RO"]) else words[:1])
        calls.append((name, int(entry["duration"]) / 1000, text[:400]))
    return calls


def redis_stalls(client: Any) -> dict[str, Any]:
    """What stalled Redis while the files landed, by its own latency monitor (events over
    ``LATENCY_EVENT_MS``: "command" for a call, "fork" for a rewrite of the AOF, "aof-*"
    for a disk that kept a write waiting, "expire-cycle"…): each event's count of spikes
    kept, latest and longest ms; and its forks."""
    try:
        events = {
            str(name): {"latest_ms": int(latest), "max_ms": int(longest),
                        "spikes": len(client.execute_command("LATENCY", "HISTORY", name))}
            for name, _, latest, longest in client.execute_command("LATENCY", "LATEST")
        }  # fmt: skip
        stats = client.info("stats")
    except Exception:  # a Redis that refuses LATENCY: no diagnosis, the figures stand
        return {}
    return {
        "events": events,
        "forks": int(stats.get("total_forks", 0)),
        "latest_fork_ms": round(int(stats.get("latest_fork_usec", 0)) / 1000, 1),
    }


def slow_summary(calls: list[tuple[str, float, str]]) -> dict[str, dict[str, Any]]:
    """Slow calls by command: how many, the longest (ms, and the call) and all together
    (ms); the 5 costliest."""
    out: dict[str, dict[str, Any]] = {}
    for name, duration, text in calls:
        entry = out.setdefault(name, {"count": 0, "max_ms": 0.0, "total_ms": 0.0})
        entry["count"] += 1
        if duration >= entry["max_ms"]:
            entry["max_ms"], entry["longest"] = round(duration, 2), text
        entry["total_ms"] = round(entry["total_ms"] + duration, 2)
    return dict(sorted(out.items(), key=lambda item: -item[1]["total_ms"])[:5])


def redis_sample(client: Any) -> tuple[float, float, int, float]:
    """(monotonic time, Redis's CPU seconds, FCALL_RO calls, FCALL_RO µs) so far."""
    stats = client.info("commandstats").get("cmdstat_fcall_ro", {})
    return (
        time.monotonic(),
        redis_cpu(client, False),
        int(stats.get("calls", 0)),
        float(stats.get("usec", 0)),
    )


@dataclass
class Step:
    """One rate of the sustained-rate ramp."""

    rate: int
    generators: int
    generated: Generated
    seconds: float
    redis_cores: float
    fcall_ro_usec_per_call: float
    slow: list[tuple[str, float, str]]

    @property
    def p99(self) -> float:
        return percentile(self.generated.latencies_ms, 0.99)

    @property
    def passed(self) -> bool:
        return self.p99 <= TARGET_MS["function"]

    @property
    def answered_in_full(self) -> bool:
        """Every check answered, at 98 % of the rate or more (whatever the p99)."""
        answered = len(self.generated.latencies_ms) - self.generated.unanswered
        return not self.generated.unanswered and answered / self.seconds >= 0.98 * self.rate

    def figures(self) -> dict[str, Any]:
        answered = len(self.generated.latencies_ms) - self.generated.unanswered
        return {
            "rate": self.rate,
            "generators": self.generators,
            "answered_per_s": round(answered / self.seconds),
            **self.generated.figures(),
            "redis_cores": round(self.redis_cores, 2),
            "fcall_ro_usec_per_call": round(self.fcall_ro_usec_per_call, 2),
            "redis_slow_calls": slow_summary(self.slow),
            "passed": self.passed,
        }

    def limit(self) -> tuple[str, str]:
        """What held this step's p99 above the target: (redis|generator|machine, why)."""
        at = f"at {self.rate}/s, "
        if self.redis_cores >= BUSY:
            return "redis", f"{at}Redis (its thread {self.redis_cores:.2f} cores busy)"
        if self.generated.generator_cores >= BUSY:
            return "generator", (
                f"{at}the generator ({self.generators} process(es), the busiest "
                f"{self.generated.generator_cores:.2f} cores busy)"
            )
        return "machine", (
            f"{at}the machine's 2 cores (Redis {self.redis_cores:.2f} cores, the busiest "
            f"generator {self.generated.generator_cores:.2f}; the rest to the other processes)"
        )


class CheckLoad:
    """The checks' load during a `run_design` stream (``benchmarks.stream.DuringRun``), then
    the ramp once the stream is stopped."""

    def __init__(self, args: argparse.Namespace, data: Dataset, http: bool, work: Path) -> None:
        self.args = args
        self.data = data
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.env: dict[str, str] = {}
        self.loads = [x for x in LOADS if x != "http" or http]
        self.seconds_per_file = args.seconds / len(data.files)
        # After the warm-up (the stream's first batches, its JIT), blocks to the end.
        warmup, width = args.warmup_seconds, args.block_seconds
        blocks = max(1, math.ceil((args.seconds - warmup) / width))
        self.blocks = [
            (warmup + b * width, min(args.seconds, warmup + (b + 1) * width)) for b in range(blocks)
        ]
        self.block_load = [self.loads[b % len(self.loads)] for b in range(blocks)]
        self.generators: dict[str, Generators] = {}
        self.service: CheckService | None = None
        self.http_problem: str | None = None
        self.generated: dict[str, Generated] = {}
        self.samples: list[tuple[float, float, int, float]] = []
        self.slow: list[list[tuple[str, float, str]]] = []  # at each block's end, its slow calls
        self.stalls: dict[str, Any] = {}
        self.probe: StallProbe | None = None
        self.probed: dict[str, Any] = {}
        self.service_cpu = 0.0
        self.ramp: list[Step] = []
        self.ramp_limit = ""
        self.sustained = self.capacity = 0
        self.capacity_limit = ""
        self.processes = 1

    def windows(self, load: str) -> list[tuple[float, float]]:
        return [w for w, x in zip(self.blocks, self.block_load, strict=True) if x == load]

    def load_of_file(self, name: str) -> str | None:
        """The load of the block the file landed in (None: it landed in the warm-up)."""
        index = next(i for i, p in enumerate(self.data.files) if p.name == name)
        landed = index * self.seconds_per_file
        if landed < self.blocks[0][0]:
            return None
        block = int((landed - self.blocks[0][0]) // self.args.block_seconds)
        return self.block_load[min(len(self.blocks) - 1, block)]

    # -- benchmarks.stream.DuringRun ------------------------------------------------------

    def before_stream(self, env: dict[str, str], client: Any) -> None:
        """Nothing: the checks need no state before the stream's own."""

    def prepare(self, env: dict[str, str], client: Any) -> None:
        from velocity.redis.connection import with_user
        from velocity.redis.keys import RedisKeys
        from velocity.redis.server import READER_USER
        from velocity.settings import load_settings

        self.env = env
        self.client = redis_client(env["VELOCITY_REDIS_URL"])
        settings = load_settings(redis_url=env["VELOCITY_REDIS_URL"])
        reader = with_user(env["VELOCITY_REDIS_URL"], READER_USER, settings.redis_reader_password)
        self.door = {"function": ["--redis", reader]}
        self.rules_key = RedisKeys(env["VELOCITY_REDIS_KEY_PREFIX"], "").check_rules
        self.door["function"] += ["--rules-key", self.rules_key]
        try:  # which calls held Redis while checks waited, and what else stalled it
            self.client.config_set("slowlog-log-slower-than", SLOW_US)
            self.client.config_set("slowlog-max-len", 10_000)
            self.client.config_set("latency-monitor-threshold", LATENCY_EVENT_MS)
        except Exception as exc:  # no diagnosis, the figures stand
            print(f"Redis's slow log not set: {exc}", flush=True)
        if "http" in self.loads:
            try:
                self.service = CheckService(env, self.args.port + 4000, self.work / "serve.log")
                self.door["http"] = ["--http", self.service.url]
            except RuntimeError as exc:
                self.http_problem = f"failed to start: {exc}"
                print(f"HTTP not measured: {self.http_problem}", flush=True)
        self.probe = StallProbe(self.blocks[-1][1] + 1, self.work, reader)
        for load, door in self.door.items():
            token = self.service.token if self.service is not None else ""
            self.generators[load] = Generators(
                door, self.args.check_rate, self.windows(load), self.data.files,
                self.seconds_per_file, self.args.lanes, self.args.generators,
                self.work / load, {**env, "VELOCITY_CHECK_TOKEN": token},
            )  # fmt: skip

    def start(self) -> None:
        at = time.time() + 0.2
        for generators in self.generators.values():
            generators.start(at)
        if self.probe is not None:
            self.probe.start(at)
        if self.service is not None:
            self.service_cpu = self.service.cpu()
        time.sleep(max(0.0, at - time.time()))
        began = time.monotonic()
        # Redis's counters at every block's edges (a thread: the stream's files land meanwhile).
        edges = [began + a for a, _ in self.blocks] + [began + self.blocks[-1][1]]

        def sample() -> None:
            for edge in edges:
                time.sleep(max(0.0, edge - time.monotonic()))
                self.samples.append(redis_sample(self.client))
                self.slow.append(slow_calls(self.client))

        self.sampler = threading.Thread(target=sample, daemon=True)
        self.sampler.start()

    def landed(self, times: dict[str, float]) -> None:
        self.landed_at = dict(times)
        self.sampler.join(timeout=self.args.seconds + 30)
        self.stalls = redis_stalls(self.client)
        for load, generators in self.generators.items():
            self.generated[load] = generators.results(timeout=60)
        if self.probe is not None:
            self.probed = self.probe.result(timeout=60)
        if self.service is not None:
            self.service_cpu = self.service.cpu() - self.service_cpu

    def stream_stopped(self, client: Any) -> None:
        self.close()
        self.run_ramp()

    def close(self) -> None:
        for generators in self.generators.values():
            generators.close()
        if self.probe is not None:
            self.probe.close()
        if self.service is not None:
            self.service.close()

    # -- the sustained rate ---------------------------------------------------------------

    def step(self, rate: int, processes: int) -> Step:
        files = self.data.files[-RAMP_FILES:]
        generators = Generators(
            self.door["function"], rate, [(0.0, self.args.step_seconds)], files, 1.0,
            self.args.lanes, processes, self.work / f"ramp-{rate}-{processes}", self.env,
            at_end=True,
        )  # fmt: skip
        try:
            at = time.time() + 0.2
            generators.start(at)
            time.sleep(max(0.0, at - time.time()))
            slow_calls(self.client)
            before = redis_sample(self.client)
            time.sleep(self.args.step_seconds)
            after = redis_sample(self.client)
            slow = slow_calls(self.client)
            generated = generators.results(timeout=60)
        finally:
            generators.close()
        seconds = after[0] - before[0]
        calls = after[2] - before[2]
        step = Step(
            rate, processes, generated, seconds, (after[1] - before[1]) / seconds,
            (after[3] - before[3]) / calls if calls else 0.0, slow,
        )  # fmt: skip
        self.ramp.append(step)
        print(json.dumps({"ramp_step": step.figures()}), flush=True)
        return step

    def run_ramp(self) -> None:
        """The sustained rate: each rate in turn until one's p99 passes 2 ms, then once
        between it and the last that held (when none held, a half and a quarter of
        it). Then, on up the rates, the highest rate answered in full whatever the p99
        (every check answered, at 98 % of the rate or more): the capacity."""
        self.processes, passed, failed = 1, 0, 0
        for rate in self.args.ramp:
            step = self.rate_step(rate)
            if step.passed:
                passed = rate
                continue
            failed, self.ramp_limit = rate, step.limit()[1]
            break
        else:
            self.ramp_limit = f"not reached: every rate up to {self.args.ramp[-1]}/s held"
        if failed:
            lower = [(passed + failed) // 2] if passed else [failed // 2, failed // 4]
            for rate in (round(r, -2) if r >= 1000 else r for r in lower):
                if passed < rate < failed and self.rate_step(rate).passed:
                    passed = rate
                    break
        self.sustained = passed
        self.capacity_limit = ""
        for rate in (r for r in self.args.ramp if r > failed > 0):
            step = self.rate_step(rate)
            if not step.answered_in_full:
                self.capacity_limit = step.limit()[1]
                break
        if not self.capacity_limit:
            self.capacity_limit = f"not reached: every rate up to {self.args.ramp[-1]}/s answered"
        self.capacity = max((s.rate for s in self.ramp if s.answered_in_full), default=0)

    def rate_step(self, rate: int) -> Step:
        """One step; again with a second generator process when one could not send as fast."""
        step = self.step(rate, self.processes)
        lacking = not step.passed or not step.answered_in_full
        if lacking and step.limit()[0] == "generator" and self.processes < 2:
            self.processes = 2  # one process cannot send this fast: two, one a core
            step = self.step(rate, self.processes)
        return step

    # -- figures --------------------------------------------------------------------------

    def figures(self, run: Any) -> dict[str, Any]:
        by_load: dict[str, list[float]] = {load: [] for load in self.loads}
        for name, latency in run.file_latencies:
            load = self.load_of_file(name)
            if load is not None:
                by_load[load].append(latency)
        # Redis's counters over each load's blocks.
        spent: dict[str, list[float]] = {load: [0.0, 0.0, 0.0, 0.0] for load in self.loads}
        slow: dict[str, list[tuple[str, float, str]]] = {load: [] for load in self.loads}
        for b, load in enumerate(self.block_load[: len(self.samples) - 1]):
            for i in range(4):
                spent[load][i] += self.samples[b + 1][i] - self.samples[b][i]
            slow[load] += self.slow[b + 1]
        quiet = spent["none"][1] / spent["none"][0] if spent["none"][0] else 0.0
        out: dict[str, Any] = {}
        for load in self.loads:
            latencies = by_load[load]
            seconds, cpu, calls, usec = spent[load]
            entry: dict[str, Any] = {
                "blocks": self.block_load.count(load),
                "alerts": len(latencies),
                "never_published": sum(1 for x in latencies if math.isinf(x)),
                "alert_p50_s": ms(percentile(latencies, 0.5) / 1000),
                "alert_p99_s": ms(percentile(latencies, 0.99) / 1000),
                "alert_max_s": ms(max(latencies, default=math.inf) / 1000),
                "redis_cores": round(cpu / seconds, 3) if seconds else 0.0,
                "redis_slow_calls": slow_summary(slow[load]),
            }
            if self.probed:
                entry.update(machine_stalls(self.probed, self.windows(load)))
            generated = self.generated.get(load)
            if load != "none" and generated is None:
                entry["measured"] = self.http_problem or "not measured"
            elif generated is not None:
                checks = len(generated.latencies_ms)
                entry.update(generated.figures())
                entry["target_ms"] = TARGET_MS[load]
                p99 = percentile(generated.latencies_ms, 0.99)
                entry["target_met"] = p99 <= TARGET_MS[load]
                entry["redis_cpu_us_per_check"] = (
                    round((cpu - quiet * seconds) / checks * 1e6, 1) if checks else 0.0
                )
                entry["fcall_ro_calls"] = calls
                entry["fcall_ro_usec_per_call"] = round(usec / calls, 2) if calls else 0.0
                if load == "http" and checks:
                    entry["service_cpu_us_per_check"] = round(self.service_cpu / checks * 1e6, 1)
            if generated is not None:  # none seen (no batch committed yet) is a figure too
                entry.update(self.freshness(load, generated.state_seen))
            out[load] = entry
        return out

    def freshness(self, load: str, seen: list[tuple[int, int]]) -> dict[str, Any]:
        """How long after a file lands a check sees it: for each file landed in this load's
        blocks whose newest eventTime is past every earlier file's, from its landing until
        the first answer whose stateAsOf.eventTime reached it (the progress moves when the
        batch commits, after its buckets: an upper bound). A file not seen before its block
        ended is counted apart (the next block's checks are another load's)."""
        seen.sort()
        answered = [a for a, _ in seen]
        reached = list(itertools.accumulate((b for _, b in seen), max))
        began = min(self.landed_at.values()) if self.landed_at else 0.0
        lags: list[float] = []
        unseen, newest_before = 0, -math.inf
        for path in self.data.files:
            newest = max(json.loads(line)["eventTime"] for line in path.read_text().splitlines())
            fresh, newest_before = newest > newest_before, max(newest_before, newest)
            landed = self.landed_at.get(path.name)
            if not fresh or landed is None or self.load_of_file(path.name) != load:
                continue
            offset = (landed - began) / 1000
            block_end = next((b for a, b in self.blocks if a <= offset < b), self.blocks[-1][1])
            i = bisect.bisect_left(reached, newest)
            if i < len(seen) and answered[i] <= began + block_end * 1000:
                lags.append(max(0.0, answered[i] - landed))
            else:
                unseen += 1
        return {
            "seen_after_landing_p50_ms": ms(percentile(lags, 0.5)),
            "seen_after_landing_p99_ms": ms(percentile(lags, 0.99)),
            "seen_after_landing_files": len(lags),
            "not_seen_in_its_block": unseen,
        }


def ratio(a: Any, b: Any) -> float | str:
    if isinstance(a, str) or isinstance(b, str) or not b:
        return "inf" if a == "inf" else "-"
    return round(a / b, 2)


def measure(args: argparse.Namespace, rules: Path, http: str | None) -> dict[str, Any]:
    began = time.monotonic()
    work, data = prepared_dataset(args, rules)
    print(
        f"{rules.name}: {data.events} in-order events in {len(data.files)} files, "
        f"{len(data.expected)} expected alerts (velocity backtest, "
        f"{time.monotonic() - began:.0f} s)",
        flush=True,
    )
    load = CheckLoad(args, data, http is None, work / "check")
    load_before = load_average()
    try:
        run = run_design(
            "new", "folder", "single", data, args.rate, args.seconds, args.keys, work,
            args.port, during=load, extra_env={"VELOCITY_CHECK_PORT": "0"},  # `up`: no service
        )  # fmt: skip
    except BaseException:
        if load.env:  # run_design stops its Redis only once it measured
            redis_service(False, "down", load.env)
        raise
    loads = load.figures(run)
    none = loads["none"]
    result = {
        "rules": rules.name,
        "events": data.events,
        "expected_alerts": len(data.expected),
        "load_average": {"before": load_before, "after": load_average()},
        "loads": loads,
        "alert_p99_ratio": {
            f"{x}/none": ratio(loads[x]["alert_p99_s"], none["alert_p99_s"])
            for x in load.loads
            if x != "none" and "checks" in loads[x]
        },
        "ramp": {
            "step_seconds": args.step_seconds,
            "steps": [s.figures() for s in load.ramp],
            "sustained_checks_per_s": load.sustained,
            "limited_by": load.ramp_limit,
            "answered_in_full_checks_per_s": load.capacity,
            "answered_in_full_limited_by": load.capacity_limit,
        },
        "stream": run.summary(),
        "redis_stalls": load.stalls,
    }
    if http is not None or load.http_problem:
        result["http"] = http or load.http_problem
    return result


def report(result: dict[str, Any]) -> None:
    """The side-by-side table of one rules file, for people."""
    loads = result["loads"]
    print(f"\n{result['rules']} (load average {result['load_average']['before']} -> "
          f"{result['load_average']['after']})")  # fmt: skip
    print(f"  {'load':<9} {'alert p99 s':>11} {'check p50/p99/max ms':>24} {'target':>7} "
          f"{'unanswered':>10} {'Redis µs/check':>14} {'fcall_ro µs':>11}")  # fmt: skip
    for name, entry in loads.items():
        if "checks" in entry:
            checks = f"{entry['p50_ms']}/{entry['p99_ms']}/{entry['max_ms']}"
            met = "met" if entry["target_met"] else "MISSED"
            print(f"  {name:<9} {entry['alert_p99_s']:>11} {checks:>24} {met:>7} "
                  f"{entry['unanswered']:>10} {entry['redis_cpu_us_per_check']:>14} "
                  f"{entry['fcall_ro_usec_per_call']:>11}")  # fmt: skip
        else:
            print(f"  {name:<9} {entry['alert_p99_s']:>11} {entry.get('measured', '-'):>24}")
    for name, entry in loads.items():
        slow = ", ".join(
            f"{command} x{c['count']} (max {c['max_ms']} ms)"
            for command, c in entry["redis_slow_calls"].items()
        )
        print(f"  {name:<9} Redis calls over {SLOW_US / 1000:g} ms: {slow or 'none'}")
        longest = entry["redis_slow_calls"].get("FCALL_RO velocity_check", {}).get("longest")
        if longest:
            print(f"  {name:<9} the longest check: {longest[:300]}")
    for name, entry in loads.items():
        if "probe_wakes" in entry:
            print(f"  {name:<9} the machine: a sleeper at real-time 10 woke >{STALL_MS:g} ms late "
                  f"{entry['probe_stalls']} times of {entry['probe_wakes']} "
                  f"({entry['probe_stall_share']:.2%}), at most {entry['probe_stall_max_ms']} ms;"
                  f" stalled {entry['probe_stalled_ms_per_s']} ms a second; a PING to Redis "
                  f"over {STALL_MS:g} ms {entry['pings_over_2ms']} times (max "
                  f"{entry['ping_max_ms']} ms)")  # fmt: skip
    for name, entry in loads.items():
        if "seen_after_landing_p50_ms" in entry:
            print(f"  {name:<9} a landed payment seen by checks after p50 "
                  f"{entry['seen_after_landing_p50_ms']} / p99 {entry['seen_after_landing_p99_ms']}"
                  f" ms ({entry['seen_after_landing_files']} files; "
                  f"{entry['not_seen_in_its_block']} not seen within their block)")  # fmt: skip
    stalls = result.get("redis_stalls") or {}
    if stalls:
        events = ", ".join(
            f"{name} x{e['spikes']} (max {e['max_ms']} ms)" for name, e in stalls["events"].items()
        )
        print(f"  Redis stalls over {LATENCY_EVENT_MS} ms: {events or 'none'}; "
              f"{stalls['forks']} forks, the latest {stalls['latest_fork_ms']} ms")  # fmt: skip
    if result["alert_p99_ratio"]:
        print(f"  alert p99 with checks / without: {result['alert_p99_ratio']}")
    ramp = result["ramp"]
    for step in ramp["steps"]:
        print(f"  ramp {step['rate']:>6}/s x{step['generators']}: p99 {step['p99_ms']} ms, "
              f"{step['answered_per_s']} answered/s, Redis {step['redis_cores']} cores, "
              f"generator {step['generator_cores']} cores")  # fmt: skip
    print(f"  sustained at p99 <= 2 ms: {ramp['sustained_checks_per_s']} checks/s; limited by "
          f"{ramp['limited_by']}")  # fmt: skip
    print(f"  answered in full (any p99): {ramp['answered_in_full_checks_per_s']} checks/s; "
          f"limited by {ramp['answered_in_full_limited_by']}")  # fmt: skip


def rates(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("give rates > 0, comma-separated: 1000,2000,4000")
    return sorted(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="the stream's payments a second")
    parser.add_argument("--seconds", type=int, default=130, help="how long files land")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct payers")
    parser.add_argument("--check-rate", type=float, default=2000, help="checks a second")
    parser.add_argument(
        "--warmup-seconds", type=float, default=10,
        help="files land this long before the first block; their alerts count for no load",
    )  # fmt: skip
    parser.add_argument(
        "--block-seconds", type=float, default=10, help="each load's turn while files land"
    )
    parser.add_argument(
        "--rules", action="append",
        help="sample, fire-often or a rule file (repeatable; default: sample, then fire-often)",
    )  # fmt: skip
    parser.add_argument(
        "--ramp", type=rates, default=rates("1000,2000,4000,8000,16000,32000"),
        help="the sustained-rate steps, checks a second (stops at the first p99 over 2 ms)",
    )  # fmt: skip
    parser.add_argument("--step-seconds", type=float, default=10, help="each ramp step's length")
    parser.add_argument(
        "--lanes", type=int, default=16,
        help=f"connections a generator process (more at rates over {LANE_RATE}/s a lane)",
    )  # fmt: skip
    parser.add_argument(
        "--generators", type=int, default=1, choices=(1, 2),
        help="generator processes for the load while the stream runs",
    )  # fmt: skip
    parser.add_argument("--http", choices=("auto", "off"), default="auto")
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench-check"))
    parser.add_argument(
        "--port", type=int, default=6396,
        help="the benchmark's own Redis (the stream's metrics +2000, the check service +4000)",
    )  # fmt: skip
    figures_file.add_option(parser)
    args = parser.parse_args()
    if args.seconds < 1 or args.check_rate <= 0 or args.block_seconds <= 0:
        parser.error("--seconds, --check-rate and --block-seconds: give values > 0")
    if not 0 <= args.warmup_seconds < args.seconds:
        parser.error("--warmup-seconds: give 0 or more, and less than --seconds")
    rule_files = [RULE_FILES.get(r, Path(r)).resolve() for r in args.rules or RULE_FILES]
    http = "turned off (--http off)" if args.http == "off" else http_missing()
    if http:
        print(f"HTTP: {http}", flush=True)
    print(
        "scheduling: Redis and velocity serve at VELOCITY_SERVING_NICE and "
        "VELOCITY_SERVING_REALTIME (as `velocity up` runs them), the check generators and the "
        "stall probe at real-time 10, nice -10 (each stands for a service on a machine of its "
        "own); the stream at the default",
        flush=True,
    )
    results = []
    for rules in rule_files:
        results.append(measure(args, rules, http))
        print(json.dumps(results[-1]), flush=True)
    for result in results:
        report(result)
    figures_file.write(
        args.figures,
        {
            "stream_rate": args.rate,
            "check_rate": args.check_rate,
            "seconds": args.seconds,
            "keys": args.keys,
            "warmup_seconds": args.warmup_seconds,
            "block_seconds": args.block_seconds,
            "http": http or "measured",
            "rules": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
