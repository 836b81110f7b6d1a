"""The open-loop load generator of `make bench-check` (``benchmarks.check``), run as a process
of its own: ``python -m benchmarks.check_load …``; not a command for people.

It sends pre-authorization checks at a fixed rate, scheduled by the clock, never by the
answers (open loop): check j of the schedule is due at ``start + window start + j / rate``,
and its latency counts from that due time to its answer, so a check sent late because an
earlier one was slow is late by that much too (no coordinated omission). A check that errors,
times out (``--timeout``), or is still unsent when its window is over counts as infinitely
late.

Each check is one round trip on a pipeline-free connection: ``FCALL_RO velocity_check`` as
the read-only user (``--redis``), or ``POST /check`` with the bearer token (``--http``, the
token in the environment variable ``VELOCITY_CHECK_TOKEN``). ``--lanes`` threads each own a
connection and take every lanes-th check of the schedule, so one slow answer delays only its
lane's next sends. ``--of N --index i``: this process takes every N-th check (the others run
as N - 1 more processes), so the rate is the combined one.

Payments are drawn like the stream's: the lines of the benchmark's event files (``--files``,
landed one every ``--seconds-per-file`` from the start), a check due at t from the file
landing at t, with a transactionId of its own. ``--at-end``: from every file, with the eventTime
just after the last one's (the state the stream left, once stopped).

Protocol: prints ``ready`` once its payments are prepared and its connections open, reads
the start (epoch seconds) from standard input, sends, writes its results as JSON to
``--out`` and exits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from velocity.operating.local_process import run_ahead

# How long a lane keeps sending the checks of a window once the window is over: checks
# still unsent then were never answered.
GRACE_SECONDS = 2.0
# An HTTP connection idle this long is opened afresh before its next check.
IDLE_SECONDS = 2.0


@dataclass
class Payment:
    """One line of the events, prepared for both doors."""

    arguments: list[str]  # velocity_check's field/value pairs
    tx_at: int  # index in ``arguments`` of the transactionId's value
    body: dict[str, Any]  # the line, for POST /check


def prepare(files: list[Path], at_end: bool) -> list[list[Payment]]:
    """The payments of each file (``at_end``: one list of all, timed after the last)."""
    from velocity.redis.check import payment_arguments, valid_payment

    lines = [[json.loads(text) for text in path.read_text().splitlines()] for path in files]
    if at_end:
        last = max(int(line["eventTime"]) for group in lines for line in group)
        lines = [[{**line, "eventTime": last + 1} for group in lines for line in group]]
    prepared = []
    for group in lines:
        payments = []
        for line in group:
            arguments = payment_arguments(valid_payment(line))
            payments.append(Payment(arguments, arguments.index("transactionId") + 1, line))
        prepared.append(payments)
    return prepared


@dataclass
class Lane:
    latencies_ms: list[float] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    fired: int = 0
    evaluated: int = 0
    # (epoch ms answered, stateAsOf.eventTime): how fresh the state each answer rests on is
    state_seen: list[tuple[int, int]] = field(default_factory=list)


Caller = Callable[[Payment, str], dict[str, Any]]


def redis_caller(url: str, rules_key: str, timeout: float) -> Caller:
    import redis

    from velocity.redis.check import CHECK_FUNCTION

    # One connection, no pipeline, no retries: a check is one round trip or an error.
    client = redis.Redis.from_url(
        url, decode_responses=True, socket_timeout=timeout, retry_on_timeout=False,
        single_connection_client=True,
    )  # fmt: skip
    client.ping()

    def call(payment: Payment, tx: str) -> dict[str, Any]:
        arguments = list(payment.arguments)
        arguments[payment.tx_at] = tx
        return answer_of(cast(str, client.fcall_ro(CHECK_FUNCTION, 1, rules_key, *arguments)))

    return call


def answer_of(text: str | bytes) -> dict[str, Any]:
    """The answer's JSON; one that is not JSON is an error naming where it breaks."""
    try:
        answer: dict[str, Any] = json.loads(text)
    except ValueError as exc:
        at = getattr(exc, "pos", 0)
        raise ValueError(f"not JSON at {at}: {text[max(0, at - 60) : at + 20]!r}") from None
    return answer


def http_caller(url: str, token: str, timeout: float) -> Caller:
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    state: dict[str, http.client.HTTPConnection] = {}
    last_used = [time.monotonic()]

    def connection() -> http.client.HTTPConnection:
        # Kept alive; opened again after an error, and after an idle pause between windows
        # (a server closes an idle connection: uvicorn after 5 s), as a pooled client would.
        if "c" in state and time.monotonic() - last_used[0] > IDLE_SECONDS:
            state.pop("c").close()
        if "c" not in state:
            state["c"] = http.client.HTTPConnection(where.netloc, timeout=timeout)
            state["c"].connect()
        last_used[0] = time.monotonic()
        return state["c"]

    def call(payment: Payment, tx: str) -> dict[str, Any]:
        body = json.dumps({**payment.body, "transactionId": tx}).encode()
        open_one = connection()
        try:
            open_one.request("POST", "/check", body, headers)
            response = open_one.getresponse()
            text = response.read()
        except Exception:
            state.pop("c", None)
            open_one.close()
            raise
        if response.status != 200:  # the server may close after it: a fresh connection
            state.pop("c", None)
            open_one.close()
            raise RuntimeError(f"HTTP {response.status}: {text[:200]!r}")
        return answer_of(text)

    connection()
    return call


