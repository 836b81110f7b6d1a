"""Analysts' reviews of alerts, and the precision of each rule version (pure: no Spark,
Delta, Redis or Airflow; ``velocity.delta.review_store`` writes what this module checks).

Invariants:

- A review is all valid or refused whole: its verdict is one of ``Verdict``, its note at
  most ``NOTE_MAX`` characters, its alert one that exists and is not a RETRACTION; a
  refusal (``InvalidReviewError``) names the field, and nothing is written.
- A review takes its ruleId and ruleVersion from its alert, never from the reviewer.
- Reviews are only ever added. The latest review of an alert (highest ``when``) is the one
  that counts; the store gives every review a ``when`` later than the alert's previous
  one (``review_time``), so two reviews of one alert never tie.
- precision = confirmed / (confirmed + false positives) over the latest reviews of a rule
  version's alerts; ``None`` while there is neither. NEEDS_REVIEW counts as reviewed and
  in neither term.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from velocity.domain.alerts import AlertKind
from velocity.errors import InvalidFieldError

NOTE_MAX = 2000  # characters: a paragraph or two; a case file belongs in a case system
WHO_MAX = 200
DAY_MS = 24 * 3600 * 1000
WEEK_MS = 7 * DAY_MS


class Verdict(StrEnum):
    CONFIRMED_FRAUD = "CONFIRMED_FRAUD"
    FALSE_POSITIVE = "FALSE_POSITIVE"
    NEEDS_REVIEW = "NEEDS_REVIEW"

    @property
    def words(self) -> str:
        """How a person says it: "confirmed fraud"."""
        return self.value.lower().replace("_", " ")


class InvalidReviewError(InvalidFieldError):
    """A review refused whole; ``field`` names the column at fault."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field, reason, "; no review recorded")


@dataclass(frozen=True)
class AlertRef:
    """What a review and the precision figures need of an alert (a row of the alerts table
    or a record from the alert stream)."""

    alert_id: str
    kind: str
    rule_id: int
    rule_version: int
    decision_time: int

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> AlertRef:
        """From a SPEC §4 record, or a row of the alerts table (the same field names)."""
        return cls(
            alert_id=str(record["alertId"]),
            kind=str(record["kind"]),
            rule_id=int(record["ruleId"]),
            rule_version=int(record["ruleVersion"]),
            decision_time=int(record["decisionTime"]),
        )


