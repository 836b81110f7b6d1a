"""Cases (SPEC §4a) as their events leave them (``velocity.analyst.cases``, pure)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from velocity.analyst.cases import (
    BACKFILL_ACTOR,
    CaseAlert,
    CaseBook,
    CaseEvent,
    CaseEventKind,
    CaseStatus,
    ClosedCase,
    InvalidCaseActionError,
    OpenCases,
    alert_spans,
    backfill_case_events,
    case_key_text,
    fold_cases,
    mark_retracted,
    person_event,
    stream_case_events,
)
from velocity.analyst.reviews import Verdict
from velocity.domain.rules import Outcome

pytestmark = pytest.mark.timeout(60)

P1, P2 = case_key_text("payerId", "p1"), case_key_text("payerId", "p2")


def alert(
    n: int,
    key: str,
    rule: int = 4,
    tx: str | None = None,
    amount: str = "10",
    outcome: Outcome = Outcome.ALERT,
) -> CaseAlert:
    return CaseAlert(f"a-{n}", rule, tx or f"tx-{n}", 1_000 + n, key, Decimal(amount), outcome)


def open_cases(events, keys):  # type: ignore[no-untyped-def]
    index = OpenCases()
    index.add(events)
    return index.open_case_of(keys)


def test_the_first_alert_of_a_key_opens_a_case_and_later_ones_join_it() -> None:
    first, case_of = stream_case_events(
        [alert(1, P1), alert(2, P1, rule=5, tx="tx-1"), alert(3, P2, amount="7.5")], {}, 0, 50
    )
    assert [e.event for e in first] == [CaseEventKind.OPENED, CaseEventKind.OPENED]
    cases = fold_cases(first)
    p1 = cases[case_of["a-1"]]
    # One payment that fired two rules counts once in the amount.
    assert (p1.alerts, p1.rule_counts, p1.amount) == (2, {4: 1, 5: 1}, Decimal("10"))
    assert (p1.opened_at, p1.latest_alert_at, p1.status) == (1_001, 1_002, CaseStatus.OPEN)
    assert p1.key == {"payerId": "p1"} and case_of["a-2"] == case_of["a-1"] != case_of["a-3"]

    later, later_of = stream_case_events([alert(9, P1)], open_cases(first, [P1]), 1, 60)
    assert later[0].event is CaseEventKind.JOINED and later_of["a-9"] == case_of["a-1"]
    again = fold_cases([*first, *later])[case_of["a-1"]]
    assert (again.alerts, again.rule_counts, again.latest_alert_at) == (3, {4: 2, 5: 1}, 1_009)


def test_an_alert_after_the_close_opens_a_new_case_and_a_reopened_one_is_joined_again() -> None:
    opened, case_of = stream_case_events([alert(1, P1)], {}, 0, 50)
    case = fold_cases(opened)[case_of["a-1"]]
    assigned = person_event(case, CaseEventKind.ASSIGNED, "ana", 60, assignee="bo")
    case = fold_cases([*opened, assigned])[case.case_id]
    assert (case.status, case.assignee) == (CaseStatus.ASSIGNED, "bo")
    closed = person_event(case, CaseEventKind.CLOSED, "bo", 70, verdict="false positive")
    history = [*opened, assigned, closed]
    case = fold_cases(history)[case.case_id]
    assert (case.status, case.verdict) == (CaseStatus.CLOSED, Verdict.FALSE_POSITIVE)
    assert open_cases(history, [P1]) == {}

    after, after_of = stream_case_events([alert(2, P1)], {}, 1, 80)
    assert after[0].event is CaseEventKind.OPENED and after_of["a-2"] != case.case_id

    reopened = person_event(case, CaseEventKind.REOPENED, "bo", 90)
    folded = fold_cases([*history, *after, reopened])
    assert folded[case.case_id].status is CaseStatus.ASSIGNED  # back to its assignee
    # Two open cases of one key: alerts join the newest.
    assert open_cases([*history, *after, reopened], [P1]) == {P1: after_of["a-2"]}


def test_a_backfill_s_corrections_open_or_join_and_its_retractions_are_noted() -> None:
    """A backfill's corrections are given their cases as stream alerts are; its events
    open the cases not opened yet, join the others, and note its retractions in the case
    of the alert each retracts, without counting them as the case's alerts."""
    streamed, streamed_of = stream_case_events([alert(1, P1)], {}, 0, 50)
    p1 = streamed_of["a-1"]
    fixes = [alert(20, P1, tx="tx-1", outcome=Outcome.BLOCK), alert(21, P2, amount="7")]
    _, case_of = stream_case_events(fixes, open_cases(streamed, [P1, P2]), None, 0, BACKFILL_ACTOR)
    assert case_of["a-20"] == p1 and case_of["a-21"] != p1
    joining = [(case_of[a.alert_id], a) for a in fixes]
    # tx-1 is in p1's case already (a-1): its amount is not added again.
    events = backfill_case_events(joining, [(p1, P1, 1_019)], {p1}, 60, {(p1, "tx-1")})
    assert [(e.case_id, e.event, e.who, e.batch) for e in events] == [
        (p1, CaseEventKind.JOINED, BACKFILL_ACTOR, None),
        (case_of["a-21"], CaseEventKind.OPENED, BACKFILL_ACTOR, None),
        (p1, CaseEventKind.RETRACTED, BACKFILL_ACTOR, None),
    ]
    cases = fold_cases([*streamed, *events])
    # The payment tx-1 counts once; the retraction is in the history, not the count.
    assert (cases[p1].alerts, cases[p1].amount, cases[p1].outcome) == (
        2,
        Decimal(10),
        Outcome.BLOCK,
    )
    assert cases[p1].status is CaseStatus.OPEN and cases[p1].latest_activity_at == 60
    assert cases[case_of["a-21"]].alerts == 1
    # The case's rows lie in its stream group's decision times and the backfill's.
    assert alert_spans(cases[p1]) == [(1_020, 1_020, 1), (1_019, 1_019, 1), (1_001, 1_001, 1)]
    index = OpenCases()
    index.add([*streamed, *events])
    assert index.open_case_of([P2]) == {P2: case_of["a-21"]}, "the key's next alert joins it"
    with pytest.raises(InvalidCaseActionError, match="stream's"):
        person_event(cases[p1], CaseEventKind.RETRACTED, "bo", 70)


