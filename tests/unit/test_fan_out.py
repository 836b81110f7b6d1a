"""The columnar fan-out (``keyed_rows``) gives the keyed events the per-event reference
(``keyed_histories``) gives, for random events and rule signatures, and writes keys
that JSON must escape exactly as ``key_text`` does."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import events, keyed_histories, rule_sets
from tests.unit.test_kernel import _ARROW
from velocity.domain.decimals import format_decimal
from velocity.domain.rules import RuleSignature, deciding_rules, key_text, rules_by_signature
from velocity.domain.schema import EVENT_FIELDS, Event, FieldKind
from velocity.engine.fan_out import keyed_rows
from velocity.engine.texts import decimal_texts

_EVENTS = pa.schema(
    [
        (f.name, pa.int64() if f.kind is FieldKind.TIME else pa.string())
        if f.kind is not FieldKind.AMOUNT
        else (f.name, pa.decimal128(26, 8))
        for f in EVENT_FIELDS
    ]
)


def event_table(batch: list[Event]) -> pa.Table:
    rows = [
        {
            **{f.name: e.values.get(f.name) for f in EVENT_FIELDS},
            "eventTime": e.event_time,
            "paymentAmount": e.amount,
        }
        for e in batch
    ]
    return pa.Table.from_pylist(rows, schema=_EVENTS)


def columnar(batch: list[Event], signatures: list[RuleSignature]) -> Counter:
    table = keyed_rows(event_table(batch), signatures, _ARROW)
    assert table.schema == _ARROW
    return Counter(tuple(row.values()) for row in table.to_pylist())


def reference(batch: list[Event], signatures: list[RuleSignature]) -> Counter:
    return Counter(
        (s.signature_id, key_text(key), e.event_time, e.transaction_id, e.value, e.number)
        for s in signatures
        for key, history in keyed_histories(batch, s).items()
        for e in history
    )


@settings(max_examples=150)
@given(batch=events(max_size=30), rules=rule_sets(max_size=5))
def test_columnar_fan_out_equals_the_reference(batch: list[Event], rules) -> None:
    signatures = list(rules_by_signature(deciding_rules(rules)))
    assert columnar(batch, signatures) == reference(batch, signatures)


AMOUNTS = [
    Decimal(v)
    for v in ("1.5", "100", "0", "0.00000001", "12.340", "7", "999999999999999999.99999999")
]


def test_keys_that_json_escapes_and_amount_keys() -> None:
    texts = ['say "hi"', "back\\slash", "line\nbreak", "tab\there", "\x01", "é ü 中", "plain"]
    batch = [
        Event(
            f"t{i}",
            1_000 * i,
            amount,
            {
                "transactionId": f"t{i}",
                "eventTime": str(1_000 * i),
                "payerId": text,
                "beneficiaryId": "b",
                "paymentAmount": format_decimal(amount),
                "paymentType": "CRD",
                "ip": None,
                "deviceId": None,
                "action": None,
            },
        )
        for i, (text, amount) in enumerate(zip(texts, AMOUNTS, strict=True))
    ]
    signatures = [
        RuleSignature(("beneficiaryId", "payerId"), (), "paymentAmount"),
        RuleSignature(("paymentAmount",), (("paymentType", ("CRD",)),), "payerId"),
        RuleSignature((), (("paymentAmount", ("0", "100", "1.5")),), None),
    ]
    assert columnar(batch, signatures) == reference(batch, signatures)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.decimals(min_value=-(10**29), max_value=10**29, places=8, allow_nan=False),
            st.sampled_from(
                [
                    Decimal("0"),
                    Decimal("-0"),
                    Decimal("1E-8"),
                    Decimal("-5E-7"),
                    Decimal("100"),
                    Decimal("10.10"),
                    Decimal("0.5"),
                    Decimal("-1000"),
                ]
            ),
        ),
        max_size=30,
    )
)
def test_decimal_texts_are_format_decimal(values: list[Decimal | None]) -> None:
    column = pa.array(values, pa.decimal128(38, 8))
    expected = [None if v is None else format_decimal(v) for v in values]
    assert decimal_texts(column).to_pylist() == expected
