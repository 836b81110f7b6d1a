"""A shadow candidate beside the rule in force, over the last 24 hours (pure: no Spark,
Delta, Redis or Airflow; ``velocity.delta.reader.shadow_comparisons`` reads the rows).

Both sides are counted per transaction (a payment): the candidate fired on it when the
candidate version's decision on it is in effect; the rule in force fired on it when a
decision of any of its ruleId's non-shadow versions is (the rule in force may have been
paused, re-activated or replaced meanwhile: each of those is a version of it). A discarded
candidate's alerts belong to neither side.

Invariants:

- A decision (ruleId, ruleVersion, transactionId) is in effect when its latest row raises
  (ALERT or CORRECTION), a RETRACTION ordered before a row of the same decisionTime (a
  backfill retracts an old value and corrects to the new one at once). With SPEC §3's net
  count of 0 or 1 per decision, that is the count being 1. Only rows decided inside the
  window are seen, so a decision counts when its value in effect was decided in it.
- both + only candidate = the candidate's alerts; both + only in force = the rule in
  force's alerts. The order of rows and of reviews changes nothing.
- The window starts at the later of 24 h before now and the candidate's apply time:
  before that the candidate decided nothing, and the rule in force's alerts would read as
  "only the rule in force".
- A verdict is on a payment: the latest review (``velocity.analyst.reviews.latest_reviews``'s
  rule) of any raising alert of either side on a transaction counts for both sides' alerts
  on it. Analysts review the rule in force's alerts, which reach the case queue; the
  candidate's shadow alerts do not, and would otherwise stay unreviewed. Precision is
  ``velocity.analyst.reviews.precision_of``: confirmed / (confirmed + false positives).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from velocity.analyst.reviews import DAY_MS, Review, Verdict, latest_reviews, precision_of
from velocity.domain.alerts import AlertKind
from velocity.domain.rule_changes import RuleBook
from velocity.domain.rules import Rule

Decision = tuple[int, int, str]  # (ruleId, ruleVersion, transactionId)


@dataclass(frozen=True)
class DecisionRow:
    """What the comparison needs of one row of the alerts table."""

    alert_id: str
    kind: str  # AlertKind's value
    rule_id: int
    rule_version: int
    transaction_id: str
    decision_time: int
    shadow: bool = False  # null in a table of an older Velocity: not shadow

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> DecisionRow:
        """From a row of the alerts table (its column names)."""
        return cls(
            alert_id=str(row["alertId"]),
            kind=str(row["kind"]),
            rule_id=int(row["ruleId"]),
            rule_version=int(row["ruleVersion"]),
            transaction_id=str(row["transactionId"]),
            decision_time=int(row["decisionTime"]),
            shadow=bool(row.get("shadow")),
        )

    @property
    def raises(self) -> bool:
        return self.kind != AlertKind.RETRACTION.value


def in_effect(rows: Iterable[DecisionRow]) -> dict[Decision, list[str]]:
    """The decisions in effect among ``rows``, each with the ids of its raising alerts
    among them (what a review may name)."""
    latest: dict[Decision, tuple[int, bool]] = {}
    raising: dict[Decision, list[str]] = {}
    for row in rows:
        decision = (row.rule_id, row.rule_version, row.transaction_id)
        # A RETRACTION sorts before a raising row of the same time (False < True).
        order = (row.decision_time, row.raises)
        if decision not in latest or order > latest[decision]:
            latest[decision] = order
        if row.raises:
            raising.setdefault(decision, []).append(row.alert_id)
    return {d: sorted(raising[d]) for d, (_, raises) in latest.items() if raises}


@dataclass(frozen=True)
class SideFigures:
    """One side's transactions fired on, and the verdicts on them."""

    alerts: int
    reviewed: int = 0
    confirmed: int = 0
    false_positives: int = 0
    needs_review: int = 0

    @property
    def precision(self) -> float | None:
        return precision_of(self.confirmed, self.false_positives)

    @classmethod
    def of(cls, fired: set[str], verdicts: Mapping[str, Verdict]) -> SideFigures:
        found = [verdicts[tx] for tx in fired if tx in verdicts]
        return cls(
            alerts=len(fired),
            reviewed=len(found),
            confirmed=found.count(Verdict.CONFIRMED_FRAUD),
            false_positives=found.count(Verdict.FALSE_POSITIVE),
            needs_review=found.count(Verdict.NEEDS_REVIEW),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "alerts": self.alerts,
            "reviewed": self.reviewed,
            "confirmed": self.confirmed,
            "falsePositives": self.false_positives,
            "needsReview": self.needs_review,
            "precision": self.precision,
        }


