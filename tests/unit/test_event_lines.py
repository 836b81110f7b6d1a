"""The columnar line parser (``velocity.engine.event_lines``) gives exactly the verdicts of
``parse_event_line``, line by line, and answers the common lines without it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import EDGE_FIELD_VALUES, event_line, event_objs, json_text
from velocity.domain.schema import EVENT_FIELDS
from velocity.engine import event_lines
from velocity.engine.event_lines import line_verdicts
from velocity.spark.ingest import VERDICT_ARROW

DECLARED = [f.name for f in EVENT_FIELDS]


def reference(lines: list[str | None], judge_blank: bool = False) -> list[dict[str, Any]]:
    """``parse_event_line`` on each line, as the parser's rows."""
    raws = pa.array(lines, pa.string())
    return event_lines._line_by_line(raws, VERDICT_ARROW, judge_blank).to_pylist()


@contextmanager
def line_parser_calls() -> Iterator[list[str]]:
    """The lines that reach ``parse_event_line`` meanwhile."""
    calls: list[str] = []
    real = event_lines.parse_event_line

    def counting(line: str) -> object:
        calls.append(line)
        return real(line)

    event_lines.parse_event_line = counting  # type: ignore[assignment]
    try:
        yield calls
    finally:
        event_lines.parse_event_line = real


@st.composite
def spelled_lines(draw: st.DrawFn) -> str | None:
    """A line as producers and mistakes write it: a valid event in the schema's order or
    another, with spaces, escapes, other fields, edge values, a key twice, cut short."""
    obj = draw(event_objs())
    changes = draw(st.dictionaries(st.sampled_from(DECLARED), EDGE_FIELD_VALUES, max_size=2))
    obj = {**obj, **changes}
    if draw(st.booleans()):
        items = list(obj.items())
        obj = dict(draw(st.permutations(items)))
    style = draw(st.sampled_from(["compact", "dumps", "spaced", "ascii"]))
    if style == "compact" or any(isinstance(v, Decimal) for v in obj.values()):
        line = json_text(obj)
    else:
        line = json.dumps(
            obj,
            ensure_ascii=style == "ascii",
            separators=(", ", ": ") if style == "spaced" else (",", ":"),
        )
    edit = draw(st.sampled_from(["none"] * 6 + ["twice", "cut", "tab", "bool", "none-line"]))
    if edit == "twice":
        name = draw(st.sampled_from(DECLARED))
        line = line[:-1] + f',"{name}":{json_text(draw(EDGE_FIELD_VALUES))}}}'
    elif edit == "cut":
        line = line[: draw(st.integers(0, len(line) - 1))]
    elif edit == "tab":
        line = " \t" + line.replace(",", "\t,", 1) + " "
    elif edit == "bool":
        line = line[:-1] + ',"flag":true}'
    elif edit == "none-line":
        return draw(st.sampled_from([None, "", "   ", "[]", "null", "{}"]))
    # A line read from a file or a message is UTF-8: a raw lone surrogate cannot be in it
    # (escaped, "\\ud800", it can).
    return line.encode("utf-8", "replace").decode("utf-8")


@settings(max_examples=300, deadline=None)
@given(st.lists(spelled_lines(), max_size=40), st.sampled_from([1, 2, 3, 4096]), st.booleans())
def test_verdicts_equal_the_line_parsers_on_any_lines(
    lines: list[str | None], block: int, judge_blank: bool
) -> None:
    original = event_lines.BLOCK_LINES
    event_lines.BLOCK_LINES = block  # small blocks: refused lines are halved down to one
    try:
        verdicts = line_verdicts(pa.array(lines, pa.string()), VERDICT_ARROW, judge_blank)
    finally:
        event_lines.BLOCK_LINES = original
    assert verdicts.type == pa.struct(list(VERDICT_ARROW))
    assert verdicts.to_pylist() == reference(lines, judge_blank)


def test_lines_in_the_schemas_order_and_plain_lines_never_reach_the_line_parser() -> None:
    in_order = [
        event_line(transactionId=f"t-{i}", payerId=i, paymentAmount="1.50") for i in range(50)
    ]
    reordered = [
        json.dumps({"paymentType": "CRD", **json.loads(line)}, separators=(", ", ": "))
        for line in in_order
    ]
    with line_parser_calls() as calls:
        verdicts = line_verdicts(pa.array(in_order + reordered), VERDICT_ARROW).to_pylist()
    assert calls == []
    assert verdicts == reference(in_order + reordered)
    assert all(v["accepted"] for v in verdicts)
    assert verdicts[3]["payerId"] == "3" and verdicts[3]["paymentAmount"] == Decimal("1.5")


def test_a_refused_line_takes_the_line_parser_alone() -> None:
    """A declared key given twice: Arrow refuses its block, which is halved down to the
    line; Python's ``json`` takes the last value, and so does the verdict."""
    lines = [event_line(transactionId=f"t-{i}") for i in range(9)]
    lines[5] = lines[5][:-1] + ', "payerId": "second"}'
    with line_parser_calls() as calls:
        verdicts = line_verdicts(pa.array(lines), VERDICT_ARROW).to_pylist()
    assert calls == [lines[5]]
    assert verdicts[5]["payerId"] == "second" and verdicts == reference(lines)


@pytest.mark.parametrize(
    "line",
    [
        '{"transactionId":"a","eventTime":-0,"payerId":1,"beneficiaryId":2,'
        '"paymentAmount":1,"paymentType":"CRD"}',
        '{"transactionId":-0,"eventTime":5,"payerId":1,"beneficiaryId":2,'
        '"paymentAmount":1,"paymentType":"CRD"}',
        '{"transactionId":"a","eventTime":5,"payerId":1.0,"beneficiaryId":2,'
        '"paymentAmount":1e2,"paymentType":"CRD"}',
        '{"transactionId":"a","eventTime":4611686018427387904,"payerId":1,"beneficiaryId":2,'
        '"paymentAmount":1,"paymentType":"CRD"}',
        '{"transactionId":"a:1,","eventTime":5,"payerId":"x:2}","beneficiaryId":2,'
        '"paymentAmount":"0.00000001","paymentType":"CSH","ip":" "}',
        *(
            '{"transactionId":"a","eventTime":5,"payerId":1,"beneficiaryId":2,'
            f'"paymentAmount":{amount},"paymentType":"CRD"}}'
            for amount in ['"0.123456789"', "1.000000000", "1" * 19, '"-1"', "1.", '"1."', "01"]
        ),
    ],
)
def test_edge_spellings_agree_with_the_line_parser(line: str) -> None:
    assert line_verdicts(pa.array([line]), VERDICT_ARROW).to_pylist() == reference([line])


def test_a_blank_message_is_quarantined_and_a_blank_line_skipped() -> None:
    lines = pa.array(["", "  ", event_line()])
    as_file = line_verdicts(lines, VERDICT_ARROW).to_pylist()
    as_messages = line_verdicts(lines, VERDICT_ARROW, judge_blank=True).to_pylist()
    assert [v["blank"] for v in as_file] == [True, True, False]
    assert [v["reason_code"] for v in as_messages] == ["not_json", "not_json", None]


def test_bytes_that_are_not_utf8_are_judged_as_text() -> None:
    lines = pa.array([b"\xff\xfe{", event_line().encode()], pa.binary())
    raws = lines.cast(pa.string(), safe=False)
    verdicts = line_verdicts(raws, VERDICT_ARROW).to_pylist()
    assert verdicts[0]["reason_code"] == "not_json" and verdicts[1]["accepted"]
