"""How applying rule entries changes the versioned rules (pure; the Delta store writes the result).

Invariants: versions of one ruleId count up from 1 without gaps, across deletes,
re-creations and shadow candidates; an entry equal to the latest version of its track
writes nothing; an entry that cannot apply (a PAUSE or DELETE of a rule not in force, a
promote or discard without a candidate) raises before anything is planned, so a file
applies whole or not at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from velocity.domain.decimals import dumps_json
from velocity.domain.rules import (
    Control,
    ControlType,
    Outcome,
    Rule,
    RuleEntry,
    RuleState,
    StateChange,
    parse_rule,
)
from velocity.errors import InvalidFieldError, UnknownRuleError, UsageError, VelocityError


@dataclass(frozen=True)
class RuleChange:
    rule_id: int
    version: int
    state: RuleState


@dataclass
class ApplyResult:
    changes: list[RuleChange] = field(default_factory=list)
    exports: list[list[dict[str, Any]]] = field(default_factory=list)
    clear_state: bool = False


def stored_rule(row: Mapping[str, Any]) -> Rule:
    """One row of the rules table (ruleId, version, ruleState, rule_json) as its Rule."""
    body = json.loads(row["rule_json"], parse_float=Decimal)
    # The state is the row's (a DISCARD is no state a rules file may carry).
    entry, problems = parse_rule({**body, "ruleState": RuleState.ACTIVE.value})
    if not isinstance(entry, Rule):
        # Only validated rules are ever written, so this means the table was edited by hand.
        raise VelocityError(
            f"rules table holds an unreadable version {row['version']} of ruleId {row['ruleId']}: "
            f"{'; '.join(str(p) for p in problems)}"
        )
    return entry.with_version(row["version"]).with_state(RuleState(row["ruleState"]))


@dataclass(frozen=True)
class Promotion:
    """`velocity rules promote ID`: the candidate of ``rule_id`` becomes its ACTIVE version."""

    rule_id: int


@dataclass(frozen=True)
class OutcomeChange:
    """The page's outcome of a rule: a new version of the rule in force, the same but for
    its outcome (planned from the version in force when it applies, so a change made
    meanwhile is kept)."""

    rule_id: int
    outcome: Outcome


def outcome_change(rule_id: int, text: object) -> OutcomeChange:
    """An ``OutcomeChange`` of ``text`` (ALERT, REVIEW or BLOCK, any case), refused with
    the field named otherwise."""
    word = text.strip().upper() if isinstance(text, str) else ""
    chosen = next((o for o in Outcome if o.value == word), None)
    if chosen is None:
        choices = ", ".join(o.value for o in Outcome)
        raise InvalidFieldError("outcome", f"{text!r} is not one of {choices}", "; nothing applied")
    return OutcomeChange(rule_id, chosen)


Change = RuleEntry | Promotion | OutcomeChange


@dataclass
class RuleBook:
    """The rules table read as two tracks per ruleId (SPEC §2): the rule in force (its
    latest ACTIVE, PAUSE or DELETE version) and the candidate beside it (its latest SHADOW
    version, unless discarded or promoted since). Versions count up across both tracks,
    so a (ruleId, version) names one rule and one alert-id scheme, shadow or not."""

    latest_version: dict[int, int] = field(default_factory=dict)
    live: dict[int, Rule] = field(default_factory=dict)  # deleted ones included
    candidates: dict[int, Rule] = field(default_factory=dict)

    @classmethod
    def of(cls, history: Iterable[Rule]) -> RuleBook:
        book = cls()
        for rule in sorted(history, key=lambda r: (r.rule_id, r.version)):
            book.record(rule)
        return book

    def record(self, rule: Rule) -> None:
        """``rule``, the next version of its ruleId, as the table's next row."""
        self.latest_version[rule.rule_id] = rule.version
        if rule.state is RuleState.SHADOW:
            self.candidates[rule.rule_id] = rule
        elif rule.state is RuleState.DISCARD:
            self.candidates.pop(rule.rule_id, None)
        else:
            self.live[rule.rule_id] = rule
            candidate = self.candidates.get(rule.rule_id)
            if candidate is not None and _promotes(rule, candidate):
                del self.candidates[rule.rule_id]

    def standing(self) -> dict[int, Rule]:
        """The ACTIVE and PAUSE rules in force, by ruleId."""
        return {i: r for i, r in self.live.items() if r.state is not RuleState.DELETE}

    def in_force(self) -> list[Rule]:
        """ACTIVE and PAUSE rules and the standing candidates, by (ruleId, version)."""
        rules = [*self.standing().values(), *self.candidates.values()]
        return sorted(rules, key=lambda r: (r.rule_id, r.version))


