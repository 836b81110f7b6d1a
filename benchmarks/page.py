"""The Velocity page's reads against the alerts stored (not a test): `make bench-page` or
`python -m benchmarks.page`.

For each size (``--sizes``, default 10 000 and 10 000 000 alerts), in a data dir and a
Redis (`velocity up` on a port of the benchmark's) of its own:

- the tables are filled with that many alerts as the stream writes them
  (``benchmarks.page_fill``: the write-behind's spool and flush, a data file a 30-second
  group, alerts gathered into cases; the storm of issue 51, 3 000 payers, a rule firing on
  every payment and its twin with a 10-minute cooldown, 2 000 alerts a second of
  decisionTime ending now; one alert in a hundred reviewed; the newest alerts on the Redis
  alert stream);
- the page's app (the FastAPI app Airflow mounts at /velocity) is served by uvicorn in a
  process of its own, an editor signed in (Airflow's login and the backfill runs read from
  Airflow's own database are left out: neither reads Velocity's tables);
- every page and API read, and the clicks that change something (assign, close and reopen
  a case, pause and activate a rule: the post and the page it redirects to), is timed from
  an HTTP client: once as the process's first look (the files each kept read is fed from
  every file), then ``--rounds`` times: p50, p95 and max ms per read.

With ``--stream-rate R`` (default 1 000; 0: nothing streams beside the reads), the stream
runs beside them instead (``benchmarks.stream.run_design``: a real `velocity stream` on a
folder, files landing once a second at R payments/s for ``--stream-seconds``) on the
filled tables and Redis, with the storm's rules (2 alerts a payment: 2 000 alerts/s at
1 000 payments/s). The tables are filled before the stream starts (the fill's groups are
numbered below zero: the stream appends its own batches after them, and starts as a
stream restarted on weeks of tables does, rebuilding Redis from Delta). After a warm-up,
``--block-seconds`` blocks alternate: in a clicking block an analyst's read or click starts
every ``--click-every`` seconds (the page's reads in turn), in a quiet block nothing reads.
Reported: each read's first look (a round before the first file lands, then another after
the page's server restarted: what a restarted api-server waits for) and its p50/p95/max
in the clicking blocks, and the stream's alert latency (rule 1's alerts, which fire on
every payment: the cooldown twin's depend on the filled history, which the backtest of the
stream's own payments does not see) in the quiet blocks against the clicking ones: the
stream's p99 with an analyst clicking every second, and without, in one run.

Then the sizes side by side with the ratio of the largest's p50 to the smallest's, and the
figures as JSON (``--figures``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import figures as figures_file

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
PREFIX = "/velocity"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="10000,10000000", help="alerts stored, comma-separated (smallest first)"
    )
    parser.add_argument("--rounds", type=int, default=20, help="timed looks a read")
    parser.add_argument("--payers", type=int, default=3_000)
    parser.add_argument("--alerts-per-second", type=float, default=2_000.0)
    parser.add_argument("--stream-entries", type=int, default=50_000)
    parser.add_argument("--port", type=int, default=6431, help="Redis; the page on port+1")
    parser.add_argument(
        "--stream-rate", type=int, default=1_000,
        help="payments/s the stream decides beside the reads (0: nothing streams)",
    )  # fmt: skip
    parser.add_argument("--stream-seconds", type=int, default=600)
    parser.add_argument("--warmup-seconds", type=int, default=60)
    parser.add_argument("--block-seconds", type=int, default=60)
    parser.add_argument("--click-every", type=float, default=1.0, help="seconds between clicks")
    parser.add_argument("--work-dir", type=Path, help="default: a temporary folder, removed")
    figures_file.add_option(parser)
    return parser


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class PageServer:
    """``python -m benchmarks.page serve`` on ``port``: the page's app over ``env``'s data
    dir and Redis."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        with log.open("a") as out:
            self.process = subprocess.Popen(
                [PYTHON, "-m", "benchmarks.page", "serve", "--port", str(port)],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the page server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base}{PREFIX}/api/health", timeout=5).status_code < 500:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        raise RuntimeError(f"the page server did not answer in 120 s: {log}")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def serve(port: int) -> None:
    """The page's app under uvicorn, signed in as an editor, with the settings of the
    environment (the process `PageServer` starts)."""
    import uvicorn

    sys.path.insert(0, str(ROOT / "plugins"))
    from velocity.settings import load_settings
    from velocity_airflow.page import access, home
    from velocity_airflow.page.app import app

    settings = load_settings()

    class Editor:
        def get_name(self) -> str:
            return "bench"

    # Routers look these up in ``access`` at call time (as the page's tests replace them).
    access.settings = lambda: settings  # type: ignore[assignment]
    access.can_edit = lambda user: True  # type: ignore[assignment]
    # The backfill runs Airflow keeps in its own database (a LIMIT 50 query), not Velocity's.
    home._airflow_backfill_runs = lambda user, limit=50: []  # type: ignore[assignment]
    for dependency in (access.SIGNED_IN, access.EDIT_RULES, access.REVIEW):
        app.dependency_overrides[dependency.dependency] = Editor
    # Mounted where Airflow mounts it: its redirects name /velocity/….
    from fastapi import FastAPI

    mounted = FastAPI()
    mounted.mount(PREFIX, app)
    uvicorn.run(mounted, host="127.0.0.1", port=port, log_level="warning")


