"""The JVM-side fan-out (``velocity.spark.fan_out``) makes the Python reference fan-out's
keyed rows (``velocity.engine.fan_out.keyed_rows``), and its hash shuffle decides the same
alerts as the string-keyed one, also when every key shares its hash with others."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tests.builders import make_rule
from velocity.delta.tables import EVENT_SCHEMA
from velocity.domain.rules import Rule, RuleSignature, rules_by_signature
from velocity.engine.fan_out import keyed_rows
from velocity.engine.kernel import KEYED_COLUMNS
from velocity.spark.evaluate import (
    ALERT_LINE_SCHEMA,
    KEYED_SCHEMA,
    hashed_alerts,
    key_partitioned,
    keyed_chunks,
    keyed_events,
    partition_alerts,
)
from velocity.spark.fan_out import (
    KEY_HASH,
    hash_partitioned,
    hashed_keyed_events,
    keyed_table,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

_EVENT_FIELDS = [f for f in EVENT_SCHEMA.fields if f.name not in ("raw", "source_file",
                 "source_block", "line_seq", "ingest_time")]  # fmt: skip
EVENTS_TYPE = StructType(_EVENT_FIELDS)
# Key and filter values a JSON text escapes, or that are not ASCII, beside plain ones.
ODD = ["p1", 'q"uote', "back\\slash", "ctl\x01\x1f", "new\nline", "é€😀", "\u2028", "", "[1]"]
AMOUNTS = ["0", "0.00000001", "100", "1.5", "99999999999.99999999", "2500.10000000"]


def _events(n: int) -> list[tuple[object, ...]]:
    rows = []
    for i in range(n):
        rows.append(
            (
                f"tx-{i}",
                1_767_225_600_000 + (i % 37) * 7_000,
                ODD[i % len(ODD)],
                ODD[(i // 3) % len(ODD)] if i % 5 else "b1",
                Decimal(AMOUNTS[i % len(AMOUNTS)]),
                "CRD" if i % 3 else "CSH",
                None if i % 4 == 0 else ODD[(i // 2) % len(ODD)],
                None if i % 7 == 0 else f"d{i % 3}",
                None if i % 2 else ODD[i % 4],
            )
        )
    return rows


def _rule(rule_id: int, **overrides: object) -> Rule:
    return make_rule(ruleId=rule_id, windowMinutes=10, **overrides)


RULES = [
    _rule(1, groupingKeyNames=["payerId"], aggregatorFunctionType="COUNT",
          limitOperatorType=">=", limit=2),
    _rule(2, groupingKeyNames=["payerId", "beneficiaryId"], aggregateFieldName="paymentAmount",
          aggregatorFunctionType="SUM", limitOperatorType=">", limit=50),
    _rule(3, groupingKeyNames=["action"], aggregateFieldName="ip",
          aggregatorFunctionType="UNIQUE_COUNT", limitOperatorType=">=", limit=2,
          filter={"paymentType": "CRD"}),
    _rule(4, groupingKeyNames=[], aggregateFieldName="paymentAmount",
          aggregatorFunctionType="MAX", limitOperatorType=">", limit=1),
    _rule(5, groupingKeyNames=["paymentAmount"], aggregatorFunctionType="COUNT",
          limitOperatorType=">", limit=1, filter={"paymentAmount": ["1.5", "100", "0"]}),
    _rule(6, groupingKeyNames=["deviceId", "ip"], aggregateFieldName="paymentAmount",
          aggregatorFunctionType="AVG", limitOperatorType=">", limit=10,
          filter={"action": ['q"uote', "ctl\x01\x1f", "p1"]}),
    _rule(7, groupingKeyNames=["beneficiaryId"], aggregateFieldName="paymentAmount",
          aggregatorFunctionType="UNIQUE_COUNT", limitOperatorType=">=", limit=2),
]  # fmt: skip


def _rows(table: pa.Table) -> Counter[tuple[object, ...]]:
    return Counter(zip(*(table.column(n).to_pylist() for n in KEYED_COLUMNS), strict=True))


def test_the_jvm_fan_out_makes_the_reference_rows(spark) -> None:  # type: ignore[no-untyped-def]
    rows = _events(300)
    signatures = list(rules_by_signature(RULES))
    events = pa.Table.from_pylist(
        [dict(zip(EVENTS_TYPE.names, r, strict=True)) for r in rows], to_arrow_schema(EVENTS_TYPE)
    )
    expected = keyed_rows(events, signatures, to_arrow_schema(KEYED_SCHEMA))
    frame = spark.createDataFrame(rows, EVENTS_TYPE)
    hashed = hashed_keyed_events(frame, signatures).toArrow()
    made = keyed_table(hashed, [s.signature_id for s in signatures])
    assert made.num_rows == expected.num_rows > 300
    assert _rows(made) == _rows(expected)
    # One (signature, key), one hash; the odd values' keys are among them.
    pairs = set(zip(made.column("signature_id").to_pylist(), made.column("key").to_pylist(),
                    made.column(KEY_HASH).to_pylist(), strict=True))  # fmt: skip
    assert len({(s, k) for s, k, _ in pairs}) == len(pairs)
    assert '["ctl\\u0001\\u001f"]' in {k for _, k, _ in pairs}


def test_colliding_hashes_decide_as_the_string_shuffle(spark) -> None:  # type: ignore[no-untyped-def]
    frame = spark.createDataFrame(_events(600), EVENTS_TYPE)
    by_signature = rules_by_signature(RULES)
    signatures: list[RuleSignature] = list(by_signature)
    decided_at = 1_800_000_000_000
    # Two bits of a key's hash: every hash is shared by many keys of its signature.
    hashed = hashed_keyed_events(frame, signatures, hash_mask=0b11)
    assert hashed.select(KEY_HASH).distinct().count() <= 4 * len(signatures)
    assert hashed.select("signature_index", "key").distinct().count() > 20
    mine = hashed_alerts(
        hash_partitioned(hashed, 3), signatures, RULES, 60_000, decided_at, ALERT_LINE_SCHEMA
    )
    ordered = key_partitioned(keyed_events(frame, by_signature), 3)
    theirs = partition_alerts(ordered, RULES, 60_000, decided_at, ALERT_LINE_SCHEMA)
    mine_lines = Counter(r.line for r in mine.collect())
    assert len(mine_lines) > 100
    assert mine_lines == Counter(r.line for r in theirs.collect())


def test_chunks_cut_only_where_the_hash_changes() -> None:
    ids = ["s0", "s1"]
    hashes = [1, 1, 1, 2, 2, 5, 5, 5, 5, 9]
    keys = ['["a"]', '["b"]', '["a"]', '["c"]', '["d"]', '["e"]', '["e"]', '["f"]', '["e"]',
            '["x\\u001F"]']  # fmt: skip
    table = pa.table(
        {
            "signature_index": pa.array([0, 1, 0, 0, 0, 1, 1, 1, 1, 0], pa.int32()),
            KEY_HASH: pa.array(hashes, pa.int64()),
            "key": keys,
            "eventTime": pa.array(range(10), pa.int64()),
            "transactionId": [f"t{i}" for i in range(10)],
            "value": pa.nulls(10, pa.string()),
            "number": pa.nulls(10, pa.decimal128(26, 8)),
        }
    )
    chunks = list(keyed_chunks(iter(table.to_batches(max_chunksize=2)), ids, 2))
    assert [c.column(KEY_HASH).to_pylist() for c in chunks] == [
        [1, 1, 1], [2, 2], [5, 5, 5, 5], [9]
    ]  # fmt: skip
    assert chunks[0].column("signature_id").to_pylist() == ["s0", "s1", "s0"]
    assert chunks[-1].column("key").to_pylist() == ['["x\\u001f"]']
