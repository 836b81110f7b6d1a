"""The rules table is one Delta table for both engines: Spark reads what the rule store
(delta-rs) writes, and the store appends to a table Spark created, as an older Velocity
did. (The store's own behaviour, without Spark: tests/integration/test_rule_store.py.)"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from pyspark.sql.types import StructField, StructType

from velocity.delta import tables
from velocity.delta.rule_store import RuleStore
from velocity.domain.decimals import dumps_json
from velocity.domain.rules import RuleState, StateChange, parse_rules
from velocity.resources import sample_rules_path

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

# As Spark makes a table it creates from a DataFrame: every column nullable.
NULLABLE_RULE_SCHEMA = StructType(
    [StructField(f.name, f.dataType, True) for f in tables.RULE_SCHEMA.fields]
)


def test_spark_reads_the_versions_the_store_writes(spark, data_settings) -> None:
    path = data_settings.table_path(tables.RULES)
    store = RuleStore(path)
    store.apply(parse_rules(sample_rules_path().read_text()), now_ms=1_000)
    store.apply([StateChange(4, RuleState.PAUSE)], now_ms=2_000)

    frame = tables.read_table(spark, path)
    assert frame.schema == NULLABLE_RULE_SCHEMA
    rows = {(r.ruleId, r.version): r for r in frame.collect()}
    assert sorted(rows) == [(r.rule_id, r.version) for r in store.history()]
    paused = rows[(4, 2)]
    assert (paused.ruleState, paused.applied_at) == ("PAUSE", 2_000)
    assert paused.signature_id == store.latest()[4].signature.signature_id
    # The stream looks for a rule change through Delta's log, each micro-batch.
    assert tables.table_version(spark, path) == DeltaTable(str(path)).version() == 2
    assert DeltaTable(str(path)).protocol().min_writer_version == 2


def test_the_store_appends_to_a_table_spark_created(spark, data_settings) -> None:
    path = data_settings.table_path(tables.RULES)
    tables.create_if_missing(spark, path, tables.RULE_SCHEMA)
    # Version 1 of the sample rules, written by Spark as the Spark rule store did.
    sample = parse_rules(sample_rules_path().read_text())
    rows = [
        (r.rule_id, 1, r.state.value, dumps_json(r.to_json()), r.signature.signature_id, 1_000)
        for r in sample
    ]
    spark.createDataFrame(rows, tables.RULE_SCHEMA).write.format("delta").mode("append").save(
        str(path)
    )

    store = RuleStore(path)
    assert [r.rule_id for r in store.in_force()] == list(range(1, 9))
    changes = store.apply([StateChange(4, RuleState.PAUSE), StateChange(5, RuleState.DELETE)])
    assert [(c.rule_id, c.version) for c in changes.changes] == [(4, 2), (5, 2)]

    frame = tables.read_table(spark, path)
    assert frame.schema == NULLABLE_RULE_SCHEMA
    assert frame.count() == 10
    states = {(r.ruleId, r.version): r.ruleState for r in frame.collect()}
    assert (states[(4, 2)], states[(5, 2)]) == ("PAUSE", "DELETE")
    assert tables.table_version(spark, path) == 2
