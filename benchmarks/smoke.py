"""Every benchmark at a tiny size, its figures checked for shape (not a measurement):
`make bench-smoke` or `python -m benchmarks.smoke`.

Benchmarks are commands that nothing ran between the days someone measured with them, so
they rotted (issue 54). This runs each `make bench*` target's command at a size that takes
seconds, reads the JSON its ``--figures`` option wrote, and checks its shape: the figures
docs/benchmarks.md quotes are present and numeric (finite), counts agree where two engines
or designs must agree (Velocity and the Flink peer, local[2] and the cluster, the kernel
and the reference, the whole case fold and the incremental one), the backtest raises alerts
with the sample rules on events with spikes, the stream publishes every expected alert
at a rate the machine easily holds, and the page answers every read at two sizes. Never
a speed: no figure is held to a bound of time.

Start-up is shared where a benchmark's design allows: backfill, window_compare and cooldown
take one Spark session in this process (their figures are a backfill's and a stream's
work, a state's size, alert counts: none is a process's start-up); the generated events of
the backtests (bench, bench-peer, bench-cluster) are made once; benchmarks that measure a
fresh process (bench, bench-peer, bench-cluster, bench-stream) run as their own processes,
as their targets do. Two lanes run side by side, longest job first. bench-peer is skipped,
with the reason printed, only when Maven or Java is missing or the peer's build fails;
bench-cluster only when the standalone cluster cannot start. Prints a table (target,
seconds, verdict) and exits 1 when any target failed. ``--report PATH`` writes the verdicts
as JSON (the pytest module reads it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stdout
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from velocity.operating.local_process import free_loopback_port

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
FIRE_OFTEN = ROOT / "benchmarks" / "rules" / "fire_often.json"
PEER_POM = ROOT / "benchmarks" / "peers" / "flink" / "pom.xml"
# Every `make bench*` target the smoke runs, in the order it reports them. A target added
# to the Makefile must be added here (tests/bench/test_bench_smoke.py checks it).
TARGETS = (
    "bench",
    "bench-cooldown",
    "bench-cases",
    "bench-kernel",
    "bench-peer",
    "bench-cluster",
    "bench-stream",
    "bench-stream-steps",
    "bench-lookup",
    "bench-window",
    "bench-backfill",
    "bench-check",
    "bench-page",
    "bench-browser",
)
# The backtests' shared events: 2 000 lines at 20/s over 200 payers (about 10 payments a
# payer in 100 s of eventTime, so sample rule 4, 5 in 10 minutes, fires).
EVENTS = ["--events", "2000", "--keys", "200"]


@dataclass
class Verdict:
    target: str
    verdict: str = "failed"  # ok, failed, skipped
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    log: str = ""


class Skip(Exception):
    """The target cannot run here; the message says why (printed, never silent)."""


# --- shape checks: each returns the problems it found (none: the shape holds) ----------


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def numeric(figures: Mapping[str, Any], *names: str, where: str = "") -> list[str]:
    """Problems unless every one of ``names`` is present and a finite number."""
    problems = []
    for name in names:
        if name not in figures:
            problems.append(f"{where}{name} missing")
        elif not _number(figures[name]):
            problems.append(f"{where}{name} is {figures[name]!r}, not a finite number")
    return problems


def all_numeric(values: Mapping[str, Any], where: str) -> list[str]:
    """Problems unless ``values`` is a non-empty mapping of finite numbers."""
    if not isinstance(values, Mapping) or not values:
        return [f"{where} is {values!r}, not a non-empty mapping"]
    return numeric(values, *values, where=f"{where}.")


def expect(condition: bool, problem: str) -> list[str]:
    return [] if condition else [problem]


def check_backtest(figures: Mapping[str, Any], masters: int = 1) -> list[str]:
    runs = figures.get("runs") or []
    problems = expect(len(runs) == masters, f"{len(runs)} runs, expected {masters}")
    for n, run in enumerate(runs):
        where = f"runs[{n}]."
        problems += numeric(
            run, "lines", "accepted", "quarantined", "alerts", "end_to_end_seconds",
            "end_to_end_events_per_s", "backtest_seconds", "events_per_s_excluding_startup",
            "peak_rss_mb", where=where,
        )  # fmt: skip
        problems += all_numeric(run.get("step_seconds"), f"{where}step_seconds")
        problems += expect(run.get("alerts", 0) > 0, f"{where}alerts: none with the sample rules")
    if masters > 1 and not problems:
        alerts = {run["master"]: run["alerts"] for run in runs}
        problems += expect(len(set(alerts.values())) == 1, f"masters disagree: {alerts}")
        for ratio in figures.get("throughput_ratios") or [{}]:
            problems += numeric(ratio, "ratio", where="throughput_ratios.")
    return problems


def check_cooldown(figures: Mapping[str, Any]) -> list[str]:
    files = figures.get("files") or []
    problems = expect(len(files) == 2, f"{len(files)} rules files, expected 2")
    for entry in files:
        where = f"{entry.get('rules')}: "
        problems += numeric(
            entry, "alerts", "notified", "alerts_per_h", "notified_per_h",
            "notified_per_h_top_only", where=where,
        )  # fmt: skip
        if not problems:
            problems += expect(entry["alerts"] > 0, f"{where}no alerts")
            problems += expect(
                entry["notified"] <= entry["alerts"], f"{where}more notified than alerts"
            )
    return problems


def check_cases(figures: Mapping[str, Any]) -> list[str]:
    problems = numeric(
        figures, "whole_fold_seconds", "first_look_seconds", "look_after_flush_seconds",
        "whole_fold_cases", "first_look_cases", "look_after_flush_cases", "speed_up",
        "fresh_first_look_snapshot_seconds", "fresh_first_look_whole_fold_seconds",
        "snapshot_write_seconds", "snapshot_refresh_seconds",
    )  # fmt: skip
    if not problems:
        problems += expect(
            figures["whole_fold_cases"] == figures["first_look_cases"] > 0,
            "the incremental read found other cases than the whole fold",
        )
    return problems


def check_kernel(figures: Mapping[str, Any]) -> list[str]:
    problems = numeric(
        figures, "keyed_rows", "decisions", "kernel_seconds", "us_per_keyed_row", "us_per_event",
        "reference_seconds", "reference_over_kernel",
    )  # fmt: skip
    problems += expect(
        figures.get("same_decision_count") is True, "the kernel and the reference disagree"
    )
    return problems


def check_peer(figures: Mapping[str, Any]) -> list[str]:
    rules = figures.get("rules") or []
    problems = expect(bool(rules), "no rules file compared")
    for entry in rules:
        where = f"{entry.get('rules')}: "
        problems += numeric(
            entry, "velocity_seconds", "peer_seconds", "ratio", "velocity_alerts", "peer_alerts",
            where=where,
        )  # fmt: skip
        if not problems:
            problems += expect(entry["velocity_alerts"] > 0, f"{where}no alerts")
            problems += expect(
                entry["velocity_alerts"] == entry["peer_alerts"]
                and entry["identical"]
                and entry["flags_identical"],
                f"{where}Velocity and the Flink peer disagree ({entry['velocity_alerts']} "
                f"against {entry['peer_alerts']} alerts)",
            )
    return problems


def check_stream(figures: Mapping[str, Any]) -> list[str]:
    runs = figures.get("runs") or []
    problems = expect(len(runs) == 1, f"{len(runs)} runs, expected 1")
    for run in runs:
        problems += numeric(
            run, "expected_alerts", "never_published", "p50_s", "p99_s", "max_s",
            "processed_events_per_s", "micro_batches", "batch_p50_s", "peak_rss_mb",
            "redis_used_mb",
        )  # fmt: skip
        problems += all_numeric(run.get("cpu_us_per_event"), "cpu_us_per_event")
        if not problems:
            problems += expect(run["expected_alerts"] > 0, "no expected alerts")
            problems += expect(
                run["never_published"] == 0,
                f"{run['never_published']} of {run['expected_alerts']} expected alerts never "
                "published at a rate the machine easily holds",
            )
    return problems


def check_stream_steps(figures: Mapping[str, Any]) -> list[str]:
    runs = figures.get("runs") or []
    problems = expect(len(runs) == 1, f"{len(runs)} runs, expected 1")
    for run in runs:
        steps = run.get("us_per_event") or {}
        problems += all_numeric(steps, "us_per_event")
        problems += numeric(
            steps, "parse", "fan-out", "key-partition (Redis read + decide + commit)", "total",
            "Redis CPU", where="us_per_event.",
        )  # fmt: skip
    return problems


def check_lookup(figures: Mapping[str, Any]) -> list[str]:
    problems = numeric(figures.get("ping") or {}, "p50_ms", "p99_ms", where="ping.")
    lookups = figures.get("lookups") or []
    # 6 windows over 3 keys, 2 aggregators each, the function before and now.
    problems += expect(len(lookups) == 24, f"{len(lookups)} lookups, expected 24")
    for entry in lookups:
        problems += numeric(entry, "buckets", "window_min", "p50_ms", "p99_ms", where="lookup.")
    return problems


def check_window(figures: Mapping[str, Any]) -> list[str]:
    problems = numeric(
        figures, "velocity_seconds", "velocity_events_per_s", "bucket_rows", "bucket_bytes",
        "spark_seconds", "spark_events_per_s", "state_rows", "throughput_ratio",
        "state_rows_ratio",
    )  # fmt: skip
    if not problems:
        problems += expect(figures["bucket_rows"] > 0, "no bucket rows")
        problems += expect(figures["state_rows"] > 0, "no state rows in Spark's window()")
    return problems


def check_backfill(figures: Mapping[str, Any]) -> list[str]:
    problems = numeric(
        figures, "events_evaluated", "backfill_seconds", "events_per_s", "corrections",
        "retractions", "buckets_rebuilt", "lock_seconds", "longest_commit_wait_s",
        "compaction_seconds", "bucket_rows_before", "bucket_rows_after", "files_before",
        "files_after", "optimize_files_before", "optimize_files_after",
    )  # fmt: skip
    problems += all_numeric(figures.get("step_seconds"), "step_seconds")
    if not problems:
        problems += expect(figures["events_evaluated"] > 0, "no events evaluated")
    return problems


def check_check(figures: Mapping[str, Any]) -> list[str]:
    """bench-check: each load's checks all answered (an easy rate), the stream's alerts all
    published, Redis's CPU per check and the ramp's steps numeric. HTTP is measured or says
    why not."""
    runs = figures.get("rules") or []
    problems = expect(len(runs) == 1, f"{len(runs)} rules files, expected 1")
    for run in runs:
        loads = run.get("loads") or {}
        http = "http" in loads and "checks" in loads["http"]
        problems += expect(http or bool(run.get("http")), "HTTP neither measured nor said why not")
        for name in ("none", "function", *(["http"] if http else [])):
            where = f"{name}."
            load = loads.get(name) or {}
            problems += numeric(
                load, "alerts", "never_published", "alert_p50_s", "alert_p99_s", "redis_cores",
                where=where,
            )  # fmt: skip
            problems += expect(load.get("never_published") == 0, f"{where}alerts never published")
            if name == "none":
                continue
            problems += numeric(
                load, "checks", "unanswered", "p50_ms", "p99_ms", "max_ms",
                "redis_cpu_us_per_check", "fcall_ro_usec_per_call", "rules_fired_per_check",
                where=where,
            )  # fmt: skip
            problems += expect(load.get("checks", 0) > 0, f"{where}no checks sent")
            problems += expect(
                load.get("unanswered") == 0,
                f"{where}{load.get('unanswered')} checks unanswered at an easy rate: "
                f"{load.get('errors')}",
            )
            problems += expect(
                load.get("rules_fired_per_check", 0) > 0, f"{where}no rule fired in any check"
            )
            problems += expect(
                "seen_after_landing_files" in load, f"{where}no freshness (stateAsOf) figures"
            )
        ramp = run.get("ramp") or {}
        steps = ramp.get("steps") or []
        problems += expect(bool(steps), "no ramp steps")
        for step in steps:
            problems += numeric(
                step, "rate", "answered_per_s", "p99_ms", "redis_cores", "generator_cores",
                where="ramp.",
            )  # fmt: skip
        problems += numeric(
            ramp, "sustained_checks_per_s", "answered_in_full_checks_per_s", where="ramp."
        )
        problems += expect(
            bool(ramp.get("limited_by") and ramp.get("answered_in_full_limited_by")),
            "ramp: no limit named",
        )
    return problems


def check_page(figures: Mapping[str, Any], sizes: tuple[int, ...]) -> list[str]:
    """bench-page: each size filled with its alerts, every read timed at each (first look,
    p50, p95, max), side by side with a ratio."""
    runs = figures.get("runs") or []
    problems = expect(
        [r.get("alerts") for r in runs] == list(sizes),
        f"sizes {[r.get('alerts') for r in runs]}, expected {list(sizes)}",
    )
    reads = figures.get("reads") or {}
    problems += expect(len(reads) >= 20, f"{len(reads)} reads timed, expected every one (20+)")
    for name, row in reads.items():
        problems += numeric(row, "p50_ratio", where=f"{name}.")
        for size in sizes:
            problems += numeric(
                row.get(str(size)) or {}, "first_ms", "p50_ms", "p95_ms", "max_ms",
                where=f"{name}.{size}.",
            )  # fmt: skip
    return problems


def check_page_beside(figures: Mapping[str, Any]) -> list[str]:
    """bench-page with the stream beside: every read timed in the clicking blocks, and the
    stream's alert p99 in the quiet blocks and the clicking ones (every alert arrived)."""
    runs = figures.get("runs") or []
    problems = expect(len(runs) == 1, f"{len(runs)} runs, expected 1")
    for run in runs:
        reads = run.get("reads") or {}
        problems += expect(len(reads) >= 20, f"{len(reads)} reads timed, expected 20+")
        # Every read's first looks; the clicking blocks' figures of those reached in them
        # (a loaded machine may not reach every read in a smoke's seconds).
        for name, row in reads.items():
            sampled = ("p50_ms", "p95_ms", "max_ms") if row.get("n") else ()
            problems += numeric(row, "first_ms", "restarted_ms", *sampled, where=f"{name}.")
        problems += expect(any(r.get("n") for r in reads.values()), "no read in the blocks")
        stream = run.get("stream") or {}
        for kind in ("quiet", "clicking"):
            problems += numeric(stream.get(kind) or {}, "p50_s", "p99_s", where=f"{kind}.")
        problems += expect(not run.get("failures"), f"reads failed: {run.get('failures')}")
    return problems


