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
token in the environment variable ``VELOCITY_CHECK_TOKEN``), over ``--lanes`` connections.
One thread runs one select loop: each check is sent when due on a connection with none in
flight (its bytes built from parts prepared once, only the transactionId put in), and the
answers are read as they come. A check due while every connection waits for an answer waits
too, late by that much. Threads, one a connection, sent late: a woken thread waits for the
interpreter's lock, and the generator's own lag hid the service's. ``--of N --index i``: this
process takes every N-th check (the others run as N - 1 more processes), so the rate is the
combined one.

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
import gc
import json
import math
import os
import random
import resource
import select
import socket
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from velocity.operating.local_process import run_ahead

# How long the generator keeps sending the checks of a window once the window is over: checks
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
class Results:
    latencies_ms: list[float] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    fired: int = 0
    evaluated: int = 0
    # (epoch ms answered, stateAsOf.eventTime): how fresh the state each answer rests on is
    state_seen: list[tuple[int, int]] = field(default_factory=list)

    def failed(self, reason: str) -> None:
        self.latencies_ms.append(math.inf)
        self.errors[reason[:200]] += 1

    def answered(self, due: float, sent: float, now: float, text: bytes) -> None:
        try:
            answer = answer_of(text)
        except ValueError as exc:
            self.failed(f"ValueError: {exc}")
            return
        self.latencies_ms.append((now - due) * 1000)
        self.send_lag_ms.append((sent - due) * 1000)
        self.decisions[str(answer.get("decision"))] += 1
        rules = answer.get("rules") or []
        self.evaluated += len(rules)
        self.fired += sum(1 for r in rules if r.get("fired"))
        newest = (answer.get("stateAsOf") or {}).get("eventTime")
        if newest is not None:
            self.state_seen.append((int(time.time() * 1000), int(newest)))


def answer_of(text: str | bytes) -> dict[str, Any]:
    """The answer's JSON; one that is not JSON is an error naming where it breaks."""
    try:
        answer: dict[str, Any] = json.loads(text)
    except ValueError as exc:
        at = getattr(exc, "pos", 0)
        raise ValueError(f"not JSON at {at}: {text[max(0, at - 60) : at + 20]!r}") from None
    return answer


class Door:
    """How a check goes on the wire and its reply is read: the bytes of a payment's check
    (built from parts prepared once, the transactionId put in), and a reply's end."""

    address: tuple[str, int]

    def greeting(self) -> bytes:
        """What a new connection sends before its first check (its reply read and dropped)."""
        return b""

    def request(self, payment: Payment, tx: str) -> bytes:
        raise NotImplementedError

    def reply(self, buffer: bytearray) -> tuple[int, bytes | None, str | None] | None:
        """The first whole reply in ``buffer``: (bytes it took, the answer's text or None,
        the error or None); None while it is not whole."""
        raise NotImplementedError

    def keeps_open(self) -> bool:
        return True


def _bulk(text: str) -> bytes:
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


class RedisDoor(Door):
    """``FCALL_RO velocity_check 1 <rules key> field value …`` as RESP, the reply a bulk
    string (the answer) or an error line."""

    def __init__(self, url: str, rules_key: str) -> None:
        where = urlsplit(url)
        self.address = (where.hostname or "127.0.0.1", where.port or 6379)
        self.auth = [unquote(where.username or "default"), unquote(where.password or "")]
        self.rules_key = rules_key
        self.parts: dict[int, tuple[bytes, bytes]] = {}

    def greeting(self) -> bytes:
        if not self.auth[1]:
            return b""
        return b"*3\r\n" + _bulk("AUTH") + _bulk(self.auth[0]) + _bulk(self.auth[1])

    def request(self, payment: Payment, tx: str) -> bytes:
        parts = self.parts.get(id(payment))
        if parts is None:
            from velocity.redis.check import CHECK_FUNCTION

            words = [CHECK_FUNCTION, "1", self.rules_key, *payment.arguments]
            at = 3 + payment.tx_at
            head = b"*%d\r\n" % (len(words) + 1) + _bulk("FCALL_RO")
            head += b"".join(map(_bulk, words[:at]))
            parts = self.parts[id(payment)] = (head, b"".join(map(_bulk, words[at + 1 :])))
        return parts[0] + _bulk(tx) + parts[1]

    def reply(self, buffer: bytearray) -> tuple[int, bytes | None, str | None] | None:
        line_end = buffer.find(b"\r\n")
        if line_end < 0:
            return None
        kind = buffer[:1]
        if kind == b"$":
            size = int(buffer[1:line_end])
            end = line_end + 2 + size + 2
            if len(buffer) < end:
                return None
            return end, bytes(buffer[line_end + 2 : end - 2]), None
        if kind == b"+":  # the greeting's OK
            return line_end + 2, None, None
        return line_end + 2, None, "ResponseError: " + buffer[1:line_end].decode(errors="replace")


