"""The analysts' queue of cases (pure: no Spark, Delta, Redis or Airflow; the cases come
from ``velocity.delta.case_store``).

Invariants:

- Order: newest activity first by (latestActivityAt, caseId), a total order, so a page
  boundary (``CaseCursor``) is exact: the next page holds the matching cases below it.
  The other orders (``case_sort``) are total too, each ending with the caseId: the case
  opened longest ago first (``oldest``: openedAt ascending), the largest total of its
  payments first (``amount``: ``Case.amount``, a payment counted once), the most alerts
  first (``alerts``), the strongest outcome first (``outcome``: a BLOCK case before every
  REVIEW and ALERT case, newest activity first within one). The boundary carries what
  the order sorts by, and stays exact.
- A filter is refused whole (``InvalidFilterError``) naming the URL field at fault; every
  field given must hold, an empty field does not filter, and an empty status means the
  cases not closed (open or assigned): what the queue is for.
- "Updated since T" is a set of cases (a case changed twice counts once): the matching
  cases whose latest activity is after T.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum

from velocity.analyst.alert_search import InvalidFilterError, KeyPart, parse_key_filter
from velocity.analyst.cases import Case, CaseStatus
from velocity.domain.decimals import format_decimal
from velocity.domain.rules import Outcome

QUEUE_PAGE_SIZE = 50  # cases a page lists unless asked otherwise
QUEUE_PAGE_MAX = 200  # and at most: the page's rows are capped by this
# The queue's fields in a URL (the page's other forms carry them along).
CASE_FILTER_FIELDS = ("case_rule", "case_status", "case_assignee", "case_key", "case_outcome")
# How the page is cut and ordered (a changed filter starts again from the first page).
CASE_PAGE_FIELDS = ("case_before", "case_limit", "case_sort")
# What the status field may say, and the statuses each takes.
STATUS_CHOICES: Mapping[str, frozenset[CaseStatus]] = {
    "": frozenset({CaseStatus.OPEN, CaseStatus.ASSIGNED}),
    "open": frozenset({CaseStatus.OPEN}),
    "assigned": frozenset({CaseStatus.ASSIGNED}),
    "closed": frozenset({CaseStatus.CLOSED}),
    "all": frozenset(CaseStatus),
}
# The assignee field's word for the cases nobody is assigned.
UNASSIGNED = "none"


class CaseSort(StrEnum):
    """The queue's order (URL field ``case_sort``; empty: NEWEST). Each is a total order,
    ending with the caseId (descending), so a page boundary is exact."""

    NEWEST = "newest"  # newest activity first (latestActivityAt)
    OLDEST = "oldest"  # the case opened longest ago first (openedAt, ascending)
    AMOUNT = "amount"  # the largest total of its payments first (Case.amount)
    ALERTS = "alerts"  # the most alerts first
    OUTCOME = "outcome"  # strongest outcome first (BLOCK, REVIEW, ALERT), then newest


@dataclass(frozen=True)
class CaseFilter:
    """Which cases a person asked for; the default takes every case not closed."""

    rule_id: int | None = None
    statuses: frozenset[CaseStatus] = STATUS_CHOICES[""]
    assignee: str | None = None  # a name (any case), or UNASSIGNED
    key: tuple[KeyPart, ...] = ()
    outcome: Outcome | None = None  # the cases whose strongest outcome is this one
    # The fields as written (stripped), for the form and the links that keep the filter.
    text: Mapping[str, str] = field(default_factory=dict, compare=False)

    def matches(self, case: Case) -> bool:
        if case.status not in self.statuses:
            return False
        if self.rule_id is not None and not case.rule_counts.get(self.rule_id):
            return False
        if self.outcome is not None and case.outcome is not self.outcome:
            return False
        if self.assignee is not None:
            if self.assignee == UNASSIGNED:
                if case.assignee:
                    return False
            elif (case.assignee or "").casefold() != self.assignee.casefold():
                return False
        key = case.key
        return all(part.matches(key) for part in self.key)

    def query(self) -> dict[str, str]:
        """The non-empty fields as URL parameters, as written."""
        return {name: self.text[name] for name in CASE_FILTER_FIELDS if self.text.get(name)}


def parse_case_filter(params: Mapping[str, str], rule_ids: Collection[int] | None) -> CaseFilter:
    """The filter of URL parameters ``case_rule``, ``case_status``, ``case_assignee``,
    ``case_key``, ``case_outcome`` (others are ignored); ``rule_ids``: the ruleIds that
    ever existed (None: not checked)."""
    text = {name: str(params.get(name) or "").strip() for name in CASE_FILTER_FIELDS}
    rule_id = None
    rule_text = text["case_rule"]
    if rule_text:
        if not (rule_text.isascii() and rule_text.isdigit() and len(rule_text) <= 18):
            raise InvalidFilterError("case_rule", f"{rule_text!r} is not a ruleId (a number)")
        rule_id = int(rule_text)
        if rule_ids is not None and rule_id not in rule_ids:
            known = ", ".join(str(r) for r in sorted(rule_ids)) or "none"
            raise InvalidFilterError(
                "case_rule", f"no ruleId {rule_id} in the rules table (ruleIds: {known})"
            )
    status_text = text["case_status"].lower()
    if status_text not in STATUS_CHOICES:
        choices = ", ".join(c for c in STATUS_CHOICES if c)
        raise InvalidFilterError(
            "case_status",
            f"{text['case_status']!r} is not a status; use one of {choices}, or leave it "
            "empty for the cases not closed",
        )
    try:
        key = parse_key_filter(text["case_key"])
    except InvalidFilterError as exc:
        raise InvalidFilterError("case_key", exc.reason) from None
    return CaseFilter(
        rule_id=rule_id,
        statuses=STATUS_CHOICES[status_text],
        assignee=text["case_assignee"] or None,
        key=key,
        outcome=parse_outcome_choice(text["case_outcome"], "case_outcome"),
        text={k: v for k, v in text.items() if v},
    )


def parse_outcome_choice(text: str, field_name: str) -> Outcome | None:
    """An outcome as written in a filter (any case; empty: None, every outcome)."""
    if not text:
        return None
    try:
        return Outcome(text.upper())
    except ValueError:
        choices = ", ".join(o.value for o in Outcome)
        raise InvalidFilterError(
            field_name,
            f"{text!r} is not an outcome; use one of {choices}, or leave it empty for every "
            "outcome",
        ) from None


def parse_case_sort(text: str | None) -> CaseSort:
    """The queue's order as written (any case; empty: newest activity first)."""
    if not text:
        return CaseSort.NEWEST
    try:
        return CaseSort(text.lower())
    except ValueError:
        choices = ", ".join(s.value for s in CaseSort)
        raise InvalidFilterError(
            "case_sort", f"{text!r} is not an order; use one of {choices}"
        ) from None


