"""SPEC §2: every rule field, spelling and control type; validation; signatures; file formats."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings

from tests.builders import (
    ABSENT,
    AGGREGATORS,
    CONTROL_TYPES,
    OPERATOR_NAMES,
    OPERATOR_SHORT,
    OPERATOR_SYMBOLS,
    RULE_USABLE_FIELDS,
    json_text,
    make_rule,
    rule_obj,
    rule_objs,
    rules_text,
)
from velocity.domain.decimals import dumps_json
from velocity.domain.rules import (
    MAX_WINDOW_MINUTES,
    Aggregator,
    Control,
    ControlType,
    Operator,
    Rule,
    RuleEntry,
    RuleSignature,
    RuleState,
    StateChange,
    deciding_rules,
    key_text,
    parse_rule,
    parse_rules,
    rules_by_signature,
)
from velocity.errors import FieldProblem, InvalidRuleError, UsageError


def problems_of(obj: Any) -> list[FieldProblem]:
    entry, problems = parse_rule(obj)
    assert entry is None, f"expected rejected, got {entry!r}"
    assert problems, "a rejected rule must name at least one problem"
    return problems


def fields_of(problems: list[FieldProblem]) -> set[str]:
    return {p.field for p in problems}


def parse_one(obj: dict[str, Any]) -> RuleEntry:
    """Parse through the file path (JSON text), as users' rules arrive."""
    entries = parse_rules(json_text(obj))
    assert len(entries) == 1
    return entries[0]


def one_rule(obj: dict[str, Any]) -> Rule:
    entry = parse_one(obj)
    assert isinstance(entry, Rule), entry
    return entry


# ---------------------------------------------------------------- the SPEC example


def test_spec_example_rule_parses_to_its_fields() -> None:
    rule = one_rule(rule_obj(filter={"paymentType": "CRD"}))
    assert rule.rule_id == 1
    assert rule.state is RuleState.ACTIVE
    assert rule.grouping_keys == ("payerId", "beneficiaryId")
    assert rule.aggregate_field == "paymentAmount"
    assert rule.aggregator is Aggregator.SUM
    assert rule.operator is Operator.GREATER
    assert rule.limit == Decimal(200000)
    assert rule.window_minutes == 1440
    assert rule.window_ms == 1440 * 60_000
    assert rule.filter == (("paymentType", ("CRD",)),)
    assert rule.version == 0


# ---------------------------------------------------------------- operators and enums


_EXPECTED_OPERATORS = [Operator(s) for s in OPERATOR_SYMBOLS]
_SPELLING_CASES = [
    (spelling, op)
    for spellings in (OPERATOR_SYMBOLS, OPERATOR_NAMES, OPERATOR_SHORT)
    for spelling, op in zip(spellings, _EXPECTED_OPERATORS, strict=True)
]


@pytest.mark.parametrize("case", [str.upper, str.lower, str.title], ids=["upper", "lower", "title"])
@pytest.mark.parametrize(("spelling", "expected"), _SPELLING_CASES)
def test_every_operator_spelling_in_any_case(spelling: str, expected: Operator, case: Any) -> None:
    rule = one_rule(rule_obj(limitOperatorType=case(spelling)))
    assert rule.operator is expected
    assert rule.to_json()["limitOperatorType"] == expected.value


@pytest.mark.parametrize("spelling", ["==", "=>", "<>", "gt ", "GREATER_THAN", "", 1, None])
def test_unknown_operator_is_rejected_naming_the_field(spelling: object) -> None:
    problems = problems_of(rule_obj(limitOperatorType=spelling))
    assert fields_of(problems) == {"limitOperatorType"}
    assert "limitOperatorType" in str(problems[0])