def _promotes(live: Rule, candidate: Rule) -> bool:
    """An ACTIVE version equal to the candidate is its promotion: shadowing the rule in
    force with itself would fire exactly its alerts, so the candidate ends there."""
    return live.state is RuleState.ACTIVE and _body(live) == _body(candidate)


def _body(rule: Rule) -> Rule:
    return rule.with_version(0).with_state(RuleState.ACTIVE)


# What `velocity rules ACTION ID` and the page's rule buttons do: a new version of the
# rule in force with that state, or the fate of its SHADOW candidate.
RULE_ACTIONS: Mapping[str, str] = {
    "pause": "set a rule in force to PAUSE",
    "activate": "set a rule in force to ACTIVE",
    "delete": "set a rule in force to DELETE",
    "promote": "make ID's SHADOW candidate its ACTIVE version",
    "discard": "withdraw ID's SHADOW candidate",
}


def rule_action(action: str, rule_id: int) -> Change:
    """The change one of ``RULE_ACTIONS`` makes to ``rule_id``."""
    if action == "promote":
        return Promotion(rule_id)
    states = {
        "pause": RuleState.PAUSE,
        "activate": RuleState.ACTIVE,
        "delete": RuleState.DELETE,
        "discard": RuleState.DISCARD,
    }
    return StateChange(rule_id, states[action])


def as_candidates(entries: Sequence[RuleEntry]) -> list[Rule]:
    """Every rule of ``entries`` as a SHADOW candidate, whatever ruleState it says
    (`velocity rules shadow FILE`, the page's Shadow); ``UsageError`` for a state change
    or a control, which has no candidate to be."""
    for entry in entries:
        if not isinstance(entry, Rule):
            raise UsageError(
                f"a shadow candidate is a whole rule, not {entry!r}; apply state changes "
                "and controls as rule changes"
            )
    return [e.with_state(RuleState.SHADOW) for e in entries if isinstance(e, Rule)]


def plan_changes(book: RuleBook, entries: Sequence[Change]) -> tuple[list[Rule], ApplyResult]:
    """The new rule versions ``entries`` make from ``book`` (pure; nothing written)."""
    book = RuleBook(dict(book.latest_version), dict(book.live), dict(book.candidates))
    written: list[Rule] = []
    result = ApplyResult()

    def write(rule: Rule) -> None:
        new = rule.with_version(book.latest_version.get(rule.rule_id, 0) + 1)
        book.record(new)
        written.append(new)
        result.changes.append(RuleChange(new.rule_id, new.version, new.state))

    def put(rule: Rule) -> None:
        current = book.live.get(rule.rule_id)
        # Applying what is already in force changes nothing (a rerun of the same file
        # keeps versions, and with them alert ids, stable).
        if current is None or not _same(current, rule):
            write(rule)

    def shadow(rule: Rule) -> None:
        current = book.candidates.get(rule.rule_id)
        if current is not None and _same(current, rule):
            return
        standing = book.standing().get(rule.rule_id)
        if standing is None or not _promotes(standing, rule):
            write(rule)  # else the rule in force already: its candidate would end at once

    def candidate_of(rule_id: int, doing: str) -> Rule:
        if rule_id not in book.candidates:
            raise UnknownRuleError(
                f"ruleId {rule_id} has no shadow candidate to {doing}; "
                "`velocity rules list` shows the SHADOW rules"
            )
        return book.candidates[rule_id]

    for entry in entries:
        if isinstance(entry, Rule):
            (shadow if entry.state is RuleState.SHADOW else put)(entry)
        elif isinstance(entry, Promotion):
            put(candidate_of(entry.rule_id, "promote").with_state(RuleState.ACTIVE))
        elif isinstance(entry, StateChange) and entry.state is RuleState.DISCARD:
            write(candidate_of(entry.rule_id, "discard").with_state(RuleState.DISCARD))
        elif isinstance(entry, StateChange):
            in_force = book.standing()
            if entry.rule_id not in in_force:
                raise UnknownRuleError(
                    f"ruleId {entry.rule_id} is not in force, so it cannot be set to "
                    f"{entry.state.value}; `velocity rules list` shows the rules in force"
                )
            put(in_force[entry.rule_id].with_state(entry.state))
        elif isinstance(entry, OutcomeChange):
            standing = book.standing()
            if entry.rule_id not in standing:
                raise UnknownRuleError(
                    f"ruleId {entry.rule_id} is not in force, so its outcome cannot be set; "
                    "`velocity rules list` shows the rules in force"
                )
            put(replace(standing[entry.rule_id], outcome=entry.outcome))
        elif isinstance(entry, Control):
            if entry.control_type is ControlType.DELETE_RULES_ALL:
                for rule in sorted(book.standing().values(), key=lambda r: r.rule_id):
                    put(rule.with_state(RuleState.DELETE))
                for rule_id in sorted(book.candidates):
                    write(book.candidates[rule_id].with_state(RuleState.DISCARD))
            elif entry.control_type is ControlType.EXPORT_RULES_CURRENT:
                result.exports.append([r.to_json() for r in book.in_force()])
            else:
                result.clear_state = True
    return written, result


