"""The analysts' queue (``velocity.analyst.case_queue``, pure): filters that name their bad field,
the cases not closed by default, pages that neither skip nor repeat a case, and the cases
changed since a page was drawn; each rule's alerts a minute and share of payments
(``velocity.analyst.rule_rates``)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from velocity.analyst.alert_search import InvalidFilterError
from velocity.analyst.case_queue import (
    QUEUE_PAGE_MAX,
    QUEUE_PAGE_SIZE,
    CaseCursor,
    CaseQuery,
    CaseSort,
    parse_case_cursor,
    parse_case_filter,
    parse_case_query,
    queue_page,
    updated_since,
)
from velocity.analyst.cases import Case, CaseStatus, case_key_text
from velocity.analyst.rule_rates import MINUTE_MS, minute_starts, rule_rates
from velocity.domain.rules import Outcome

pytestmark = pytest.mark.timeout(60)

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def case(
    n: int,
    status: CaseStatus = CaseStatus.OPEN,
    rules: dict[int, int] | None = None,
    assignee: str | None = None,
    payer: str | None = None,
    activity: int | None = None,
    outcome: Outcome = Outcome.ALERT,
) -> Case:
    return Case(
        case_id=f"c-{n:03d}",
        case_key=case_key_text("payerId", payer or f"p-{n}"),
        status=status,
        assignee=assignee,
        opened_at=NOW + n,
        latest_alert_at=NOW + n,
        latest_activity_at=NOW + n * 10 if activity is None else activity,
        alerts=sum((rules or {4: 1}).values()),
        rule_counts=dict(rules or {4: 1}),
        amount=Decimal("10.5"),
        outcome=outcome,
    )


def test_the_queue_holds_the_cases_not_closed_newest_activity_first() -> None:
    cases = [
        case(1),
        case(2, CaseStatus.ASSIGNED, assignee="ana"),
        case(3, CaseStatus.CLOSED),
        case(4),
    ]
    page = queue_page(cases, CaseQuery())
    assert [c.case_id for c in page.cases] == ["c-004", "c-002", "c-001"]
    assert page.matching == 3 and page.older is None


def test_each_field_narrows_the_queue_and_every_field_given_must_hold() -> None:
    cases = [
        case(1, rules={4: 2, 5: 1}),
        case(2, CaseStatus.ASSIGNED, rules={5: 3}, assignee="Ana"),
        case(3, CaseStatus.CLOSED, rules={4: 1}, assignee="ana"),
        case(4, rules={7: 1}, payer="p-1"),
    ]

    def shown(**params: str) -> list[str]:
        query = parse_case_query(params, {4, 5, 7})
        return [c.case_id for c in queue_page(cases, query).cases]

    assert shown(case_rule="5") == ["c-002", "c-001"]
    assert shown(case_status="closed") == ["c-003"]
    assert shown(case_status="ALL", case_rule="4") == ["c-003", "c-001"]
    assert shown(case_assignee="ana") == ["c-002"], "a name in any case"
    assert shown(case_assignee="none") == ["c-004", "c-001"], "nobody's"
    assert shown(case_key="payerId=p-1") == ["c-004", "c-001"]
    assert shown(case_key="p-1", case_rule="7") == ["c-004"]


def test_a_key_is_matched_whole_as_the_page_shows_it() -> None:
    cases = [case(1, payer="p-1"), case(2, payer="p-10"), case(3, payer="p-1", activity=NOW)]
    query = parse_case_query({"case_key": "payerId=p-1"}, None)
    assert [c.case_id for c in queue_page(cases, query).cases] == ["c-001", "c-003"]
    bare = parse_case_query({"case_key": "p-10"}, None)
    assert [c.case_id for c in queue_page(cases, bare).cases] == ["c-002"]


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"case_rule": "four"}, "case_rule", "'four' is not a ruleId"),
        ({"case_rule": "9"}, "case_rule", "no ruleId 9 in the rules table (ruleIds: 4, 5)"),
        ({"case_status": "pending"}, "case_status", "use one of open, assigned, closed, all"),
        ({"case_key": "color=red"}, "case_key", "'color' is not a field rules use"),
        ({"case_before": "yesterday"}, "case_before", "is not a page boundary"),
        ({"case_limit": str(QUEUE_PAGE_MAX + 1)}, "case_limit", "from 1 to 200"),
        ({"case_outcome": "deny"}, "case_outcome", "use one of ALERT, REVIEW, BLOCK"),
        (
            {"case_sort": "biggest"},
            "case_sort",
            "use one of newest, oldest, amount, alerts, outcome",
        ),
        # A boundary of the other order: pages of one order never mix with the other's.
        ({"case_sort": "outcome", "case_before": f"{NOW}_c-1"}, "case_before", "<outcome>_"),
        ({"case_before": f"BLOCK_{NOW}_c-1"}, "case_before", "is not a page boundary"),
        ({"case_sort": "amount", "case_before": f"{NOW}_c-1"}, "case_before", "amount_<amount>_"),
        ({"case_sort": "oldest", "case_before": f"alerts_{NOW}_c-1"}, "case_before", "oldest_<"),
        ({"case_sort": "amount", "case_before": "amount_1e5_c-1"}, "case_before", "boundary"),
        ({"case_sort": "alerts", "case_before": "alerts_1.5_c-1"}, "case_before", "boundary"),
    ],
)
def test_a_field_that_cannot_be_read_is_named(
    params: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(InvalidFilterError) as refused:
        parse_case_query(params, {4, 5})
    assert refused.value.field == field and words in str(refused.value)
    assert str(refused.value).startswith(f"field '{field}': ")


def test_the_filter_keeps_what_was_written_for_the_links() -> None:
    query = parse_case_filter({"case_rule": " 4 ", "case_key": "payerId=p 1", "rule": "9"}, None)
    assert query.query() == {"case_rule": "4", "case_key": "payerId=p 1"}
    assert parse_case_query({}, None).limit == QUEUE_PAGE_SIZE
    assert parse_case_cursor(CaseCursor(NOW, "c-1").text()) == CaseCursor(NOW, "c-1")


@given(
    st.lists(st.tuples(st.integers(0, 20), st.sampled_from(list(CaseStatus))), max_size=40),
    st.integers(1, 7),
)
def test_paging_lists_each_matching_case_once_ties_included(
    drawn: list[tuple[int, CaseStatus]], limit: int
) -> None:
    cases = [case(n, status, activity=NOW + at) for n, (at, status) in enumerate(drawn)]
    query = CaseQuery(limit=limit)
    listed: list[str] = []
    while True:
        page = queue_page(cases, query)
        listed += [c.case_id for c in page.cases]
        assert len(page.cases) <= limit
        if page.older is None:
            break
        query = CaseQuery(query.filter, page.older, limit)
    expected = sorted(
        (c for c in cases if c.status is not CaseStatus.CLOSED),
        key=lambda c: (c.latest_activity_at, c.case_id),
        reverse=True,
    )
    assert listed == [c.case_id for c in expected]


def test_the_queue_filters_by_the_strongest_outcome_and_puts_a_block_case_first() -> None:
    cases = [case(n, activity=NOW + n) for n in range(1, 8)]  # a pile of ALERT cases
    cases += [
        case(8, outcome=Outcome.BLOCK, activity=NOW - 50),  # the oldest activity of all
        case(9, outcome=Outcome.REVIEW, activity=NOW - 40),
        case(10, outcome=Outcome.REVIEW, activity=NOW - 30),
        case(11, CaseStatus.CLOSED, outcome=Outcome.BLOCK),
    ]

    def shown(**params: str) -> list[str]:
        return [c.case_id for c in queue_page(cases, parse_case_query(params, None)).cases]

    assert shown(case_outcome="block") == ["c-008"], "the closed one is not in the queue"
    assert shown(case_outcome="REVIEW", case_status="all") == ["c-010", "c-009"]
    by_outcome = shown(case_sort="outcome")
    assert by_outcome[:4] == ["c-008", "c-010", "c-009", "c-007"]
    assert shown()[:1] == ["c-007"] and shown()[-1] == "c-008", "newest activity first"
    query = parse_case_query({"case_sort": "outcome", "case_limit": "2"}, None)
    page = queue_page(cases, query)
    assert page.older is not None and page.older.text() == f"REVIEW_{NOW - 30}_c-010"
    assert parse_case_cursor(page.older.text(), CaseSort.OUTCOME) == page.older


@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(Outcome))), min_size=1, max_size=30),
    st.integers(1, 7),
)
def test_paging_by_outcome_lists_each_case_once_strongest_first(
    drawn: list[tuple[int, Outcome]], limit: int
) -> None:
    cases = [case(n, activity=NOW + at, outcome=o) for n, (at, o) in enumerate(drawn)]
    query = parse_case_query({"case_sort": "outcome", "case_limit": str(limit)}, None)
    listed: list[str] = []
    while True:
        page = queue_page(cases, query)
        listed += [c.case_id for c in page.cases]
        if page.older is None:
            break
        text = page.older.text()
        query = parse_case_query({"case_sort": "outcome", "case_before": text}, None)
        query = CaseQuery(query.filter, query.before, limit, query.sort)
    expected = sorted(
        cases, key=lambda c: (c.outcome.strength, c.latest_activity_at, c.case_id), reverse=True
    )
    assert listed == [c.case_id for c in expected]


def test_the_cases_updated_since_a_page_was_drawn_pass_its_filter() -> None:
    cases = [case(1, activity=NOW), case(2, activity=NOW + 5), case(3, CaseStatus.CLOSED)]
    cases.append(case(4, rules={7: 1}, activity=NOW + 9))
    assert updated_since(cases, parse_case_filter({}, None), NOW) == ["c-004", "c-002"]
    only_4 = parse_case_filter({"case_rule": "4"}, None)
    assert updated_since(cases, only_4, NOW) == ["c-002"]
    closed_too = parse_case_filter({"case_status": "all"}, None)
    assert updated_since(cases, closed_too, NOW + 9) == ["c-003"]  # activity NOW + 30


def test_a_rule_s_alerts_a_minute_and_the_share_of_payments_it_fires_on() -> None:
    now = NOW + 9 * MINUTE_MS + 30_000  # half-way through the tenth minute
    starts = minute_starts(now)
    assert starts[0] == NOW and starts[-1] == NOW + 9 * MINUTE_MS and len(starts) == 10
    counts = [
        (4, NOW + 8 * MINUTE_MS, False, 120),
        (4, NOW + 8 * MINUTE_MS, True, 30),
        (4, NOW + 9 * MINUTE_MS, False, 7),
        (4, NOW - MINUTE_MS, False, 999),  # before the minutes: left out
        (5, NOW, True, 2),
    ]
    rates = rule_rates(counts, {4: 150, 5: 2}, 600, [4, 5, 6], now)
    four = rates[4]
    assert four.notified[-2:] == (120, 7) and four.suppressed[-2] == 30
    assert sum(four.notified) == 127, "the minute before the window is not counted"
    assert four.share == 0.25 and four.fires_often
    assert rates[5].suppressed[0] == 2 and not rates[5].fires_often
    assert rates[6].notified == (0,) * 10 and rates[6].share == 0.0
    assert rule_rates([], {}, 0, [4], now)[4].share is None, "no payments: no share"
    at_the_limit = rule_rates([], {4: 20}, 100, [4], now)[4]
    assert at_the_limit.share == 0.2 and not at_the_limit.fires_often, "over 20 %, not at"


def _by(sort: str, c: Case) -> tuple[object, ...]:
    """Each order as the docs word it, ascending (the queue lists it descending)."""
    figure = {
        "newest": c.latest_activity_at,
        "oldest": -c.opened_at,
        "amount": c.amount,
        "alerts": c.alerts,
        "outcome": (c.outcome.strength, c.latest_activity_at),
    }[sort]
    return (figure, c.case_id)


def _every_page(cases: list[Case], sort: str, limit: int) -> list[str]:
    """Page through the queue by the boundary's text, as the page's links do."""
    params = {"case_sort": sort, "case_limit": str(limit)}
    listed: list[str] = []
    while True:
        page = queue_page(cases, parse_case_query(params, None))
        assert len(page.cases) <= limit
        listed += [c.case_id for c in page.cases]
        if page.older is None:
            return listed
        params = {**params, "case_before": page.older.text()}


@given(
    st.lists(
        st.tuples(
            st.integers(0, 4),
            st.integers(0, 4),
            st.sampled_from(["0", "10.5", "10.50", "999.99", "1000"]),
            st.integers(1, 4),
            st.sampled_from(list(Outcome)),
        ),
        max_size=30,
    ),
    st.sampled_from(["newest", "oldest", "amount", "alerts", "outcome"]),
    st.integers(1, 7),
)
def test_every_order_pages_each_case_once_ties_broken_by_case_id(
    drawn: list[tuple[int, int, str, int, Outcome]], sort: str, limit: int
) -> None:
    cases = []
    for n, (opened, active, amount, alerts, outcome) in enumerate(drawn):
        one = case(n, rules={4: alerts}, activity=NOW + active, outcome=outcome)
        one.opened_at, one.amount = NOW - opened, Decimal(amount)
        cases.append(one)
    expected = sorted(cases, key=lambda c: _by(sort, c), reverse=True)
    assert _every_page(cases, sort, limit) == [c.case_id for c in expected]


def test_the_orders_put_the_oldest_the_largest_and_the_busiest_case_first() -> None:
    cases = [case(n) for n in range(1, 6)]
    cases[2].opened_at = NOW - 86_400_000  # c-003: opened a day ago
    cases[3].amount = Decimal("250000")  # c-004: the largest total
    cases[4].alerts = 40  # c-005: the most alerts
    cases.append(case(6, CaseStatus.CLOSED))

    def first(sort: str) -> str:
        return queue_page(cases, parse_case_query({"case_sort": sort}, None)).cases[0].case_id

    assert [first(s) for s in ("newest", "oldest", "amount", "alerts")] == [
        "c-005",  # the newest activity (case(n): n * 10 ms after NOW)
        "c-003",
        "c-004",
        "c-005",
    ]
    page = queue_page(cases, parse_case_query({"case_sort": "AMOUNT", "case_limit": "1"}, None))
    assert page.older is not None and page.older.text() == "amount_250000_c-004"
    page = queue_page(cases, parse_case_query({"case_sort": "oldest", "case_limit": "1"}, None))
    assert page.older is not None and page.older.text() == f"oldest_{NOW - 86_400_000}_c-003"
    assert parse_case_cursor(page.older.text(), CaseSort.OLDEST) == page.older