def test_a_case_s_alert_list_marks_what_a_retraction_took_back() -> None:
    def record(alert_id: str, kind: str, decided: int, tx: str = "t1") -> dict[str, object]:
        return {"alertId": alert_id, "kind": kind, "ruleId": 4, "ruleVersion": 1,
                "transactionId": tx, "decisionTime": decided}  # fmt: skip

    listed = mark_retracted(
        [
            record("a1", "ALERT", 10),
            record("r1", "RETRACTION", 50),
            record("c1", "CORRECTION", 51),  # the corrected value, in effect
            record("a2", "ALERT", 11, tx="t2"),
        ]
    )
    assert [a.get("retracted", False) for a in listed] == [True, False, False, False]


def test_a_closed_case_says_how_many_of_its_alerts_are_reviewed_and_being_written() -> None:
    opened, case_of = stream_case_events([alert(1, P1), alert(2, P1), alert(3, P1)], {}, 0, 50)
    case = fold_cases(opened)[case_of["a-1"]]
    closed = ClosedCase.of(case, 2)
    assert (closed.alerts, closed.reviewed, closed.being_written) == (3, 2, 1)
    assert closed.case_id == case.case_id and closed.to_json() == case.to_json()
    assert closed.reviewed_words() == "2 alerts reviewed, 1 being written (reviewed as they land)"
    assert ClosedCase.of(case, 3).reviewed_words() == "3 alerts reviewed"


