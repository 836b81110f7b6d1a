"""`make soak MINUTES=30`: the stream on Kafka at 1,000 payments/s with the sample rules
(cooldowns and cases included) while faults strike at random times, then what held.

Not a test and not part of `make test` (tests/soak/test_soak.py runs a short version).
Everything is real and on this machine, in a work folder of its own (``--work-dir``):
a Redis and a Kafka broker as `velocity up` starts them (ports of their own), an Airflow
home (``infra/airflow.sh test-env``) with its api-server serving the Velocity page, and
the stream started through the ``run_stream`` DAG (`airflow dags test`).

Events are generated once (in eventTime order per payer), and their complete-data
alerts and buckets computed by `velocity backtest --keep-state`; a producer sends one
second of them a second to the events topic, keyed by payerId. Meanwhile each fault kind
strikes ``--each`` times at random moments (one at a time, each waited out until the
stream commits a batch again):

- ``stream_sigkill``: SIGKILL the stream's spark-submit and everything under it; start it
  again through ``run_stream``;
- ``decider_kill``: SIGKILL a process deciding a key-partition (``LOCAL_DECIDERS``: a
  batch under ``VELOCITY_STREAM_EXECUTOR_MIN_ROWS`` keyed rows is decided there);
- ``redis_restart``: SIGKILL redis-server and start it again: it loads its AOF;
- ``redis_flush``: FLUSHALL; the stream rebuilds the mirror from Delta;
- ``kafka_restart``: stop the broker and start it again;
- ``maintain_state``: the maintenance DAG (`velocity maintain all`: compaction, OPTIMIZE,
  VACUUM, eviction, reconcile) beside the running stream;
- ``backfill``: the ``backfill_alerts`` DAG over a range the stream has decided;
- ``case_close``: close open cases through the page's API (a bearer token).

A tail of the Redis alert stream (``XREAD``, from where it was, across restarts and
flushes) and a probe of the page (every 2 s) run throughout. At the end, the stream
stopped: the checks of ``tools.soak_checks`` on the Delta tables, the tail, the alerts
topic and the probe, printed as a table. Exit 1 when a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tools.soak_checks import (
    Check,
    FaultRecord,
    Outcome,
    Slot,
    bucket_problems,
    case_problems,
    compare_alerts,
    fault_schedule,
    fault_summary,
    in_effect,
    repeats,
    what_held,
)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RULES = ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"
AIRFLOW_SH = ROOT / "infra" / "airflow.sh"
FAULTS = (
    "stream_sigkill",
    "decider_kill",
    "redis_restart",
    "redis_flush",
    "kafka_restart",
    "maintain_state",
    "backfill",
    "case_close",
)
# Airflow DAG runs: they run beside the other faults, one at a time.
SLOW_FAULTS = ("maintain_state", "backfill")


@dataclass
class SoakConfig:
    minutes: float = 30.0  # how long payments are produced
    rate: int = 1000  # payments a second
    keys: int = 20_000  # distinct payers
    each: int = 2  # times each fault kind strikes
    gap: float = 20.0  # seconds at least between two faults' moments
    # Redis restarted while the stream is down after each SIGKILL (not on its own): one
    # restart of the stream for both, for a short run (the test).
    redis_with_sigkill: bool = False
    seed: int = 53
    work: Path = ROOT / "data" / "soak"
    # A fault not recovered from by then counts as not: a flushed Redis's rebuild alone took
    # 149 s at the 30-minute run's end (2.5M buckets), a stream's restart a minute more.
    recovery_seconds: float = 600.0
    airflow_home: Path | None = None  # an Airflow home already migrated (tests); else made
    log: Callable[[str], None] = field(default=lambda text: print(text, flush=True))


def run_checked(command: list[str], env: dict[str, str], what: str, **kwargs: Any) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode:
        raise RuntimeError(
            f"{what} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def process_tree(root_pid: int) -> list[int]:
    """``root_pid`` and its descendants."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        return [root_pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        return []


