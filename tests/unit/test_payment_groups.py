"""A case's alerts grouped by payment and paged (``velocity.analyst.payment_groups``, pure):
one group a payment, newest first, pages that neither skip nor repeat a payment nor split
one, however few alerts each read brings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from velocity.analyst.alert_search import InvalidFilterError
from velocity.analyst.payment_groups import (
    PaymentCursor,
    parse_payment_cursor,
    parse_payment_limit,
    payment_page,
    read_payment_page,
)

pytestmark = pytest.mark.timeout(60)


def _alerts(drawn: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Alerts of payments tx-<n> at eventTime <t>, one a rule, in the store's time order."""
    rows = [
        {"alertId": f"a-{n}-{rule}", "transactionId": f"tx-{n}", "eventTime": t, "ruleId": rule}
        for n, (t, rules) in enumerate(drawn)
        for rule in range(1, rules + 1)
    ]
    return sorted(rows, key=lambda r: (r["eventTime"], r["ruleId"]))


def test_a_payment_s_alerts_are_one_row_newest_payment_first() -> None:
    alerts = _alerts([(10, 2), (30, 1), (20, 3)])
    page = payment_page(alerts, all_read=True)
    assert page is not None and page.older is None
    assert [g.transaction_id for g in page.payments] == ["tx-1", "tx-2", "tx-0"]
    assert [a["ruleId"] for a in page.payments[1].alerts] == [1, 2, 3], "in time order"
    # The oldest payment read may have older alerts: not listed until they are read.
    assert payment_page(alerts[-4:], all_read=False, limit=5) is None
    cut = payment_page(alerts[-4:], all_read=False, limit=1)
    assert cut is not None and [g.transaction_id for g in cut.payments] == ["tx-1"]
    assert cut.older == PaymentCursor(30, "tx-1")


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 4)), max_size=25),
    st.integers(1, 6),
    st.integers(1, 9),
)
def test_paging_lists_each_payment_once_whole(
    drawn: list[tuple[int, int]], limit: int, first: int
) -> None:
    alerts = _alerts(drawn)
    reads: list[int] = []

    def read(n: int) -> list[dict[str, Any]]:
        reads.append(n)
        return alerts[max(0, len(alerts) - n) :]

    listed: list[tuple[str, int]] = []
    before = None
    while True:
        page = read_payment_page(read, before, limit, first)
        assert len(page.payments) <= limit
        listed += [(g.transaction_id, len(g.alerts)) for g in page.payments]
        if page.older is None:
            break
        before = parse_payment_cursor(page.older.text())
    expected = sorted(((t, f"tx-{n}", rules) for n, (t, rules) in enumerate(drawn)), reverse=True)
    assert listed == [(tx, rules) for _, tx, rules in expected]


def test_a_boundary_or_a_size_that_cannot_be_read_is_named() -> None:
    with pytest.raises(InvalidFilterError, match=r"field 'alerts_before'"):
        parse_payment_cursor("yesterday")
    with pytest.raises(InvalidFilterError, match=r"field 'alerts_limit'.*from 1 to 200"):
        parse_payment_limit("500")
    assert parse_payment_cursor("12_tx_1") == PaymentCursor(12, "tx_1")
