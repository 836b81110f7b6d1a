"""The reviews table under maintenance: Spark's OPTIMIZE folds the one-file-a-review
table the review store (delta-rs) writes, the store reads it as before and appends on
top. (The store itself, without Spark: tests/integration/test_review_store.py.)"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from tests.builders import alert_row, append_alerts
from velocity.delta import reader, tables
from velocity.spark.maintenance import optimize_tables

pytestmark = [pytest.mark.spark, pytest.mark.redis, pytest.mark.timeout(300)]

NOW = 1_767_225_600_000


def test_optimize_folds_the_reviews_and_the_store_reads_and_appends_after_it(
    spark, data_settings
) -> None:
    append_alerts(
        data_settings.table_path(tables.ALERTS),
        [alert_row(f"a{n}", (1, 1), NOW - n) for n in range(6)],
    )
    store = reader.review_store(data_settings)
    for n in range(6):
        alert = reader.alert_ref(data_settings, f"a{n}")
        store.record(f"a{n}", alert, "FALSE_POSITIVE" if n % 2 else "CONFIRMED_FRAUD", "", "ana")
    before = store.all()
    assert len(DeltaTable(str(store.path)).file_uris()) == 6, "one file a review"

    figures = optimize_tables(spark, data_settings, ["alert_reviews"])["alert_reviews"]
    assert (figures.files_before, figures.files_after) == (6, 1)
    assert store.all() == before
    alert = reader.alert_ref(data_settings, "a0")
    store.record("a0", alert, "FALSE_POSITIVE", "second look", "bo")
    assert store.latest()["a0"].who == "bo"
    assert len(store.all()) == 7
    assert tables.read_table(spark, store.path).count() == 7, "Spark reads it too"
