"""What the page keeps instead of reading every alert and review (issue 51), without Delta:
the latest reviews and their verdict counts fed in any order and in pieces, the alerts per
minute fed and forgotten file by file, the decision times a case's alerts lie in, the
search's spans chosen by rows, and decision-time ranges joined."""

from __future__ import annotations

from itertools import pairwise

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from velocity.analyst.cases import CaseEvent, CaseEventKind, alert_spans, fold_cases
from velocity.analyst.reviews import (
    AlertVolume,
    Review,
    ReviewBook,
    Verdict,
    latest_reviews,
    precision_by_version,
    precision_of_versions,
)
from velocity.delta.alert_files import AlertMinutes, FileSpan, merged, minute_counts
from velocity.delta.reader import _spans_below

pytestmark = pytest.mark.timeout(60)

# An alert's reviews carry its rule (the store takes it from the alert), so two reviews of
# one alert never differ in it; they may tie in everything else but the verdict.
RULE_OF = {"a1": 4, "a2": 4, "a3": 5}
reviews = st.lists(
    st.builds(
        lambda alert_id, verdict, note, who, when: Review(
            alert_id, RULE_OF[alert_id], 1, verdict, note, who, when
        ),
        alert_id=st.sampled_from(sorted(RULE_OF)),
        verdict=st.sampled_from(list(Verdict)),
        note=st.sampled_from(["", "n"]),
        who=st.sampled_from(["ana", "bo"]),
        when=st.integers(0, 20),
    ),
    max_size=30,
)


@given(reviews, st.integers(0, 30), st.randoms())
def test_a_review_book_fed_in_any_order_and_pieces_holds_the_latest_reviews(
    given_reviews: list[Review], cut: int, rng: object
) -> None:
    shuffled = list(given_reviews)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    book = ReviewBook()
    book.add(shuffled[:cut])
    book.add(shuffled[cut:])
    assert book.latest == latest_reviews(given_reviews)
    volumes = {(4, 1): AlertVolume(1, 2)}
    assert precision_of_versions(volumes, book.verdicts) == precision_by_version(
        volumes, given_reviews
    )


def _counts(
    rule: int, minute: int, n: int
) -> list[tuple[tuple[int, int, str, bool, bool], int, int]]:
    return [((rule, 1, "ALERT", False, False), minute, n)]


def test_alert_minutes_add_files_forget_them_and_count_the_minutes_asked_for() -> None:
    minutes = AlertMinutes()
    minutes.add_file("f1", _counts(4, 60_000, 3) + _counts(5, 120_000, 1))
    minutes.add_file("f2", _counts(4, 60_000, 2) + _counts(4, 240_000, 7))
    assert list(minutes.between(120_000)) == [
        ((5, 1, "ALERT", False, False), 120_000, 1),
        ((4, 1, "ALERT", False, False), 240_000, 7),
    ]
    assert list(minutes.between(0, 60_000)) == [((4, 1, "ALERT", False, False), 60_000, 5)]
    assert minutes.forget({"f2"}) is True
    assert list(minutes.between(0)) == [
        ((4, 1, "ALERT", False, False), 60_000, 3),
        ((5, 1, "ALERT", False, False), 120_000, 1),
    ]
    minutes.forget({"f1"})
    assert minutes.by_minute == {} and minutes.minutes == [], "nothing left behind"


def test_minute_counts_group_by_version_kind_flags_and_minute() -> None:
    rows = pa.table(
        {
            "ruleId": [4, 4, 4, 5],
            "ruleVersion": [1, 1, 1, 2],
            "kind": ["ALERT", "ALERT", "ALERT", "CORRECTION"],
            "decisionTime": [60_001, 119_999, 120_000, 60_500],
            "shadow": [None, False, None, True],
            "suppressed": [True, None, None, None],
        }
    )
    assert sorted(minute_counts(rows)) == [
        ((4, 1, "ALERT", False, False), 60_000, 1),
        ((4, 1, "ALERT", False, False), 120_000, 1),
        ((4, 1, "ALERT", False, True), 60_000, 1),
        ((5, 2, "CORRECTION", True, False), 60_000, 1),
    ]


def test_a_case_s_alerts_lie_in_its_stream_events_decision_times_newest_first() -> None:
    def event(kind: CaseEventKind, at: int, first: int | None, latest: int | None) -> CaseEvent:
        return CaseEvent("c", '{"payerId":"p"}', kind, at, "velocity-stream", alerts=2,
                         first_alert_at=first, latest_alert_at=latest, batch=at)  # fmt: skip

    history = [
        event(CaseEventKind.OPENED, 10, 1, 5),
        event(CaseEventKind.JOINED, 20, 12, 18),
        CaseEvent("c", '{"payerId":"p"}', CaseEventKind.ASSIGNED, 21, "ana", assignee="ana"),
        event(CaseEventKind.JOINED, 30, 6, 25),
    ]
    case = fold_cases(history)["c"]
    assert alert_spans(case) == [(6, 25, 2), (12, 18, 2), (1, 5, 2)]
    older = fold_cases([event(CaseEventKind.OPENED, 10, None, None)])["c"]
    assert alert_spans(older) is None, "an event that does not say: read every file"


def test_the_search_s_spans_hold_the_page_then_eight_times_more_rows() -> None:
    files = [FileSpan(10, 400, 499), FileSpan(10, 300, 399), FileSpan(10, 200, 299),
             FileSpan(10, 100, 199), FileSpan(100, 0, 99)]  # fmt: skip
    assert _spans_below(files, 499, 11) == [300, 0, None]
    assert _spans_below(files, 250, 15) == [100, 0, None], "only files at or below the top"
    assert _spans_below(files, 499, 1000) == [None], "too few rows: the whole table at once"
    assert _spans_below([], 499, 5) == [None]


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10)), max_size=12))
def test_joined_ranges_cover_exactly_what_the_ranges_cover(given_ranges: list) -> None:
    ranges = [(low, low + width) for low, width in given_ranges]
    joined = merged(ranges)
    covered = {t for low, high in ranges for t in range(low, high + 1)}
    assert {t for low, high in joined for t in range(low, high + 1)} == covered
    assert all(a[1] + 1 < b[0] for a, b in pairwise(joined))