class HttpDoor(Door):
    """``POST /check`` with the bearer token, HTTP/1.1 kept alive; the reply's body by its
    Content-Length (uvicorn's JSON answers have one)."""

    def __init__(self, url: str, token: str) -> None:
        where = urlsplit(url)
        self.address = (where.hostname or "127.0.0.1", where.port or 80)
        self.head = (
            f"POST /check HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {token}"
            "\r\nContent-Type: application/json\r\nContent-Length: "
        ).encode()
        self.parts: dict[int, tuple[bytes, bytes]] = {}
        self.closing = False

    def request(self, payment: Payment, tx: str) -> bytes:
        parts = self.parts.get(id(payment))
        if parts is None:
            marker = "\u0000tx\u0000"
            body = json.dumps({**payment.body, "transactionId": marker}).encode()
            before, after = body.split(json.dumps(marker).encode())
            parts = self.parts[id(payment)] = (before, after)
        body = parts[0] + json.dumps(tx).encode() + parts[1]
        return self.head + b"%d\r\n\r\n" % len(body) + body

    def reply(self, buffer: bytearray) -> tuple[int, bytes | None, str | None] | None:
        head_end = buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        lines = bytes(buffer[:head_end]).decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
        }
        if "content-length" not in headers:
            raise RuntimeError(f"an answer without Content-Length: {lines[0]}")
        end = head_end + 4 + int(headers["content-length"])
        if len(buffer) < end:
            return None
        self.closing = headers.get("connection", "").lower() == "close"
        body = bytes(buffer[head_end + 4 : end])
        status = lines[0].split(" ", 2)
        if len(status) < 2 or status[1] != "200":
            self.closing = True  # the server may close after it: a fresh connection
            return end, None, f"HTTP {' '.join(status[1:])}: {body[:160]!r}"
        return end, body, None

    def keeps_open(self) -> bool:
        closing, self.closing = self.closing, False
        return not closing


@dataclass
class Connection:
    """One pipeline-free connection: at most one check in flight."""

    sock: socket.socket
    used: float
    check: tuple[int, float, float] | None = None  # (schedule index, due, sent)
    buffer: bytearray = field(default_factory=bytearray)