@dataclass(frozen=True)
class ShadowComparison:
    """A candidate beside its rule in force (None for a new ruleId) since ``since``."""

    candidate: Rule
    in_force: Rule | None
    since: int  # epoch ms: the window's start
    candidate_figures: SideFigures
    in_force_figures: SideFigures
    both: int
    only_candidate: int
    only_in_force: int

    def to_json(self) -> dict[str, Any]:
        """What ``/velocity/api/shadow`` answers for one candidate."""
        live = self.in_force
        return {
            "ruleId": self.candidate.rule_id,
            "candidateVersion": self.candidate.version,
            "inForceVersion": None if live is None else live.version,
            "inForceState": None if live is None else live.state.value,
            "since": self.since,
            "candidate": self.candidate_figures.to_json(),
            "inForce": self.in_force_figures.to_json(),
            "both": self.both,
            "onlyCandidate": self.only_candidate,
            "onlyInForce": self.only_in_force,
        }


def window_start(now_ms: int, applied_at: int | None) -> int:
    """Where a candidate's comparison starts: 24 h before ``now_ms``, or when the candidate
    was applied if later."""
    day = now_ms - DAY_MS
    return day if applied_at is None else max(day, applied_at)


def compare(
    candidate: Rule,
    in_force: Rule | None,
    rows: Iterable[DecisionRow],
    reviews: Iterable[Review],
    since: int,
) -> ShadowComparison:
    """``candidate`` beside ``in_force`` over the rows of its ruleId decided at ``since``
    or later (other rows are left out here) and every review (those of other alerts are
    left out here)."""
    rule_id = candidate.rule_id
    # The candidate's rows, and the rule in force's (its non-shadow versions); a discarded
    # candidate's rows are neither.
    seen = [
        r
        for r in rows
        if r.rule_id == rule_id
        and r.decision_time >= since
        and (r.rule_version == candidate.version or not r.shadow)
    ]
    fired: dict[bool, set[str]] = {True: set(), False: set()}  # by "is the candidate's"
    alert_tx: dict[str, str] = {}
    for (_, version, tx), alert_ids in in_effect(seen).items():
        fired[version == candidate.version].add(tx)
        alert_tx.update((a, tx) for a in alert_ids)
    # The latest review of each transaction's alerts: reviews keyed by their transaction.
    by_tx = latest_reviews(
        replace(r, alert_id=alert_tx[r.alert_id]) for r in reviews if r.alert_id in alert_tx
    )
    verdicts = {tx: review.verdict for tx, review in by_tx.items()}
    ours, theirs = fired[True], fired[False]
    return ShadowComparison(
        candidate=candidate,
        in_force=in_force,
        since=since,
        candidate_figures=SideFigures.of(ours, verdicts),
        in_force_figures=SideFigures.of(theirs, verdicts),
        both=len(ours & theirs),
        only_candidate=len(ours - theirs),
        only_in_force=len(theirs - ours),
    )


def compare_candidates(
    book: RuleBook,
    rows: Iterable[DecisionRow],
    reviews: Iterable[Review],
    applied_at: Mapping[tuple[int, int], int],
    now_ms: int,
) -> list[ShadowComparison]:
    """Every standing candidate of ``book`` beside its rule in force, by ruleId, over the
    last 24 h before ``now_ms`` (``applied_at``: when each (ruleId, version) was applied)."""
    rows, reviews = list(rows), list(reviews)
    return [
        compare(
            candidate,
            book.live.get(rule_id),
            rows,
            reviews,
            window_start(now_ms, applied_at.get((rule_id, candidate.version))),
        )
        for rule_id, candidate in sorted(book.candidates.items())
    ]