@pytest.mark.parametrize(
    ("left", "op", "right", "expected"),
    [
        (Decimal(2), Operator.EQUAL, Decimal("2.00"), True),
        (Decimal(2), Operator.NOT_EQUAL, Decimal(2), False),
        (Decimal(2), Operator.GREATER_EQUAL, Decimal(2), True),
        (Decimal(2), Operator.LESS_EQUAL, Decimal(2), True),
        (Decimal(2), Operator.GREATER, Decimal(2), False),
        (Decimal(2), Operator.LESS, Decimal(2), False),
        (Decimal(3), Operator.GREATER, Decimal(2), True),
        (Decimal(1), Operator.LESS, Decimal(2), True),
    ],
)
def test_operator_holds(left: Decimal, op: Operator, right: Decimal, expected: bool) -> None:
    assert op.holds(left, right) is expected


def test_operator_compares_fractions_with_decimals_exactly() -> None:
    from fractions import Fraction

    third = Fraction(1, 3)
    assert not Operator.EQUAL.holds(third, Decimal("0.3333333333333333333333333333"))
    assert Operator.GREATER.holds(third, Decimal("0.3333333333333333333333333333"))
    assert Operator.EQUAL.holds(Fraction(5, 2), Decimal("2.5"))


@pytest.mark.parametrize("state", ["active", "Active", "aCTIVE", "ACTIVE"])
@pytest.mark.parametrize("aggregator", ["sum", "Sum", "SUM"])
def test_enums_are_case_insensitive_and_stored_canonical(state: str, aggregator: str) -> None:
    rule = one_rule(rule_obj(ruleState=state, aggregatorFunctionType=aggregator))
    assert rule.state is RuleState.ACTIVE
    assert rule.aggregator is Aggregator.SUM
    assert rule.to_json()["ruleState"] == "ACTIVE"
    assert rule.to_json()["aggregatorFunctionType"] == "SUM"


@pytest.mark.parametrize("aggregator", AGGREGATORS)
def test_every_aggregator_in_lower_case(aggregator: str) -> None:
    field = "ip" if aggregator in ("COUNT", "UNIQUE_COUNT") else "paymentAmount"
    rule = one_rule(rule_obj(aggregatorFunctionType=aggregator.lower(), aggregateFieldName=field))
    assert rule.aggregator is Aggregator(aggregator)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ruleState", "RUNNING"),
        ("ruleState", 1),
        ("ruleState", ABSENT),
        ("aggregatorFunctionType", "MEDIAN"),
        ("aggregatorFunctionType", ABSENT),
        ("aggregatorFunctionType", ["SUM"]),
    ],
)
def test_bad_enum_is_rejected_naming_the_field(field: str, value: object) -> None:
    problems = problems_of(rule_obj(**{field: value}))
    assert field in fields_of(problems)
    assert any(field in str(p) for p in problems)


@pytest.mark.parametrize("name", ["payerid", "PayerId", "PAYERID", "payer_id"])
def test_field_names_are_case_sensitive(name: str) -> None:
    problems = problems_of(rule_obj(groupingKeyNames=[name]))
    assert fields_of(problems) == {"groupingKeyNames[0]"}
    assert name in problems[0].reason


# ---------------------------------------------------------------- CONTROL, PAUSE, DELETE


@pytest.mark.parametrize("control", CONTROL_TYPES)
@pytest.mark.parametrize("with_rule_id", [False, True])
def test_control_with_each_control_type(control: str, with_rule_id: bool) -> None:
    obj: dict[str, Any] = {"ruleState": "control", "controlType": control.lower()}
    if with_rule_id:
        obj["ruleId"] = 3
    assert parse_one(obj) == Control(ControlType(control))


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"ruleState": "CONTROL"}, "controlType"),
        ({"ruleState": "CONTROL", "controlType": "RESTART"}, "controlType"),
        ({"ruleState": "CONTROL", "controlType": "CLEAR_STATE_ALL", "ruleId": 0}, "ruleId"),
        ({"ruleState": "CONTROL", "controlType": "CLEAR_STATE_ALL", "color": 1}, "color"),
    ],
)
def test_bad_control_is_rejected_naming_the_field(obj: dict[str, Any], field: str) -> None:
    assert field in fields_of(problems_of(obj))


