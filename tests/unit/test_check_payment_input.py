"""The check's client validates a payment exactly as the stream does and sends its canonical
field values (the Function's arguments), before any Redis call."""

from __future__ import annotations

from decimal import Decimal

import pytest

from velocity.errors import InvalidFieldError
from velocity.redis.check import decision_of, payment_arguments, valid_payment

PAYMENT = {"transactionId": 42, "eventTime": 1767225600000, "payerId": 12, "beneficiaryId": "b-7",
           "paymentAmount": Decimal("120.50"), "paymentType": "CRD"}  # fmt: skip


def test_the_arguments_are_the_canonical_values_of_the_declared_fields() -> None:
    args = payment_arguments(valid_payment(PAYMENT | {"ip": "", "note": {"any": 1}}))
    assert args == [
        "transactionId", "42", "eventTime", "1767225600000", "payerId", "12",
        "beneficiaryId", "b-7", "paymentAmount", "120.5", "paymentType", "CRD",
    ]  # fmt: skip
    with_device = payment_arguments(valid_payment(PAYMENT | {"deviceId": 7, "payerId": "12"}))
    assert with_device[4:6] == ["payerId", "12"] and with_device[-2:] == ["deviceId", "7"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"paymentAmount": -3}, "paymentAmount"),
        ({"paymentAmount": "1.123456789"}, "paymentAmount"),
        ({"payerId": None}, "payerId"),
        ({"payerId": {"nested": 1}}, "payerId"),
        ({"eventTime": "soon"}, "eventTime"),
        ({"paymentType": "WIRE"}, "paymentType"),
        ({"transactionId": 1.5}, "transactionId"),
    ],
)
def test_a_malformed_payment_is_refused_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(InvalidFieldError) as refused:
        valid_payment(PAYMENT | change)
    assert refused.value.field == field
    assert "nothing checked" in str(refused.value)


def test_a_payment_that_is_no_object_is_named_as_a_whole() -> None:
    with pytest.raises(InvalidFieldError) as refused:
        valid_payment([PAYMENT])
    assert refused.value.field == "(payment)"


def test_the_decision_is_read_from_the_head_of_the_functions_answer() -> None:
    assert decision_of('{"decision":"BLOCK","rules":[],"stateAsOf":{}}') == "BLOCK"
    with pytest.raises(ValueError, match="not a check's answer"):
        decision_of('{"rules":[],"decision":"ALLOW"}')