@dataclass(frozen=True)
class Review:
    """One row of the ``alert_reviews`` table."""

    alert_id: str
    rule_id: int
    rule_version: int
    verdict: Verdict
    note: str
    who: str
    when: int  # epoch ms

    def to_json(self) -> dict[str, Any]:
        """The row by its column names (``velocity reviews export`` prints these)."""
        return {
            "alertId": self.alert_id,
            "ruleId": self.rule_id,
            "ruleVersion": self.rule_version,
            "verdict": self.verdict.value,
            "note": self.note,
            "who": self.who,
            "when": self.when,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Review:
        return cls(
            alert_id=str(row["alertId"]),
            rule_id=int(row["ruleId"]),
            rule_version=int(row["ruleVersion"]),
            verdict=Verdict(row["verdict"]),
            note=str(row["note"] or ""),
            who=str(row["who"]),
            when=int(row["when"]),
        )


def parse_verdict(text: object) -> Verdict:
    """A verdict in any case, with spaces or hyphens for underscores ("confirmed fraud")."""
    if isinstance(text, str):
        canonical = text.strip().upper().replace(" ", "_").replace("-", "_")
        if canonical in Verdict.__members__:
            return Verdict(canonical)
    choices = ", ".join(v.value for v in Verdict)
    raise InvalidReviewError("verdict", f"{text!r} is not a verdict; use one of {choices}")


def check_fields(verdict: object, note: object, who: object) -> tuple[Verdict, str, str]:
    """The reviewer's own fields, checked before any table is read: (verdict, note, who).
    The note is kept as written, less surrounding white space."""
    checked = parse_verdict(verdict)
    if note is None:
        note = ""
    if not isinstance(note, str):
        raise InvalidReviewError("note", f"must be text, got {type(note).__name__}")
    note = note.strip()
    if len(note) > NOTE_MAX:
        raise InvalidReviewError(
            "note", f"{len(note)} characters, at most {NOTE_MAX} allowed; shorten it"
        )
    if not isinstance(who, str) or not who.strip():
        raise InvalidReviewError("who", "the reviewer's name is missing")
    if len(who) > WHO_MAX:
        raise InvalidReviewError("who", f"{len(who)} characters, at most {WHO_MAX} allowed")
    return checked, note, who.strip()


def make_review(
    alert_id: str,
    alert: AlertRef | None,
    verdict: object,
    note: object,
    who: object,
    when: int,
) -> Review:
    """The review of ``alert`` (looked up by the caller: None when no alert has that id),
    or ``InvalidReviewError`` naming the field at fault."""
    checked, note_text, reviewer = check_fields(verdict, note, who)
    if not isinstance(alert_id, str) or not alert_id.strip():
        raise InvalidReviewError("alertId", "missing")
    if alert is None or alert.alert_id != alert_id:
        raise InvalidReviewError(
            "alertId", f"no alert {alert_id!r} in the alerts table or on the alert stream"
        )
    if alert.kind == AlertKind.RETRACTION:
        raise InvalidReviewError(
            "alertId",
            f"{alert_id!r} is a RETRACTION, which withdraws an alert; review the alert instead",
        )
    return Review(alert_id, alert.rule_id, alert.rule_version, checked, note_text, reviewer, when)


def review_time(now_ms: int, previous: Review | None) -> int:
    """When a new review of an alert is recorded: now, or 1 ms after the alert's previous
    review when the clock is not past it (two api-server workers, a clock set back), so the
    latest review is always the one recorded last."""
    return now_ms if previous is None else max(now_ms, previous.when + 1)


def latest_reviews(reviews: Iterable[Review]) -> dict[str, Review]:
    """The review that counts for each reviewed alert: its latest (ties, which the store
    never writes, go to the greater row, so the answer does not depend on read order)."""
    latest: dict[str, Review] = {}
    for review in reviews:
        current = latest.get(review.alert_id)
        if current is None or _order(review) > _order(current):
            latest[review.alert_id] = review
    return latest


def _order(review: Review) -> tuple[int, str, str, str]:
    return (review.when, review.verdict.value, review.who, review.note)


@dataclass
class ReviewBook:
    """The latest review of each alert (``latest_reviews``) and how many of them give each
    verdict per (ruleId, ruleVersion), kept up to date as reviews are added in any order
    (the latest wins whenever it comes): the page reads these, not every review."""

    latest: dict[str, Review] = field(default_factory=dict)
    verdicts: dict[tuple[int, int], dict[Verdict, int]] = field(default_factory=dict)

    def add(self, reviews: Iterable[Review]) -> None:
        for review in reviews:
            current = self.latest.get(review.alert_id)
            if current is not None and _order(review) <= _order(current):
                continue
            if current is not None:
                self._count(current, -1)
            self.latest[review.alert_id] = review
            self._count(review, 1)

    def _count(self, review: Review, sign: int) -> None:
        by_verdict = self.verdicts.setdefault((review.rule_id, review.rule_version), {})
        by_verdict[review.verdict] = by_verdict.get(review.verdict, 0) + sign


def precision_of(confirmed: int, false_positives: int) -> float | None:
    """confirmed / (confirmed + false positives); None while there is neither."""
    decided = confirmed + false_positives
    return None if decided == 0 else confirmed / decided


@dataclass(frozen=True)
class VersionPrecision:
    """The figures of one rule version, as the page shows them."""

    rule_id: int
    rule_version: int
    alerts_24h: int
    alerts_7d: int
    reviewed: int
    confirmed: int
    false_positives: int
    needs_review: int

    @property
    def precision(self) -> float | None:
        return precision_of(self.confirmed, self.false_positives)

    def to_json(self) -> dict[str, Any]:
        return {
            "ruleId": self.rule_id,
            "ruleVersion": self.rule_version,
            "alerts24h": self.alerts_24h,
            "alerts7d": self.alerts_7d,
            "reviewed": self.reviewed,
            "confirmed": self.confirmed,
            "falsePositives": self.false_positives,
            "needsReview": self.needs_review,
            "precision": self.precision,
        }


@dataclass(frozen=True)
class AlertVolume:
    """How many alerts (ALERT and CORRECTION: a RETRACTION raises nothing) one rule
    version raised in the last 24 hours and 7 days, by their decisionTime."""

    last_24h: int
    last_7d: int


def precision_by_version(
    volumes: Mapping[tuple[int, int], AlertVolume], reviews: Iterable[Review]
) -> list[VersionPrecision]:
    """Per (ruleId, ruleVersion), by ruleId then version: its alert volume (``volumes``,
    by (ruleId, ruleVersion)) and the latest reviews of its alerts, whenever they were
    raised (a version's precision does not fade after a week). A version appears when it
    has either."""
    book = ReviewBook()
    book.add(reviews)
    return precision_of_versions(volumes, book.verdicts)


def precision_of_versions(
    volumes: Mapping[tuple[int, int], AlertVolume],
    verdicts: Mapping[tuple[int, int], Mapping[Verdict, int]],
) -> list[VersionPrecision]:
    """``precision_by_version`` of the latest reviews' verdicts counted per version
    (``ReviewBook.verdicts``)."""
    counted = {v: found for v, found in verdicts.items() if any(found.values())}
    figures = []
    for rule_id, version in sorted(volumes.keys() | counted.keys()):
        volume = volumes.get((rule_id, version), AlertVolume(0, 0))
        found = counted.get((rule_id, version), {})
        figures.append(
            VersionPrecision(
                rule_id=rule_id,
                rule_version=version,
                alerts_24h=volume.last_24h,
                alerts_7d=volume.last_7d,
                reviewed=sum(found.values()),
                confirmed=found.get(Verdict.CONFIRMED_FRAUD, 0),
                false_positives=found.get(Verdict.FALSE_POSITIVE, 0),
                needs_review=found.get(Verdict.NEEDS_REVIEW, 0),
            )
        )
    return figures