def test_control_type_outside_control_is_rejected() -> None:
    problems = problems_of(rule_obj(controlType="CLEAR_STATE_ALL"))
    assert fields_of(problems) == {"controlType"}


@pytest.mark.parametrize("state", ["PAUSE", "pause", "DELETE", "Delete"])
def test_pause_or_delete_with_only_rule_id_is_a_state_change(state: str) -> None:
    entry = parse_one({"ruleId": 7, "ruleState": state})
    assert entry == StateChange(7, RuleState(state.upper()))


@pytest.mark.parametrize("state", ["PAUSE", "DELETE"])
@pytest.mark.parametrize("rule_id", [ABSENT, 0, -1, "7", None])
def test_state_change_needs_a_positive_rule_id(state: str, rule_id: object) -> None:
    obj: dict[str, Any] = {"ruleState": state}
    if rule_id is not ABSENT:
        obj["ruleId"] = rule_id
    assert fields_of(problems_of(obj)) == {"ruleId"}


def test_pause_with_a_full_body_is_a_paused_rule() -> None:
    rule = one_rule(rule_obj(ruleState="pause"))
    assert rule.state is RuleState.PAUSE
    assert deciding_rules([rule]) == []


def test_active_with_only_rule_id_names_every_missing_field() -> None:
    problems = problems_of({"ruleId": 1, "ruleState": "ACTIVE"})
    assert fields_of(problems) >= {
        "aggregatorFunctionType",
        "limitOperatorType",
        "groupingKeyNames",
        "limit",
        "windowMinutes",
    }


# ---------------------------------------------------------------- field validation


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"ruleId": 0}, "ruleId"),
        ({"ruleId": -5}, "ruleId"),
        ({"ruleId": "1"}, "ruleId"),
        ({"ruleId": Decimal("1.0")}, "ruleId"),
        ({"ruleId": True}, "ruleId"),
        ({"ruleId": ABSENT}, "ruleId"),
        ({"groupingKeyNames": "payerId"}, "groupingKeyNames"),
        ({"groupingKeyNames": None}, "groupingKeyNames"),
        ({"groupingKeyNames": ABSENT}, "groupingKeyNames"),
        ({"groupingKeyNames": ["payerId", 3]}, "groupingKeyNames[1]"),
        ({"groupingKeyNames": ["merchantId"]}, "groupingKeyNames[0]"),
        ({"groupingKeyNames": ["transactionId"]}, "groupingKeyNames[0]"),
        ({"groupingKeyNames": ["eventTime"]}, "groupingKeyNames[0]"),
        ({"groupingKeyNames": ["payerId", "ip", "payerId"]}, "groupingKeyNames[2]"),
        ({"aggregateFieldName": ABSENT}, "aggregateFieldName"),
        ({"aggregateFieldName": None}, "aggregateFieldName"),
        ({"aggregateFieldName": "merchantId"}, "aggregateFieldName"),
        ({"aggregateFieldName": "transactionId"}, "aggregateFieldName"),
        ({"aggregateFieldName": "payerId"}, "aggregateFieldName"),  # SUM of a non-number
        ({"limit": "100"}, "limit"),
        ({"limit": None}, "limit"),
        ({"limit": ABSENT}, "limit"),
        ({"limit": True}, "limit"),
        ({"limit": float("nan")}, "limit"),
        ({"limit": float("inf")}, "limit"),
        ({"windowMinutes": 0}, "windowMinutes"),
        ({"windowMinutes": MAX_WINDOW_MINUTES + 1}, "windowMinutes"),
        ({"windowMinutes": -1}, "windowMinutes"),
        ({"windowMinutes": Decimal("1.5")}, "windowMinutes"),
        ({"windowMinutes": "5"}, "windowMinutes"),
        ({"windowMinutes": ABSENT}, "windowMinutes"),
        ({"filter": ["paymentType"]}, "filter"),
        ({"filter": "CRD"}, "filter"),
        ({"filter": {"merchantId": "m1"}}, "filter.merchantId"),
        ({"filter": {"transactionId": "t1"}}, "filter.transactionId"),
        ({"filter": {"payerId": []}}, "filter.payerId"),
        ({"filter": {"payerId": {}}}, "filter.payerId"),
        ({"filter": {"payerId": [["p1"]]}}, "filter.payerId"),
        ({"filter": {"payerId": None}}, "filter.payerId"),
        ({"filter": {"payerId": ""}}, "filter.payerId"),
        ({"filter": {"paymentType": "XYZ"}}, "filter.paymentType"),
        ({"filter": {"paymentAmount": "-1"}}, "filter.paymentAmount"),
        ({"ruleID": 1}, "ruleID"),
        ({"window": 5}, "window"),
    ],
    ids=repr,
)
def test_invalid_field_is_rejected_with_a_message_naming_it(
    overrides: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidRuleError) as caught:
        parse_rules(json_text(rule_obj(**overrides)))
    problems = caught.value.problems
    assert field in fields_of(problems), problems
    assert field in str(caught.value)
    assert isinstance(caught.value, UsageError)  # the CLI maps it to exit code 2