def test_a_case_s_outcome_is_the_strongest_of_its_alerts_and_a_row_keeps_it() -> None:
    first, case_of = stream_case_events(
        [alert(1, P1, outcome=Outcome.REVIEW), alert(2, P1), alert(3, P2)], {}, 0, 50
    )
    assert [e.outcome for e in first] == [Outcome.REVIEW, Outcome.ALERT]
    cases = fold_cases(first)
    assert cases[case_of["a-1"]].outcome is Outcome.REVIEW
    assert cases[case_of["a-3"]].to_json()["outcome"] == "ALERT"
    later, _ = stream_case_events(
        [alert(4, P1, outcome=Outcome.BLOCK)], open_cases(first, [P1]), 1, 60
    )
    weaker, _ = stream_case_events([alert(5, P1)], open_cases(first, [P1]), 2, 70)
    # The strongest stays, whatever joins after it; and the events survive their rows.
    rows = [CaseEvent.from_row(e.to_row()) for e in [*first, *later, *weaker]]
    assert rows == [*first, *later, *weaker]
    assert fold_cases(rows)[case_of["a-1"]].outcome is Outcome.BLOCK
    # A person's event, or a row of an older Velocity, has none: its alerts were ALERT.
    older = {**first[1].to_row(), "outcome": None}
    assert CaseEvent.from_row(older).outcome is None
    assert fold_cases([CaseEvent.from_row(older)])[case_of["a-3"]].outcome is Outcome.ALERT


def test_people_changes_are_checked_whole() -> None:
    opened, case_of = stream_case_events([alert(1, P1)], {}, 0, 50)
    case = fold_cases(opened)[case_of["a-1"]]
    with pytest.raises(InvalidCaseActionError, match="verdict"):
        person_event(case, CaseEventKind.CLOSED, "bo", 60, verdict="maybe")
    with pytest.raises(InvalidCaseActionError, match="who"):
        person_event(case, CaseEventKind.ASSIGNED, " ", 60, assignee="bo")
    with pytest.raises(InvalidCaseActionError, match="not closed"):
        person_event(case, CaseEventKind.REOPENED, "bo", 60)
    with pytest.raises(InvalidCaseActionError, match="stream's"):
        person_event(case, CaseEventKind.JOINED, "bo", 60)
    closed = person_event(case, CaseEventKind.CLOSED, "bo", 10, verdict="CONFIRMED_FRAUD")
    assert closed.at == 51  # after the case's latest event, whatever the caller's clock
    case = fold_cases([*opened, closed])[case.case_id]
    with pytest.raises(InvalidCaseActionError, match="closed already"):
        person_event(case, CaseEventKind.CLOSED, "bo", 60, verdict="CONFIRMED_FRAUD")


def test_a_case_event_round_trips_as_a_row_and_the_id_is_deterministic() -> None:
    events, case_of = stream_case_events([alert(1, P1), alert(2, P1, rule=7)], {}, 3, 50)
    again, again_of = stream_case_events([alert(2, P1, rule=7), alert(1, P1)], {}, 3, 50)
    assert case_of == again_of and events == again
    from velocity.analyst.cases import CaseEvent

    assert [CaseEvent.from_row(e.to_row()) for e in events] == events
    shown = fold_cases(events)[case_of["a-1"]].to_json(history=True)
    assert shown["caseKey"] == {"payerId": "p1"} and shown["alerts"] == 2
    assert shown["alertsByRule"] == {"4": 1, "7": 1} and shown["history"][0]["event"] == "opened"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("gcr"), st.sampled_from([P1, P2]), st.integers(0, 3))))