class Reads:
    """Every page and API read, and the clicks, against one filled data dir."""

    def __init__(self, base: str, settings: Any) -> None:
        import httpx

        self.client = httpx.Client(base_url=f"{base}{PREFIX}", timeout=120)
        self.settings = settings

    def plan(self) -> dict[str, Callable[[], Any]]:
        from velocity.delta.case_store import CaseStore

        cases = CaseStore(self.settings).cases()
        busiest = max(cases.values(), key=lambda c: (c.alerts, c.case_id))
        quiet = min(cases.values(), key=lambda c: (c.alerts, c.case_id))
        first = self.get_json("/api/alerts", limit="50")
        older = first["older"]
        oldest = self.oldest_alert()
        tx = first["alerts"][-1]["transactionId"]
        get, page = self.get, self.page
        return {
            "page": lambda: page("/"),
            "page, queue filtered": lambda: page("/", case_status="all", case_rule="2"),
            "page, alerts filtered": lambda: page("/", rule="2"),
            "page, an old alert explained": lambda: page("/", alert=oldest),
            "page, window lookup": lambda: page("/", lookup_rule="1", lookup_key="payerId=p-7"),
            "alert rows (show new)": lambda: get("/alerts/rows"),
            "api/alerts?limit=50": lambda: get("/api/alerts", limit="50"),
            "api/alerts, rule 2": lambda: get("/api/alerts", rule="2", limit="50"),
            "api/alerts, next page": lambda: get("/api/alerts", limit="50", before=older),
            "api/alerts, a payment": lambda: get("/api/alerts", tx=tx),
            "api/alerts, a key": lambda: get("/api/alerts", key="payerId=p-7"),
            "api/alerts/ID/explanation (old)": lambda: get(f"/api/alerts/{oldest}/explanation"),
            "api/cases": lambda: get("/api/cases"),
            "api/cases, filtered": lambda: get("/api/cases", case_status="all", case_rule="2"),
            "queue rows (show new)": lambda: get("/cases/rows"),
            "case page (busiest)": lambda: get(f"/cases/{busiest.case_id}"),
            "api/precision": lambda: get("/api/precision"),
            "api/health": lambda: get("/api/health"),
            "api/rules": lambda: get("/api/rules"),
            "api/shadow": lambda: get("/api/shadow"),
            "api/lookup": lambda: get("/api/lookup", rule="1", key="payerId=p-7"),
            "click: assign": lambda: self.click(f"/cases/{busiest.case_id}/assign",
                                                assignee="bench", return_to="case"),
            "click: close (quiet case)": lambda: self.click(
                f"/cases/{quiet.case_id}/close", verdict="FALSE_POSITIVE"
            ),
            "click: reopen (quiet case)": lambda: self.click(
                f"/cases/{quiet.case_id}/reopen", return_to="case"
            ),
            # Rule 2 shares rule 1's signature: its pause forgets no buckets, so its
            # activation rebuilds none. (Rule 3's would: the stream rebuilds a signature's
            # buckets from the raw events inside its day-long window, a stall of the
            # stream's batches of 13.6 s with 10 000 alerts stored, SPEC §2.)
            "click: pause rule 2": lambda: self.click("/rules/2/pause"),
            "click: activate rule 2": lambda: self.click("/rules/2/activate"),
        }  # fmt: skip

    def oldest_alert(self) -> str:
        """An alert of the table's first file: long gone from the Redis alert stream."""
        from deltalake import DeltaTable

        from velocity.delta.names import ALERTS

        table = DeltaTable(str(self.settings.table_path(ALERTS)))
        first = sorted(table.file_uris())[0]
        import pyarrow.parquet as pq
        from pyarrow import fs as pafs

        filesystem, path = pafs.FileSystem.from_uri(first)
        with filesystem.open_input_file(path) as source:
            return str(pq.ParquetFile(source).read(columns=["alertId"]).column(0)[0])

    def get(self, path: str, **params: str) -> None:
        reply = self.client.get(path, params=params)
        if reply.status_code != 200:
            raise RuntimeError(f"GET {path} {params}: {reply.status_code} {reply.text[:500]}")

    def get_json(self, path: str, **params: str) -> Any:
        reply = self.client.get(path, params=params)
        reply.raise_for_status()
        return reply.json()

    def page(self, path: str, **params: str) -> None:
        reply = self.client.get(path, params=params, headers={"accept": "text/html"})
        if reply.status_code != 200 or "cannot read" in reply.text:
            broken = reply.text.split("cannot read", 1)[-1][:300]
            raise RuntimeError(f"page {params}: {reply.status_code}: cannot read{broken}")

    def click(self, path: str, **form: str) -> None:
        """A post and the page it redirects to: what the browser waits for."""
        reply = self.client.post(path, data=form)
        if reply.status_code != 303:
            raise RuntimeError(f"POST {path}: {reply.status_code} {reply.text[:500]}")
        where = reply.headers["location"].removeprefix(PREFIX)
        self.page(where)


