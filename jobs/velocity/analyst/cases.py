"""Cases (SPEC §4a): the alerts of one case key gathered while the case is open (pure: no
Spark, Delta, Redis or Airflow; ``velocity.delta.case_store`` reads and writes them).

A case's whole life is its events, only ever appended (``CaseEvent``): ``opened`` and
``joined`` by the stream's write-behind (the alerts of a micro-batch group, with their
count per rule and their payments' amount) and by a backfill (its corrections, alike),
``retracted`` by a backfill (its retractions of alerts of the case), ``assigned``,
``closed`` (with a verdict and a note) and ``reopened`` by people. What a case is now is
the fold of its events (``fold_cases``): nothing else is stored, so every change is kept
(who, when, what).

- The first alert of a case key with no open case opens one; later alerts join it; an
  alert of the key after its case closed opens a new one (``stream_case_events``; a
  backfill's corrections are gathered the same way).
- A case's id is deterministic in its key and its first alert, so a flush redone after a
  crash opens the same case.
- A payment that fired several rules counts once in the case's amount.
- A case's outcome is the strongest of its alerts' (BLOCK > REVIEW > ALERT): each stream
  event records the strongest of the alerts it brought, and the fold keeps the strongest.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import uuid
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol, overload

from velocity.analyst.reviews import NOTE_MAX, WHO_MAX, Verdict, parse_verdict
from velocity.domain.decimals import format_decimal
from velocity.domain.rules import Outcome
from velocity.errors import InvalidFieldError, UsageError

_CASE_NAMESPACE = uuid.UUID("5f1d7c2e-9a43-4c1b-8e0f-6b2d3a9c4e71")
STREAM_ACTOR = "velocity-stream"
BACKFILL_ACTOR = "velocity-backfill"


class CaseStatus(StrEnum):
    OPEN = "open"
    ASSIGNED = "assigned"
    CLOSED = "closed"


class CaseEventKind(StrEnum):
    OPENED = "opened"
    JOINED = "joined"
    ASSIGNED = "assigned"
    CLOSED = "closed"
    REOPENED = "reopened"
    # A backfill retracted alerts of the case (``alerts``: how many; the span: the
    # retractions' decision time). The case's alerts and status are unchanged.
    RETRACTED = "retracted"


class InvalidCaseActionError(InvalidFieldError):
    """A change of a case refused whole; ``field`` names what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field, reason, "; the case is unchanged")