@pytest.mark.parametrize("aggregator", ["SUM", "AVG", "MIN", "MAX"])
@pytest.mark.parametrize("field", ["payerId", "paymentType", "ip", "deviceId", "action"])
def test_numeric_aggregators_need_a_numeric_field(aggregator: str, field: str) -> None:
    problems = problems_of(rule_obj(aggregatorFunctionType=aggregator, aggregateFieldName=field))
    assert fields_of(problems) == {"aggregateFieldName"}
    assert "numeric" in problems[0].reason


@pytest.mark.parametrize("field", RULE_USABLE_FIELDS)
def test_unique_count_takes_any_declared_field(field: str) -> None:
    rule = one_rule(rule_obj(aggregatorFunctionType="UNIQUE_COUNT", aggregateFieldName=field))
    assert rule.aggregate_field == field
    assert rule.signature.aggregate_field == field


@pytest.mark.parametrize("field", [ABSENT, None, "paymentAmount", "payerId"])
def test_count_ignores_its_field(field: object) -> None:
    rule = one_rule(rule_obj(aggregatorFunctionType="COUNT", aggregateFieldName=field))
    assert rule.aggregator is Aggregator.COUNT
    assert rule.signature.aggregate_field is None


def test_all_problems_of_a_rule_are_reported_at_once() -> None:
    obj = rule_obj(
        ruleId=0, limitOperatorType="~", windowMinutes=0, filter={"merchantId": 1}, colour="red"
    )
    problems = problems_of(obj)
    assert fields_of(problems) == {
        "ruleId",
        "limitOperatorType",
        "windowMinutes",
        "filter.merchantId",
        "colour",
    }
    assert all(p.rule_id == 0 for p in problems)


def test_all_problems_of_all_rules_in_a_file_are_reported_and_nothing_is_returned() -> None:
    text = rules_text(
        [rule_obj(ruleId=1), rule_obj(ruleId=2, windowMinutes=0), rule_obj(ruleId=3, limit="x")]
    )
    with pytest.raises(InvalidRuleError) as caught:
        parse_rules(text)
    located = {(p.rule_index, p.rule_id, p.field) for p in caught.value.problems}
    assert located == {(1, 2, "windowMinutes"), (2, 3, "limit")}
    message = str(caught.value)
    assert "rule #2" in message
    assert "rule #3" in message
    assert "ruleId 2" in message


def test_field_problem_str_names_rule_and_field() -> None:
    problem = FieldProblem("windowMinutes", "is too big", rule_index=0, rule_id=4)
    assert str(problem) == "rule #1 ruleId 4: field 'windowMinutes': is too big"


def test_non_object_rule_is_rejected() -> None:
    with pytest.raises(InvalidRuleError) as caught:
        parse_rules("[1]")
    assert fields_of(caught.value.problems) == {"(rule)"}


# ---------------------------------------------------------------- grouping keys and window


