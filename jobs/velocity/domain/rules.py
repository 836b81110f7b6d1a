"""The rule model of SPEC §2: parsing, validation and the rule signature.

Invariants callers rely on:
- ``parse_rules`` either returns every entry of the payload or raises
  ``InvalidRuleError`` naming every bad field of every bad rule; it never
  returns part of a payload.
- Enum values are case-insensitive on input and canonical on output; field
  names are case-sensitive.
- Two rules with the same grouping keys (as a set), filter and aggregated
  field have the same ``RuleSignature`` and so share buckets. COUNT ignores
  its field, so every COUNT rule's signature has field None.
- Nothing in a rule is evaluated as code: a filter is an equality map.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction
from typing import Any

from velocity.domain.decimals import decimal_places, json_string
from velocity.domain.schema import (
    NUMERIC_FIELDS,
    RULE_FIELDS,
    canonical_value,
)
from velocity.errors import FieldProblem, InvalidRuleError

MAX_WINDOW_MINUTES = 527_040  # 366 days


class RuleState(StrEnum):
    ACTIVE = "ACTIVE"
    PAUSE = "PAUSE"
    DELETE = "DELETE"
    CONTROL = "CONTROL"
    # A candidate: decided like ACTIVE, its alerts marked shadow and kept from downstream.
    SHADOW = "SHADOW"
    # Written by `velocity rules discard` (never read from a rules file): the candidate
    # of its ruleId is withdrawn.
    DISCARD = "DISCARD"


class Outcome(StrEnum):
    """What a firing of the rule asks of the payment (SPEC §2 ``outcome``), weakest first."""

    ALERT = "ALERT"
    REVIEW = "REVIEW"
    BLOCK = "BLOCK"

    @property
    def strength(self) -> int:
        """0 for ALERT, 1 for REVIEW, 2 for BLOCK: a case or a check takes the strongest."""
        return _OUTCOME_ORDER.index(self)


_OUTCOME_ORDER: tuple[Outcome, ...] = (Outcome.ALERT, Outcome.REVIEW, Outcome.BLOCK)


class Aggregator(StrEnum):
    SUM = "SUM"
    COUNT = "COUNT"
    AVG = "AVG"
    MIN = "MIN"
    MAX = "MAX"
    UNIQUE_COUNT = "UNIQUE_COUNT"


class ControlType(StrEnum):
    CLEAR_STATE_ALL = "CLEAR_STATE_ALL"
    DELETE_RULES_ALL = "DELETE_RULES_ALL"
    EXPORT_RULES_CURRENT = "EXPORT_RULES_CURRENT"


class Operator(StrEnum):
    EQUAL = "="
    NOT_EQUAL = "!="
    GREATER_EQUAL = ">="
    LESS_EQUAL = "<="
    GREATER = ">"
    LESS = "<"

    def holds(self, left: Decimal | Fraction, right: Decimal | Fraction) -> bool:
        """``left OP right``, exact (Fractions compare exactly with Decimals)."""
        return bool(_COMPARISONS[self](left, right))

    @property
    def comparison(self) -> Callable[[Any, Any], Any]:
        """``left OP right`` as the plain function (``operator.gt``, …), for hot loops."""
        return _COMPARISONS[self]


_COMPARISONS: Mapping[Operator, Callable[[Any, Any], Any]] = {
    Operator.EQUAL: operator.eq,
    Operator.NOT_EQUAL: operator.ne,
    Operator.GREATER_EQUAL: operator.ge,
    Operator.LESS_EQUAL: operator.le,
    Operator.GREATER: operator.gt,
    Operator.LESS: operator.lt,
}


_OPERATOR_SPELLINGS: Mapping[str, Operator] = {
    **{op.value: op for op in Operator},
    **{op.name: op for op in Operator},
    "EQ": Operator.EQUAL,
    "NE": Operator.NOT_EQUAL,
    "GTE": Operator.GREATER_EQUAL,
    "LTE": Operator.LESS_EQUAL,
    "GT": Operator.GREATER,
    "LT": Operator.LESS,
}
OPERATOR_SPELLINGS: tuple[str, ...] = tuple(_OPERATOR_SPELLINGS)

# A filter in canonical form: sorted (field, sorted allowed canonical values).
Filter = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class RuleSignature:
    """What decides a bucket's contents: rules with equal signatures share buckets."""

    grouping_keys: tuple[str, ...]  # sorted
    filter: Filter
    aggregate_field: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "groupingKeyNames": list(self.grouping_keys),
            "filter": {name: list(values) for name, values in self.filter},
            "aggregateFieldName": self.aggregate_field,
        }

    @property
    def signature_id(self) -> str:
        """Stable short id, the same in every process and release (a content hash)."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))  # no Decimals
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def passes_filter(self, values: Mapping[str, str | None]) -> bool:
        return all(values.get(name) in allowed for name, allowed in self.filter)

    def key_of(self, values: Mapping[str, str | None]) -> tuple[str, ...] | None:
        """The dynamic key of an event, or None when a grouping field is absent.

        An event without a value for a grouping field is not evaluated by the
        rule: lumping all such events into one "null" group would raise alerts
        that describe no real payer, device or account.
        """
        key = tuple(values.get(name) for name in self.grouping_keys)
        if any(v is None for v in key):
            return None
        return key  # type: ignore[return-value]  # no None left


def key_text(key: Sequence[str]) -> str:
    """The one string form of a key, used in tables and Redis: a compact JSON array
    (``json.dumps(list(key), separators=(",", ":"), ensure_ascii=False)``, made with its
    string encoder directly: the stream makes one per key of every batch)."""
    return "[" + ",".join(map(json_string, key)) + "]"


@dataclass(frozen=True)
class Rule:
    """A rule in force or to be applied. ``version`` is 0 until the rule store assigns one."""

    rule_id: int
    state: RuleState
    grouping_keys: tuple[str, ...]
    aggregator: Aggregator
    aggregate_field: str | None
    operator: Operator
    limit: Decimal
    window_minutes: int
    filter: Filter = ()
    version: int = 0
    cooldown_minutes: int = 0  # SPEC §3 cooldown: 0 notifies every alert
    outcome: Outcome = Outcome.ALERT

    @property
    def window_ms(self) -> int:
        return self.window_minutes * 60_000

    @property
    def cooldown_ms(self) -> int:
        return self.cooldown_minutes * 60_000

    @property
    def signature(self) -> RuleSignature:
        field_name = None if self.aggregator is Aggregator.COUNT else self.aggregate_field
        return RuleSignature(tuple(sorted(self.grouping_keys)), self.filter, field_name)

    def with_version(self, version: int) -> Rule:
        return replace(self, version=version)

    def with_state(self, state: RuleState) -> Rule:
        return replace(self, state=state)

    def to_json(self) -> dict[str, Any]:
        """The rule in canonical SPEC §2 form; ``parse_rules`` reads it back unchanged.

        A non-integral limit is a Decimal: write it with ``velocity.domain.decimals.dumps_json``.
        """
        out: dict[str, Any] = {
            "ruleId": self.rule_id,
            "ruleState": self.state.value,
            "groupingKeyNames": list(self.grouping_keys),
            "aggregateFieldName": self.aggregate_field,
            "aggregatorFunctionType": self.aggregator.value,
            "limitOperatorType": self.operator.value,
            "limit": _limit_json(self.limit),
            "windowMinutes": self.window_minutes,
        }
        if self.aggregate_field is None:
            del out["aggregateFieldName"]
        if self.filter:
            out["filter"] = {
                name: values[0] if len(values) == 1 else list(values)
                for name, values in self.filter
            }
        if self.cooldown_minutes:
            out["cooldownMinutes"] = self.cooldown_minutes
        if self.outcome is not Outcome.ALERT:
            out["outcome"] = self.outcome.value
        return out


def aggregate_text(rule: Rule) -> str:
    """What the rule measures: ``SUM(paymentAmount)``, ``COUNT()``."""
    return f"{rule.aggregator.value}({rule.aggregate_field or ''})"


def rule_summary(rule: Rule) -> str:
    """One line for people, like
    ``SUM(paymentAmount) > 200000 over 1440 min by payerId, beneficiaryId``."""
    text = (
        f"{aggregate_text(rule)} {rule.operator.value} {rule.limit} "
        f"over {rule.window_minutes} min by {', '.join(rule.grouping_keys)}"
    )
    if rule.filter:
        kept = "; ".join(f"{name} in {', '.join(values)}" for name, values in rule.filter)
        text += f" where {kept}"
    if rule.cooldown_minutes:
        text += f", cooldown {rule.cooldown_minutes} min"
    if rule.outcome is not Outcome.ALERT:
        text += f", {rule.outcome.value}"
    return text


def _limit_json(limit: Decimal) -> int | Decimal:
    """Integers stay ints; other limits stay exact Decimals (write them with ``dumps_json``)."""
    if decimal_places(limit) == 0:
        return int(limit)
    return limit


@dataclass(frozen=True)
class StateChange:
    """PAUSE, ACTIVE or DELETE naming only a ruleId: changes the state of the rule in force."""

    rule_id: int
    state: RuleState


@dataclass(frozen=True)
class Control:
    control_type: ControlType


RuleEntry = Rule | StateChange | Control

_ALL_RULE_FIELDS = frozenset(
    {
        "ruleId",
        "ruleState",
        "groupingKeyNames",
        "aggregateFieldName",
        "aggregatorFunctionType",
        "limitOperatorType",
        "limit",
        "windowMinutes",
        "filter",
        "cooldownMinutes",
        "outcome",
        "controlType",
    }
)


@dataclass
class _Checker:
    index: int | None
    rule_id: object | None = None
    problems: list[FieldProblem] = field(default_factory=list)

    def bad(self, name: str, reason: str) -> None:
        self.problems.append(FieldProblem(name, reason, self.index, self.rule_id))


def _enum(checker: _Checker, obj: Mapping[str, Any], name: str, enum: type[StrEnum]) -> Any:
    raw = obj.get(name)
    if raw is None:
        checker.bad(name, f"is required; one of {[e.value for e in enum]}")
        return None
    if not isinstance(raw, str):
        checker.bad(name, f"must be a string, one of {[e.value for e in enum]}; got {raw!r}")
        return None
    try:
        return enum(raw.upper())
    except ValueError:
        checker.bad(name, f"{raw!r} is not one of {[e.value for e in enum]}")
        return None


def _rule_id(checker: _Checker, raw: object) -> int | None:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        checker.bad("ruleId", f"must be a positive integer, got {raw!r}")
        return None
    return raw


def _declared(checker: _Checker, name: str, raw: object, *, numeric: bool = False) -> str | None:
    if not isinstance(raw, str):
        checker.bad(name, f"must be a field name string, got {raw!r}")
        return None
    if raw not in RULE_FIELDS:
        checker.bad(name, f"{raw!r} is not a declared event field; use one of {list(RULE_FIELDS)}")
        return None
    if numeric and raw not in NUMERIC_FIELDS:
        checker.bad(
            name,
            f"{raw!r} is not numeric; SUM, AVG, MIN and MAX need one of {list(NUMERIC_FIELDS)}",
        )
        return None
    return raw


def _filter(checker: _Checker, raw: object) -> Filter:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        checker.bad("filter", f"must be an object of field: value or [values], got {raw!r}")
        return ()
    entries: list[tuple[str, tuple[str, ...]]] = []
    for name, allowed in raw.items():
        if _declared(checker, f"filter.{name}", name) is None:
            continue
        values = allowed if isinstance(allowed, list) else [allowed]
        if not values:
            checker.bad(f"filter.{name}", "must list at least one value")
            continue
        canonical: set[str] = set()
        for value in values:
            try:
                text = canonical_value(name, value)
            except ValueError as exc:
                checker.bad(f"filter.{name}", str(exc))
                continue
            if text is None:
                checker.bad(f"filter.{name}", f"value {value!r} is empty; name a real value")
                continue
            canonical.add(text)
        entries.append((name, tuple(sorted(canonical))))
    return tuple(sorted(entries))


def _limit(checker: _Checker, raw: object) -> Decimal | None:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, Decimal)):
        checker.bad("limit", f"must be a number, got {raw!r}")
        return None
    value = Decimal(str(raw)) if isinstance(raw, float) else Decimal(raw)
    if not value.is_finite():
        checker.bad("limit", f"must be finite, got {raw!r}")
        return None
    return value


def _window_minutes(checker: _Checker, raw: object) -> int | None:
    if isinstance(raw, bool) or not isinstance(raw, int):
        checker.bad("windowMinutes", f"must be an integer number of minutes, got {raw!r}")
        return None
    if not 1 <= raw <= MAX_WINDOW_MINUTES:
        checker.bad("windowMinutes", f"{raw} is outside 1 .. {MAX_WINDOW_MINUTES} (366 days)")
        return None
    return raw


def _cooldown_minutes(checker: _Checker, raw: object) -> int:
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int):
        checker.bad("cooldownMinutes", f"must be an integer number of minutes, got {raw!r}")
        return 0
    if not 0 <= raw <= MAX_WINDOW_MINUTES:
        checker.bad("cooldownMinutes", f"{raw} is outside 0 .. {MAX_WINDOW_MINUTES} (366 days)")
        return 0
    return raw


def parse_rule(
    obj: object, index: int | None = None
) -> tuple[RuleEntry | None, list[FieldProblem]]:
    """One decoded rule object; returns the entry or the problems (never both)."""
    checker = _Checker(index)
    if not isinstance(obj, dict):
        checker.bad("(rule)", f"must be a JSON object, got {type(obj).__name__}")
        return None, checker.problems
    checker.rule_id = obj.get("ruleId")
    for unknown in sorted(set(obj) - _ALL_RULE_FIELDS):
        checker.bad(unknown, f"is not a rule field; the fields are {sorted(_ALL_RULE_FIELDS)}")
    state = _enum(checker, obj, "ruleState", RuleState)
    if state is RuleState.DISCARD:
        checker.bad(
            "ruleState",
            "DISCARD is written by `velocity rules discard ID` (or the page), not by a rules file",
        )
        return None, checker.problems
    if state is RuleState.CONTROL:
        control = _enum(checker, obj, "controlType", ControlType)
        if "ruleId" in obj:
            _rule_id(checker, obj["ruleId"])
        if checker.problems:
            return None, checker.problems
        return Control(control), []
    if "controlType" in obj:
        checker.bad("controlType", "is only allowed with ruleState CONTROL")
    rule_id = _rule_id(checker, obj.get("ruleId"))
    body = set(obj) - {"ruleId", "ruleState"}
    if state in (RuleState.PAUSE, RuleState.DELETE) and not body:
        if checker.problems or rule_id is None:
            return None, checker.problems
        return StateChange(rule_id, state), []

    aggregator = _enum(checker, obj, "aggregatorFunctionType", Aggregator)
    operator_raw = obj.get("limitOperatorType")
    operator = None
    if not isinstance(operator_raw, str) or operator_raw.upper() not in _OPERATOR_SPELLINGS:
        checker.bad(
            "limitOperatorType", f"{operator_raw!r} is not one of {list(OPERATOR_SPELLINGS)}"
        )
    else:
        operator = _OPERATOR_SPELLINGS[operator_raw.upper()]

    keys_raw = obj.get("groupingKeyNames")
    grouping: list[str] = []
    if not isinstance(keys_raw, list):
        checker.bad(
            "groupingKeyNames", f"must be a list of field names (may be empty), got {keys_raw!r}"
        )
    else:
        for i, name in enumerate(keys_raw):
            declared = _declared(checker, f"groupingKeyNames[{i}]", name)
            if declared is not None:
                if declared in grouping:
                    checker.bad(f"groupingKeyNames[{i}]", f"{declared!r} is listed twice")
                else:
                    grouping.append(declared)

    aggregate_field: str | None = None
    if aggregator is not None and aggregator is not Aggregator.COUNT:
        if obj.get("aggregateFieldName") is None:
            checker.bad("aggregateFieldName", f"is required for {aggregator.value}")
        else:
            aggregate_field = _declared(
                checker,
                "aggregateFieldName",
                obj["aggregateFieldName"],
                numeric=aggregator is not Aggregator.UNIQUE_COUNT,
            )
    elif aggregator is Aggregator.COUNT and isinstance(obj.get("aggregateFieldName"), str):
        # Ignored for COUNT (SPEC §2), but kept so an export reads back as written.
        aggregate_field = obj["aggregateFieldName"]

    limit = _limit(checker, obj.get("limit"))
    window = _window_minutes(checker, obj.get("windowMinutes"))
    rule_filter = _filter(checker, obj.get("filter"))
    cooldown = _cooldown_minutes(checker, obj.get("cooldownMinutes"))
    outcome = (
        Outcome.ALERT if obj.get("outcome") is None else _enum(checker, obj, "outcome", Outcome)
    )
    if checker.problems:
        return None, checker.problems
    # Every None above added a problem, so none is left here.
    return (
        Rule(
            rule_id=rule_id,  # type: ignore[arg-type]
            state=state,
            grouping_keys=tuple(grouping),
            aggregator=aggregator,
            aggregate_field=aggregate_field,
            operator=operator,  # type: ignore[arg-type]
            limit=limit,  # type: ignore[arg-type]
            window_minutes=window,  # type: ignore[arg-type]
            filter=rule_filter,
            cooldown_minutes=cooldown,
            outcome=outcome,
        ),
        [],
    )


def decode_rules_text(text: str) -> list[object]:
    """A rules file: one JSON object, a JSON array of objects, or JSON lines."""
    stripped = text.strip()
    if not stripped:
        raise InvalidRuleError([FieldProblem("(file)", "is empty; expected rules as JSON")])
    try:
        decoded = json.loads(stripped, parse_float=Decimal)
        return decoded if isinstance(decoded, list) else [decoded]
    except ValueError:
        pass
    objects: list[object] = []
    problems: list[FieldProblem] = []
    for number, line in enumerate(stripped.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            objects.append(json.loads(line, parse_float=Decimal))
        except ValueError as exc:
            problems.append(FieldProblem(f"(line {number})", f"is not valid JSON: {exc}"))
    if problems:
        raise InvalidRuleError(problems)
    return objects


def parse_rules(text: str) -> list[RuleEntry]:
    """Every entry of a rules file in order, or ``InvalidRuleError`` naming every bad field.

    Entries apply in file order, so a file may activate a rule and pause it later.
    """
    entries: list[RuleEntry] = []
    problems: list[FieldProblem] = []
    for index, obj in enumerate(decode_rules_text(text)):
        entry, found = parse_rule(obj, index)
        problems.extend(found)
        if entry is not None:
            entries.append(entry)
    if problems:
        raise InvalidRuleError(problems)
    return entries


def deciding_rules(rules: Iterable[Rule]) -> list[Rule]:
    """The rules that raise alerts, ACTIVE and SHADOW (a candidate decides exactly as it
    would in force, only its alerts go elsewhere), by (ruleId, version)."""
    return sorted(
        (r for r in rules if r.state in (RuleState.ACTIVE, RuleState.SHADOW)),
        key=lambda r: (r.rule_id, r.version),
    )


def rules_by_signature(rules: Iterable[Rule]) -> dict[RuleSignature, list[Rule]]:
    """Deciding rules grouped by the buckets they share, signatures in a stable order."""
    grouped: dict[RuleSignature, list[Rule]] = {}
    for rule in deciding_rules(rules):
        grouped.setdefault(rule.signature, []).append(rule)
    return dict(sorted(grouped.items(), key=lambda item: item[0].signature_id))


def distinct_counted(rules: Iterable[Rule]) -> frozenset[str]:
    """The signatures whose buckets keep their distinct values: those an active
    UNIQUE_COUNT rule (or candidate) counts. Only they need them, and a bucket keyed by
    a busy field would otherwise carry every amount it ever saw."""
    return frozenset(
        r.signature.signature_id
        for r in deciding_rules(rules)
        if r.aggregator is Aggregator.UNIQUE_COUNT
    )