# --- running ---------------------------------------------------------------------------


def free_port(offsets: tuple[int, ...] = (0,)) -> int:
    """A loopback port P with P + each offset free, from the smoke's own range (none of the
    test suite's: the smoke runs inside it; tests/conftest.py lists the ranges)."""
    return free_loopback_port(offsets, low=2_000, high=6_000)


class Runner:
    def __init__(self, work: Path, cluster_master: str | None, env: dict[str, str]) -> None:
        self.work = work
        self.cluster_master = cluster_master
        self.env = env  # this process's environment at the start, for every child
        self.verdicts: dict[str, Verdict] = {}
        self._events_ready = threading.Lock()

    def figures_path(self, target: str, part: str = "") -> Path:
        return self.work / "figures" / f"{target}{part}.json"

    def run(self, target: str, what: Callable[[Verdict], list[str]]) -> Verdict:
        verdict = self.verdicts[target] = Verdict(target, log=str(self.work / f"{target}.log"))
        started = time.monotonic()
        try:
            verdict.problems = what(verdict)
            verdict.verdict = "failed" if verdict.problems else "ok"
        except Skip as reason:
            verdict.verdict, verdict.problems = "skipped", [str(reason)]
        except Exception as error:  # any failure of a benchmark is this target's verdict
            verdict.problems = [f"{type(error).__name__}: {error}"]
            with open(verdict.log, "a") as log:
                traceback.print_exc(file=log)
        verdict.seconds = round(time.monotonic() - started, 1)
        # To the terminal itself: the other lane may be printing into a log.
        print(f"{target:<20} {verdict.seconds:6.1f} s  {verdict.verdict}", file=sys.__stdout__)
        sys.__stdout__.flush()
        return verdict

    def command(self, verdict: Verdict, *args: str, env: Mapping[str, str] = {}) -> None:
        """One benchmark process; its output to the target's log; fails on exit status."""
        with open(verdict.log, "a") as log:
            log.write(f"$ {' '.join(args)}\n")
            log.flush()
            done = subprocess.run(
                args, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT,
                check=False, timeout=600,
            )  # fmt: skip
        if done.returncode:
            tail = Path(verdict.log).read_text().splitlines()[-15:]
            raise RuntimeError(f"exit {done.returncode}: " + "\n".join(tail))

    def benchmark(self, verdict: Verdict, module: str, *args: str, part: str = "") -> dict:
        path = self.figures_path(verdict.target, part)
        self.command(verdict, PYTHON, "-m", f"benchmarks.{module}", *args, "--figures", str(path))
        return dict(json.loads(path.read_text()))

    # Each target at its smoke size: the make target's command with smaller options.

    def bench(self, v: Verdict) -> list[str]:
        return check_backtest(self.benchmark(v, "backtest", *self.backtest_args("bench")))

    def backtest_args(self, name: str) -> list[str]:
        return [*EVENTS, "--baseline-events", "0", "--work-dir", str(self.work / name),
                "--events-dir", str(self.events_dir())]  # fmt: skip

    def events_dir(self) -> Path:
        """The backtests' events, generated once (benchmarks.backtest._events caches them;
        made here first so that two lanes never generate them at once)."""
        with self._events_ready, open(self.work / "events.log", "a") as log:
            made = subprocess.run(  # velocity generate prints its summary: into a log
                [PYTHON, "-c", "import sys; from benchmarks.backtest import _events; "
                 "from pathlib import Path; _events(Path(sys.argv[1]), 2000, 200, 20.0)",
                 str(self.work / "events")],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, check=False,
            )  # fmt: skip
        if made.returncode:
            raise RuntimeError(f"generating the events failed: {self.work / 'events.log'}")
        return self.work / "events"

    def bench_cluster(self, v: Verdict) -> list[str]:
        with self.cluster() as master:
            figures = self.benchmark(
                v, "backtest", *self.backtest_args("cluster"), "--master", "local[2]",
                "--master", master,
            )  # fmt: skip
        return check_backtest(figures, masters=2)

    @contextmanager
    def cluster(self) -> Iterator[str]:
        """The given master, or a standalone cluster (infra/cluster.sh) of this run's own."""
        if self.cluster_master:
            yield self.cluster_master
            return
        port = free_port((0, 1))
        env = {**self.env, "VELOCITY_CLUSTER_PORT": str(port),
               "VELOCITY_CLUSTER_UI_PORT": str(port + 1),
               "VELOCITY_CLUSTER_WORKER_MEMORY": "2g",
               "VELOCITY_CLUSTER_DIR": str(self.work / "spark-cluster")}  # fmt: skip
        script = str(ROOT / "infra" / "cluster.sh")
        up = subprocess.run(
            ["bash", script, "up"], env=env, capture_output=True, text=True, timeout=180,
            check=False,
        )  # fmt: skip
        try:
            if up.returncode:
                raise Skip(f"the standalone cluster did not start: {up.stderr.strip()[-400:]}")
            yield f"spark://127.0.0.1:{port}"
        finally:
            subprocess.run(["bash", script, "down"], env=env, capture_output=True, check=False)

    def bench_peer(self, v: Verdict) -> list[str]:
        for tool in ("mvn", "java"):
            if shutil.which(tool) is None:
                raise Skip(f"no {tool} on PATH: the Flink peer cannot be built or run")
        build = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(PEER_POM), f"-Dmaven.repo.local={ROOT / '.cache/m2'}",
             "package"],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if build.returncode:
            raise Skip(f"the peer's Maven build failed: {(build.stdout + build.stderr)[-600:]}")
        figures = self.benchmark(
            v, "peer", *EVENTS, "--rules", "sample", "--events-dir", str(self.events_dir()),
            "--work-dir", str(self.work / "peer"),
        )  # fmt: skip
        return check_peer(figures)

    def bench_stream(self, v: Verdict) -> list[str]:
        # 250 events over 5 s with the fire-often rules: alerts to wait for, an easy rate.
        port = free_port((0, 1000, 2000, 3000))
        figures = self.benchmark(
            v, "stream", "--rate", "50", "--seconds", "5", "--keys", "200", "--rules",
            str(FIRE_OFTEN), "--port", str(port), "--work-dir", str(self.work / "stream"),
        )  # fmt: skip
        return check_stream(figures)

    def bench_check(self, v: Verdict) -> list[str]:
        # The fire-often rules (alerts to wait for, rules that fire in checks) at 50 payments
        # and 100 checks a second: 3 s of warm-up, then 1 s a load; one ramp step.
        port = free_port((0, 1000, 2000, 3000, 4000))
        figures = self.benchmark(
            v, "check", "--rate", "50", "--seconds", "6", "--warmup-seconds", "3",
            "--block-seconds", "1", "--keys", "200", "--rules", "fire-often",
            "--check-rate", "100", "--lanes", "2", "--ramp", "100", "--step-seconds", "1",
            "--port", str(port), "--work-dir", str(self.work / "check"),
        )  # fmt: skip
        return check_check(figures)

    def bench_page(self, v: Verdict) -> list[str]:
        # Two tiny sizes (a write-behind group each), two rounds of every read with nothing
        # streaming; then one size with the stream beside (50 payments/s for 28 s, a read
        # every 0.2 s in two 6-second blocks: every read at least once).
        sizes = (2000, 6000)
        figures = self.benchmark(
            v, "page", "--sizes", ",".join(map(str, sizes)), "--rounds", "2",
            "--stream-rate", "0", "--stream-entries", "1000",
            "--port", str(free_port((0, 1))), "--work-dir", str(self.work / "page"),
        )  # fmt: skip
        beside = self.benchmark(
            v, "page", "--sizes", "2000", "--stream-rate", "50", "--stream-seconds", "28",
            "--warmup-seconds", "4", "--block-seconds", "6", "--click-every", "0.2",
            "--port", str(free_port((0, 1, 1000, 2000))),
            "--work-dir", str(self.work / "page-beside"), part="beside",
        )  # fmt: skip
        return check_page(figures, sizes) + check_page_beside(beside)

    def bench_browser(self, v: Verdict) -> list[str]:
        # Its test is the browser suite's storm test (the suite runs it); what bench-browser
        # adds is the fill (bench-page's) and the selection of that test, with a time limit
        # grown by the fill's: checked here by collecting it as the target does.
        command = [PYTHON, "-m", "pytest", "tests/browser/test_velocity_queue.py", "-k", "storm",
                   "--collect-only", "-q", "-p", "no:cacheprovider"]  # fmt: skip
        done = subprocess.run(
            command, cwd=ROOT, env={**self.env, "VELOCITY_BROWSER_STORED_ALERTS": "10000000"},
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        with open(v.log, "a") as log:
            log.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}")
        selected = [line for line in done.stdout.splitlines() if "::" in line]
        return expect(
            done.returncode == 0 and len(selected) == 1 and "storm" in selected[0],
            f"bench-browser selects {selected} (exit {done.returncode}), expected the storm test",
        )

    def bench_cases(self, v: Verdict) -> list[str]:
        args = ("--groups", "4", "--alerts", "200", "--payers", "300")
        return check_cases(self.benchmark(v, "cases", *args))

    def bench_kernel(self, v: Verdict) -> list[str]:
        problems = []
        for part, rules in (("", []), ("-fire-often", ["--rules", str(FIRE_OFTEN)])):
            figures = self.benchmark(
                v, "kernel", "--events", "20000", "--payers", "2000", "--runs", "1",
                "--reference", "2000", *rules, part=part,
            )  # fmt: skip
            problems += [f"{part or 'sample'}: {p}" for p in check_kernel(figures)]
        return problems

    def bench_stream_steps(self, v: Verdict) -> list[str]:
        figures = self.benchmark(
            v, "stream_steps", "--batch", "500", "--batches", "3", "--keys", "500",
            "--before", "", "--rounds", "1", "--port", str(free_port()),
            "--work-dir", str(self.work / "stream-steps"),
        )  # fmt: skip
        return check_stream_steps(figures)

    def bench_lookup(self, v: Verdict) -> list[str]:
        figures = self.benchmark(
            v, "lookup", "--runs", "3", "--port", str(free_port()),
            "--work-dir", str(self.work / "lookup"),
        )  # fmt: skip
        return check_lookup(figures)

    # In this process, on one shared Spark session.

    def in_process(self, v: Verdict, module: str, args: list[str]) -> dict[str, Any]:
        import importlib

        benchmark = importlib.import_module(f"benchmarks.{module}")
        path = self.figures_path(v.target)
        options = benchmark.parser().parse_args([*args, "--figures", str(path)])
        spark = self.spark()
        with open(v.log, "a") as log, redirect_stdout(log):
            print(f"in this process: benchmarks.{module} {' '.join(args)}", flush=True)
            benchmark.run(options, spark=spark)
        return dict(json.loads(path.read_text()))

    def spark(self) -> Any:
        if not hasattr(self, "_spark"):
            from velocity.settings import load_settings
            from velocity.spark.session import build_spark

            settings = load_settings(data_dir=self.work / "spark")
            self._spark = build_spark(settings, "velocity-bench-smoke")
            # Its log is this process's stderr, shared by both lanes: Spark's own errors
            # (window()'s code generation falls back, with a long trace) stay out of it;
            # a failure still raises in the benchmark.
            self._spark.sparkContext.setLogLevel("FATAL")
        return self._spark

    def bench_backfill(self, v: Verdict) -> list[str]:
        args = [*EVENTS, "--commits", "4", "--redis-port", str(free_port()),
                "--work-dir", str(self.work / "backfill")]  # fmt: skip
        return check_backfill(self.in_process(v, "backfill", args))

    def bench_cooldown(self, v: Verdict) -> list[str]:
        args = ["--events", "2000", "--keys", "100", "--work", str(self.work / "cooldown")]
        return check_cooldown(self.in_process(v, "cooldown", args))

    def bench_window(self, v: Verdict) -> list[str]:
        # Spark's window() on one signature, in one micro-batch: each of its micro-batches
        # is 20-30 s (its code generation for the 1 440 slides fails, then interprets).
        args = ["--events", "200", "--keys", "50", "--files", "1", "--signatures", "1",
                "--port", str(free_port()), "--work-dir", str(self.work / "window")]  # fmt: skip
        return check_window(self.in_process(v, "window_compare", args))