def test_empty_grouping_keys_make_one_global_group() -> None:
    rule = one_rule(rule_obj(groupingKeyNames=[]))
    assert rule.grouping_keys == ()
    assert rule.signature.key_of({"payerId": "p1"}) == ()


def test_grouping_key_order_is_kept_on_the_rule_and_sorted_on_the_signature() -> None:
    rule = one_rule(rule_obj(groupingKeyNames=["payerId", "beneficiaryId", "ip"]))
    assert rule.grouping_keys == ("payerId", "beneficiaryId", "ip")
    assert rule.signature.grouping_keys == ("beneficiaryId", "ip", "payerId")


def test_key_of_is_none_when_a_grouping_field_is_missing() -> None:
    signature = make_rule(groupingKeyNames=["payerId", "ip"]).signature
    assert signature.key_of({"payerId": "p1", "ip": None}) is None
    assert signature.key_of({"payerId": "p1"}) is None
    assert signature.key_of({"payerId": "p1", "ip": "1.1.1.1"}) == ("1.1.1.1", "p1")


@pytest.mark.parametrize("minutes", [1, 2, 1440, MAX_WINDOW_MINUTES])
def test_window_minutes_bounds_accepted(minutes: int) -> None:
    assert one_rule(rule_obj(windowMinutes=minutes)).window_minutes == minutes
    assert MAX_WINDOW_MINUTES == 527_040


@pytest.mark.parametrize("minutes", [0, MAX_WINDOW_MINUTES + 1])
def test_window_minutes_bounds_rejected(minutes: int) -> None:
    assert fields_of(problems_of(rule_obj(windowMinutes=minutes))) == {"windowMinutes"}


@pytest.mark.parametrize(
    ("limit_json", "expected"),
    [
        ("200000", Decimal(200000)),
        ("0.1", Decimal("0.1")),
        ("-3", Decimal(-3)),
        ("2.50", Decimal("2.5")),
        ("1e3", Decimal(1000)),
        ("0", Decimal(0)),
    ],
)
def test_limit_is_an_exact_decimal(limit_json: str, expected: Decimal) -> None:
    text = json_text(rule_obj(limit=0)).replace('"limit":0', f'"limit":{limit_json}')
    rule = one_rule(json.loads(text, parse_float=Decimal))
    assert rule.limit == expected
    assert parse_rules(text) == [rule]


# ---------------------------------------------------------------- filters


@pytest.mark.parametrize(
    ("raw_filter", "expected"),
    [
        ({}, ()),
        (None, ()),
        ({"paymentType": "CRD"}, (("paymentType", ("CRD",)),)),
        ({"paymentType": ["CSH", "CRD"]}, (("paymentType", ("CRD", "CSH")),)),
        ({"payerId": [12, "12", "7"]}, (("payerId", ("12", "7")),)),
        ({"payerId": 12}, (("payerId", ("12",)),)),
        ({"paymentAmount": ["100.50", Decimal("100.5"), 3]}, (("paymentAmount", ("100.5", "3")),)),
        (
            {"paymentType": "CRD", "ip": "1.1.1.1", "action": ["pay"]},
            (("action", ("pay",)), ("ip", ("1.1.1.1",)), ("paymentType", ("CRD",))),
        ),
    ],
    ids=repr,
)
def test_filter_is_canonicalised(raw_filter: object, expected: object) -> None:
    rule = one_rule(rule_obj(filter=raw_filter))
    assert rule.filter == expected


@pytest.mark.parametrize(
    ("values", "passes"),
    [
        ({"paymentType": "CRD", "payerId": "12"}, True),
        ({"paymentType": "CSH", "payerId": "7"}, True),
        ({"paymentType": "CRD", "payerId": "8"}, False),
        ({"paymentType": "XYZ", "payerId": "12"}, False),
        ({"payerId": "12"}, False),
        ({"paymentType": "CRD", "payerId": None}, False),
    ],
)
def test_filter_passes_only_when_every_field_matches(
    values: dict[str, str | None], passes: bool
) -> None:
    rule = make_rule(filter={"paymentType": ["CRD", "CSH"], "payerId": [12, 7]})
    assert rule.signature.passes_filter(values) is passes


