"""`velocity check [FILE]`: the pre-authorization check of one payment (SPEC §5a)."""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal

from velocity.cli.shared import EXIT_OK, settings_from
from velocity.errors import InvalidFieldError


def check(args: argparse.Namespace) -> int:
    from velocity.redis import connection
    from velocity.redis.check import check_payment

    text = sys.stdin.read() if args.file in (None, "-") else open(args.file).read()  # noqa: SIM115
    try:
        payment = json.loads(text, parse_float=Decimal)
    except ValueError as exc:
        raise InvalidFieldError(
            "(payment)", f"is not one JSON object: {exc}", "; nothing checked"
        ) from exc
    settings = settings_from(args)
    answer = check_payment(connection.connect(settings), settings.redis_keys, payment)
    print(json.dumps(answer))
    return EXIT_OK
