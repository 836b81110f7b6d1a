"""Searching and paging alerts (pure): filters that name their bad field, UTC times and
their inclusive upper ends, page boundaries that neither skip nor repeat an alert, keys and
durations as people read them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from velocity.analyst.alert_search import (
    PAGE_MAX,
    AlertFilter,
    Cursor,
    InvalidFilterError,
    KeyPart,
    duration_text,
    key_text,
    page_of,
    parse_cursor,
    parse_filter,
    parse_limit,
    parse_time,
)
from velocity.domain.alerts import AlertKind

pytestmark = pytest.mark.timeout(60)

JAN_1 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _alert(n: int, decision_time: int, **fields: object) -> dict[str, object]:
    return {
        "alertId": f"a-{n:03d}",
        "kind": "ALERT",
        "ruleId": 1,
        "ruleVersion": 1,
        "transactionId": f"tx-{n}",
        "key": {"payerId": f"p-{n % 3}", "beneficiaryId": "2034"},
        "eventTime": decision_time - 10,
        "decisionTime": decision_time,
        **fields,
    }


def test_times_are_utc_and_an_upper_bound_covers_the_unit_written() -> None:
    assert parse_time("2026-01-01", "from", upper=False) == JAN_1
    assert parse_time("2026-01-01", "to", upper=True) == JAN_1 + 86_400_000 - 1
    assert parse_time("2026-01-01 00:05", "to", upper=True) == JAN_1 + 6 * 60_000 - 1
    assert parse_time("2026-01-01T00:05:07Z", "to", upper=True) == JAN_1 + 307_999
    # The page shows times so; pasted back, a shown time finds its own alert.
    assert parse_time("2026-01-01 00:00:01.250Z", "from", upper=False) == JAN_1 + 1250
    assert parse_time("2026-01-01 00:00:01.250Z", "to", upper=True) == JAN_1 + 1250
    assert parse_time("2026-01-01T02:00:00+02:00", "from", upper=False) == JAN_1
    assert parse_time("2025-12-31T19:00-0500", "from", upper=False) == JAN_1
    assert parse_time(str(JAN_1), "from", upper=False) == JAN_1


@pytest.mark.parametrize(
    "text", ["yesterday", "2026-13-01", "2026-01-01 25:00", "01/01/2026", "-5", "2026-01-01T"]
)
def test_a_time_that_cannot_be_read_names_its_field(text: str) -> None:
    with pytest.raises(InvalidFilterError, match=r"field 'from': .* is not a time") as raised:
        parse_filter({"from": text}, None)
    assert raised.value.field == "from"


def test_a_filter_names_the_field_at_fault() -> None:
    cases = {
        ("rule", "9"): "field 'rule': no ruleId 9 in the rules table (ruleIds: 1, 4)",
        ("rule", "one"): "field 'rule': 'one' is not a ruleId",
        ("kind", "fraud"): "field 'kind': 'fraud' is not a kind; use one of ALERT, CORRECTION",
        ("key", "colour=red"): "field 'key': 'colour' is not a field rules use",
        ("key", "payerId="): "field 'key': 'payerId=' has no value",
        ("to", "2025-12-31"): "field 'to': '2025-12-31' is before from '2026-01-01'",
    }
    for (name, value), message in cases.items():
        params = {name: value, **({"from": "2026-01-01"} if name == "to" else {})}
        with pytest.raises(InvalidFilterError) as raised:
            parse_filter(params, {1, 4})
        assert str(raised.value).startswith(message), raised.value
        assert raised.value.field == name
    with pytest.raises(InvalidFilterError, match="field 'before'"):
        parse_cursor("yesterday")
    for bad in ("0", "x", str(PAGE_MAX + 1)):
        with pytest.raises(InvalidFilterError, match="field 'limit'"):
            parse_limit(bad)
    assert parse_limit("") == 50 and parse_limit("7") == 7


def test_every_field_given_must_hold_and_empty_fields_do_not_filter() -> None:
    query = parse_filter(
        {
            "rule": " 1 ",
            "kind": "alert",
            "key": "payerId=p-1, beneficiaryId=2034",
            "tx": "tx-4",
            "from": "",
            "other": "ignored",
        },
        {1},
    )
    assert query.rule_id == 1 and query.kind is AlertKind.ALERT
    assert query.key == (KeyPart("payerId", "p-1"), KeyPart("beneficiaryId", "2034"))
    assert query.query() == {
        "rule": "1",
        "kind": "alert",
        "key": "payerId=p-1, beneficiaryId=2034",
        "tx": "tx-4",
    }
    assert query.matches(_alert(4, JAN_1))
    for differs in (
        {"ruleId": 2},
        {"kind": "CORRECTION"},
        {"transactionId": "tx-5"},
        {"key": {"payerId": "p-1"}},
        {"key": {"payerId": "p-1", "beneficiaryId": "2035"}},
    ):
        assert not query.matches({**_alert(4, JAN_1), **differs}), differs
    assert parse_filter({}, None).empty and AlertFilter().matches({"alertId": "x"})


def test_a_key_value_alone_matches_any_key_field_and_values_compare_canonically() -> None:
    bare = parse_filter({"key": "2034"}, None)
    assert bare.matches(_alert(1, JAN_1)) and not bare.matches(_alert(1, JAN_1, key={}))
    assert parse_filter({"key": "beneficiaryId=2034"}, None).matches(_alert(1, JAN_1))
    # An amount key is compared as its canonical decimal.
    amount = parse_filter({"key": "paymentAmount=12.50"}, None)
    assert amount.key == (KeyPart("paymentAmount", "12.5"),)


def test_time_bounds_are_of_the_event_time_and_inclusive() -> None:
    alert = _alert(1, JAN_1 + 70_000)  # eventTime 00:01:09.990
    assert parse_filter({"from": "2026-01-01 00:01", "to": "2026-01-01 00:01"}, None).matches(alert)
    assert not parse_filter({"from": "2026-01-01 00:01:10"}, None).matches(alert)
    assert not parse_filter({"to": "2026-01-01 00:01:09.989Z"}, None).matches(alert)
    assert not parse_filter({"to": "2026-01-01"}, None).matches({"alertId": "x"})


def test_pages_are_newest_first_each_alert_once_and_the_next_starts_below_the_last() -> None:
    delta = [_alert(n, JAN_1 + n * 1000) for n in range(0, 8)]
    redis = [_alert(n, JAN_1 + n * 1000) for n in range(6, 10)]  # 6 and 7 on both
    first = page_of(redis + delta, AlertFilter(), None, 4)
    assert [a["alertId"] for a in first.alerts] == ["a-009", "a-008", "a-007", "a-006"]
    assert first.older == Cursor(JAN_1 + 6000, "a-006")
    second = page_of(redis + delta, AlertFilter(), first.older, 4)
    assert [a["alertId"] for a in second.alerts] == ["a-005", "a-004", "a-003", "a-002"]
    last = page_of(delta, AlertFilter(), second.older, 4)
    assert [a["alertId"] for a in last.alerts] == ["a-001", "a-000"] and last.older is None
    # A source that held back matching alerts: there is an older page.
    assert page_of(delta[:2], AlertFilter(), None, 4, more=True).older == Cursor(JAN_1, "a-000")


@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 2)), max_size=60),
    st.integers(1, 7),
)
def test_paging_through_lists_every_matching_alert_exactly_once(
    times: list[tuple[int, int]], limit: int
) -> None:
    """Equal decision times included: the alertId breaks the tie, so no page boundary
    skips or repeats an alert."""
    alerts = [_alert(n, JAN_1 + t, ruleId=rule) for n, (t, rule) in enumerate(times)]
    query = AlertFilter(rule_id=1)
    seen: list[str] = []
    before = None
    for _ in range(len(alerts) + 1):
        page = page_of(alerts, query, before, limit)
        seen += [str(a["alertId"]) for a in page.alerts]
        if page.older is None:
            break
        before = page.older
    expected = sorted(
        (a for a in alerts if a["ruleId"] == 1),
        key=lambda a: (a["decisionTime"], a["alertId"]),
        reverse=True,
    )
    assert seen == [a["alertId"] for a in expected]


def test_a_cursor_reads_back_what_it_writes_whatever_the_alert_id() -> None:
    cursor = Cursor(JAN_1, "4f1c_x y")
    assert parse_cursor(cursor.text()) == cursor


def test_keys_read_as_field_equals_value_in_the_rules_order() -> None:
    key = {"beneficiaryId": "2034", "payerId": "p-4041"}
    assert key_text(key, ("payerId", "beneficiaryId")) == "payerId=p-4041, beneficiaryId=2034"
    assert key_text(key) == "beneficiaryId=2034, payerId=p-4041"
    assert key_text({}) == "(all)" and key_text(None) == "(all)"


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (None, None),
        (0, "0 ms"),
        (850, "850 ms"),
        (4_249, "4.2 s"),
        (42_000, "42 s"),
        (308_927, "5 min 8 s"),
        (300_000, "5 min"),
        (7_500_000, "2 h 5 min"),
        (3 * 86_400_000 + 4 * 3_600_000, "3 d 4 h"),
        (-5, "0 ms"),
    ],
)
def test_durations_read_in_seconds_minutes_hours_or_days(ms: int | None, text: str) -> None:
    assert duration_text(ms) == text