# ---------------------------------------------------------------- signatures


def test_same_keys_in_another_order_same_filter_same_field_share_a_signature() -> None:
    first = make_rule(
        ruleId=1,
        groupingKeyNames=["payerId", "beneficiaryId"],
        filter={"paymentType": ["CRD", "CSH"], "payerId": 12},
    )
    second = make_rule(
        ruleId=2,
        groupingKeyNames=["beneficiaryId", "payerId"],
        filter={"payerId": "12", "paymentType": ["CSH", "CRD"]},
        aggregatorFunctionType="max",
        limitOperatorType="lt",
        limit=5,
        windowMinutes=3,
    )
    assert first.signature == second.signature
    assert first.signature.signature_id == second.signature.signature_id


@pytest.mark.parametrize(
    "other",
    [
        {"filter": {"paymentType": "CSH"}},
        {"filter": {"paymentType": ["CRD", "CSH"]}},
        {"filter": ABSENT},
        {"groupingKeyNames": ["payerId"]},
        {"groupingKeyNames": ["payerId", "beneficiaryId", "ip"]},
        {"aggregatorFunctionType": "UNIQUE_COUNT", "aggregateFieldName": "ip"},
        {"aggregatorFunctionType": "COUNT"},
    ],
    ids=repr,
)
def test_a_different_filter_keys_or_field_gives_a_different_signature(
    other: dict[str, object],
) -> None:
    base = make_rule(filter={"paymentType": "CRD"})
    changed = make_rule(**{"filter": {"paymentType": "CRD"}, **other})
    assert base.signature != changed.signature
    assert base.signature.signature_id != changed.signature.signature_id


def test_count_rules_share_a_signature_whatever_their_field() -> None:
    plain = make_rule(aggregatorFunctionType="COUNT", aggregateFieldName=ABSENT)
    with_ip = make_rule(aggregatorFunctionType="COUNT", aggregateFieldName="ip")
    with_amount = make_rule(aggregatorFunctionType="count", aggregateFieldName="paymentAmount")
    ids = {r.signature.signature_id for r in (plain, with_ip, with_amount)}
    assert len(ids) == 1
    assert plain.signature.aggregate_field is None


def test_numeric_aggregators_over_one_field_share_a_signature() -> None:
    ids = {
        make_rule(aggregatorFunctionType=a).signature.signature_id
        for a in ("SUM", "AVG", "MIN", "MAX")
    }
    assert len(ids) == 1


def test_signature_id_is_a_stable_content_hash() -> None:
    # Pinned: changing how the id is computed would orphan every stored bucket.
    signature = RuleSignature(
        ("beneficiaryId", "payerId"), (("paymentType", ("CRD",)),), "paymentAmount"
    )
    text = (
        '{"aggregateFieldName":"paymentAmount","filter":{"paymentType":["CRD"]},'
        '"groupingKeyNames":["beneficiaryId","payerId"]}'
    )
    assert signature.signature_id == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert len(signature.signature_id) == 16


def test_rules_by_signature_groups_active_rules_in_rule_id_order() -> None:
    a = make_rule(ruleId=5)
    b = make_rule(ruleId=2, aggregatorFunctionType="MAX")
    paused = make_rule(ruleId=3, ruleState="PAUSE")
    other = make_rule(ruleId=4, groupingKeyNames=["ip"])
    grouped = rules_by_signature([a, paused, other, b])
    assert grouped == {a.signature: [b, a], other.signature: [other]}
    assert list(grouped) == sorted(grouped, key=lambda s: s.signature_id)
    assert deciding_rules([a, paused, other, b]) == [b, other, a]


def test_key_text_is_compact_json() -> None:
    assert key_text(("p1", "é", '"q"')) == '["p1","é","\\"q\\""]'
    assert key_text(()) == "[]"


