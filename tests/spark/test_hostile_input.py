"""Hostile input on the real stream: 10,000 lines of garbage and edge cases, empty files,
CRLF and BOMs, and a file deleted between listing and reading. Every line is accepted or
quarantined with a reason, the job never dies, and nothing else changes."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from tests.spark.streaming import run_available_now
from velocity.delta import tables
from velocity.delta.live import LiveTables
from velocity.domain.arrival import Arrivals, Verdict
from velocity.domain.rules import parse_rules
from velocity.domain.schema import Event, is_blank, parse_event_line
from velocity.resources import sample_rules_path
from velocity.settings import Settings
from velocity.spark.stream import StreamJob

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

T0 = 1_767_225_600_000


def valid(tx: str, **fields: object) -> dict[str, object]:
    event = {
        "transactionId": tx,
        "eventTime": T0 + random.randrange(3_600_000),
        "payerId": f"p-{random.randrange(50)}",
        "beneficiaryId": f"b-{random.randrange(20)}",
        "paymentAmount": "12.50",
        "paymentType": "CRD",
    }
    return {**event, **fields}


def hostile_line(rng: random.Random, n: int) -> bytes:
    """One line (no line break inside) of a hostile kind chosen by ``rng``."""
    kind = n % 14
    if kind == 0:  # random bytes, invalid UTF-8 included
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        return raw.replace(b"\n", b" ").replace(b"\r", b" ")
    if kind == 1:  # deeply nested JSON
        depth = rng.choice((100, 10_000, 100_000))
        return (b"[" * depth + b"]" * depth) if n % 2 else b'{"a":' * depth + b"1" + b"}" * depth
    if kind == 2:  # huge and negative numbers
        value = rng.choice(("1e400", "-5", "1" + "0" * 5000, "-0.0", "99999999999999999999"))
        field = rng.choice(("paymentAmount", "eventTime", "payerId"))
        return json.dumps(valid(f"num-{n}"))[:-1].encode() + f', "{field}": {value}}}'.encode()
    if kind == 3:  # NaN, Infinity and exponents
        value = rng.choice(("NaN", "Infinity", "-Infinity", "1e3", "1E-2", "2.5e+1", "1e-9"))
        return f'{json.dumps(valid(f"exp-{n}"))[:-1]}, "paymentAmount": {value}}}'.encode()
    if kind == 4:  # duplicate keys: the last one wins, as in every JSON reader
        head = json.dumps(valid(f"dupkey-{n}"))[:-1]
        return f'{head}, "transactionId": "dupkey-{n}-b", "paymentType": "CSH"}}'.encode()
    if kind == 5:  # a byte-order mark in front of an otherwise valid event
        return "\ufeff".encode() + json.dumps(valid(f"bom-{n}")).encode()
    if kind == 6:  # control characters and unpaired surrogates in strings
        return json.dumps(valid(f"ctl-{n}", payerId="p\u0000\u0007\ud800x")).encode()
    if kind == 7:  # wrong types everywhere
        field = rng.choice(("transactionId", "eventTime", "paymentAmount", "paymentType"))
        value = rng.choice(([1, 2], {"a": 1}, True, None, "", 1.5))
        return json.dumps(valid(f"type-{n}", **{field: value})).encode()
    if kind == 8:  # a redelivery of an earlier id with another payload
        return json.dumps(valid(f"ok-{n - 8 * rng.randrange(1, 5)}", paymentAmount="999")).encode()
    if kind == 9:  # truncated JSON
        text = json.dumps(valid(f"cut-{n}"))
        return text[: rng.randrange(1, len(text))].encode()
    if kind == 10:  # not an object
        return rng.choice((b"42", b'"text"', b"null", b"[]", b"true", b"{}"))
    if kind == 11:  # whitespace only: blank, skipped
        return rng.choice((b"", b"   ", b"\t", b"\x0b\x0c"))
    return json.dumps(valid(f"ok-{n}")).encode()  # fine events among them


def write_files(folder: Path, rng: random.Random) -> list[Path]:
    """10,000 hostile lines over 10 files (one with CRLF endings, one starting with a BOM),
    two 1 MB lines, two empty files; modification times in name order."""
    folder.mkdir()
    lines = [hostile_line(rng, n) for n in range(10_000)]
    lines[17] = json.dumps(valid("big-ok", note="x" * 1_000_000)).encode()  # 1 MB, valid
    lines[18] = b"z" * 1_000_000  # 1 MB of garbage
    files = []
    for index in range(10):
        chunk = lines[index * 1000 : (index + 1) * 1000]
        ending = b"\r\n" if index == 3 else b"\n"
        data = ending.join(chunk) + ending
        if index == 5:
            data = "\ufeff".encode() + data
        files.append((f"hostile-{index:02d}.jsonl", data))
    files.insert(4, ("hostile-03-empty.jsonl", b""))
    files.append(("hostile-99-empty.jsonl", b""))
    paths = []
    for order, (name, data) in enumerate(files):
        path = folder / name
        path.write_bytes(data)
        os.utime(path, (1_700_000_000 + order, 1_700_000_000 + order))
        paths.append(path)
    return paths


def spark_lines(path: Path) -> list[str]:
    """The lines of ``path`` as Spark's text source gives them (a byte-order mark at the
    file's start skipped, split at \\n, \\r\\n and \\r, decoded as UTF-8 with
    replacement), blank ones left out."""
    data = path.read_bytes()
    text = data.removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="replace")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line for line in lines if not is_blank(line)]


class StreamLosingAFile(StreamJob):
    """A stream whose first batch finds one of its listed files deleted before it reads."""

    def __init__(self, spark, settings: Settings, doomed: Path) -> None:
        super().__init__(spark, settings)
        self.doomed = doomed

    def process_batch(self, lines, batch_id: int) -> None:
        self.doomed.unlink(missing_ok=True)
        super().process_batch(lines, batch_id)


def test_every_hostile_line_is_accepted_or_quarantined_and_the_job_survives(
    spark, data_settings: Settings, tmp_path: Path
) -> None:
    rng = random.Random(12)
    random.seed(12)
    events = tmp_path / "events"
    paths = write_files(events, rng)
    doomed = events / "hostile-00-doomed.jsonl"  # listed, then gone before the read
    doomed.write_text(json.dumps(valid("doomed")) + "\n")
    os.utime(doomed, (1_699_999_999, 1_699_999_999))

    job = StreamLosingAFile(spark, data_settings, doomed)
    job.rule_store.apply(parse_rules(sample_rules_path().read_text()))
    run_available_now(job, events, files_per_batch=4)  # raises if the query failed
    job.close()

    # What the pure parser and arrival rules say about the same lines, in arrival order.
    arrivals = Arrivals((), None, data_settings.max_future_ms)
    expected: Counter[str] = Counter()
    accepted: set[str] = set()
    lines = [line for path in paths for line in spark_lines(path)]
    for line in lines:
        parsed = parse_event_line(line)
        if not isinstance(parsed, Event):
            expected["quarantine"] += 1
            continue
        verdict = arrivals.admit(parsed.transaction_id, parsed.event_time)
        if verdict is Verdict.ACCEPTED:
            accepted.add(parsed.transaction_id)
        expected[{"accepted": "events", "duplicate": "duplicates"}.get(verdict, "quarantine")] += 1

    live = LiveTables.of(data_settings)
    read = {name: tables.read_table(spark, getattr(live, name)) for name in expected}
    got = {name: frame.count() for name, frame in read.items()}
    assert got == dict(expected)
    assert sum(got.values()) == len(lines) > 9_000
    stored = {r["transactionId"] for r in read["events"].select("transactionId").collect()}
    assert stored == accepted and "big-ok" in stored and "doomed" not in stored
    reasons = read["quarantine"].where("reason_code IS NULL OR reason IS NULL OR reason = ''")
    assert reasons.count() == 0, "every quarantined line says why"
    quarantined = Counter(r["reason_code"] for r in read["quarantine"].collect())
    assert {"not_json", "not_object", "wrong_type", "missing_field"} <= set(quarantined)