def _same(current: Rule, rule: Rule) -> bool:
    return current.with_version(0) == rule.with_version(0)


def rules_file_text(rules: Sequence[Mapping[str, Any]]) -> str:
    """A JSON array with one rule a line: readable, diffable, and exact (Decimal limits)."""
    if not rules:
        return "[]\n"
    return "[\n" + ",\n".join(f"  {dumps_json(r)}" for r in rules) + "\n]\n"


def outcome_lines(result: ApplyResult, entries: Sequence[Change]) -> list[str]:
    """What `velocity rules apply|pause|activate|delete` prints of an applied change, and
    what the Airflow page shows of it: a line per new version, each export as a rules
    file, or why nothing changed (clearing the state says so itself)."""
    lines = [f"ruleId {c.rule_id}: version {c.version} {c.state.value}" for c in result.changes]
    lines += [rules_file_text(export).rstrip("\n") for export in result.exports]
    if not lines and not result.clear_state:
        only = entries[0] if len(entries) == 1 else None
        if isinstance(only, StateChange):
            lines.append(f"ruleId {only.rule_id} is {only.state.value} already: nothing to apply")
        elif isinstance(only, OutcomeChange):
            lines.append(
                f"ruleId {only.rule_id}'s outcome is {only.outcome.value} already: nothing to apply"
            )
        else:
            lines.append("nothing to apply")
    return lines


# --- which rule versions the stream decided with ---------------------------------------

RuleVersion = tuple[int, int]  # (ruleId, version)


def rule_versions(rules: Iterable[Rule]) -> tuple[RuleVersion, ...]:
    """The (ruleId, version)s of ``rules``, sorted: what a micro-batch decided with."""
    return tuple(sorted((rule.rule_id, rule.version) for rule in rules))


def rule_versions_text(versions: Sequence[RuleVersion]) -> str:
    """Compact JSON of (ruleId, version) pairs, as the rule_epochs table keeps them."""
    return json.dumps([list(pair) for pair in versions], separators=(",", ":"))


@dataclass(frozen=True)
class RuleEpochs:
    """The rule versions the stream decided with, from which micro-batch on (SPEC §3: a
    backfill decides each event with the versions in force when the stream accepted it).

    ``starts`` increase; epoch ``i`` covers the batches from ``starts[i]`` up to the next
    start. A batch before the first start has no record (a data dir of an older Velocity).
    """

    starts: tuple[int, ...] = ()
    versions: tuple[tuple[RuleVersion, ...], ...] = ()

    @classmethod
    def of_rows(cls, rows: Iterable[tuple[int, int, str]]) -> RuleEpochs:
        """From rule_epochs rows (from_batch, recorded_at, rule_versions): of several rows
        for one batch (a batch replayed after a crash, with rules changed meanwhile), the
        latest recorded is the one it decided with."""
        latest: dict[int, tuple[int, str]] = {}
        for from_batch, recorded_at, text in rows:
            if from_batch not in latest or recorded_at >= latest[from_batch][0]:
                latest[from_batch] = (recorded_at, text)
        starts = tuple(sorted(latest))
        return cls(
            starts,
            tuple(
                tuple(sorted((int(i), int(v)) for i, v in json.loads(latest[s][1]))) for s in starts
            ),
        )

    def newest(self) -> tuple[RuleVersion, ...] | None:
        return self.versions[-1] if self.versions else None