@dataclass(frozen=True)
class CaseEvent:
    """One row of the ``case_events`` table."""

    case_id: str
    case_key: str  # JSON object text, e.g. {"payerId":"p1"}
    event: CaseEventKind
    at: int  # epoch ms
    who: str
    assignee: str | None = None
    verdict: Verdict | None = None
    note: str | None = None
    alerts: int = 0  # joined or opened with (retracted: how many retractions)
    rule_counts: Mapping[int, int] = field(default_factory=dict)
    amount: Decimal = Decimal(0)
    first_alert_at: int | None = None  # decisionTime of the first of these alerts
    latest_alert_at: int | None = None
    # The write-behind group's last batch; None for a person's and a backfill's.
    batch: int | None = None
    # The strongest outcome of the alerts it opened or joined with (None: a person's, or
    # an event recorded before outcome existed, whose alerts were all ALERT).
    outcome: Outcome | None = None

    def to_row(self) -> dict[str, Any]:
        return {
            "caseId": self.case_id,
            "caseKey": self.case_key,
            "event": self.event.value,
            "at": self.at,
            "who": self.who,
            "assignee": self.assignee,
            "verdict": None if self.verdict is None else self.verdict.value,
            "note": self.note,
            "alerts": self.alerts,
            "ruleCounts": json.dumps({str(k): v for k, v in sorted(self.rule_counts.items())}),
            "amount": format_decimal(self.amount),
            "firstAlertAt": self.first_alert_at,
            "latestAlertAt": self.latest_alert_at,
            "batch": self.batch,
            "outcome": None if self.outcome is None else self.outcome.value,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CaseEvent:
        counts = json.loads(row.get("ruleCounts") or "{}")
        return cls(
            case_id=str(row["caseId"]),
            case_key=str(row["caseKey"]),
            event=CaseEventKind(row["event"]),
            at=int(row["at"]),
            who=str(row["who"]),
            assignee=row.get("assignee"),
            verdict=None if row.get("verdict") is None else Verdict(row["verdict"]),
            note=row.get("note"),
            alerts=int(row.get("alerts") or 0),
            rule_counts={int(k): int(v) for k, v in counts.items()},
            amount=Decimal(row.get("amount") or 0),
            first_alert_at=row.get("firstAlertAt"),
            latest_alert_at=row.get("latestAlertAt"),
            batch=row.get("batch"),
            outcome=None if row.get("outcome") is None else Outcome(row["outcome"]),
        )


class HistorySource(Protocol):
    """Where a snapshot's case events are kept (``velocity.delta.case_snapshot``)."""

    def events(self, case_id: str, first: int, count: int) -> list[CaseEvent]:
        """The ``count`` events of case ``case_id`` from row ``first``, in history order."""
        ...


# A case's history not read yet: (where it is, its first row there, how many rows). A
# plain tuple: 150,000 of them unpickle at C speed.
UnreadHistory = tuple[HistorySource, int, int]


class _History:
    """``Case.history``: the case's events in order. A case read from a snapshot holds an
    ``UnreadHistory`` instead (``leave_unread``), followed by the events added to it
    since (``CaseBook``), read at the first use of its history: the first look at 150,000
    cases needs their figures, not their 600,000 events."""

    @overload
    def __get__(self, case: None, owner: type | None = None) -> tuple[()]: ...
    @overload
    def __get__(self, case: Case, owner: type | None = None) -> list[CaseEvent]: ...
    def __get__(self, case: Case | None, owner: type | None = None) -> list[CaseEvent] | tuple[()]:
        if case is None:  # the dataclass's default for the field: no events
            return ()
        held = case.__dict__["history"]
        if type(held) is not list:  # unread, and the events added since (``_add_event``)
            source, first, count, *added = held
            events = source.events(case.case_id, first, count)
            for e in added:
                bisect.insort(events, e, key=_event_order)
            held = case.__dict__["history"] = events
        return held

    def __set__(self, case: Case, events: Iterable[CaseEvent]) -> None:
        case.__dict__["history"] = list(events)


def held_history(case: Case) -> list[CaseEvent] | tuple[Any, ...]:
    """``case``'s history as it is held: its events, or an ``UnreadHistory`` followed by
    the events added since."""
    held: list[CaseEvent] | tuple[Any, ...] = case.__dict__["history"]
    return held


def leave_unread(case: Case, unread: UnreadHistory) -> None:
    """Let ``case``'s history be read from ``unread`` when first used."""
    case.__dict__["history"] = unread


def _add_event(case: Case, e: CaseEvent) -> None:
    """``e`` into ``case``'s history in event order; after an unread history, to be put in
    when it is read (a snapshot's case changed since is not read for it)."""
    held = case.__dict__["history"]
    if type(held) is list:
        bisect.insort(held, e, key=_event_order)
    else:
        case.__dict__["history"] = (*held, e)


@dataclass
class Case:
    """A case as its events left it."""

    case_id: str
    case_key: str
    status: CaseStatus = CaseStatus.OPEN
    assignee: str | None = None
    opened_at: int = 0  # decisionTime of its first alert
    latest_alert_at: int = 0
    latest_activity_at: int = 0  # its newest event of any kind
    alerts: int = 0
    rule_counts: dict[int, int] = field(default_factory=dict)
    amount: Decimal = Decimal(0)
    verdict: Verdict | None = None
    outcome: Outcome = Outcome.ALERT  # the strongest of its alerts' outcomes
    history: _History = _History()

    @property
    def key(self) -> dict[str, str]:
        return dict(json.loads(self.case_key))

    def to_json(self, history: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "caseId": self.case_id,
            "caseKey": self.key,
            "status": self.status.value,
            "assignee": self.assignee,
            "alerts": self.alerts,
            "alertsByRule": {str(k): v for k, v in sorted(self.rule_counts.items())},
            "amount": format_decimal(self.amount),
            "openedAt": self.opened_at,
            "latestAlertAt": self.latest_alert_at,
            "latestActivityAt": self.latest_activity_at,
            "verdict": None if self.verdict is None else self.verdict.value,
            "outcome": self.outcome.value,
        }
        if history:
            out["history"] = [
                {k: v for k, v in e.to_row().items() if k not in ("caseId", "caseKey")}
                for e in self.history
            ]
        return out


@dataclass
class ClosedCase(Case):
    """A case as its close left it, and what the close reviewed (the figure to report,
    not ``alerts``): ``reviewed``, its alerts whose reviews are committed to Delta (the
    close's, in its one commit); ``being_written``, alerts that joined it but whose rows
    the stream's write-behind has not appended yet (it reviews each with the case's
    verdict as it appends it)."""

    reviewed: int = 0
    being_written: int = 0

    @classmethod
    def of(cls, case: Case, reviewed: int) -> ClosedCase:
        fields = {f.name: getattr(case, f.name) for f in dataclasses.fields(Case)}
        return cls(**fields, reviewed=reviewed, being_written=max(0, case.alerts - reviewed))

    def reviewed_words(self) -> str:
        """The figures in words: ``3 alerts reviewed``, then, when some are still being
        written, ``, 2 being written (reviewed as they land)``."""
        text = f"{self.reviewed} alerts reviewed"
        if self.being_written:
            text += f", {self.being_written} being written (reviewed as they land)"
        return text


def strongest(outcomes: Iterable[Outcome]) -> Outcome:
    """The strongest of ``outcomes`` (BLOCK > REVIEW > ALERT); ALERT of none."""
    return max(outcomes, key=lambda o: o.strength, default=Outcome.ALERT)


def case_key_text(field_name: str, value: str) -> str:
    """The one text of a case key (a JSON object of its field)."""
    return json.dumps({field_name: value}, separators=(",", ":"), ensure_ascii=False)


def case_id(key_text: str, first_alert_id: str) -> str:
    return str(uuid.uuid5(_CASE_NAMESPACE, f"{key_text}|{first_alert_id}"))


# A shortened id as people write it (the docs' `8c1f…`): its start, then an ellipsis.
_ELLIPSES = ("…", "...")
# Candidates an ambiguous prefix's error names, at most.
_CANDIDATES_NAMED = 10


def resolve_case_id(given: str, cases: Mapping[str, Case], where: object) -> str:
    """The id of the one case of ``cases`` whose id is ``given`` or starts with it (any
    case; a trailing ``…`` or ``...`` ignored, as the docs shorten ids). Raises
    ``UsageError`` naming the candidates when none or several match; ``where`` (the data
    dir) goes into the message."""
    prefix = given.strip()
    for ellipsis in _ELLIPSES:
        prefix = prefix.removesuffix(ellipsis)
    prefix = prefix.lower()
    if given in cases:
        return given
    if not prefix:
        raise UsageError(f"case id {given!r} is empty; give a case id or its start (8c1f…)")
    matches = sorted(c for c in cases if c.lower().startswith(prefix))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(
            f"no case id starts with {prefix!r} under {where}; `velocity cases list` shows "
            "the cases and their ids"
        )
    named = ", ".join(
        f"{c} ({','.join(f'{k}={v}' for k, v in cases[c].key.items())} {cases[c].status.value})"
        for c in matches[:_CANDIDATES_NAMED]
    )
    more = (
        f" and {len(matches) - _CANDIDATES_NAMED} more" if len(matches) > _CANDIDATES_NAMED else ""
    )
    raise UsageError(
        f"{prefix!r} starts {len(matches)} case ids: {named}{more}; give more of the id"
    )


# A case's alerts in time order: by their payment's eventTime, then ruleId (then rule
# version, transactionId and alertId, so the order is total): the columns to sort by.
ALERT_TIME_ORDER = ("eventTime", "ruleId", "ruleVersion", "transactionId", "alertId")


def mark_retracted(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A case's alert records (SPEC §4 records, or rows) with each ALERT or CORRECTION that
    a RETRACTION among them takes back (the same rule version and transaction, decided
    later) marked ``"retracted": true``: a backfill retracted it, it is no longer in
    effect, and the case lists the retraction beside it."""
    retracted: dict[tuple[Any, Any, Any], int] = {}
    for r in records:
        if r.get("kind") == "RETRACTION":
            decision = (r["ruleId"], r["ruleVersion"], r["transactionId"])
            retracted[decision] = max(retracted.get(decision, r["decisionTime"]), r["decisionTime"])
    out = []
    for r in records:
        decision = (r.get("ruleId"), r.get("ruleVersion"), r.get("transactionId"))
        taken_back = retracted.get(decision)
        fired = r.get("kind") != "RETRACTION"
        if fired and taken_back is not None and r["decisionTime"] < taken_back:
            r = {**r, "retracted": True}
        out.append(r)
    return out


def fold_cases(events: Iterable[CaseEvent]) -> dict[str, Case]:
    """Every case as its events (any order) leave it; events apply by time, a case's
    stream events before people's at the same millisecond."""
    book = CaseBook()
    book.add(events)
    return book.cases


# The kinds the stream's write-behind and a backfill write, never a person
# (``person_event`` refuses them): at one millisecond they come before people's.
_MACHINE_KINDS = frozenset({CaseEventKind.OPENED, CaseEventKind.JOINED, CaseEventKind.RETRACTED})


def _event_order(e: CaseEvent) -> tuple[int, bool, str]:
    return (e.at, e.event not in _MACHINE_KINDS, e.event.value)


@dataclass
class CaseBook:
    """Every case as the events added so far leave it, kept up to date as a table's new
    files are read (the page's queue and ``cases list`` read only what is new, not every
    case event at every look). Events must come in table order, as in ``OpenCases``; then
    the cases equal ``fold_cases`` of all of them: only people's events (always later
    than the case's events before them) set a case's status, and each case's history is
    kept in event order whatever the writers' clocks."""

    cases: dict[str, Case] = field(default_factory=dict)

    def add(self, events: Iterable[CaseEvent]) -> None:
        for e in sorted(events, key=_event_order):
            self._apply(e)

    def _apply(self, e: CaseEvent) -> None:
        case = self.cases.get(e.case_id)
        if case is None:
            case = self.cases[e.case_id] = Case(e.case_id, e.case_key)
        _add_event(case, e)
        case.latest_activity_at = max(case.latest_activity_at, e.at)
        match e.event:
            case CaseEventKind.OPENED | CaseEventKind.JOINED:
                if e.event is CaseEventKind.OPENED or not case.opened_at:
                    case.opened_at = e.first_alert_at or e.at
                case.alerts += e.alerts
                for rule, n in e.rule_counts.items():
                    case.rule_counts[rule] = case.rule_counts.get(rule, 0) + n
                case.amount += e.amount
                case.latest_alert_at = max(case.latest_alert_at, e.latest_alert_at or e.at)
                brought = e.outcome or Outcome.ALERT
                if brought.strength > case.outcome.strength:  # ``strongest``, per event
                    case.outcome = brought
            case CaseEventKind.ASSIGNED:
                case.assignee = e.assignee
                if case.status is not CaseStatus.CLOSED:
                    case.status = CaseStatus.ASSIGNED
            case CaseEventKind.CLOSED:
                case.status, case.verdict = CaseStatus.CLOSED, e.verdict
            case CaseEventKind.REOPENED:
                case.verdict = None
                case.status = CaseStatus.ASSIGNED if case.assignee else CaseStatus.OPEN
            case CaseEventKind.RETRACTED:
                pass  # in its history only: the alerts it retracted stay the case's


@dataclass
class OpenCases:
    """Which case each key's alerts join (its newest case that is not closed), kept up to
    date event by event: the write-behind reads only the case events it has not seen, not the whole
    table at every flush. Events must come in table order (a person's event is always
    later than its case's events before it: ``person_event``)."""

    opened: dict[str, tuple[str, int, int | None]] = field(default_factory=dict)
    open_by_key: dict[str, dict[str, int]] = field(default_factory=dict)
    by_batch: dict[int, dict[str, str]] = field(default_factory=dict)  # recent groups' cases
    opened_in: dict[int, list[tuple[str, str, int]]] = field(default_factory=dict)
    kept_batches: int = 256

    def add(self, events: Iterable[CaseEvent]) -> None:
        for e in sorted(events, key=_event_order):
            if e.event is CaseEventKind.OPENED:
                self.opened[e.case_id] = (e.case_key, e.first_alert_at or e.at, e.batch)
                self.open_by_key.setdefault(e.case_key, {})[e.case_id] = e.first_alert_at or e.at
                if e.batch is not None:
                    opened = (e.case_id, e.case_key, e.first_alert_at or e.at)
                    self.opened_in.setdefault(e.batch, []).append(opened)
            elif e.event is CaseEventKind.CLOSED:
                self.open_by_key.get(e.case_key, {}).pop(e.case_id, None)
            elif e.event is CaseEventKind.REOPENED and e.case_id in self.opened:
                opened_at = self.opened[e.case_id][1]
                self.open_by_key.setdefault(e.case_key, {})[e.case_id] = opened_at
            if e.batch is not None:
                self.by_batch.setdefault(e.batch, {})[e.case_key] = e.case_id
        for recent in (self.by_batch, self.opened_in):
            while len(recent) > self.kept_batches:
                del recent[min(recent)]

    def closed(self, case_ids: Iterable[str]) -> list[str]:
        """Those of ``case_ids`` that are closed now (each opened, and no longer open)."""
        return [
            c
            for c in case_ids
            if c in self.opened and c not in self.open_by_key.get(self.opened[c][0], {})
        ]

    def open_case_of(self, keys: Iterable[str]) -> dict[str, str]:
        """Each of ``keys``' newest case that is not closed."""
        out = {}
        for key in keys:
            candidates = self.open_by_key.get(key)
            if candidates:
                out[key] = max(candidates.items(), key=lambda c: (c[1], c[0]))[0]
        return out

    def opened_by(self, batch: int) -> list[tuple[str, str, int]]:
        """(caseId, caseKey, openedAt) of the cases a recent write-behind group opened."""
        return list(self.opened_in.get(batch, []))


@dataclass(frozen=True)
class CaseAlert:
    """What a case needs of one alert: which, of which rule, when, of which payment."""

    alert_id: str
    rule_id: int
    transaction_id: str
    decision_time: int
    case_key: str
    amount: Decimal | None
    outcome: Outcome = Outcome.ALERT  # its rule version's


def stream_case_events(
    alerts: Sequence[CaseAlert],
    open_cases: Mapping[str, str],
    batch: int | None,
    now_ms: int,
    who: str = STREAM_ACTOR,
) -> tuple[list[CaseEvent], dict[str, str]]:
    """The events by which a write-behind group's ``alerts`` (or a backfill's corrections:
    ``batch`` None, ``who`` ``BACKFILL_ACTOR``) open or join cases, given each case key's
    open case before them; and the case of each alert (by alertId)."""
    by_key: dict[str, list[CaseAlert]] = {}
    for alert in sorted(alerts, key=lambda a: (a.decision_time, a.alert_id)):
        by_key.setdefault(alert.case_key, []).append(alert)
    events, case_of = [], {}
    for key, mine in by_key.items():
        existing = open_cases.get(key)
        chosen = existing or case_id(key, mine[0].alert_id)
        for alert in mine:
            case_of[alert.alert_id] = chosen
        kind = CaseEventKind.JOINED if existing else CaseEventKind.OPENED
        events.append(_gathering_event(chosen, key, kind, mine, now_ms, who, batch))
    return events, case_of


def backfill_case_events(
    joining: Sequence[tuple[str, CaseAlert]],
    retracted: Sequence[tuple[str, str, int]],
    opened: Container[str],
    now_ms: int,
    counted: Container[tuple[str, str]] = (),
) -> list[CaseEvent]:
    """The events by which a backfill's amendments enter cases, each amendment given its
    case already (a correction's chosen by ``stream_case_events``, as a stream alert's; a
    retraction's: the case of the alert it retracts). ``joining``: (caseId, correction)
    pairs; a case not in ``opened`` (the ids of the cases opened so far) is opened by
    them, any other joined. ``retracted``: (caseId, caseKey, decisionTime) of each
    retraction; one ``retracted`` event a case, its span the retractions' decision times.
    ``counted``: (caseId, transactionId) of the payments a case has counted already (an
    alert of it joined before): their amounts are not added again."""
    by_case: dict[str, list[CaseAlert]] = {}
    for chosen, alert in sorted(joining, key=lambda p: (p[1].decision_time, p[1].alert_id)):
        by_case.setdefault(chosen, []).append(alert)
    events = [
        _gathering_event(
            chosen,
            mine[0].case_key,
            CaseEventKind.JOINED if chosen in opened else CaseEventKind.OPENED,
            mine,
            now_ms,
            BACKFILL_ACTOR,
            None,
            {a.transaction_id for a in mine if (chosen, a.transaction_id) in counted},
        )
        for chosen, mine in by_case.items()
    ]
    spans: dict[tuple[str, str], list[int]] = {}
    for chosen, key, decided in retracted:
        spans.setdefault((chosen, key), []).append(decided)
    for (chosen, key), times in sorted(spans.items()):
        events.append(
            CaseEvent(
                case_id=chosen,
                case_key=key,
                event=CaseEventKind.RETRACTED,
                at=now_ms,
                who=BACKFILL_ACTOR,
                alerts=len(times),
                first_alert_at=min(times),
                latest_alert_at=max(times),
            )
        )
    return events


def _gathering_event(
    chosen: str,
    key: str,
    kind: CaseEventKind,
    mine: Sequence[CaseAlert],
    now_ms: int,
    who: str,
    batch: int | None,
    counted: Container[str] = (),
) -> CaseEvent:
    """The ``opened`` or ``joined`` event of ``mine`` (in decision order) into ``chosen``:
    their count per rule, their payments' amount (a payment once, and none the case has
    ``counted`` already), their decision span and strongest outcome."""
    counts: dict[int, int] = {}
    paid: dict[str, Decimal] = {}
    for alert in mine:
        counts[alert.rule_id] = counts.get(alert.rule_id, 0) + 1
        if alert.transaction_id not in counted:
            paid.setdefault(alert.transaction_id, alert.amount or Decimal(0))
    return CaseEvent(
        case_id=chosen,
        case_key=key,
        event=kind,
        at=now_ms,
        who=who,
        alerts=len(mine),
        rule_counts=counts,
        amount=sum(paid.values(), Decimal(0)),
        first_alert_at=mine[0].decision_time,
        latest_alert_at=mine[-1].decision_time,
        batch=batch,
        outcome=strongest(a.outcome for a in mine),
    )


def person_event(
    case: Case,
    kind: CaseEventKind,
    who: object,
    now_ms: int,
    *,
    assignee: object = None,
    verdict: object = None,
    note: object = None,
) -> CaseEvent:
    """An analyst's change of ``case``, checked whole (``InvalidCaseActionError`` names
    the field at fault)."""
    if not isinstance(who, str) or not who.strip() or len(who) > WHO_MAX:
        raise InvalidCaseActionError("who", f"a name of 1 to {WHO_MAX} characters, got {who!r}")
    if note is not None and (not isinstance(note, str) or len(note) > NOTE_MAX):
        raise InvalidCaseActionError("note", f"text of at most {NOTE_MAX} characters")
    checked_verdict = None
    checked_assignee = None
    match kind:
        case CaseEventKind.ASSIGNED:
            if not isinstance(assignee, str) or not assignee.strip() or len(assignee) > WHO_MAX:
                raise InvalidCaseActionError("assignee", f"a name, got {assignee!r}")
            if case.status is CaseStatus.CLOSED:
                raise InvalidCaseActionError("status", f"case {case.case_id} is closed")
            checked_assignee = assignee.strip()
        case CaseEventKind.CLOSED:
            try:
                checked_verdict = parse_verdict(verdict)
            except InvalidFieldError as refused:
                raise InvalidCaseActionError("verdict", refused.reason) from None
            if case.status is CaseStatus.CLOSED:
                raise InvalidCaseActionError("status", f"case {case.case_id} is closed already")
        case CaseEventKind.REOPENED:
            if case.status is not CaseStatus.CLOSED:
                raise InvalidCaseActionError("status", f"case {case.case_id} is not closed")
        case _:
            raise InvalidCaseActionError("event", f"{kind.value} is the stream's, not a person's")
    return CaseEvent(
        case_id=case.case_id,
        case_key=case.case_key,
        event=kind,
        at=max(now_ms, case.latest_activity_at + 1),
        who=who.strip(),
        assignee=checked_assignee,
        verdict=checked_verdict,
        note=None if note is None else note.strip(),
    )


def alert_spans(case: Case) -> list[tuple[int, int, int]] | None:
    """(first, latest decisionTime, alerts) of each write-behind group's alerts that opened
    or joined ``case`` (and of a backfill's corrections that did, and its retractions of
    the case's alerts), newest first: its alerts' rows lie in the alerts table's data
    files of those decision times. None when an event does not say (a table of an older
    Velocity): then only a read of every file finds them."""
    spans = []
    for event in case.history:
        if event.event not in _MACHINE_KINDS:
            continue
        if event.first_alert_at is None or event.latest_alert_at is None:
            return None
        spans.append((event.first_alert_at, event.latest_alert_at, event.alerts))
    return sorted(spans, key=lambda s: (s[1], s[0]), reverse=True)
