"""The JVM's share of parsing accepts only what the pure parser accepts, with the same
values, and the whole parse (JVM plus pure parser) judges every line as the pure parser
does: on hostile lines and on lines built to trip a JSON reader that is not Python's."""

from __future__ import annotations

import json
import random
from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from tests.spark.test_hostile_input import hostile_line, valid
from velocity.schema import Event, Rejection, is_blank, parse_event_line
from velocity.spark.ingest import parse_events, with_plain_events

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def _with(**fields: object) -> str:
    return json.dumps(valid("t-x", **fields))


# Lines a Jackson-based reader and Python's json judge differently unless handled.
TRICKY = [
    json.dumps(valid("plain-1")),
    json.dumps(valid("plain-2", paymentAmount=12.5)),
    json.dumps(valid("plain-3", paymentAmount="007.10")),
    json.dumps(valid("plain-4", payerId=12, beneficiaryId=-0, ip="", deviceId=None)),
    json.dumps(valid("plain-5", action="caf\u00e9"), ensure_ascii=False),
    _with(paymentAmount="0.30000000000000001"),
    _with(paymentAmount="1.500000000"),
    _with(paymentAmount="123456789012345678.12345678"),
    _with(paymentAmount="1000000000000000000"),
    _with(paymentAmount=" 12"),
    _with(paymentAmount="-0"),
    _with(payerId="\u00a0"),
    _with(payerId=" "),
    _with(ip="\u3000"),
    _with(ip=" x "),
    _with(payerId="true"),
    _with(transactionId=7),
    _with(eventTime="1767225600000"),
    _with(eventTime=2**62),
    _with(eventTime=-1),
    _with(paymentType="crd"),
    '{"transactionId":"a","eventTime":1767225600000,"payerId":1.50,"beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD"}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":1e5,"beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD"}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":123456789012345678.12345678,"paymentType":"CRD"}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":0.30000000000000001,"paymentType":"CRD"}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD"} trailing',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD"}{"x":1}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD","ip":true}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD","ip":{"a":1}}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentAmount":2,"paymentType":"CRD"}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD","paymentType":"CSH","payerId":"q"}',
    '{"TRANSACTIONID":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD"}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD","junk":abc}',
    "{'transactionId':'a','eventTime':1767225600000,'payerId':'p','beneficiaryId':'b',"
    "'paymentAmount':1,'paymentType':'CRD'}",
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD",}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p\\u0041","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD"}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":NaN,"paymentType":"CRD"}',
    '{"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD","ip":"fe80::1","deviceId":"a:true"}',
    '  {"transactionId":"a","eventTime":1767225600000,"payerId":"p","beneficiaryId":"b",'
    '"paymentAmount":1,"paymentType":"CRD"}\t',
]


def corpus() -> list[str]:
    rng = random.Random(5)
    hostile = [hostile_line(rng, n).decode("utf-8", errors="replace") for n in range(1400)]
    lines = [line for line in hostile + TRICKY if "\n" not in line and "\r" not in line]
    return [line for line in lines if len(line) < 100_000]


def expected_verdict(line: str) -> dict[str, object] | None:
    """What the pure parser makes of ``line``: the event's columns, a rejection, or None
    for a blank line."""
    if is_blank(line):
        return None
    parsed = parse_event_line(line)
    if isinstance(parsed, Rejection):
        return {"accepted": False, "reason_code": parsed.code.value, "reason": parsed.message}
    assert isinstance(parsed, Event)
    return {
        "accepted": True,
        **parsed.values,
        "eventTime": parsed.event_time,
        "paymentAmount": parsed.amount,
    }


def test_the_jvm_accepts_only_what_the_pure_parser_accepts(spark) -> None:
    lines = corpus()
    frame = spark.createDataFrame([(line,) for line in lines], "raw string")
    rows = with_plain_events(frame).select("raw", F.col("_plain").alias("plain")).collect()

    accepted_in_jvm = 0
    for row in rows:
        if row["plain"] is None:
            continue
        accepted_in_jvm += 1
        expected = expected_verdict(row["raw"])
        assert expected is not None and expected["accepted"], row["raw"]
        got = row["plain"].asDict()
        for name, value in expected.items():
            if name == "paymentAmount":
                assert Decimal(got[name]) == value, row["raw"]
            else:
                assert got[name] == value, (name, row["raw"])
    plain_ok = sum(1 for line in lines if line.startswith('{"transactionId": "ok-'))
    # The JVM takes the ordinary events itself, so the pure parser sees only the odd ones.
    assert accepted_in_jvm >= plain_ok + 5


def test_parse_events_judges_every_line_as_the_pure_parser(spark) -> None:
    lines = corpus()
    frame = spark.createDataFrame(
        [(line, "f", 0, n) for n, line in enumerate(lines)],
        "raw string, source_file string, source_block long, line_seq long",
    )
    parsed = {row["line_seq"]: row for row in parse_events(frame).collect()}

    for n, line in enumerate(lines):
        expected = expected_verdict(line)
        if expected is None:
            assert n not in parsed, "blank lines are skipped"
            continue
        got = parsed[n]
        for name, value in expected.items():
            if name == "paymentAmount":
                assert Decimal(got[name]) == value, line
            else:
                assert got[name] == value, (name, line)
