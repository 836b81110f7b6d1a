"""A shadow candidate's figures read from real Delta tables (delta-rs, no JVM): the rules
table (the rule store), the alerts table (first written without the shadow column, as an
older Velocity left it, then with it) and the alert_reviews table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import alert_row, append_alerts, make_rule
from velocity.analyst.reviews import DAY_MS
from velocity.delta import reader
from velocity.delta.names import ALERTS, RULES
from velocity.delta.rule_store import RuleStore
from velocity.domain.rules import RuleState
from velocity.settings import load_settings

pytestmark = pytest.mark.timeout(120)

NOW = 1_767_225_600_000
APPLIED = NOW - 3_600_000  # the candidate: an hour ago


def test_a_candidate_beside_its_rule_in_force_from_the_tables(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path / "data")
    store = RuleStore(settings.table_path(RULES))
    assert reader.shadow_comparisons(settings, NOW) == [], "no rules table yet"
    store.apply([make_rule(ruleId=4), make_rule(ruleId=5)], now_ms=NOW - 2 * DAY_MS)
    candidate = make_rule(ruleId=4, limit=3).with_state(RuleState.SHADOW)
    store.apply([candidate], now_ms=APPLIED)
    assert store.applied_times() == {
        (4, 1): NOW - 2 * DAY_MS,
        (5, 1): NOW - 2 * DAY_MS,
        (4, 2): APPLIED,
    }
    assert reader.shadow_comparisons(settings, NOW)[0].candidate_figures.alerts == 0
    alerts = settings.table_path(ALERTS)
    append_alerts(  # an older Velocity's table: no shadow column
        alerts,
        [
            alert_row("a1", (4, 1), APPLIED - 1, transaction_id="tx-0"),  # before the candidate
            alert_row("a2", (4, 1), APPLIED + 10, transaction_id="tx-1"),
            alert_row("a3", (4, 1), APPLIED + 20, transaction_id="tx-2"),
            alert_row("a4", (5, 1), APPLIED + 20, transaction_id="tx-1"),  # another rule
        ],
    )
    append_alerts(
        alerts,
        [
            alert_row("s1", (4, 2), APPLIED + 10, transaction_id="tx-1", shadow=True),
            alert_row("s3", (4, 2), APPLIED + 30, transaction_id="tx-3", shadow=True),
            alert_row("a5", (4, 1), APPLIED + 40, transaction_id="tx-4", shadow=False),
        ],
    )
    store_of_reviews = reader.review_store(settings)
    for alert_id, verdict in [("a2", "CONFIRMED_FRAUD"), ("s3", "FALSE_POSITIVE")]:
        alert = reader.alert_ref(settings, alert_id)
        store_of_reviews.record(alert_id, alert, verdict, "", "ana")

    [got] = reader.shadow_comparisons(settings, NOW)
    assert (got.candidate.version, got.in_force.version if got.in_force else None) == (2, 1)
    assert got.since == APPLIED
    assert got.to_json() == {
        "ruleId": 4,
        "candidateVersion": 2,
        "inForceVersion": 1,
        "inForceState": "ACTIVE",
        "since": APPLIED,
        "candidate": {
            "alerts": 2,
            "reviewed": 2,
            "confirmed": 1,
            "falsePositives": 1,
            "needsReview": 0,
            "precision": 0.5,
        },
        "inForce": {
            "alerts": 3,
            "reviewed": 1,
            "confirmed": 1,
            "falsePositives": 0,
            "needsReview": 0,
            "precision": 1.0,
        },
        "both": 1,
        "onlyCandidate": 1,
        "onlyInForce": 2,
    }
    # Rows of the rules read already and no reviews: the same comparison, without verdicts.
    [again] = reader.shadow_comparisons(settings, NOW, store.history(), [])
    assert again.both == 1 and again.candidate_figures.reviewed == 0
    store.discard(4, now_ms=NOW)
    assert reader.shadow_comparisons(settings, NOW) == []