@dataclass(frozen=True)
class CaseCursor:
    """A page boundary: the last case listed, as its order places it. ``activity``: its
    latestActivityAt (sorted by newest or by outcome, else 0); ``case_id``; ``outcome``:
    its outcome when sorted by outcome; ``figure``: what the other orders sort by (its
    openedAt, its payments' total, its alert count)."""

    activity: int
    case_id: str
    outcome: Outcome | None = None
    sort: CaseSort = CaseSort.NEWEST
    figure: Decimal = Decimal(0)

    def __post_init__(self) -> None:
        if self.outcome is not None and self.sort is CaseSort.NEWEST:
            object.__setattr__(self, "sort", CaseSort.OUTCOME)

    @property
    def key(self) -> tuple[int, Decimal, int, str]:
        """The order of the queue, descending: the greater, the nearer the top."""
        strength = -1 if self.outcome is None else self.outcome.strength
        figure = -self.figure if self.sort is CaseSort.OLDEST else self.figure
        return (strength, figure, self.activity, self.case_id)

    def text(self) -> str:
        """``<latestActivityAt>_<caseId>`` (newest), ``<outcome>_<latestActivityAt>_<caseId>``
        (outcome), ``<order>_<figure>_<caseId>`` (oldest, amount, alerts): a boundary of
        one order is not read as another's."""
        if self.sort is CaseSort.NEWEST:
            return f"{self.activity}_{self.case_id}"
        if self.sort is CaseSort.OUTCOME and self.outcome is not None:
            return f"{self.outcome.value}_{self.activity}_{self.case_id}"
        return f"{self.sort.value}_{format_decimal(self.figure)}_{self.case_id}"

    @classmethod
    def of(cls, case: Case, sort: CaseSort = CaseSort.NEWEST) -> CaseCursor:
        match sort:
            case CaseSort.OUTCOME:
                return cls(case.latest_activity_at, case.case_id, case.outcome, sort)
            case CaseSort.OLDEST:
                return cls(0, case.case_id, None, sort, Decimal(case.opened_at))
            case CaseSort.AMOUNT:
                return cls(0, case.case_id, None, sort, case.amount)
            case CaseSort.ALERTS:
                return cls(0, case.case_id, None, sort, Decimal(case.alerts))
        return cls(case.latest_activity_at, case.case_id)


