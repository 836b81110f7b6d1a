"""SPEC §1: which event lines are accepted, which are quarantined and why, canonical values."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import (
    ABSENT,
    BASE_TIME,
    EDGE_FIELD_VALUES,
    OPTIONAL_EVENT_FIELDS,
    REQUIRED_EVENT_FIELDS,
    RULE_USABLE_FIELDS,
    event_line,
    event_obj,
    event_objs,
    json_text,
)
from velocity.domain.schema import (
    EVENT_FIELDS,
    NUMERIC_FIELDS,
    RULE_FIELDS,
    Event,
    Rejection,
    RejectReason,
    _checked_event,
    _plain_event,
    canonical_value,
    format_decimal,
    is_blank,
    parse_amount,
    parse_event_line,
    parse_event_object,
)

DECLARED_FIELDS = REQUIRED_EVENT_FIELDS + OPTIONAL_EVENT_FIELDS


def accept_line(line: str) -> Event:
    result = parse_event_line(line)
    assert isinstance(result, Event), f"expected accepted, got {result}"
    return result


def reject_line(line: str) -> Rejection:
    result = parse_event_line(line)
    assert isinstance(result, Rejection), f"expected quarantined, got {result}"
    return result


def reject_obj(obj: Any) -> Rejection:
    result = parse_event_object(obj)
    assert isinstance(result, Rejection), f"expected quarantined, got {result}"
    return result


# ---------------------------------------------------------------- the declared schema


def test_declared_fields_match_spec() -> None:
    assert tuple(f.name for f in EVENT_FIELDS) == DECLARED_FIELDS
    assert {f.name for f in EVENT_FIELDS if f.required} == set(REQUIRED_EVENT_FIELDS)
    assert set(RULE_FIELDS) == set(RULE_USABLE_FIELDS)
    assert NUMERIC_FIELDS == ("paymentAmount",)


def test_valid_event_is_accepted_with_canonical_values() -> None:
    event = accept_line(event_line(transactionId="tx-1", ip="1.2.3.4"))
    assert event.transaction_id == "tx-1"
    assert event.event_time == BASE_TIME
    assert event.amount == Decimal(100)
    assert event.value("payerId") == "payer-1"
    assert event.value("paymentType") == "CRD"
    assert event.value("ip") == "1.2.3.4"
    assert event.value("deviceId") is None


# ---------------------------------------------------------------- not JSON, not an object


@pytest.mark.parametrize(
    "line", ["not json", "{", '{"transactionId": "t",}', "", "   ", "{'a': 1}", "[1,"]
)
def test_not_json_is_quarantined(line: str) -> None:
    assert reject_line(line).code is RejectReason.NOT_JSON


@pytest.mark.parametrize("line", ["[]", "1", '"text"', "null", "true", "[" + event_line() + "]"])
def test_json_that_is_not_an_object_is_quarantined(line: str) -> None:
    assert reject_line(line).code is RejectReason.NOT_OBJECT


def test_blank_lines_are_recognised_so_readers_can_skip_them() -> None:
    assert is_blank("  \t\n")
    assert not is_blank(event_line())


# ---------------------------------------------------------------- required fields


_MISSING = pytest.mark.parametrize(
    "missing", [ABSENT, None, "", "   "], ids=["absent", "null", "empty", "blank"]
)


@pytest.mark.parametrize("field", REQUIRED_EVENT_FIELDS)
@_MISSING
def test_missing_required_field_is_quarantined_naming_it(field: str, missing: object) -> None:
    rejection = reject_line(event_line(**{field: missing}))
    assert rejection.code is RejectReason.MISSING_FIELD
    assert field in rejection.message


# ---------------------------------------------------------------- wrong types


@pytest.mark.parametrize("field", DECLARED_FIELDS)
@pytest.mark.parametrize("bad", [{}, {"a": 1}, [], ["x"], True, False], ids=repr)
def test_object_array_or_boolean_in_declared_field_is_quarantined(field: str, bad: object) -> None:
    rejection = reject_line(event_line(**{field: bad}))
    assert rejection.code is RejectReason.WRONG_TYPE
    assert field in rejection.message


@pytest.mark.parametrize(
    "raw_time",
    ["1767225600000.0", "1767225600000.5", "1.7672256E12", '"1767225600000"', '"abc"'],
)
def test_non_integer_event_time_is_quarantined(raw_time: str) -> None:
    line = event_line(eventTime=0).replace('"eventTime":0', f'"eventTime":{raw_time}')
    assert raw_time in line
    rejection = reject_line(line)
    assert rejection.code is RejectReason.WRONG_TYPE
    assert "eventTime" in rejection.message


def test_float_event_time_in_a_decoded_object_is_quarantined() -> None:
    assert reject_obj(event_obj(eventTime=1767225600000.0)).code is RejectReason.WRONG_TYPE


@pytest.mark.parametrize("event_time", [-1, -BASE_TIME])
def test_negative_event_time_is_quarantined(event_time: int) -> None:
    rejection = reject_line(event_line(eventTime=event_time))
    assert rejection.code is RejectReason.TIME_OUT_OF_RANGE
    assert "eventTime" in rejection.message


def test_event_time_zero_is_accepted() -> None:
    assert accept_line(event_line(eventTime=0)).event_time == 0


@pytest.mark.parametrize("tx", [1.5, Decimal("12.0")], ids=repr)
def test_non_integer_number_as_transaction_id_is_quarantined(tx: object) -> None:
    rejection = reject_line(event_line(transactionId=tx))
    assert rejection.code is RejectReason.WRONG_TYPE
    assert "transactionId" in rejection.message


# ---------------------------------------------------------------- amounts


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        (0, "0"),
        (100, "100"),
        (Decimal("100.5"), "100.5"),  # JSON number with a fraction
        ("100.50", "100.5"),  # numeric string
        (" 100.5 ", "100.5"),
        ("0.00000001", "0.00000001"),  # exactly 8 places
        ("1.123456780", "1.12345678"),  # 9 digits after the point, only 8 significant
        ("999999999999999999.99999999", "999999999999999999.99999999"),  # largest allowed
        (Decimal("1E+3"), "1000"),  # exponent form, JSON number
        ("1e3", "1000"),  # exponent form, numeric string
        ("1.5E2", "150"),
        ("2.5e-7", "0.00000025"),
        ("+5", "5"),
    ],
    ids=repr,
)
def test_valid_amounts_are_accepted_exactly(amount: object, expected: str) -> None:
    event = accept_line(event_line(paymentAmount=amount))
    assert event.value("paymentAmount") == expected
    assert event.amount == Decimal(expected)


def test_float_amount_in_a_decoded_object_keeps_its_shortest_decimal() -> None:
    result = parse_event_object(event_obj(paymentAmount=0.1))
    assert isinstance(result, Event)
    assert result.amount == Decimal("0.1")  # not 0.1000000000000000055511151231257827...


@pytest.mark.parametrize(
    "amount",
    [-1, Decimal("-0.01"), "-5", 10**18, "1000000000000000000", Decimal("1E+18"), "1e400"],
    ids=repr,
)
def test_amount_out_of_range_is_quarantined(amount: object) -> None:
    rejection = reject_line(event_line(paymentAmount=amount))
    assert rejection.code is RejectReason.AMOUNT_OUT_OF_RANGE
    assert "paymentAmount" in rejection.message


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_json_constants_are_quarantined(constant: str) -> None:
    line = event_line(paymentAmount=0).replace('"paymentAmount":0', f'"paymentAmount":{constant}')
    assert constant in line
    reject_line(line)


@pytest.mark.parametrize("amount", ["NaN", "nan", "Infinity", "inf", "-Infinity"])
def test_nan_and_infinity_strings_are_quarantined(amount: str) -> None:
    rejection = reject_line(event_line(paymentAmount=amount))
    assert "paymentAmount" in rejection.message


@pytest.mark.parametrize(
    "amount", [float("nan"), float("inf"), Decimal("NaN"), Decimal("-Infinity")]
)
def test_non_finite_amount_in_a_decoded_object_is_quarantined(amount: object) -> None:
    assert reject_obj(event_obj(paymentAmount=amount)).code is RejectReason.AMOUNT_OUT_OF_RANGE


@pytest.mark.parametrize(
    "amount",
    [
        "0.000000001",
        Decimal("0.123456789"),
        "1e-9",
        Decimal("1.5E-9"),
        "123456789012345678.123456789",
        # More significant digits than Decimal's default 28-digit context: the check
        # must not round the extra places away before counting them.
        "100000000000000000.00000000001",
        "999999999999999999.999999999999",
        # An exponent beyond any context: counted from the digits, never rounded (it
        # raised decimal.Inexact and failed the backtest; found by the Flink peer).
        "1e-999999999999",
        Decimal("1E-999999999999"),
    ],
    ids=repr,
)
def test_amount_with_more_than_8_decimal_places_is_quarantined(amount: object) -> None:
    rejection = reject_line(event_line(paymentAmount=amount))
    assert rejection.code is RejectReason.AMOUNT_PRECISION
    assert "paymentAmount" in rejection.message


@pytest.mark.parametrize("amount", ["abc", "1,000", "0x10", "1.2.3", "", "1e", "€5"], ids=repr)
def test_non_numeric_amount_string_is_quarantined(amount: str) -> None:
    rejection = reject_line(event_line(paymentAmount=amount))
    expected = RejectReason.MISSING_FIELD if amount == "" else RejectReason.WRONG_TYPE
    assert rejection.code is expected
    assert "paymentAmount" in rejection.message


def test_parse_amount_rejects_booleans() -> None:
    rejection = reject_line(event_line(paymentAmount=True))
    assert rejection.code is RejectReason.WRONG_TYPE


@given(st.decimals(min_value=0, max_value=Decimal("999999999999999999.99999999"), places=8))
@settings(max_examples=200, deadline=None)
def test_any_amount_in_range_with_8_places_is_accepted_exactly(amount: Decimal) -> None:
    assert parse_amount(amount) == amount
    event = accept_line(event_line(paymentAmount=amount))
    assert event.amount == amount
    assert Decimal(event.value("paymentAmount") or "nan") == amount


# ---------------------------------------------------------------- paymentType


@pytest.mark.parametrize("payment_type", ["CSH", "CRD"])
def test_known_payment_types_are_accepted(payment_type: str) -> None:
    assert accept_line(event_line(paymentType=payment_type)).value("paymentType") == payment_type


@pytest.mark.parametrize("payment_type", ["XYZ", "CASH", "crd", " CRD", 1])
def test_unknown_payment_type_is_quarantined(payment_type: object) -> None:
    rejection = reject_line(event_line(paymentType=payment_type))
    assert rejection.code is RejectReason.UNKNOWN_ENUM
    assert "paymentType" in rejection.message


# ---------------------------------------------------------------- optional and extra fields


@pytest.mark.parametrize("field", OPTIONAL_EVENT_FIELDS)
@_MISSING
def test_optional_field_absent_or_empty_is_accepted_as_none(field: str, missing: object) -> None:
    event = accept_line(event_line(**{field: missing}))
    assert event.value(field) is None
    assert field in event.values


@pytest.mark.parametrize("field", OPTIONAL_EVENT_FIELDS)
@pytest.mark.parametrize(
    ("raw", "expected"), [("abc", "abc"), (42, "42"), (Decimal("1.5"), "1.5")], ids=repr
)
def test_optional_field_string_or_number_is_kept_canonical(
    field: str, raw: object, expected: str
) -> None:
    assert accept_line(event_line(**{field: raw})).value(field) == expected


def test_extra_fields_are_ignored() -> None:
    event = accept_line(
        event_line(merchant={"nested": [1, {"x": None}]}, tags=["a"], note=None, flag=True)
    )
    assert set(event.values) == set(DECLARED_FIELDS)


# ---------------------------------------------------------------- canonical values


def test_integer_and_string_keys_are_the_same_value() -> None:
    as_int = accept_line(event_line(transactionId=12, payerId=12, beneficiaryId=7, ip=5))
    as_str = accept_line(event_line(transactionId="12", payerId="12", beneficiaryId="7", ip="5"))
    assert as_int.transaction_id == as_str.transaction_id == "12"
    for field in ("payerId", "beneficiaryId", "ip"):
        assert as_int.value(field) == as_str.value(field)


@pytest.mark.parametrize(
    "amount", ["100.50", Decimal("100.5"), Decimal("100.500"), " 100.5", "1.005e2"], ids=repr
)
def test_equal_amounts_have_one_canonical_value(amount: object) -> None:
    event = accept_line(event_line(paymentAmount=amount))
    assert event.value("paymentAmount") == "100.5"
    assert event.amount == Decimal("100.5")


def test_float_and_string_amounts_in_objects_are_equal() -> None:
    from_float = parse_event_object(event_obj(paymentAmount=100.5))
    from_string = parse_event_object(event_obj(paymentAmount="100.50"))
    assert isinstance(from_float, Event)
    assert isinstance(from_string, Event)
    assert from_float.value("paymentAmount") == from_string.value("paymentAmount") == "100.5"


@pytest.mark.parametrize(
    ("field", "raw", "expected"),
    [
        ("payerId", 12, "12"),
        ("payerId", "12", "12"),
        ("payerId", "  padded ", "  padded "),
        ("paymentAmount", "100.50", "100.5"),
        ("paymentAmount", 0, "0"),
        ("paymentAmount", "0.000", "0"),
        ("paymentAmount", 250000, "250000"),
        ("paymentType", "CRD", "CRD"),
        ("ip", None, None),
        ("ip", "", None),
    ],
)
def test_canonical_value(field: str, raw: object, expected: str | None) -> None:
    assert canonical_value(field, raw) == expected


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("payerId", {}),
        ("payerId", [1]),
        ("payerId", True),
        ("paymentType", "XYZ"),
        ("paymentAmount", "-1"),
        ("paymentAmount", "abc"),
    ],
)
def test_canonical_value_of_a_wrong_value_raises_value_error(field: str, raw: object) -> None:
    with pytest.raises(ValueError, match=field):
        canonical_value(field, raw)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Decimal("250000.00"), "250000"),
        (Decimal("0.50"), "0.5"),
        (Decimal("0E-8"), "0"),
        (Decimal("1E+6"), "1000000"),
        (Decimal("0.00000001"), "0.00000001"),
        # More than 28 significant digits: a SUM over large amounts can get here.
        (Decimal("123456789012345678901.12345678"), "123456789012345678901.12345678"),
    ],
)
def test_format_decimal_is_plain_and_exact(value: Decimal, expected: str) -> None:
    assert format_decimal(value) == expected


# ---------------------------------------------------------------- reason codes and robustness


def test_rejection_str_leads_with_its_stable_code() -> None:
    rejection = reject_line(event_line(paymentType="XYZ"))
    assert str(rejection).startswith("unknown_enum: ")
    assert {r.value for r in RejectReason} >= {
        "not_json",
        "not_object",
        "missing_field",
        "wrong_type",
        "amount_out_of_range",
        "amount_precision",
        "unknown_enum",
    }


def test_first_bad_field_in_schema_order_decides_the_reason() -> None:
    rejection = reject_line(event_line(payerId=ABSENT, paymentAmount="-1"))
    assert rejection.code is RejectReason.MISSING_FIELD
    assert "payerId" in rejection.message


@given(event_objs())
@settings(max_examples=300, deadline=None)
def test_every_generated_valid_event_is_accepted_as_line_and_object(obj: dict[str, Any]) -> None:
    from_line = parse_event_line(json_text(obj))
    from_obj = parse_event_object(obj)
    assert isinstance(from_line, Event), from_line
    assert from_line == from_obj
    assert from_line.transaction_id == str(obj["transactionId"])


_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.text(max_size=10),
    st.floats(allow_nan=True, allow_infinity=True),
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_parse_event_line_never_raises_on_any_text(line: str) -> None:
    assert isinstance(parse_event_line(line), (Event, Rejection))


@given(st.dictionaries(st.sampled_from(DECLARED_FIELDS), _json_values))
@settings(max_examples=300, deadline=None)
def test_parse_event_object_never_raises_on_any_json_values(fields: dict[str, Any]) -> None:
    obj = {**event_obj(), **fields}
    assert isinstance(parse_event_object(obj), (Event, Rejection))
    line = json.dumps(obj, allow_nan=True)
    assert isinstance(parse_event_line(line), (Event, Rejection))


# ---------------------------------------------------------------- hostile text


@pytest.mark.parametrize("field", ["transactionId", "payerId", "ip"])
def test_an_unpaired_surrogate_is_not_text(field: str) -> None:
    """JSON can spell "\\ud800", but no UTF-8 store (Delta, Arrow, Redis keys) can hold it."""
    rejection = reject_obj(event_obj(**{field: "a\ud800b"}))
    assert rejection.code is RejectReason.WRONG_TYPE and "surrogate" in rejection.message
    paired = json.dumps(event_obj(**{field: "a\U0001f600b"}), ensure_ascii=True)
    assert accept_line(paired).values[field] == "a\U0001f600b"


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("utf-8", errors="replace"))))
def test_any_text_is_accepted_or_quarantined_and_accepted_text_is_utf8(line: str) -> None:
    result = parse_event_line(line)
    assert isinstance(result, (Event, Rejection))
    if isinstance(result, Event):
        for value in result.values.values():
            assert value is None or value.encode("utf-8")


@pytest.mark.parametrize(
    "line",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 50_000 + "1" + "}" * 50_000,
        '{"transactionId": "t", "eventTime": 1' + "0" * 5000 + "}",
        '{"paymentAmount": 1e999999}',
        "\ufeff{}",
        "z" * 1_000_000,
    ],
)
def test_deep_huge_and_odd_lines_are_quarantined_not_raised(line: str) -> None:
    assert reject_line(line).message


@settings(max_examples=500)
@given(
    obj=event_objs(),
    changes=st.dictionaries(st.sampled_from(DECLARED_FIELDS), EDGE_FIELD_VALUES, max_size=3),
)
def test_the_plain_path_agrees_with_the_checked_path(obj: dict[str, Any], changes) -> None:
    mutated = {**obj, **changes}
    plain = _plain_event(mutated)
    assert plain is None or plain == _checked_event(mutated)
    if not changes:
        assert plain is not None or any(
            type(v) not in (str, int) or (type(v) is str and not v.isascii()) for v in obj.values()
        )