# The in-process benchmarks, one after the other on one Spark session (window_compare last:
# it sets the session's state store and puts this process's environment back after).
ON_SHARED_SPARK = ("bench-backfill", "bench-cooldown", "bench-window")
# Longest first, so that two lanes finish about together (seconds measured at smoke size).
LONGEST_FIRST = ("shared-spark", "bench-cluster", "bench-stream", "bench-check", "bench-peer",
                 "bench", "bench-page", "bench-stream-steps", "bench-lookup", "bench-kernel",
                 "bench-cases", "bench-browser")  # fmt: skip


def run_all(runner: Runner, targets: list[str], lanes: int) -> list[Verdict]:
    """The targets in ``lanes`` side by side, longest first; the in-process Spark ones as
    one job (one session)."""
    steps = {t: getattr(runner, t.replace("-", "_")) for t in targets}
    shared = [t for t in ON_SHARED_SPARK if t in steps]

    def job(name: str) -> None:
        for target in shared if name == "shared-spark" else [name]:
            runner.run(target, steps[target])

    jobs = [j for j in LONGEST_FIRST if j in steps or (j == "shared-spark" and shared)]
    with ThreadPoolExecutor(max_workers=max(1, lanes)) as pool:
        for future in [pool.submit(job, name) for name in jobs]:
            future.result()
    if hasattr(runner, "_spark"):
        runner._spark.stop()
    return [runner.verdicts[t] for t in TARGETS if t in runner.verdicts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=TARGETS, help="these targets only")
    parser.add_argument("--skip", action="append", choices=TARGETS, default=[], help="not these")
    parser.add_argument(
        "--cluster-master", help="bench-cluster on this running master (default: start one)"
    )
    parser.add_argument("--lanes", type=int, default=2, help="targets run side by side")
    parser.add_argument("--work-dir", type=Path, help="default: a temporary folder, removed")
    parser.add_argument("--report", type=Path, help="write the verdicts as JSON here")
    args = parser.parse_args(argv)
    targets = [t for t in (args.only or TARGETS) if t not in args.skip]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="velocity-bench-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"bench smoke: {len(targets)} targets, work in {work}", flush=True)
    verdicts = run_all(Runner(work, args.cluster_master, dict(os.environ)), targets, args.lanes)
    total = time.monotonic() - started
    print(f"\n{'target':<20} {'seconds':>8}  verdict")
    for v in verdicts:
        print(f"{v.target:<20} {v.seconds:>8.1f}  {v.verdict}")
        for problem in v.problems:
            print(f"    {problem}")
        if v.verdict == "failed":
            print(f"    log: {v.log}")
    print(f"{'all':<20} {total:>8.1f}  (side by side in {args.lanes} lanes)")
    if args.report:
        args.report.write_text(
            json.dumps({"seconds": round(total, 1), "targets": [asdict(v) for v in verdicts]})
        )
    failed = any(v.verdict == "failed" for v in verdicts)
    if not failed and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