def run_lane(
    lane: Lane,
    call: Caller,
    schedule: list[tuple[float, float]],  # (due, window's end), monotonic, this lane's checks
    payments: list[list[Payment]],
    seconds_per_file: float,
    start: float,
    name: str,
    seed: int,
) -> None:
    rng = random.Random(seed)
    for j, (due, window_end) in enumerate(schedule):
        now = time.monotonic()
        if now > window_end + GRACE_SECONDS:
            lane.errors["unsent (the lane fell behind)"] += 1
            lane.latencies_ms.append(math.inf)
            continue
        if due > now:
            time.sleep(due - now)
        group = payments[min(len(payments) - 1, int((due - start) / seconds_per_file))]
        payment = group[rng.randrange(len(group))]
        sent = time.monotonic()
        try:
            answer = call(payment, f"check-{name}-{j}")
        except Exception as exc:  # any failure of a check is an answer that never came
            lane.latencies_ms.append(math.inf)
            lane.errors[type(exc).__name__ + ": " + str(exc)[:160]] += 1
            continue
        answered = time.monotonic()
        lane.latencies_ms.append((answered - due) * 1000)
        lane.send_lag_ms.append((sent - due) * 1000)
        lane.decisions[str(answer.get("decision"))] += 1
        rules = answer.get("rules") or []
        lane.evaluated += len(rules)
        lane.fired += sum(1 for r in rules if r.get("fired"))
        newest = (answer.get("stateAsOf") or {}).get("eventTime")
        if newest is not None:
            lane.state_seen.append((int(time.time() * 1000), int(newest)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    door = parser.add_mutually_exclusive_group(required=True)
    door.add_argument("--redis", metavar="URL", help="FCALL_RO velocity_check on this Redis")
    door.add_argument("--http", metavar="URL", help="POST /check on this service")
    parser.add_argument("--rules-key", default="velocity:rules")
    parser.add_argument("--rate", type=float, required=True, help="checks a second, all processes")
    parser.add_argument(
        "--window", action="append", required=True, metavar="FROM:TO",
        help="seconds from the start during which checks are sent (repeatable)",
    )  # fmt: skip
    parser.add_argument("--files", type=Path, nargs="+", required=True)
    parser.add_argument("--seconds-per-file", type=float, default=1.0)
    parser.add_argument("--at-end", action="store_true")
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--of", type=int, default=1)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--nice", type=int, default=-10,
        help="this generator's niceness: it stands for a service on a machine of its own, so "
        "it runs ahead of the stream's batch work (as `velocity up` runs Redis)",
    )  # fmt: skip
    args = parser.parse_args()
    # Before the lanes' threads start: they inherit it.
    print(f"generator {args.index}: {run_ahead(0, args.nice)}", file=sys.stderr, flush=True)

    payments = prepare(sorted(args.files), args.at_end)
    token = os.environ.get("VELOCITY_CHECK_TOKEN", "")
    callers = [
        redis_caller(args.redis, args.rules_key, args.timeout)
        if args.redis
        else http_caller(args.http, token, args.timeout)
        for _ in range(args.lanes)
    ]
    print("ready", flush=True)
    start_epoch = float(sys.stdin.readline())
    start = time.monotonic() + (start_epoch - time.time())
    # The combined schedule: every window at the combined rate; this process takes every
    # of-th check, its lanes every lanes-th of those.
    due_times: list[tuple[float, float]] = []
    for window in args.window:
        begin, end = (float(x) for x in window.split(":"))
        count = round((end - begin) * args.rate)
        due_times += [(start + begin + j / args.rate, start + end) for j in range(count)]
    mine = due_times[args.index :: args.of]
    lanes = [Lane() for _ in callers]
    threads = [
        threading.Thread(
            target=run_lane,
            args=(
                lane,
                call,
                mine[k :: len(lanes)],
                payments,
                args.seconds_per_file,
                start,
                f"{os.getpid()}-{k}",
                args.index * 1000 + k,
            ),
            daemon=True,
        )
        for k, (lane, call) in enumerate(zip(lanes, callers, strict=True))
    ]
    time.sleep(max(0.0, start - time.monotonic()))
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - began
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    errors: Counter[str] = Counter()
    decisions: Counter[str] = Counter()
    for lane in lanes:
        errors.update(lane.errors)
        decisions.update(lane.decisions)
    result = {
        "latencies_ms": [x if math.isfinite(x) else None for ln in lanes for x in ln.latencies_ms],
        "send_lag_ms": [x for lane in lanes for x in lane.send_lag_ms],
        "errors": dict(errors),
        "decisions": dict(decisions),
        "fired": sum(lane.fired for lane in lanes),
        "evaluated": sum(lane.evaluated for lane in lanes),
        "state_seen": [pair for lane in lanes for pair in lane.state_seen],
        "cpu_seconds": cpu,
        "wall_seconds": wall,
    }
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
