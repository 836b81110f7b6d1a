"""The columnar cooldown (``velocity.engine.cooldown.notify``) equals its definition, one
alert at a time (``velocity.domain.cooldown_reference.notified_reference``): random alert
sequences with ties in eventTime, cooldowns of 1 minute to a day, several rules and versions
sharing a key, keys that alert in every batch, the state carried from batch to batch as the
stream carries it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import BASE_TIME, make_rule
from velocity.domain.cooldown_reference import CooledAlert, notified_reference
from velocity.domain.rules import Rule, key_text, parse_rules
from velocity.engine.cooldown import LAST_NOTIFIED, notify
from velocity.engine.kernel import Decisions
from velocity.errors import InvalidRuleError

pytestmark = pytest.mark.timeout(120)

MINUTE = 60_000


def _rules(cooldowns: list[int]) -> list[Rule]:
    """Rules 1..n, two of them versions of one ruleId (their cooldowns apart)."""
    rules = []
    for index, minutes in enumerate(cooldowns):
        rule = make_rule(ruleId=1 + index // 2, cooldownMinutes=minutes)
        rules.append(rule.with_version(1 + index % 2))
    return rules


def _batch(alerts: list[tuple[int, str, int, str]], rules: list[Rule]):
    """(rule index, key, eventTime, transactionId) alerts as the kernel's events and
    decisions (one event row per alert; rows in a shuffled order)."""
    events = pa.table(
        {
            "signature_id": [rules[r].signature.signature_id for r, _, _, _ in alerts],
            "key": [key_text([k]) for _, k, _, _ in alerts],
            "eventTime": pa.array([t for _, _, t, _ in alerts], pa.int64()),
            "transactionId": [tx for _, _, _, tx in alerts],
        }
    )
    n = len(alerts)
    decisions = Decisions(
        np.arange(n, dtype=np.int64),
        np.array([r for r, _, _, _ in alerts], dtype=np.int64),
        np.array(["1"] * n, dtype=str),
        np.zeros(n, dtype=np.int64),
    )
    return events, decisions


def _group(rules: list[Rule], r: int, key: str) -> tuple[int, int, str]:
    return (rules[r].rule_id, rules[r].version, key_text([key]))


alert_lists = st.lists(
    st.tuples(
        st.integers(0, 3),  # rule index
        st.sampled_from(["p1", "p2", "p3"]),  # key
        st.integers(0, 2 * 24 * 60).map(lambda m: BASE_TIME + m * MINUTE // 4),  # ties
    ),
    min_size=1,
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(
    alert_lists,
    st.lists(st.sampled_from([0, 1, 2, 5, 10, 60, 1440]), min_size=4, max_size=4),
    st.integers(1, 6),
    st.randoms(use_true_random=False),
)
def test_notify_equals_the_reference_across_batches(raw, cooldowns, batches, rnd):
    rules = _rules(cooldowns)
    # Unique transactionIds per (rule, key): the same event never alerts twice for a rule.
    alerts = sorted(
        {(r, k, t, f"tx-{i:04d}") for i, (r, k, t) in enumerate(raw)}, key=lambda a: (a[2], a[3])
    )
    cooldown_ms = {_group(rules, r, k): rules[r].cooldown_ms for r, k, _, _ in alerts}
    expected, _ = notified_reference(
        [CooledAlert(_group(rules, r, k), t, tx) for r, k, t, tx in alerts], cooldown_ms
    )
    # In (eventTime, transactionId) order, cut into batches; each batch's rows shuffled.
    cuts = sorted(rnd.sample(range(1, len(alerts)), min(batches - 1, len(alerts) - 1)))
    state = LAST_NOTIFIED.empty_table()
    got: dict[CooledAlert, str | None] = {}
    for part in np.split(np.array(alerts, dtype=object), cuts):
        batch = [tuple(a) for a in part]
        rnd.shuffle(batch)
        events, decisions = _batch(batch, rules)
        notified = notify(decisions, events, rules, state)
        for (r, k, t, tx), by in zip(batch, notified.suppressed_by.to_pylist(), strict=True):
            got[CooledAlert(_group(rules, r, k), t, tx)] = by
        assert notified.suppressed.tolist() == [
            by is not None for by in notified.suppressed_by.to_pylist()
        ]
        state = _carried(state, notified.last)
    assert got == expected


def _carried(state: pa.Table, newer: pa.Table) -> pa.Table:
    """The stream's commit: a key's newest last notified replaces the one before."""
    keys = ["signature_id", "key", "ruleId", "ruleVersion"]
    rows = {tuple(r[k] for k in keys): r for r in state.to_pylist()}
    rows.update({tuple(r[k] for k in keys): r for r in newer.to_pylist()})
    return pa.Table.from_pylist(list(rows.values()), schema=LAST_NOTIFIED)


def test_a_key_that_alerts_every_minute_for_a_day_notifies_once_a_cooldown():
    rules = _rules([10])
    alerts = [(0, "p1", BASE_TIME + m * MINUTE, f"tx-{m:05d}") for m in range(24 * 60)]
    events, decisions = _batch(alerts, rules)
    notified = notify(decisions, events, rules)
    by = notified.suppressed_by.to_pylist()
    assert [i for i, b in enumerate(by) if b is None] == list(range(0, 24 * 60, 10))
    assert by[15] == "tx-00010"
    assert notified.last.to_pylist()[0]["transactionId"] == "tx-01430"


def test_a_suppressed_alert_after_the_state_names_the_notified_alert_before_the_batch():
    rules = _rules([60])
    group = rules[0].signature.signature_id, key_text(["p1"])
    state = pa.Table.from_pylist(
        [dict(zip(LAST_NOTIFIED.names, [*group, 1, 1, BASE_TIME, "tx-old"], strict=True))],
        schema=LAST_NOTIFIED,
    )
    alerts = [
        (0, "p1", BASE_TIME + 59 * MINUTE, "tx-a"),
        (0, "p1", BASE_TIME + 60 * MINUTE, "tx-b"),
    ]
    events, decisions = _batch(alerts, rules)
    notified = notify(decisions, events, rules, state)
    assert notified.suppressed_by.to_pylist() == ["tx-old", None]
    assert notified.last.column("transactionId").to_pylist() == ["tx-b"]


def test_no_cooldown_notifies_everything_and_keeps_no_state():
    rules = _rules([0])
    alerts = [(0, "p1", BASE_TIME, "tx-a"), (0, "p1", BASE_TIME, "tx-b")]
    events, decisions = _batch(alerts, rules)
    notified = notify(decisions, events, rules)
    assert notified.suppressed_by.to_pylist() == [None, None]
    assert notified.last.num_rows == 0


def test_cooldown_minutes_is_validated_and_round_trips():
    (rule,) = parse_rules(
        '{"ruleId":1,"ruleState":"ACTIVE","groupingKeyNames":["payerId"],'
        '"aggregatorFunctionType":"COUNT","limitOperatorType":">","limit":1,'
        '"windowMinutes":10,"cooldownMinutes":30}'
    )
    assert isinstance(rule, Rule) and rule.cooldown_minutes == 30
    assert rule.to_json()["cooldownMinutes"] == 30
    for bad in ('"x"', "-1", "527041", "1.5", "true"):
        with pytest.raises(InvalidRuleError, match="cooldownMinutes"):
            parse_rules(
                '{"ruleId":1,"ruleState":"ACTIVE","groupingKeyNames":["payerId"],'
                '"aggregatorFunctionType":"COUNT","limitOperatorType":">","limit":1,'
                f'"windowMinutes":10,"cooldownMinutes":{bad}}}'
            )
