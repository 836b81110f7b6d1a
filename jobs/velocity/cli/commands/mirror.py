"""The Redis mirror of the Delta buckets: `velocity lookup` (a rule's window aggregate for a
key) and `velocity mirror rebuild|migrate|reconcile`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from velocity.cli.shared import EXIT_FAILURE, EXIT_OK, settings_from, spark_session
from velocity.domain.schema import parse_key_values
from velocity.errors import UsageError
from velocity.settings import Settings


def lookup(args: argparse.Namespace) -> int:
    from velocity.redis import connection, mirror

    settings = settings_from(args)
    client = connection.connect(settings)
    try:
        key = parse_key_values(args.key)
    except ValueError as exc:
        raise UsageError(f"--key {exc}") from exc
    try:
        result = mirror.lookup(client, settings.redis_keys, args.rule, key, args.at)
    except KeyError as exc:
        raise UsageError(f"--key: {exc.args[0]}") from exc
    print(json.dumps(result))
    return EXIT_OK


def _redis_state(settings: Settings) -> Any:
    from velocity.delta.live import LiveState
    from velocity.redis import connection
    from velocity.spark.redis_state import RedisState

    client = connection.connect(settings)
    connection.load_functions(client)
    return RedisState(LiveState(spark_session(settings, "velocity-mirror"), settings), client)


def rebuild(args: argparse.Namespace) -> int:
    written = _redis_state(settings_from(args)).rebuild()
    print(f"mirror rebuilt from Delta: {written} buckets written to Redis")
    return EXIT_OK


def migrate(args: argparse.Namespace) -> int:
    from velocity.redis import connection, mirror

    settings = settings_from(args)
    client = connection.connect(settings)
    connection.load_functions(client)
    packed, dense, seen = mirror.pack_hashes(client, settings)
    print(
        f"{packed} of {seen} key states packed into one string each, {dense} made dense "
        f"({mirror.DENSE_MIN_BUCKETS}+ buckets: a hash beside the string); the rest were "
        "migrated already"
    )
    return EXIT_OK


def reconcile(args: argparse.Namespace) -> int:
    redis_state = _redis_state(settings_from(args))
    if args.repair:
        drift, written = redis_state.repair()
    else:
        drift = redis_state.reconcile()
    print(
        f"checked {drift.checked} buckets: {len(drift.missing)} missing in Redis, "
        f"{len(drift.different)} different, {len(drift.extra)} only in Redis"
    )
    for label, slots in (
        ("missing", drift.missing),
        ("different", drift.different),
        ("extra", drift.extra),
    ):
        for signature_id, key, start in slots[:20]:
            print(f"  {label}: signature {signature_id} key {key} bucket {start}")
    if drift.clean:
        return EXIT_OK
    if args.repair:
        print(f"repaired: {written} buckets rewritten from Delta, {len(drift.extra)} removed")
        return EXIT_OK
    return EXIT_FAILURE