def connect(door: Door, timeout: float) -> Connection:
    sock = socket.create_connection(door.address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    greeting = door.greeting()
    if greeting:  # answered before any check: read it whole here
        sock.sendall(greeting)
        buffer = bytearray()
        while (whole := door.reply(buffer)) is None:
            buffer += sock.recv(65536)
        if whole[2]:
            raise RuntimeError(f"the connection was refused: {whole[2]}")
    return Connection(sock, time.monotonic())


def send_checks(
    results: Results,
    door: Door,
    pool: list[Connection],
    schedule: list[tuple[float, float]],  # (due, window's end), monotonic, this process's
    payments: list[list[Payment]],
    seconds_per_file: float,
    start: float,
    timeout: float,
    seed: int,
) -> None:
    """Sends each check at its due time on an idle connection (one thread, one select
    loop: a check due while every connection is busy waits for the first to answer, late
    by that much), and reads the answers as they come."""
    rng = random.Random(seed)
    waiting: deque[int] = deque()  # due, not yet sent
    upcoming, name = 0, f"check-{os.getpid()}"

    def drop(conn: Connection, reason: str) -> None:
        if conn.check is not None:
            results.failed(reason)
            conn.check = None
        conn.sock.close()
        conn.sock = connect(door, timeout).sock
        conn.buffer.clear()

    while upcoming < len(schedule) or waiting or any(c.check for c in pool):
        now = time.monotonic()
        while upcoming < len(schedule) and schedule[upcoming][0] <= now:
            waiting.append(upcoming)
            upcoming += 1
        while waiting and now > schedule[waiting[0]][1] + GRACE_SECONDS:
            waiting.popleft()
            results.failed("unsent (every connection was busy until its window was over)")
        for conn in pool:
            if not waiting:
                break
            if conn.check is not None:
                continue
            j = waiting.popleft()
            due = schedule[j][0]
            group = payments[min(len(payments) - 1, int((due - start) / seconds_per_file))]
            payment = group[rng.randrange(len(group))]
            if now - conn.used > IDLE_SECONDS:  # a server closes an idle connection
                conn.sock.close()
                conn.sock = connect(door, timeout).sock
            try:
                conn.sock.sendall(door.request(payment, f"{name}-{j}"))
            except OSError as exc:
                conn.check = (j, due, now)
                drop(conn, f"{type(exc).__name__}: {exc}")
                continue
            conn.check, conn.used = (j, due, time.monotonic()), now
        busy = [c for c in pool if c.check is not None]
        for conn in busy:
            if now - conn.check[2] > timeout:  # type: ignore[index]
                drop(conn, f"TimeoutError: no answer in {timeout} s")
        busy = [c for c in pool if c.check is not None]
        wake = [now + timeout]
        if upcoming < len(schedule):
            wake.append(schedule[upcoming][0])
        if waiting and len(busy) < len(pool):
            wake.append(now)
        readable, _, _ = select.select([c.sock for c in busy], [], [], max(0.0, min(wake) - now))
        for sock in readable:
            conn = next(c for c in busy if c.sock is sock)
            try:
                data = sock.recv(65536)
            except OSError as exc:
                drop(conn, f"{type(exc).__name__}: {exc}")
                continue
            if not data:
                drop(conn, "ConnectionError: closed by the server")
                continue
            conn.buffer += data
            whole = door.reply(conn.buffer)
            if whole is None:
                continue
            taken, text, error = whole
            del conn.buffer[:taken]
            j, due, sent = conn.check  # type: ignore[misc]
            conn.check = None
            if error is not None:
                results.failed(error)
            elif text is not None:
                results.answered(due, sent, time.monotonic(), text)
            if not door.keeps_open():
                drop(conn, "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--redis", metavar="URL", help="FCALL_RO velocity_check on this Redis")
    where.add_argument("--http", metavar="URL", help="POST /check on this service")
    parser.add_argument("--rules-key", default="velocity:rules")
    parser.add_argument("--rate", type=float, required=True, help="checks a second, all processes")
    parser.add_argument(
        "--window", action="append", required=True, metavar="FROM:TO",
        help="seconds from the start during which checks are sent (repeatable)",
    )  # fmt: skip
    parser.add_argument("--files", type=Path, nargs="+", required=True)
    parser.add_argument("--seconds-per-file", type=float, default=1.0)
    parser.add_argument("--at-end", action="store_true")
    parser.add_argument(
        "--lanes", type=int, default=4, help="connections, one check in flight each"
    )
    parser.add_argument("--of", type=int, default=1)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--nice", type=int, default=-10,
        help="this generator's niceness: it stands for a service on a machine of its own, so "
        "it runs ahead of the stream's batch work (as `velocity up` runs Redis)",
    )  # fmt: skip
    parser.add_argument(
        "--realtime", type=int, default=10,
        help="its round-robin real-time priority (0: none), as VELOCITY_SERVING_REALTIME",
    )  # fmt: skip
    args = parser.parse_args()
    scheduling = run_ahead(0, args.nice, args.realtime)
    print(f"generator {args.index}: {scheduling}", file=sys.stderr, flush=True)

    payments = prepare(sorted(args.files), args.at_end)
    door: Door = (
        RedisDoor(args.redis, args.rules_key)
        if args.redis
        else HttpDoor(args.http, os.environ.get("VELOCITY_CHECK_TOKEN", ""))
    )
    pool = [connect(door, args.timeout) for _ in range(args.lanes)]
    # The prepared payments are ~200 000 objects: a full collection of them took ~100 ms,
    # every check in flight late by as much (the p99 it made was the generator's). Frozen,
    # and no collection while sending: the records kept are acyclic, freed by count.
    gc.collect()
    gc.freeze()
    gc.disable()
    print("ready", flush=True)
    start_epoch = float(sys.stdin.readline())
    start = time.monotonic() + (start_epoch - time.time())
    # The combined schedule: every window at the combined rate; this process takes every
    # of-th check.
    due_times: list[tuple[float, float]] = []
    for window in args.window:
        begin, end = (float(x) for x in window.split(":"))
        count = round((end - begin) * args.rate)
        due_times += [(start + begin + j / args.rate, start + end) for j in range(count)]
    results = Results()
    time.sleep(max(0.0, start - time.monotonic()))
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.monotonic()
    send_checks(
        results, door, pool, due_times[args.index :: args.of], payments,
        args.seconds_per_file, start, args.timeout, args.index,
    )  # fmt: skip
    wall = time.monotonic() - began
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    result = {
        "latencies_ms": [x if math.isfinite(x) else None for x in results.latencies_ms],
        "send_lag_ms": results.send_lag_ms,
        "errors": dict(results.errors),
        "decisions": dict(results.decisions),
        "fired": results.fired,
        "evaluated": results.evaluated,
        "state_seen": results.state_seen,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
    }
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
