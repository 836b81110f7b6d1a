"""Maintenance writes the case book's snapshot: every table's OPTIMIZE pass (`velocity
maintain optimize`, and so the maintain_state DAG) refreshes it once the tables are
compacted, and a fresh process's first look at the cases reads it. (The snapshot itself,
without Spark: tests/integration/test_case_snapshot.py.)"""

from __future__ import annotations

import json
import logging

import pytest
from deltalake import DeltaTable

from tests.integration.test_case_snapshot import WHOLE_FOLD, first_look, whole_fold, worked_cases
from velocity.delta.case_snapshot import CURRENT, snapshot_root
from velocity.delta.case_store import CaseStore
from velocity.spark.maintenance import optimize_tables

pytestmark = [pytest.mark.spark, pytest.mark.redis, pytest.mark.timeout(300)]


def test_optimize_refreshes_the_case_snapshot_that_a_first_look_reads(
    spark, data_settings, caplog: pytest.LogCaptureFixture
) -> None:
    store = CaseStore(data_settings)
    payer = worked_cases(store)
    optimize_tables(spark, data_settings)
    current = json.loads((snapshot_root(data_settings.data_dir) / CURRENT).read_text())
    assert current["version"] == DeltaTable(str(store.events_path)).version()
    assert current["cases"] == 4

    store.assign(payer["p3"], "bo", "lead")
    caplog.set_level(logging.INFO, "velocity.cases")
    caplog.clear()  # only what follows: an earlier look may have logged at INFO
    assert first_look(store) == whole_fold(store)
    assert WHOLE_FOLD not in caplog.text, caplog.text