def first_looks(reads: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Each read once, in turn: ms each."""
    first: dict[str, float] = {}
    for name, read in reads.items():
        began = time.perf_counter()
        read()
        first[name] = (time.perf_counter() - began) * 1000
    return first


def time_reads(reads: dict[str, Callable[[], Any]], rounds: int) -> dict[str, Any]:
    """Each read once (its first look), then ``rounds`` times in turn."""
    first = first_looks(reads)
    samples: dict[str, list[float]] = {name: [] for name in reads}
    for _ in range(rounds):
        for name, read in reads.items():
            began = time.perf_counter()
            read()
            samples[name].append((time.perf_counter() - began) * 1000)
    return {
        name: {
            "first_ms": round(first[name], 1),
            "p50_ms": round(statistics.median(samples[name]), 1),
            "p95_ms": round(percentile(samples[name], 0.95), 1),
            "max_ms": round(max(samples[name]), 1),
        }
        for name in reads
    }


def measure(args: argparse.Namespace, size: int, work: Path) -> dict[str, Any]:
    from benchmarks.page_fill import fill
    from velocity.settings import load_settings

    data = work / f"data-{size}"
    shutil.rmtree(data, ignore_errors=True)
    env = {
        **os.environ,
        "VELOCITY_DATA_DIR": str(data),
        "VELOCITY_REDIS_URL": f"redis://:velocity-bench@127.0.0.1:{args.port}/0",
        "VELOCITY_KAFKA_BOOTSTRAP": "",  # nothing reads a broker
        "VELOCITY_CHECK_PORT": "0",  # nor the check service
        "AIRFLOW_HOME": str(work / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    velocity = [PYTHON, "-m", "velocity.cli"]
    subprocess.run([*velocity, "up"], env=env, check=True, stdout=subprocess.DEVNULL)
    server = None
    try:
        settings = load_settings(data_dir=data, redis_url=env["VELOCITY_REDIS_URL"])
        import redis

        redis.Redis.from_url(settings.redis_url).flushall()

        def progress(groups: int, done: int, total: int) -> None:
            if groups % 50 == 0:
                print(f"  filled {done * 2:,} of {total * 2:,} alerts", flush=True)

        filled = fill(
            settings, size, payers=args.payers, alerts_per_second=args.alerts_per_second,
            stream_entries=args.stream_entries, progress=progress,
        )  # fmt: skip
        print(f"  {filled}", flush=True)
        server = PageServer(env, args.port + 1, work / f"page-{size}.log")
        reads = time_reads(Reads(server.base, settings).plan(), args.rounds)
        return {"alerts": filled.alerts, "fill": vars(filled), "reads": reads}
    finally:
        if server is not None:
            server.close()
        subprocess.run([*velocity, "down"], env=env, check=False, stdout=subprocess.DEVNULL)


def fill_here(argv: list[str]) -> None:
    """``python -m benchmarks.page fill``: fill the data dir and Redis of the environment's
    settings (the stream's, when it runs beside) and print what was filled as JSON."""
    from benchmarks.page_fill import fill
    from velocity.settings import load_settings

    options = argparse.ArgumentParser(prog="benchmarks.page fill")
    options.add_argument("--alerts", type=int, required=True)
    options.add_argument("--payers", type=int, required=True)
    options.add_argument("--alerts-per-second", type=float, required=True)
    options.add_argument("--stream-entries", type=int, required=True)
    args = options.parse_args(argv)

    def progress(groups: int, done: int, total: int) -> None:
        if groups % 50 == 0:
            print(f"  filled {done * 2:,} of {total * 2:,} alerts", file=sys.stderr, flush=True)

    filled = fill(
        load_settings(), args.alerts, payers=args.payers,
        alerts_per_second=args.alerts_per_second, stream_entries=args.stream_entries,
        progress=progress,
    )  # fmt: skip
    print(json.dumps(vars(filled)))


PLAN = "(the plan: cases and the newest alerts)"


class ReadsBeside:
    """The page's reads while `run_design`'s stream decides payments on the filled tables
    (``benchmarks.stream.DuringRun``): the fill before the stream starts, a first look at
    every read while it starts, then a read or click every ``click_every`` seconds in the
    clicking blocks and none in the quiet ones."""

    def __init__(self, args: argparse.Namespace, size: int, work: Path) -> None:
        self.args = args
        self.size = size
        self.work = work
        warmup, width = args.warmup_seconds, args.block_seconds
        blocks = max(2, (args.stream_seconds - warmup) // width)
        self.blocks = [(warmup + b * width, warmup + (b + 1) * width) for b in range(blocks)]
        self.clicking = [b % 2 == 0 for b in range(blocks)]
        self.filled: dict[str, Any] = {}
        self.env: dict[str, str] = {}
        self.server: PageServer | None = None
        self.first: dict[str, float] = {}  # each read's first look (nothing kept yet)
        self.restarted: dict[str, float] = {}  # and the first look of a restarted server
        self.samples: dict[str, list[float]] = {}
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.reader: threading.Thread | None = None

    # -- benchmarks.stream.DuringRun ------------------------------------------------------

    def before_stream(self, env: dict[str, str], client: Any) -> None:
        self.env = env
        began = time.monotonic()
        filled = subprocess.run(
            [PYTHON, "-m", "benchmarks.page", "fill", "--alerts", str(self.size),
             "--payers", str(self.args.payers),
             "--alerts-per-second", str(self.args.alerts_per_second),
             "--stream-entries", "0"],  # the stream publishes its own
            cwd=ROOT, env=env, check=True, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.filled = json.loads(filled.stdout.strip().splitlines()[-1])
        print(f"  filled in {time.monotonic() - began:.0f} s: {self.filled}", flush=True)

    def prepare(self, env: dict[str, str], client: Any) -> None:
        from velocity.settings import load_settings

        log = self.work / f"page-{self.size}.log"
        self.server = PageServer(env, self.args.port + 1, log)
        settings = load_settings(data_dir=Path(env["VELOCITY_DATA_DIR"]))
        began = time.perf_counter()
        self.reads = Reads(self.server.base, settings).plan()
        self.first[PLAN] = _ms(began)
        self.first.update(first_looks(self.reads))  # as the stream starts
        # The api-server restarted: its first look reads what the first one kept.
        self.server.close()
        self.server = PageServer(env, self.args.port + 1, log)
        self.restarted = first_looks(self.reads)
        self.samples = {name: [] for name in self.reads}

    def start(self) -> None:
        began = time.monotonic()
        names = list(self.reads)

        def click_through() -> None:
            turn = 0
            for (start, end), clicking in zip(self.blocks, self.clicking, strict=True):
                if not clicking:
                    continue
                at = began + start
                while at < began + end and not self.stop.is_set():
                    if self.stop.wait(max(0.0, at - time.monotonic())):
                        return
                    name = names[turn % len(names)]
                    turn += 1
                    clicked = time.perf_counter()
                    try:
                        self.reads[name]()
                        self.samples[name].append(_ms(clicked))
                    except Exception as exc:  # counted, and the analyst clicks on
                        self.failures.append(f"{name}: {exc}"[:300])
                    at = max(at + self.args.click_every, time.monotonic())

        self.reader = threading.Thread(target=click_through, daemon=True)
        self.reader.start()

    def landed(self, times: dict[str, float]) -> None:
        self.landed_at = dict(times)
        if self.reader is not None:
            self.reader.join(timeout=self.args.stream_seconds + 120)

    def stream_stopped(self, client: Any) -> None:
        """Nothing: the reads ended with the last block."""

    def close(self) -> None:
        self.stop.set()
        if self.server is not None:
            self.server.close()
            self.server = None

    # -- figures --------------------------------------------------------------------------

    def block_of(self, file_index: int, files: int) -> bool | None:
        """Whether the file landed in a clicking block (None: in the warm-up or after)."""
        landed = file_index * self.args.stream_seconds / files
        for (start, end), clicking in zip(self.blocks, self.clicking, strict=True):
            if start <= landed < end:
                return clicking
        return None

    def figures(self, run: Any, data: Any) -> dict[str, Any]:
        index = {path.name: i for i, path in enumerate(data.files)}
        latencies: dict[bool, list[float]] = {True: [], False: []}
        for name, latency in run.file_latencies:
            clicking = self.block_of(index[name], len(data.files))
            if clicking is not None:
                latencies[clicking].append(latency / 1000)
        stream = {
            ("clicking" if clicking else "quiet"): {
                "alerts": len(values),
                "p50_s": round(percentile(values, 0.5), 3) if values else None,
                "p99_s": round(percentile(values, 0.99), 3) if values else None,
            }
            for clicking, values in latencies.items()
        }
        quiet, clicking = stream["quiet"]["p99_s"], stream["clicking"]["p99_s"]
        if quiet and clicking is not None:
            stream["p99_ratio_clicking_over_quiet"] = round(clicking / quiet, 2)
        reads = {
            name: {
                "first_ms": round(self.first[name], 1),
                "restarted_ms": round(self.restarted[name], 1),
                "n": len(values),
                "p50_ms": round(statistics.median(values), 1) if values else math.inf,
                "p95_ms": round(percentile(values, 0.95), 1) if values else math.inf,
                "max_ms": round(max(values), 1) if values else math.inf,
            }
            for name, values in self.samples.items()
        }
        return {
            "alerts": self.size,
            "fill": self.filled,
            "plan_first_ms": round(self.first[PLAN], 1),
            "reads": reads,
            "failures": self.failures,
            "stream": stream,
            "stream_run": run.summary(),
        }


def _ms(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def measure_beside(args: argparse.Namespace, size: int, work: Path) -> dict[str, Any]:
    """One size with the stream beside the reads (``--stream-rate``)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from benchmarks.page_fill import RULES_TEXT
    from benchmarks.stream import prepared_dataset, redis_service, run_design

    rules = work / "storm_rules.json"
    rules.write_text(RULES_TEXT)
    sizes = SimpleNamespace(
        work_dir=work, rate=args.stream_rate, seconds=args.stream_seconds, keys=args.payers
    )
    stream_work, data = prepared_dataset(sizes, rules)
    # Rule 1 fires on every payment whatever came before; the twin's cooldown and rule 3's
    # day follow the filled history too, which the backtest of these payments alone lacks.
    data = replace(data, expected={pair for pair in data.expected if pair[0] == 1})
    beside = ReadsBeside(args, size, work)
    try:
        run = run_design(
            "new", "folder", "single", data, args.stream_rate, args.stream_seconds,
            args.payers, stream_work, args.port, during=beside,
            extra_env={"VELOCITY_CHECK_PORT": "0"}, until_decided=True,
        )  # fmt: skip
    except BaseException:
        if beside.env:  # run_design stops its Redis only once it measured
            redis_service(False, "down", beside.env)
        raise
    return beside.figures(run, data)


def side_by_side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per read: each size's p50/p95/max and the largest's p50 over the smallest's."""
    small, large = runs[0]["reads"], runs[-1]["reads"]
    return {
        name: {
            **{f"{run['alerts']}": run["reads"][name] for run in runs},
            "p50_ratio": round(large[name]["p50_ms"] / max(small[name]["p50_ms"], 0.1), 2),
        }
        for name in small
    }


def report(runs: list[dict[str, Any]], compared: dict[str, Any]) -> None:
    sizes = [f"{run['alerts']:,} alerts" for run in runs]
    head = "".join(f"{s + ' p50/p95/max ms':>34}" for s in sizes)
    print(f"\n{'read':<36}{'first look ms':>16}{head}{'p50 ratio':>11}")
    for name, row in compared.items():
        cells = "".join(
            f"{row[str(run['alerts'])]['p50_ms']:>12.1f}{row[str(run['alerts'])]['p95_ms']:>11.1f}"
            f"{row[str(run['alerts'])]['max_ms']:>11.1f}"
            for run in runs
        )
        first = runs[-1]["reads"][name]["first_ms"]
        print(f"{name:<36}{first:>16.1f}{cells}{row['p50_ratio']:>11.2f}")


def report_beside(run: dict[str, Any]) -> None:
    """One size's figures with the stream beside: the stream's, then each read's."""
    stream = run["stream"]
    print(f"\n{run['alerts']:,} alerts stored, the stream beside: rule 1's alert latency")
    for kind in ("quiet", "clicking"):
        figures = stream[kind]
        print(f"  {kind:<9} {figures['alerts']:>9,} alerts  p50 {figures['p50_s']} s  "
              f"p99 {figures['p99_s']} s")  # fmt: skip
    print(f"  p99 clicking / quiet: {stream.get('p99_ratio_clicking_over_quiet')}")
    summary = run["stream_run"]
    print(f"  the stream: {summary}")
    print(f"  the plan's first look {run['plan_first_ms']:.0f} ms; failures: "
          f"{len(run['failures'])} {run['failures'][:3]}")  # fmt: skip
    print(f"{'read':<36}{'first ms':>10}{'restarted':>10}{'n':>5}{'p50':>9}{'p95':>9}{'max':>9}")
    for name, row in run["reads"].items():
        print(f"{name:<36}{row['first_ms']:>10.0f}{row['restarted_ms']:>10.0f}{row['n']:>5}"
              f"{row['p50_ms']:>9.0f}{row['p95_ms']:>9.0f}{row['max_ms']:>9.0f}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve(int(argv[argv.index("--port") + 1]))
        return
    if argv[:1] == ["fill"]:
        fill_here(argv[1:])
        return
    args = parser().parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="velocity-bench-page-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    try:
        for size in sizes:
            if args.stream_rate:
                print(
                    f"{size:,} alerts: filling, then the stream at {args.stream_rate:,} "
                    f"payments/s for {args.stream_seconds} s, a click every "
                    f"{args.click_every} s in every other {args.block_seconds}-s block",
                    flush=True,
                )
                runs.append(measure_beside(args, size, work))
                report_beside(runs[-1])
            else:
                print(f"{size:,} alerts: filling, then {args.rounds} rounds of reads", flush=True)
                runs.append(measure(args, size, work))
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    compared = side_by_side(runs)
    report(runs, compared)
    result = {
        "command": "python -m benchmarks.page " + " ".join(argv),
        "date": time.strftime("%Y-%m-%d"),
        "load_average": os.getloadavg()[0],
        "rounds": args.rounds,
        "runs": runs,
        "reads": compared,
        "stream_beside": (
            {"payments_per_s": args.stream_rate, "seconds": args.stream_seconds,
             "click_every_s": args.click_every, "block_seconds": args.block_seconds}
            if args.stream_rate else "none: the reads timed with nothing streaming"
        ),
    }  # fmt: skip
    for name, row in compared.items():  # the figures as JSON, a read a line
        print(json.dumps({"read": name, **row}))
    figures_file.write(args.figures, result)


if __name__ == "__main__":
    main()