def test_open_cases_read_piece_by_piece_are_the_newest_unclosed_case_of_each_key(steps) -> None:
    """Stream groups (g), closes (c) and reopens (r) in any order, the index fed the
    events in pieces as the write-behind reads new files: always the fold's answer."""
    events, index, clock = [], OpenCases(kept_batches=3), 100
    for batch, (step, key, pick) in enumerate(steps):
        clock += 10
        cases = fold_cases(events)
        mine = sorted((c for c in cases.values() if c.case_key == key), key=lambda c: c.case_id)
        new = []
        if step == "g":
            known = index.open_case_of([key])
            new, _ = stream_case_events([alert(batch, key)], known, batch, clock)
        elif mine:
            case = mine[pick % len(mine)]
            kind = CaseEventKind.CLOSED if step == "c" else CaseEventKind.REOPENED
            try:
                new = [person_event(case, kind, "ana", clock, verdict="false positive")]
            except InvalidCaseActionError:
                new = []
        events += new
        index.add(new)
        folded = fold_cases(events).values()
        for k in (P1, P2):
            unclosed = [c for c in folded if c.case_key == k and c.status is not CaseStatus.CLOSED]
            newest = max(unclosed, key=lambda c: (c.opened_at, c.case_id), default=None)
            assert index.open_case_of([k]) == ({} if newest is None else {k: newest.case_id})
        closed = sorted(c.case_id for c in folded if c.status is CaseStatus.CLOSED)
        assert index.closed(sorted(c.case_id for c in folded)) == closed


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("gacr"),
            st.sampled_from([P1, P2]),
            st.integers(0, 3),
            st.integers(0, 30),  # the stream's clock behind the people's, in ms
            st.booleans(),  # the table's next file ends here
        )
    )
)
def test_a_case_book_fed_file_by_file_equals_the_fold_of_every_event(steps) -> None:
    """What the page and ``cases list`` show, read incrementally as new files come, is the
    fold of the whole table: assignments, closes and reopens in any order, stream groups
    whose clock is behind the people's."""
    events, book, unread, clock = [], CaseBook(), [], 100
    for batch, (step, key, pick, skew, file_ends) in enumerate(steps):
        clock += 10
        mine = sorted(
            (c for c in fold_cases(events).values() if c.case_key == key), key=lambda c: c.case_id
        )
        new = []
        if step == "g":
            known = OpenCases()
            known.add(events)
            new, _ = stream_case_events(
                [alert(batch, key)], known.open_case_of([key]), batch, clock - skew
            )
        elif mine:
            case = mine[pick % len(mine)]
            kind = {
                "a": CaseEventKind.ASSIGNED,
                "c": CaseEventKind.CLOSED,
                "r": CaseEventKind.REOPENED,
            }[step]
            try:
                new = [
                    person_event(case, kind, "ana", clock, assignee="bo", verdict="confirmed fraud")
                ]
            except InvalidCaseActionError:
                new = []
        events += new
        unread += new
        if file_ends:
            book.add(unread)
            unread = []
    book.add(unread)
    whole = fold_cases(events)
    assert book.cases.keys() == whole.keys()
    for case_id, case in whole.items():
        assert book.cases[case_id].to_json(history=True) == case.to_json(history=True)


def test_a_case_is_named_by_its_id_or_a_unique_start_as_the_docs_shorten_it() -> None:
    from dataclasses import replace

    from velocity.analyst.cases import Case, resolve_case_id
    from velocity.errors import UsageError

    ids = ["8c1f0b7e-aaaa", "8c1f9d22-bbbb", "3e07c4a1-cccc"]
    cases = {i: Case(i, P1 if n else P2) for n, i in enumerate(ids)}
    cases[ids[1]] = replace(cases[ids[1]], status=CaseStatus.CLOSED)
    for written in ("3e07c4a1-cccc", "3e07", "3e07…", "3e07...", "3E07", " 3e07… "):
        assert resolve_case_id(written, cases, "/data") == "3e07c4a1-cccc", written
    assert resolve_case_id("8c1f0…", cases, "/data") == "8c1f0b7e-aaaa"
    # Ambiguous: every candidate named, with its key and status; unknown: where it looked.
    with pytest.raises(UsageError) as ambiguous:
        resolve_case_id("8c1f…", cases, "/data")
    message = str(ambiguous.value)
    assert "'8c1f' starts 2 case ids" in message and "give more of the id" in message
    assert "8c1f0b7e-aaaa (payerId=p2 open)" in message
    assert "8c1f9d22-bbbb (payerId=p1 closed)" in message
    with pytest.raises(UsageError, match=r"no case id starts with 'ffff' under /data"):
        resolve_case_id("ffff", cases, "/data")
    with pytest.raises(UsageError, match="empty"):
        resolve_case_id("…", cases, "/data")
    many = {f"ab{n:02d}": Case(f"ab{n:02d}", P1) for n in range(12)}
    with pytest.raises(UsageError, match=r"starts 12 case ids: ab00 .* and 2 more;"):
        resolve_case_id("ab", many, "/data")