# The shape of each order's page boundary, as a refusal names it.
_CURSOR_SHAPES = {
    CaseSort.NEWEST: "<latestActivityAt>_<caseId>",
    CaseSort.OUTCOME: "<outcome>_<latestActivityAt>_<caseId>",
    CaseSort.OLDEST: "oldest_<openedAt>_<caseId>",
    CaseSort.AMOUNT: "amount_<amount>_<caseId>",
    CaseSort.ALERTS: "alerts_<alerts>_<caseId>",
}


def _whole(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 19


def _decimal(text: str) -> Decimal | None:
    whole, dot, part = text.removeprefix("-").partition(".")
    if not _whole(whole) or (dot and not _whole(part)):
        return None
    return Decimal(text)


def parse_case_cursor(text: str, sort: CaseSort = CaseSort.NEWEST) -> CaseCursor:
    """A cursor as ``CaseCursor.text`` writes it for ``sort`` (``_CURSOR_SHAPES``)."""
    rest = text.strip()
    refused = InvalidFilterError(
        "case_before", f"{text!r} is not a page boundary ({_CURSOR_SHAPES[sort]})"
    )
    word = ""
    if sort is not CaseSort.NEWEST:
        word, _, rest = rest.partition("_")
    figure, sep, case_id = rest.partition("_")
    if not (sep and case_id):
        raise refused
    if sort in (CaseSort.NEWEST, CaseSort.OUTCOME):
        outcome = next((o for o in Outcome if o.value == word), None)
        if not _whole(figure) or (sort is CaseSort.OUTCOME and outcome is None):
            raise refused
        return CaseCursor(int(figure), case_id, outcome, sort)
    value = _decimal(figure) if sort is CaseSort.AMOUNT else None
    if sort is not CaseSort.AMOUNT and _whole(figure):
        value = Decimal(int(figure))
    if word != sort.value or value is None:
        raise refused
    return CaseCursor(0, case_id, None, sort, value)


def parse_case_limit(text: str | None) -> int:
    """How many cases a page lists: ``QUEUE_PAGE_SIZE`` unless 1 to ``QUEUE_PAGE_MAX``."""
    if not text:
        return QUEUE_PAGE_SIZE
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= QUEUE_PAGE_MAX:
        raise InvalidFilterError(
            "case_limit", f"{text!r} is not a number from 1 to {QUEUE_PAGE_MAX}"
        )
    return int(text)


@dataclass(frozen=True)
class CaseQuery:
    """A page of the queue as asked for: the filter, the boundary, the page size and the
    order."""

    filter: CaseFilter = field(default_factory=CaseFilter)
    before: CaseCursor | None = None
    limit: int = QUEUE_PAGE_SIZE
    sort: CaseSort = CaseSort.NEWEST


def parse_case_query(params: Mapping[str, str], rule_ids: Collection[int] | None) -> CaseQuery:
    before = str(params.get("case_before") or "").strip()
    sort = parse_case_sort(str(params.get("case_sort") or "").strip() or None)
    return CaseQuery(
        parse_case_filter(params, rule_ids),
        parse_case_cursor(before, sort) if before else None,
        parse_case_limit(str(params.get("case_limit") or "").strip() or None),
        sort,
    )


@dataclass(frozen=True)
class CasePage:
    """Cases in the query's order; ``older``: the next page's boundary, None at the last;
    ``matching``: how many cases pass the filter in all (every page)."""

    cases: Sequence[Case]
    older: CaseCursor | None
    matching: int


def queue_page(cases: Iterable[Case], query: CaseQuery) -> CasePage:
    """The first ``query.limit`` cases in the query's order (``CaseSort``) that pass the
    filter and lie below the boundary."""
    chosen = [c for c in cases if query.filter.matches(c)]

    def place(c: Case) -> tuple[int, Decimal, int, str]:
        return CaseCursor.of(c, query.sort).key

    below = [c for c in chosen if query.before is None or place(c) < query.before.key]
    below.sort(key=place, reverse=True)
    shown = below[: query.limit]
    older = CaseCursor.of(shown[-1], query.sort) if shown and len(below) > query.limit else None
    return CasePage(shown, older, len(chosen))


def newest_activity(cases: Iterable[Case]) -> int:
    """The latest activity of any case (0 for none): the moment a drawn page is as of."""
    return max((c.latest_activity_at for c in cases), default=0)


def updated_since(cases: Iterable[Case], case_filter: CaseFilter, since_ms: int) -> list[str]:
    """The caseIds that pass ``case_filter`` and changed after ``since_ms``, newest first."""
    changed = [c for c in cases if c.latest_activity_at > since_ms and case_filter.matches(c)]
    return [c.case_id for c in sorted(changed, key=lambda c: CaseCursor.of(c).key, reverse=True)]
