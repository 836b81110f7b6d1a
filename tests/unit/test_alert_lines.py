"""An alert's JSON line made by Arrow (``alert_lines``) is ``record_of_stored`` as JSON.

Arbitrary text where an event supplies it (transactionIds, a key's names and values, a
suppressor): quotes, backslashes, control characters and non-ASCII; shadow and
suppressed flags set, unset and null; outcomes set and null (an older row's: ALERT);
tables in several chunks and sliced.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from velocity.domain.alerts import record_of_stored
from velocity.engine.records import alert_lines
from velocity.spark.evaluate import _ALERT_ARROW as ALERT_ARROW  # tables.ALERT_SCHEMA's

event_text = st.text(max_size=12)
flag = st.sampled_from([True, False, None])


@st.composite
def alert_row(draw: st.DrawFn) -> dict[str, Any]:
    event_time = draw(st.integers(0, 2**62))
    names = draw(st.lists(event_text, max_size=3, unique=True))
    return {
        "alertId": "cd87f7df-cc03-576f-b5a7-ef2962a8d320",
        "kind": draw(st.sampled_from(["ALERT", "CORRECTION", "RETRACTION"])),
        "ruleId": draw(st.integers(1, 2**62)),
        "ruleVersion": draw(st.integers(1, 2**31 - 1)),
        "transactionId": draw(event_text),
        "key": [(name, draw(event_text)) for name in names],
        "eventTime": event_time,
        "aggregatorFunctionType": draw(st.sampled_from(["SUM", "COUNT", "AVG", "MAX"])),
        "aggregateValue": draw(st.sampled_from(["0", "3", "-12.5", "1000000000.001"])),
        "limitOperatorType": draw(st.sampled_from([">", ">=", "<", "<=", "==", "!="])),
        "limit": draw(st.sampled_from(["3", "250000.00"])),
        "windowStart": event_time - draw(st.integers(0, 10**10)),
        "windowEnd": event_time,
        "decisionTime": draw(st.integers(0, 2**62)),
        "signature_id": "sig",
        "shadow": draw(flag),
        "suppressed": draw(flag),
        "suppressedBy": draw(st.none() | event_text),
        "caseId": None,
        # null: a row of a Velocity before outcome existed (read as ALERT)
        "outcome": draw(st.sampled_from(["ALERT", "REVIEW", "BLOCK", None])),
    }


def expected_line(row: dict[str, Any]) -> str:
    return json.dumps(record_of_stored(row), separators=(",", ":"), ensure_ascii=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(alert_row(), min_size=1, max_size=30), st.integers(1, 4), st.data())
def test_each_line_is_the_stored_record_as_compact_json(
    rows: list[dict[str, Any]], chunks: int, data: st.DataObject
) -> None:
    # In several chunks, and sliced: as the executors' batches arrive.
    size = -(-len(rows) // chunks)
    table = pa.Table.from_batches(
        [
            pa.RecordBatch.from_pylist(rows[at : at + size], ALERT_ARROW)
            for at in range(0, len(rows), size)
        ]
    )
    start = data.draw(st.integers(0, len(rows) - 1))
    table = table.slice(start)
    lines = alert_lines(table).to_pylist()
    assert lines == [expected_line(row) for row in rows[start:]]
    assert [json.loads(line) for line in lines] == [record_of_stored(r) for r in rows[start:]]


def test_text_that_json_must_escape_is_escaped() -> None:
    row = {
        **dict.fromkeys(ALERT_ARROW.names, "x"),
        **dict.fromkeys(["ruleId", "ruleVersion", "eventTime", "windowStart"], 1),
        **dict.fromkeys(["windowEnd", "decisionTime"], 1),
        "transactionId": 'tx "1"\\\n\t\x00\x1f',
        "key": [('pay"er', "a\\b"), ("ü", "€\u2028")],
        "shadow": True,
        "suppressed": True,
        "suppressedBy": "tx\r0",
    }
    (line,) = alert_lines(pa.Table.from_pylist([row], ALERT_ARROW)).to_pylist()
    assert "\n" not in line and "\x00" not in line
    assert json.loads(line)["transactionId"] == 'tx "1"\\\n\t\x00\x1f'
    assert json.loads(line)["key"] == {'pay"er': "a\\b", "ü": "€\u2028"}
    assert json.loads(line)["suppressedBy"] == "tx\r0"
    assert line == expected_line(row)


def test_no_rows_no_lines() -> None:
    assert alert_lines(ALERT_ARROW.empty_table()).to_pylist() == []


def test_alerts_without_the_outcome_column_say_alert() -> None:
    row = {**dict.fromkeys(ALERT_ARROW.names, "x"), "key": [], "shadow": None}
    row.update(dict.fromkeys(["ruleId", "ruleVersion", "eventTime", "windowStart"], 1))
    row.update(dict.fromkeys(["windowEnd", "decisionTime"], 1), suppressed=None)
    older = pa.Table.from_pylist([row], ALERT_ARROW).drop_columns(["outcome"])
    (line,) = alert_lines(older).to_pylist()
    assert json.loads(line)["outcome"] == "ALERT"
    assert line == expected_line({k: v for k, v in row.items() if k != "outcome"})
