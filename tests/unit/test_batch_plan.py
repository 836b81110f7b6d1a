"""What a key-partition records and what a replayed batch is cut by, read back unchanged."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import rule_sets
from velocity.domain.rules import Rule, parse_rules
from velocity.resources import sample_rules_path
from velocity.spark.stream_decide import (
    OUTCOME_COMPRESSION,
    RecordedPlan,
    _from_ipc,
    _to_ipc,
    packed,
    unpacked,
)


def test_a_recorded_plan_reads_back_with_its_rules_versions_and_exact_limits() -> None:
    rules = tuple(
        r.with_version(i + 2)
        for i, r in enumerate(parse_rules(sample_rules_path().read_text()))
        if isinstance(r, Rule)
    )
    plan = RecordedPlan(3, 1_767_225_600_123, rules)
    assert RecordedPlan.parse(plan.text(17)) == plan
    assert '"batch":"17"' in plan.text(17)  # text: velocity_batch_plan compares it as such


@given(rules=rule_sets(max_size=6), partitions=st.integers(1, 64))
def test_any_rule_set_reads_back(rules: list[Rule], partitions: int) -> None:
    plan = RecordedPlan(partitions, 0, tuple(rules))
    assert RecordedPlan.parse(plan.text(0)) == plan


@given(st.lists(st.binary(max_size=40), max_size=5))
def test_a_partitions_outcome_unpacks_to_its_parts(blobs: list[bytes]) -> None:
    assert unpacked(packed(blobs)) == blobs


def test_an_outcome_is_compressed_and_one_recorded_uncompressed_still_reads() -> None:
    alerts = pa.table(
        {
            "json": [
                f'{{"ruleId":{i % 8},"transactionId":"tx-{i}","limit":"3"}}' for i in range(3000)
            ],
            "eventTime": pa.array(range(3000), pa.int64()),
        }
    )
    now = [_from_ipc(b) for b in unpacked(packed([_to_ipc(alerts, OUTCOME_COMPRESSION)]))]
    before = [_from_ipc(b) for b in unpacked(packed([_to_ipc(alerts)]))]
    assert now == before == [alerts]
    assert len(packed([_to_ipc(alerts, OUTCOME_COMPRESSION)])) * 3 < len(packed([_to_ipc(alerts)]))