# ---------------------------------------------------------------- to_json round trip


@given(rule_objs(states=("ACTIVE", "PAUSE", "DELETE")))
@settings(max_examples=300, deadline=None)
def test_to_json_round_trips_through_parse_rules(obj: dict[str, Any]) -> None:
    rule = one_rule(obj)
    exported = rule.to_json()
    again = parse_rules(dumps_json(exported))
    assert again == [rule]
    assert isinstance(again[0], Rule)
    assert again[0].to_json() == exported  # canonical: a second export is identical
    assert exported["ruleState"] == rule.state.value
    assert exported["aggregatorFunctionType"] == rule.aggregator.value
    assert exported["limitOperatorType"] in OPERATOR_SYMBOLS


@pytest.mark.parametrize(
    "limit", ["123456789012.12345678", "999999999999999999.99999999", "0.1", "2.5", "1E+3"]
)
def test_to_json_keeps_an_exact_limit_exactly(limit: str) -> None:
    # A limit is read as an exact decimal; an export must read back as the same rule,
    # or `rules export` then `rules apply` silently moves the threshold.
    rule = make_rule(limit=Decimal(limit))
    assert rule.limit == Decimal(limit)
    again = parse_rules(json_text(rule.to_json()))
    assert again == [rule]
    again = parse_rules(dumps_json(rule.to_json()))
    assert again == [rule]


def test_with_version_and_with_state_copy_the_rule() -> None:
    rule = make_rule()
    assert rule.with_version(3).version == 3
    assert rule.with_version(3).rule_id == rule.rule_id
    assert rule.with_state(RuleState.PAUSE).state is RuleState.PAUSE
    assert rule.version == 0


# ---------------------------------------------------------------- file formats


def _two_rules() -> list[dict[str, Any]]:
    return [rule_obj(ruleId=1), rule_obj(ruleId=2, aggregatorFunctionType="COUNT", limit=3)]


@pytest.mark.parametrize("layout", ["array", "lines"])
def test_file_as_array_or_json_lines(layout: str) -> None:
    entries = parse_rules(rules_text(_two_rules(), layout))
    assert [e.rule_id for e in entries if isinstance(e, Rule)] == [1, 2]


def test_file_as_single_object() -> None:
    entries = parse_rules(rules_text([rule_obj(ruleId=9)], "object"))
    assert [e.rule_id for e in entries if isinstance(e, Rule)] == [9]


def test_json_lines_with_blank_lines_and_a_pretty_printed_single_object() -> None:
    lines = "\n\n".join(json_text(o) for o in _two_rules()) + "\n\n"
    assert len(parse_rules(lines)) == 2
    assert len(parse_rules(json.dumps(rule_obj(), indent=2))) == 1


def test_entries_keep_file_order() -> None:
    text = rules_text(
        [
            rule_obj(ruleId=1),
            {"ruleId": 1, "ruleState": "PAUSE"},
            {"ruleState": "CONTROL", "controlType": "EXPORT_RULES_CURRENT"},
        ],
        "lines",
    )
    entries = parse_rules(text)
    assert isinstance(entries[0], Rule)
    assert entries[1] == StateChange(1, RuleState.PAUSE)
    assert entries[2] == Control(ControlType.EXPORT_RULES_CURRENT)


def test_invalid_json_line_is_named() -> None:
    lines = [json_text(rule_obj(ruleId=1)), '{"ruleId": 2, "ruleState":', json_text(rule_obj())]
    with pytest.raises(InvalidRuleError) as caught:
        parse_rules("\n".join(lines))
    assert fields_of(caught.value.problems) == {"(line 2)"}
    assert "(line 2)" in str(caught.value)


@pytest.mark.parametrize("text", ["", "  \n\t\n"])
def test_empty_file_is_rejected(text: str) -> None:
    with pytest.raises(InvalidRuleError) as caught:
        parse_rules(text)
    assert fields_of(caught.value.problems) == {"(file)"}