def cmdline(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def sigkill(pids: list[int]) -> list[int]:
    killed = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def maps_hold(pid: int, text: str) -> bool:
    try:
        return text in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def decider_pids(driver: int) -> list[int]:
    """The stream driver's kept deciding processes (``LOCAL_DECIDERS``): its spawned
    pool workers but the spool flusher, the one that loaded delta-rs."""
    workers = [
        pid
        for pid in process_tree(driver)[1:]
        if "spawn_main" in cmdline(pid) and "resource_tracker" not in cmdline(pid)
    ]
    return sorted(pid for pid in workers if not maps_hold(pid, "deltalake"))


class Soak:
    """One soak run: its services, the stream, the faults, the checks."""

    def __init__(self, config: SoakConfig) -> None:
        from velocity.operating.local_process import free_loopback_port
        from velocity.settings import load_settings

        self.config = config
        self.log = config.log
        work = config.work
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        self.work = work
        self.rng = random.Random(config.seed)
        # Ranges no test fixture draws from (tests/conftest.py lists them): the suite runs
        # the short soak beside its own tests (tests/background.py).
        redis_port = free_loopback_port((0,), low=8_000, high=9_000)
        kafka_port = free_loopback_port((0, 1), low=6_000, high=7_000)
        self.airflow_port = free_loopback_port((0, 1, 2, 3), low=9_000, high=10_000)
        self.settings = load_settings(
            data_dir=work / "data",
            redis_url=f"redis://:soak-secret@127.0.0.1:{redis_port}/0",
            kafka_bootstrap=f"127.0.0.1:{kafka_port}",
        )
        self.velocity_env = {
            "VELOCITY_DATA_DIR": str(self.settings.data_dir),
            "VELOCITY_REDIS_URL": self.settings.redis_url,
            "VELOCITY_KAFKA_BOOTSTRAP": self.settings.kafka_bootstrap,
            "VELOCITY_METRICS_PORT": "0",  # beside others' streams on a shared machine
            "VELOCITY_CHECK_PORT": "0",
        }
        self.env = {**os.environ, **self.velocity_env}
        self.began = time.monotonic()
        self.outcome = Outcome()
        self.stream: subprocess.Popen[str] | None = None
        self.stream_runs = 0
        self.stream_deaths: list[tuple[str, str]] = []  # (verdict, when and why) by itself
        self.api_server: subprocess.Popen[str] | None = None
        self.token = ""
        self.stop = threading.Event()
        self.produced_files = 0
        self.produced_lines = 0
        self.tail_ids: list[tuple[str, str, int, str]] = []  # (alertId, kind, ruleId, txId)
        self.probes: list[tuple[float, int, float]] = []  # (at, status, seconds)
        self.closed_cases: list[str] = []
        self.slow_faults: list[threading.Thread] = []
        self.slow_lock = threading.Lock()
        self.dag_runs: list[subprocess.Popen[str]] = []
        self.errors: list[str] = []

    # --- the run ------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.began

    def say(self, text: str) -> None:
        self.log(f"[{self.now():7.1f} s] {text}")

    def run(self) -> Outcome:
        config = self.config
        seconds = int(config.minutes * 60)
        try:
            # The reference is computed while the services and the stream start (two
            # JVMs at once, but the run is shorter); payments wait in the topic meanwhile.
            backtest = threading.Thread(target=self.backtest)
            self.generate(seconds)
            backtest.start()
            self.start_services()
            self.start_airflow()
            self.start_stream()
            self.sign_in_admin()
            threads = [
                threading.Thread(target=self.produce, daemon=True),
                threading.Thread(target=self.tail_alerts, daemon=True),
                threading.Thread(target=self.probe_page, daemon=True),
            ]
            for thread in threads:
                thread.start()
            # The faults' moments count from the stream's first batch: before it there is
            # nothing to break (payments wait in the topic meanwhile).
            self.wait_for_batch(-1, config.recovery_seconds)
            self.production_began = time.monotonic()
            self.inject_faults(seconds)
            threads[0].join()
            self.say(f"produced {self.produced_lines} payments in {self.produced_files} s")
            for slow in self.slow_faults:
                while slow.is_alive():  # the stream is watched meanwhile
                    slow.join(timeout=2)
                    if not self.stream_alive():
                        self.stream_ended_by_itself()
            self.finish_stream()
            self.backfill_late()
            self.stop.set()
            for thread in threads[1:]:
                thread.join(timeout=30)
            backtest.join()
            if self.errors:
                raise RuntimeError("; ".join(self.errors))
            self.check()
        finally:
            self.stop.set()
            self.tear_down()
        return self.outcome

    # --- events and the reference -------------------------------------------------------

    def generate(self, seconds: int) -> None:
        config = self.config
        self.staging = self.work / "events"
        self.start_ms = int(time.time() * 1000)
        run_checked(
            [str(BIN / "velocity"), "generate", "--out", str(self.staging),
             "--events", str(config.rate * seconds), "--rate", str(config.rate),
             "--keys", str(config.keys), "--files", str(seconds), "--start", str(self.start_ms),
             "--spike-fraction", "0.01", "--late-fraction", "0", "--duplicate-fraction", "0",
             "--malformed-fraction", "0", "--seed", str(config.seed)],
            {**self.env, "VELOCITY_DATA_DIR": str(self.work / "generate")}, "velocity generate",
        )  # fmt: skip
        self.files = sorted(self.staging.glob("*.jsonl"))
        self.say(f"generated {config.rate * seconds} payments in {len(self.files)} files")

    def backtest(self) -> None:
        try:
            self.expected_file = self.work / "expected.jsonl"
            began = time.monotonic()
            run_checked(
                [str(BIN / "velocity"), "backtest", "--rules", str(RULES), "--events",
                 str(self.staging), "--out", str(self.expected_file), "--keep-state"],
                {**self.env, "VELOCITY_DATA_DIR": str(self.work / "backtest"),
                 "VELOCITY_SPARK_MASTER": "local[2]"},
                "velocity backtest",
            )  # fmt: skip
            self.say(f"backtest of every payment: {time.monotonic() - began:.0f} s")
        except Exception as exc:  # raised again in run()
            self.errors.append(str(exc))

    # --- services -----------------------------------------------------------------------

    def start_services(self) -> None:
        from velocity.kafka.broker import kafka_up
        from velocity.kafka.topics import ensure_topics
        from velocity.redis.server import redis_up

        redis_up(self.settings)
        kafka_up(self.settings)
        ensure_topics(self.settings)
        self.say(f"Redis {self.settings.redis_address[:2]}, Kafka {self.settings.kafka_bootstrap}")

    def airflow_environment(self, home: Path) -> dict[str, str]:
        script = f'eval "$(bash {AIRFLOW_SH} test-env {home} {self.airflow_port})" && env -0'
        out = run_checked(["bash", "-c", script], dict(os.environ), "infra/airflow.sh test-env")
        evaluated = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
        return {k: v for k, v in evaluated.items() if k.startswith("AIRFLOW") or k == "PATH"}

    def start_airflow(self) -> None:
        config = self.config
        home = config.airflow_home or self.work / "airflow"
        home.mkdir(parents=True, exist_ok=True)
        extra = {
            "data_dir": str(self.settings.data_dir),
            "redis_url": self.settings.redis_url,
            "kafka_bootstrap": self.settings.kafka_bootstrap,
            "spark_shuffle_partitions": 2,
        }
        self.env.update(self.airflow_environment(home))
        self.env["AIRFLOW_CONN_VELOCITY_DEFAULT"] = json.dumps(
            {"conn_type": "generic", "extra": json.dumps(extra)}
        )
        self.env["AIRFLOW_CONN_VELOCITY_SPARK"] = json.dumps(
            {"conn_type": "spark", "host": "local[2]"}
        )
        # Also on a given home (the suite's): in the full suite its database was found
        # needing a migration ("Database migration required"), and the api-server exited.
        # On a current database it is a check of a few seconds.
        run_checked(["airflow", "db", "migrate"], self.env, "airflow db migrate", timeout=300)
        if config.airflow_home is None:
            run_checked(
                ["airflow", "pools", "set", "velocity_spark", "1", "one Spark batch job"],
                self.env, "airflow pools set", timeout=120,
            )  # fmt: skip
        log = (self.work / "api-server.log").open("w")
        self.api_server = subprocess.Popen(
            ["airflow", "api-server", "--port", str(self.airflow_port)],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.airflow_port}"

    def sign_in_admin(self) -> None:
        """Once the api-server answers: admin's bearer token."""
        assert self.api_server is not None
        home = Path(self.env["AIRFLOW_HOME"])
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError, StopIteration):
                self.token = self.sign_in(home)
                break
            if self.api_server.poll() is not None:
                log = self.work / "api-server.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
                raise RuntimeError(f"airflow api-server exited; the end of {log}:\n{tail}")
            time.sleep(1)
        else:
            raise RuntimeError("airflow api-server did not sign in admin within 180 s")
        self.say(f"Airflow api-server on {self.base}, admin signed in")

    def sign_in(self, home: Path) -> str:
        named = self.env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
        found = Path(named) if named else next(home.glob("simple_auth_manager_passwords.json*"))
        passwords = json.loads(found.read_text())
        body = json.dumps({"username": "admin", "password": passwords["admin"]}).encode()
        request = urllib.request.Request(
            f"{self.base}/auth/token", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return str(json.load(answer)["access_token"])

    def tear_down(self) -> None:
        from velocity.kafka.broker import kafka_down
        from velocity.redis.server import redis_down

        for process in (self.stream, self.api_server, *self.dag_runs):
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=60)
        self.kill_stream_tree()
        with contextlib.suppress(Exception):
            kafka_down(self.settings)
        with contextlib.suppress(Exception):
            redis_down(self.settings)

    # --- the stream, through run_stream ---------------------------------------------------

    def start_stream(self) -> None:
        self.stream_runs += 1
        conf = json.dumps({"source": "kafka", "rules_file": str(RULES)})
        log = (self.work / f"run_stream-{self.stream_runs}.log").open("w")
        self.stream = subprocess.Popen(
            ["airflow", "dags", "test", "run_stream", "--conf", conf],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.say(f"run_stream started (run {self.stream_runs})")

    def driver_pid(self) -> int | None:
        from velocity.operating.local_process import process_alive
        from velocity.operating.stream_control import read_status

        status = read_status(self.settings.data_dir) or {}
        pid = status.get("pid")
        return pid if isinstance(pid, int) and process_alive(pid) else None

    def last_batch(self) -> int:
        from velocity.operating.stream_control import checkpoint_dir, last_commit

        commit = last_commit(checkpoint_dir(self.settings.data_dir))
        return -1 if commit is None else commit.batch

    def stream_alive(self) -> bool:
        return self.stream is not None and self.stream.poll() is None

    def wait_for_batch(self, after: int, timeout: float) -> float | None:
        """Seconds until the checkpoint holds a batch past ``after`` with the stream running;
        None after ``timeout``. A stream that ended by itself is noted and started again."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            caught_up = self.last_batch() > after or self.idle_and_caught_up()
            if caught_up and self.stream_alive() and self.driver_pid():
                return time.monotonic() - began
            if not self.stream_alive():
                self.stream_ended_by_itself()
            time.sleep(0.5)
        return None

    def idle_and_caught_up(self) -> bool:
        """Every payment produced and committed by a batch, the stream running: no batch
        is to come."""
        if self.produced_files < len(self.files) or not self.stream_alive():
            return False
        return self.consumed_messages() >= self.produced_lines

    def consumed_messages(self) -> int:
        """Messages of the events topic the committed batches read (the newest committed
        batch's end offsets, summed over partitions: the topic is the run's own, from 0).
        Not the stream's offsetsBehindLatest: that is measured when a batch is planned,
        and a stream keeping up reports 0 while the last second is still in the topic."""
        from velocity.operating.stream_control import checkpoint_dir

        batch = self.last_batch()
        if batch < 0:
            return 0
        path = checkpoint_dir(self.settings.data_dir) / "offsets" / str(batch)
        try:
            ends = json.loads(path.read_text().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            return 0
        return sum(int(o) for o in ends.get(self.settings.kafka_events_topic, {}).values())

    def stream_ended_by_itself(self) -> None:
        """The run_stream run ended without the harness: note how (the stream's own
        verdict) and start it again, as check_stream would for ``failed`` and ``dead``."""
        from velocity.operating.stream_control import check_health

        health = check_health(self.settings)
        code = None if self.stream is None else self.stream.returncode
        reason = " ".join(str(health.reason).split())[:200]
        self.stream_deaths.append((health.verdict, f"{self.now():.0f} s: {reason}"))
        log = self.work / f"run_stream-{self.stream_runs}.log"
        self.say(f"run_stream ended by itself (exit {code}, {health.verdict}: {reason}; {log})")
        self.kill_stream_tree()
        self.start_stream()

    def kill_stream_tree(self) -> list[int]:
        """SIGKILL the stream's spark-submit (the JVM whose child the driver is) and every
        process under it; the pids killed."""
        driver = self.driver_pid()
        if driver is None:
            return []
        import psutil

        try:
            parent = psutil.Process(driver).ppid()
        except psutil.Error:
            parent = None
        root = parent if parent and "SparkSubmit" in cmdline(parent) else driver
        return sigkill(process_tree(root))

    def finish_stream(self) -> None:
        """Wait until a committed batch has read every produced payment, then stop the
        stream as an operator does (`velocity stream-stop`) and wait for run_stream to end."""
        deadline = time.monotonic() + 2 * self.config.recovery_seconds
        while not self.idle_and_caught_up():
            if time.monotonic() > deadline:
                self.errors.append(
                    f"the stream had committed {self.consumed_messages()} of "
                    f"{self.produced_lines} payments {2 * self.config.recovery_seconds:.0f} s "
                    "after the last was produced"
                )
                break
            if not self.stream_alive():
                self.stream_ended_by_itself()
            time.sleep(0.5)
        self.say(f"caught up ({self.consumed_messages()} payments read); stream-stop")
        run_checked(
            [str(BIN / "velocity"), "stream-stop", "--wait", "180"], self.env,
            "velocity stream-stop", timeout=300,
        )  # fmt: skip
        assert self.stream is not None
        try:
            code = self.stream.wait(timeout=300)
        except subprocess.TimeoutExpired:
            code = None
        self.say(f"run_stream ended (exit {code})")

    def backfill_late(self) -> None:
        """`velocity backfill --late`, as the contract asks once a stream has stopped
        (docs/concepts/contract.md): the payments of one key that reached it out of order
        across partitions (a beneficiary's from every payer's partition, most of all in the
        batches that catch up after a restart) were decided without each other; the
        backfill decides their range again. The tail still reads what it publishes."""
        began = time.monotonic()
        out = run_checked(
            [str(BIN / "velocity"), "backfill", "--late"], self.env, "velocity backfill --late",
            timeout=1800,
        )  # fmt: skip
        last = out.strip().splitlines()[-1] if out.strip() else ""
        self.say(f"backfill --late: {time.monotonic() - began:.0f} s; {last[:300]}")
        time.sleep(5)  # the tail reads what the backfill published

    # --- the threads beside the stream ---------------------------------------------------

    def produce(self) -> None:
        """One file a second to the events topic, keyed by payerId (a payer's events in
        one partition, in order), each file acknowledged before the next."""
        from velocity.kafka.topics import TopicWriter

        settings = self.settings
        sink = TopicWriter(settings, settings.kafka_events_topic, **{"batch.num.messages": 10000})
        started = time.monotonic()
        try:
            for index, path in enumerate(self.files):
                pause = started + index - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                lines = path.read_text().splitlines()
                for line in lines:
                    sink.send(line, str(json.loads(line)["payerId"]))
                sink.flush()
                self.produced_files = index + 1
                self.produced_lines += len(lines)
        except Exception as exc:  # the end checks would blame the stream for what is missing
            self.errors.append(f"the producer stopped after {self.produced_files} files: {exc}")
            raise

    def tail_alerts(self) -> None:
        """Every entry of the Redis alert stream as it comes, from where the tail was:
        across a Redis restart (its AOF keeps the ids) and a flush (new ids are later)."""
        import redis

        stream, last = self.settings.alert_stream, "0-0"
        client = redis.Redis.from_url(self.settings.redis_url, decode_responses=True)
        while not self.stop.is_set() or last == "0-0":
            try:
                found: Any = client.xread({stream: last}, count=5000, block=1000)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                time.sleep(0.5)
                continue
            if not found:
                if self.stop.is_set():
                    return
                continue
            for entry_id, fields in found[0][1]:
                alert = json.loads(fields["alert"])
                self.tail_ids.append(
                    (
                        str(alert["alertId"]),
                        str(alert.get("kind", "ALERT")),
                        int(alert["ruleId"]),
                        str(alert["transactionId"]),
                    )
                )
                last = entry_id

    def probe_page(self) -> None:
        """The page's queue API, and every fifth time the page itself, every 2 s."""
        paths = ["/velocity/api/cases?case_limit=5"] * 4 + ["/velocity/"]
        turn = 0
        while not self.stop.wait(2.0):
            path = paths[turn % len(paths)]
            turn += 1
            began = time.monotonic()
            try:
                status = self.get(path, timeout=30)[0]
            except Exception as exc:  # any failure is a probe the page did not answer
                status = getattr(exc, "code", 0) or 0
            self.probes.append((self.now(), status, time.monotonic() - began))

    def get(self, path: str, timeout: float = 30) -> tuple[int, bytes]:
        request = urllib.request.Request(
            self.base + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return int(answer.status), answer.read()

    # --- faults -------------------------------------------------------------------------

    def inject_faults(self, seconds: int) -> None:
        """Each fault at its moment. The DAG runs (maintenance, a backfill) run beside the
        others, one at a time, as they would in production; the others one after another,
        each until the stream committed a batch again."""
        kinds = [k for k in FAULTS if k != "redis_restart" or not self.config.redis_with_sigkill]
        schedule = fault_schedule(kinds, self.config.each, seconds, self.rng, self.config.gap)
        self.say("faults: " + ", ".join(f"{kind} at {at:.0f} s" for at, kind in schedule))
        for at, kind in schedule:
            while self.production_began + at > time.monotonic():  # the stream watched
                time.sleep(min(2.0, max(self.production_began + at - time.monotonic(), 0)))
                if not self.stream_alive():
                    self.stream_ended_by_itself()
            if not self.stream_alive():
                self.stream_ended_by_itself()
            record = FaultRecord(round(self.now(), 1), kind)
            self.outcome.faults.append(record)
            if kind in SLOW_FAULTS:
                slow = threading.Thread(target=self.inject, args=(record,), daemon=True)
                slow.start()
                self.slow_faults.append(slow)
            else:
                self.inject(record)

    def inject(self, record: FaultRecord) -> None:
        kind = record.kind
        with self.slow_lock if kind in SLOW_FAULTS else contextlib.nullcontext():
            self.say(f"{kind}: injecting")
            try:
                getattr(self, f"fault_{kind}")(record)
            except Exception as exc:  # a fault the harness could not inject is reported
                record.detail = f"could not inject: {exc}"
                record.recovered_s = None
        took = "NOT recovered" if record.recovered_s is None else f"{record.recovered_s:.1f} s"
        self.say(f"{kind}: {record.detail}; recovered: {took}")

    def recovered(self, record: FaultRecord, batch: int, began: float) -> None:
        """Recovered once a batch planned after the fault committed: two past ``batch``
        (the last committed when it struck), not the one in flight then (its commit to
        Redis may have come before the fault)."""
        waited = self.wait_for_batch(batch + 1, self.config.recovery_seconds)
        record.recovered_s = None if waited is None else time.monotonic() - began

    def fault_stream_sigkill(self, record: FaultRecord) -> None:
        batch, began = self.last_batch(), time.monotonic()
        killed = self.kill_stream_tree()
        assert self.stream is not None
        try:
            self.stream.wait(timeout=120)  # run_stream's task fails with its spark-submit
        except subprocess.TimeoutExpired:
            os.killpg(self.stream.pid, signal.SIGKILL)
            self.stream.wait(timeout=60)
        code = self.stream.returncode
        record.detail = f"killed {len(killed)} processes at batch {batch}; run_stream exit {code}"
        also = None
        if self.config.redis_with_sigkill:  # one restart of the stream for both faults
            also = FaultRecord(record.at, "redis_restart")
            self.outcome.faults.append(also)
            self.restart_redis(also, batch)
            record.detail += f"; {also.detail}"
        self.start_stream()
        self.recovered(record, batch, began)
        if also is not None:
            also.recovered_s = record.recovered_s

    def fault_decider_kill(self, record: FaultRecord) -> None:
        # A stream started again a moment ago spawns its deciders with its first batch.
        deadline, driver = time.monotonic() + 120, None
        deciders: list[int] = []
        while not deciders and time.monotonic() < deadline:
            driver = self.driver_pid()
            deciders = decider_pids(driver) if driver else []
            if not deciders:
                time.sleep(1)
        if not deciders:
            raise RuntimeError(f"no deciding process under the driver {driver} within 120 s")
        batch, began = self.last_batch(), time.monotonic()
        victim = self.rng.choice(deciders)
        sigkill([victim])
        record.detail = f"killed decider {victim} (of {deciders}) at batch {batch}"
        self.recovered(record, batch, began)

    def fault_redis_restart(self, record: FaultRecord) -> None:
        batch, began = self.last_batch(), time.monotonic()
        self.restart_redis(record, batch)
        self.recovered(record, batch, began)

    def restart_redis(self, record: FaultRecord, batch: int) -> None:
        """SIGKILL redis-server and start it again from its AOF."""
        from velocity.operating.local_process import pidfile_process
        from velocity.redis.server import local_redis, redis_up

        server = local_redis(self.settings)
        pid = pidfile_process(server.pid_path, b"redis-server")
        if pid is None:
            raise RuntimeError("no redis-server to kill")
        sigkill([pid])
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        redis_up(self.settings, timeout_seconds=300)  # late in a run its AOF takes a while
        record.detail = f"SIGKILLed redis-server {pid} at batch {batch}, started from its AOF"

    def fault_redis_flush(self, record: FaultRecord) -> None:
        import redis

        batch, began = self.last_batch(), time.monotonic()
        redis.Redis.from_url(self.settings.redis_url).flushall()
        record.detail = f"FLUSHALL at batch {batch}"
        self.recovered(record, batch, began)

    def fault_kafka_restart(self, record: FaultRecord) -> None:
        from velocity.kafka.broker import kafka_down, kafka_up

        batch, began = self.last_batch(), time.monotonic()
        kafka_down(self.settings)
        time.sleep(2)  # clients poll a broker that is gone
        kafka_up(self.settings)
        record.detail = f"broker stopped and started at batch {batch}"
        self.recovered(record, batch, began)

    def dag_test(self, dag_id: str, record: FaultRecord, *extra: str) -> None:
        """The DAG run (`airflow dags test`); recovered when it succeeded. A run that failed
        while another fault struck (a Redis flushed under it takes its state lock; a
        restarted one its connection) runs once more, as the next scheduled run would: a
        job that refuses to go on without its lock is the contract, not a failure."""
        began, at = time.monotonic(), self.now()
        code, took, name = self._dag_run(dag_id, *extra)
        record.detail = f"{dag_id} exit {code} in {took:.0f} s ({name})"
        during = [
            f.kind for f in self.outcome.faults if f is not record and at <= f.at <= self.now()
        ]
        if code != 0 and during:
            code, took, name = self._dag_run(dag_id, *extra)
            record.detail += (
                f"; {', '.join(during)} struck during it; again: exit {code} in {took:.0f} s "
                f"({name})"
            )
        # Recovered: the run succeeded (the stream's batches are watched by the others).
        record.recovered_s = time.monotonic() - began if code == 0 else None

    def _dag_run(self, dag_id: str, *extra: str) -> tuple[int | None, float, str]:
        """(exit code or None when killed at 20 minutes, seconds, log name) of one run."""
        began = time.monotonic()
        name = f"{dag_id}-{len(self.dag_runs) + 1}.log"
        with (self.work / name).open("w") as log:
            run = subprocess.Popen(
                ["airflow", "dags", "test", dag_id, *extra],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,  # its spark-submit goes with it in tear_down
            )  # fmt: skip
            self.dag_runs.append(run)
            try:
                code: int | None = run.wait(timeout=1200)
            except subprocess.TimeoutExpired:
                code = None
                os.killpg(run.pid, signal.SIGKILL)
        return code, time.monotonic() - began, name

    def fault_maintain_state(self, record: FaultRecord) -> None:
        self.dag_test("maintain_state", record)

    def fault_backfill(self, record: FaultRecord) -> None:
        # A range the stream has decided: produced a minute ago or earlier (event times
        # follow production: one file a second from start_ms).
        produced = self.produced_files
        to_s = max(1, produced - 60)
        from_s = max(0, to_s - 300)

        def iso(ms: int) -> str:
            return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        conf = {
            "from_time": iso(self.start_ms + from_s * 1000),
            "to_time": iso(self.start_ms + to_s * 1000),
        }
        self.dag_test("backfill_alerts", record, "--conf", json.dumps(conf))
        record.detail += f" over {conf['from_time']}..{conf['to_time']}"

    def fault_case_close(self, record: FaultRecord) -> None:
        began = time.monotonic()
        cases: list[dict[str, Any]] = []
        while not cases and time.monotonic() - began < self.config.recovery_seconds:
            body = self.get("/velocity/api/cases?case_limit=50")[1]
            cases = [c for c in json.loads(body)["cases"] if c["status"] != "closed"]
            if not cases:  # no alert has opened one yet (a short run's first seconds)
                time.sleep(2)
        chosen = self.rng.sample(cases, min(3, len(cases)))
        answers = []
        for case in chosen:
            verdict = self.rng.choice(["CONFIRMED_FRAUD", "FALSE_POSITIVE", "NEEDS_REVIEW"])
            answers.append(self.post_close(case["caseId"], verdict))
        record.detail = f"closed {len(chosen)} of {len(cases)} open cases listed: answers {answers}"
        if chosen and all(a == 303 for a in answers):
            self.closed_cases += [c["caseId"] for c in chosen]
            record.recovered_s = time.monotonic() - began
        else:
            record.recovered_s = None

    def post_close(self, case_id: str, verdict: str) -> int:
        from urllib.parse import quote, urlencode

        body = urlencode({"verdict": verdict, "note": "soak"}).encode()
        request = urllib.request.Request(
            f"{self.base}/velocity/cases/{quote(case_id, safe='')}/close",
            body,
            {
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        try:
            with urllib.request.build_opener(NoRedirect).open(request, timeout=60) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    # --- the checks ---------------------------------------------------------------------

    def check(self) -> None:
        from deltalake import DeltaTable

        from velocity.delta.case_store import CaseStore
        from velocity.delta.names import ALERTS, BUCKETS, EVENTS

        outcome, settings = self.outcome, self.settings
        checks = outcome.checks
        checks.append(fault_summary(outcome.faults, FAULTS, self.config.each)[1])
        # A failed micro-batch stops the stream as `failed` (a Redis it cannot reach:
        # restarted or still loading its AOF) and check_stream starts it again
        # (docs/operating/stream.md): the contract. Any other end is not.
        others = [d for verdict, d in self.stream_deaths if verdict != "failed"]
        failed_runs = [d for verdict, d in self.stream_deaths if verdict == "failed"]
        checks.append(
            Check(
                "the stream ended only as documented (failed: run_stream again)",
                not others,
                f"{self.stream_runs} run_stream runs; {len(failed_runs)} ended failed"
                + (f" (first: {failed_runs[0]})" if failed_runs else "")
                + (f"; {len(others)} ended otherwise: {others[:2]}" if others else ""),
            )
        )

        with self.expected_file.open() as lines:  # read as it is folded: ~2 GB for 30 min
            expected, _ = in_effect(row for row in map(json.loads, lines) if not row.get("shadow"))
        # The columns the checks read: the whole table of a 30-minute run (its keys,
        # explain fields) as Python dicts took over 20 GB.
        columns = [
            "alertId", "kind", "ruleId", "transactionId", "decisionTime", "aggregateValue",
            "windowStart", "suppressed", "shadow", "caseId",
        ]  # fmt: skip
        alerts = (
            DeltaTable(str(settings.table_path(ALERTS)))
            .to_pyarrow_table(columns=columns)
            .to_pylist()
        )
        rows = [a for a in alerts if not a.get("shadow")]
        actual, broken = in_effect(rows)
        comparison = compare_alerts(actual, expected)
        detail = comparison.detail(len(expected))
        if broken:
            detail += f"; {len(broken)} decisions with a net count above 1 or below 0: {broken[:3]}"
        checks.append(
            Check(
                "alerts in effect = backtest of every payment",
                comparison.equal and not broken and bool(expected),  # none expected: no test
                detail,
            )
        )

        store = CaseStore(settings)
        cases = store.cases()
        stream_alerts = [(str(a["alertId"]), a.get("caseId")) for a in rows if a["kind"] == "ALERT"]
        problems = case_problems(stream_alerts, {c: case.alerts for c, case in cases.items()})
        corrections = sum(1 for a in rows if a["kind"] == "CORRECTION")
        checks.append(
            Check(
                "every alert in exactly one case",
                not problems,
                "; ".join(problems[:4]) + (f" (of {len(problems)})" if problems else "")
                or f"{len(stream_alerts)} alerts in {len(cases)} cases"
                + (f"; {corrections} corrections not counted" if corrections else ""),
            )
        )
        not_closed = [
            c for c in self.closed_cases if c not in cases or cases[c].status.value != "closed"
        ]
        checks.append(
            Check(
                "cases closed through the page stay closed",
                not not_closed
                and (
                    bool(self.closed_cases)
                    or not any(f.kind == "case_close" for f in outcome.faults)
                ),
                f"{len(self.closed_cases)} closed, {len(not_closed)} not closed {not_closed[:3]}",
            )
        )

        notified = {p for p, e in expected.items() if not e.suppressed}
        tail_repeats = repeats(i for i, *_ in self.tail_ids)
        seen = {(r, t) for _, kind, r, t in self.tail_ids if kind != "RETRACTION"}
        unseen = notified - seen
        checks.append(
            Check(
                "Redis alert stream: each alert once",
                not tail_repeats and not unseen,
                f"{len(self.tail_ids)} entries read, {len(tail_repeats)} alertIds repeated "
                f"({sum(tail_repeats.values()) - len(tail_repeats)} repeats), "
                f"{len(unseen)} of {len(notified)} notified alerts never seen",
            )
        )
        topic = self.alerts_topic()
        topic_repeats = repeats(i for i, _ in topic)
        unseen_topic = notified - {p for _, p in topic}
        checks.append(
            Check(
                "Kafka alerts topic: each alert at least once",
                not unseen_topic,
                f"{len(topic)} records, {sum(topic_repeats.values()) - len(topic_repeats)} "
                f"repeats of {len(topic_repeats)} alertIds (at least once: docs/serving/"
                f"alerts.md), {len(unseen_topic)} of {len(notified)} notified alerts missing",
            )
        )

        events = DeltaTable(str(settings.table_path(EVENTS))).to_pyarrow_table(
            columns=["transactionId"]
        )
        ids = events.column("transactionId").to_pylist()
        twice = repeats(ids)
        produced = self.produced_ids()
        absent, stranger = produced - set(ids), set(ids) - produced
        checks.append(
            Check(
                "every payment recorded once",
                not (twice or absent or stranger) and len(produced) == self.produced_lines,
                f"{len(ids)} rows, {len(set(ids))} payments of {self.produced_lines} produced, "
                f"{len(twice)} twice, {len(absent)} produced and not recorded "
                f"{sorted(absent)[:3]}, {len(stranger)} recorded and never produced",
            )
        )
        del ids, produced, absent, stranger
        kept = g_wide_counts(DeltaTable(str(settings.table_path(BUCKETS))))
        backtest_buckets = next((self.work / "backtest").rglob("buckets/_delta_log")).parent
        reference = g_wide_counts(DeltaTable(str(backtest_buckets)))
        problems, compared = bucket_problems(kept, reference, self.evictable_before())
        checks.append(
            Check(
                "buckets: no payment lost or counted twice",
                not problems and compared > 0,
                "; ".join(problems[:3]) + (f" (of {len(problems)})" if problems else "")
                or f"{compared} kept buckets equal the backtest's",
            )
        )

        failed = [p for p in self.probes if p[1] != 200]
        slowest = max((p[2] for p in self.probes), default=0.0)
        checks.append(
            Check(
                "the page answered throughout",
                bool(self.probes) and not failed,
                f"{len(self.probes) - len(failed)}/{len(self.probes)} answered 200, slowest "
                f"{slowest:.1f} s"
                + (f"; failed at {[(round(t), s) for t, s, _ in failed[:5]]}" if failed else ""),
            )
        )

    def produced_ids(self) -> set[str]:
        """The transactionIds of the files the producer sent."""
        return {
            str(json.loads(line)["transactionId"])  # a number in some lines, text in the table
            for path in self.files[: self.produced_files]
            for line in path.read_text().splitlines()
        }

    def evictable_before(self) -> int:
        """Buckets starting before this may have been evicted by the end: the horizon of the
        rules (the widest window + lateness + one bucket) behind the newest eventTime
        produced, at its latest (one file a second of eventTime from ``start_ms``)."""
        from velocity.domain.rules import Rule, deciding_rules, parse_rules
        from velocity.domain.windows import horizon_seconds

        rules = deciding_rules(r for r in parse_rules(RULES.read_text()) if isinstance(r, Rule))
        newest = self.start_ms + len(self.files) * 1000
        return newest - horizon_seconds(rules, self.settings) * 1000

    def alerts_topic(self) -> list[tuple[str, tuple[int, str]]]:
        """Every record of the alerts topic but retractions, from the beginning: (alertId,
        (rule, tx))."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.settings.kafka_bootstrap,
                "group.id": f"soak-{os.getpid()}-{time.time()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        topic = self.settings.kafka_alerts_topic
        try:
            metadata = consumer.list_topics(topic, timeout=30).topics[topic]
            ends = {}
            for partition in metadata.partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=30
                )
                if high > low:
                    ends[partition] = high
            consumer.assign([TopicPartition(topic, p, 0) for p in ends])
            out: list[tuple[str, tuple[int, str]]] = []
            done: set[int] = set()
            deadline = time.monotonic() + 300
            while len(done) < len(ends) and time.monotonic() < deadline:
                for message in consumer.consume(10_000, timeout=2):
                    if message.error() is not None:
                        continue
                    alert = json.loads(message.value() or b"{}")
                    if alert.get("kind") != "RETRACTION":  # takes an alert back: not one
                        pair = (int(alert["ruleId"]), str(alert["transactionId"]))
                        out.append((str(alert["alertId"]), pair))
                    partition, offset = message.partition() or 0, message.offset() or 0
                    if offset + 1 >= ends[partition]:
                        done.add(partition)
            return out
        finally:
            consumer.close()

    def report(self) -> str:
        faults = "\n".join(
            f"  {f.at:7.1f} s  {f.kind:<15} "
            + ("NOT recovered" if f.recovered_s is None else f"recovered in {f.recovered_s:5.1f} s")
            + f"  {f.detail}"
            for f in self.outcome.faults
        )
        rows = fault_summary(self.outcome.faults, FAULTS, self.config.each)[0]
        table = what_held(rows, self.outcome.checks)
        return f"faults:\n{faults}\n\n{table}\n\n{self.batch_figures()}"

    def batch_figures(self) -> str:
        """The micro-batches the runs logged: how many, the slowest, the longest wait for
        the state lock (maintenance and backfills hold it too)."""
        seconds, locks = [], []
        for log in sorted(self.work.glob("run_stream-*.log")):
            for text in log.read_text(errors="replace").splitlines():
                if "velocity.stream" in text and '"batch"' in text and "{" in text:
                    with contextlib.suppress(ValueError, KeyError):
                        record = json.loads(text[text.index("{") : text.rindex("}") + 1])
                        seconds.append(float(record["seconds"]))
                        locks.append(float(record.get("steps", {}).get("lock", 0.0)))
        if not seconds:
            return "micro-batches: none logged"
        return (
            f"micro-batches: {len(seconds)} logged, slowest {max(seconds):.1f} s, longest "
            f"wait for the state lock {max(locks):.1f} s ({sum(w > 5 for w in locks)} over 5 s)"
        )


def g_wide_counts(table: Any) -> dict[Slot, int]:
    """Events per g-wide bucket of a buckets table: plain rows as they are, compacted hours
    by their parts, rows of one bucket summed (readers merge them the same way)."""
    import pyarrow.compute as pc

    columns = ["signature_id", "key", "bucket_start", "event_count", "parts"]
    rows = table.to_pyarrow_table(columns=columns)
    plain = rows.filter(pc.is_null(rows["parts"]))
    hours = rows.filter(pc.is_valid(rows["parts"]))
    owner = pc.list_parent_indices(hours["parts"])
    parts = pc.list_flatten(hours["parts"])
    counts: dict[Slot, int] = {}
    for sigs, keys, starts, events in (
        (plain["signature_id"], plain["key"], plain["bucket_start"], plain["event_count"]),
        (
            pc.take(hours["signature_id"], owner),
            pc.take(hours["key"], owner),
            pc.struct_field(parts, "bucket_start"),
            pc.struct_field(parts, "event_count"),
        ),
    ):
        for slot in zip(
            sigs.to_pylist(), keys.to_pylist(), starts.to_pylist(), events.to_pylist(), strict=True
        ):
            bucket = (str(slot[0]), str(slot[1]), int(slot[2]))
            counts[bucket] = counts.get(bucket, 0) + int(slot[3] or 0)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--minutes", type=float, default=30.0, help="how long payments are produced"
    )
    parser.add_argument("--rate", type=int, default=1000, help="payments a second")
    parser.add_argument("--keys", type=int, default=20_000, help="distinct payers")
    parser.add_argument("--each", type=int, default=2, help="times each fault kind strikes")
    parser.add_argument(
        "--gap", type=float, default=20.0, help="seconds at least between two faults' moments"
    )
    parser.add_argument(
        "--redis-with-sigkill",
        action="store_true",
        help="restart Redis while the stream is down after each SIGKILL, not on its own "
        "(one restart of the stream for both: the suite's short run)",
    )
    parser.add_argument("--seed", type=int, default=53)
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "soak"))
    args = parser.parse_args(argv)
    config = SoakConfig(
        minutes=args.minutes,
        rate=args.rate,
        keys=args.keys,
        each=args.each,
        gap=args.gap,
        redis_with_sigkill=args.redis_with_sigkill,
        seed=args.seed,
        work=Path(args.work_dir),
    )
    soak = Soak(config)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    try:
        outcome = soak.run()
    except Exception as exc:  # the faults and the checks so far, then why it stopped
        print(soak.report(), flush=True)
        print(f"the soak stopped: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(soak.report(), flush=True)
    print(f"load average at end: {os.getloadavg()}", flush=True)
    return 0 if outcome.held else 1


if __name__ == "__main__":
    sys.exit(main())
