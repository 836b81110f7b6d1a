"""Exact decimal arithmetic and text: no amount, sum or limit is ever rounded.

``EXACT`` traps ``Inexact``: an operation that would have to round raises instead
of silently losing a digit. 80 digits hold any sum of amounts below 10^18 with 8
places over far more events than exist.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Context, Decimal, Inexact, InvalidOperation, Overflow
from json.encoder import encode_basestring

EXACT = Context(prec=80, traps=[Inexact, InvalidOperation, Overflow])


def exact_add(a: Decimal, b: Decimal) -> Decimal:
    return EXACT.add(a, b)


def exact_subtract(a: Decimal, b: Decimal) -> Decimal:
    return EXACT.subtract(a, b)


def format_decimal(value: Decimal) -> str:
    """Exact decimal as a plain string: no exponent, no trailing zeros (``250000``, ``0.5``)."""
    if value.is_zero():
        return "0"
    return format(value.normalize(EXACT), "f")


def decimal_places(value: Decimal) -> int:
    """Digits after the point once trailing zeros are dropped (``1.50`` has 1, ``1E+3`` 0).

    Read from the digits, with no context: ``normalize`` would have to round an exponent
    beyond the context's (``1E-999999999999``), and an amount line must be quarantined
    for its places, not fail the job."""
    _, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):  # NaN or infinity
        return 0
    zeros = len(digits) - len(bytes(digits).rstrip(b"\0"))
    if zeros == len(digits):  # zero
        return 0
    return max(0, -(exponent + zeros))


def json_string(text: str) -> str:
    """``text`` as a JSON string, exactly as ``json.dumps(text, ensure_ascii=False)``
    writes it (the same C encoder, without the call's overhead)."""
    return encode_basestring(text)


def dumps_json(value: object) -> str:
    """Compact JSON in which a ``Decimal`` is a JSON number with exactly its digits.

    ``json.dumps`` cannot write Decimals, and a float would round them; readers
    parse them back exactly with ``json.loads(..., parse_float=Decimal)``.
    """
    if isinstance(value, Decimal):
        return format_decimal(value)
    if isinstance(value, Mapping):
        items = (f"{json_string(str(k))}:{dumps_json(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps_json(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)
