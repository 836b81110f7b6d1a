"""Reviews (pure): verdicts, refusals that name their field, the latest review wins, and
precision per rule version."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from velocity.analyst.reviews import (
    NOTE_MAX,
    AlertRef,
    AlertVolume,
    InvalidReviewError,
    Review,
    Verdict,
    check_fields,
    latest_reviews,
    make_review,
    parse_verdict,
    precision_by_version,
    review_time,
)

pytestmark = pytest.mark.timeout(60)

ALERT = AlertRef("a-1", "ALERT", rule_id=4, rule_version=2, decision_time=1_767_225_600_000)


def _review(alert_id: str, verdict: Verdict, when: int, rule: tuple[int, int] = (4, 2)) -> Review:
    return Review(alert_id, rule[0], rule[1], verdict, "", "ana", when)


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("CONFIRMED_FRAUD", Verdict.CONFIRMED_FRAUD),
        ("confirmed fraud", Verdict.CONFIRMED_FRAUD),
        (" false-positive ", Verdict.FALSE_POSITIVE),
        ("Needs_Review", Verdict.NEEDS_REVIEW),
    ],
)
def test_a_verdict_in_any_case_and_spelling(text: str, verdict: Verdict) -> None:
    assert parse_verdict(text) is verdict


@pytest.mark.parametrize("text", ["fraud", "", None, 3, "CONFIRMED"])
def test_an_unknown_verdict_is_refused_naming_the_field_and_the_choices(text: object) -> None:
    with pytest.raises(InvalidReviewError) as refused:
        parse_verdict(text)
    assert refused.value.field == "verdict"
    assert "CONFIRMED_FRAUD, FALSE_POSITIVE, NEEDS_REVIEW" in str(refused.value)
    assert "no review recorded" in str(refused.value)


def test_a_review_takes_its_rule_version_from_its_alert() -> None:
    review = make_review("a-1", ALERT, "false positive", "  known merchant \n", "ana", 7)
    assert review == Review("a-1", 4, 2, Verdict.FALSE_POSITIVE, "known merchant", "ana", 7)
    assert review.to_json() == {
        "alertId": "a-1",
        "ruleId": 4,
        "ruleVersion": 2,
        "verdict": "FALSE_POSITIVE",
        "note": "known merchant",
        "who": "ana",
        "when": 7,
    }
    assert Review.from_row(review.to_json()) == review


def test_a_note_up_to_the_limit_is_kept_one_over_is_refused() -> None:
    assert check_fields("NEEDS_REVIEW", "x" * NOTE_MAX, "ana")[1] == "x" * NOTE_MAX
    with pytest.raises(InvalidReviewError) as refused:
        make_review("a-1", ALERT, "NEEDS_REVIEW", "x" * (NOTE_MAX + 1), "ana", 7)
    assert refused.value.field == "note"
    assert f"{NOTE_MAX + 1} characters, at most {NOTE_MAX}" in str(refused.value)


@pytest.mark.parametrize(
    ("alert_id", "alert", "field", "words"),
    [
        ("a-9", None, "alertId", "no alert 'a-9'"),
        ("a-9", ALERT, "alertId", "no alert 'a-9'"),
        ("", None, "alertId", "missing"),
        ("r-1", AlertRef("r-1", "RETRACTION", 4, 2, 0), "alertId", "is a RETRACTION"),
    ],
)
def test_a_missing_or_unreviewable_alert_is_refused(
    alert_id: str, alert: AlertRef | None, field: str, words: str
) -> None:
    with pytest.raises(InvalidReviewError) as refused:
        make_review(alert_id, alert, "CONFIRMED_FRAUD", "", "ana", 7)
    assert refused.value.field == field and words in str(refused.value)


def test_a_reviewer_must_be_named() -> None:
    with pytest.raises(InvalidReviewError) as refused:
        make_review("a-1", ALERT, "CONFIRMED_FRAUD", "", " ", 7)
    assert refused.value.field == "who"


def test_a_correction_may_be_reviewed() -> None:
    correction = AlertRef("c-1", "CORRECTION", 5, 1, 0)
    assert make_review("c-1", correction, "confirmed fraud", None, "ana", 1).rule_id == 5


def test_a_new_review_is_later_than_the_previous_one_whatever_the_clock() -> None:
    previous = _review("a-1", Verdict.CONFIRMED_FRAUD, 1000)
    assert review_time(5000, None) == 5000
    assert review_time(5000, previous) == 5000
    assert review_time(1000, previous) == 1001, "same millisecond"
    assert review_time(400, previous) == 1001, "a clock set back"


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]), st.sampled_from(list(Verdict)), st.integers(0, 50)
        ),
        max_size=30,
    ),
    st.randoms(use_true_random=False),
)
def test_the_latest_review_of_each_alert_wins_in_any_read_order(
    rows: list[tuple[str, Verdict, int]], shuffler: object
) -> None:
    reviews = [_review(a, v, when) for a, v, when in rows]
    shuffled = list(reviews)
    shuffler.shuffle(shuffled)  # type: ignore[attr-defined]
    latest = latest_reviews(reviews)
    assert latest == latest_reviews(shuffled)
    assert set(latest) == {a for a, _, _ in rows}
    for alert_id, review in latest.items():
        assert review.when == max(r.when for r in reviews if r.alert_id == alert_id)


def test_precision_counts_only_the_latest_review_of_each_alert_per_version() -> None:
    reviews = [
        _review("a", Verdict.FALSE_POSITIVE, 1),
        _review("a", Verdict.CONFIRMED_FRAUD, 2),  # a changed its mind: confirmed counts
        _review("b", Verdict.FALSE_POSITIVE, 3),
        _review("c", Verdict.CONFIRMED_FRAUD, 4),
        _review("d", Verdict.NEEDS_REVIEW, 5),  # reviewed, in neither term
        _review("e", Verdict.FALSE_POSITIVE, 6, rule=(4, 1)),  # another version
        _review("f", Verdict.NEEDS_REVIEW, 7, rule=(1, 1)),
    ]
    volumes = {(4, 2): AlertVolume(3, 10), (4, 3): AlertVolume(1, 1)}
    figures = {(f.rule_id, f.rule_version): f for f in precision_by_version(volumes, reviews)}
    assert list(figures) == [(1, 1), (4, 1), (4, 2), (4, 3)], "by ruleId, then version"
    v2 = figures[(4, 2)]
    assert (v2.alerts_24h, v2.alerts_7d, v2.reviewed) == (3, 10, 4)
    assert (v2.confirmed, v2.false_positives, v2.needs_review) == (2, 1, 1)
    assert v2.precision == pytest.approx(2 / 3)
    assert figures[(4, 1)].precision == 0.0 and figures[(4, 1)].alerts_7d == 0
    assert figures[(4, 3)].precision is None and figures[(4, 3)].reviewed == 0
    assert figures[(1, 1)].precision is None, "needs review only: no precision yet"
    assert figures[(4, 2)].to_json() == {
        "ruleId": 4,
        "ruleVersion": 2,
        "alerts24h": 3,
        "alerts7d": 10,
        "reviewed": 4,
        "confirmed": 2,
        "falsePositives": 1,
        "needsReview": 1,
        "precision": pytest.approx(2 / 3),
    }
