"""The Redis layout, as a published contract (README "Reading aggregates from Redis").

Pure: names and values only, so the layout is tested byte for byte without a server.

- ``velocity:{<signature_id>:<key>}:buckets`` — hash of one (signature, key): field =
  bucket start (epoch ms, decimal), value = ``bucket_value``. The hash tag keeps one
  (signature, key) in one cluster slot and spreads keys over slots.
- ``velocity:rule:<ruleId>`` — hash describing a rule in force: what a client needs to
  name the bucket hash and call ``velocity_window``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal

from velocity.buckets import BucketAggregate
from velocity.decimals import format_decimal
from velocity.rules import Rule, key_text

PREFIX = "velocity"


def bucket_hash_key(signature_id: str, key: str) -> str:
    """The hash of one (signature, key); ``key`` is ``velocity.rules.key_text`` of the values."""
    return f"{PREFIX}:{{{signature_id}:{key}}}:buckets"


def rule_entry_key(rule_id: int) -> str:
    return f"{PREFIX}:rule:{rule_id}"


def _decimal_or_none(value: Decimal | None) -> str | None:
    return None if value is None else format_decimal(value)


def bucket_value(aggregate: BucketAggregate) -> str:
    """``[event_count, value_count, sum, min, max, [distinct…]]``, decimals as strings."""
    return json.dumps(
        [
            aggregate.count,
            aggregate.value_count,
            _decimal_or_none(aggregate.total),
            _decimal_or_none(aggregate.minimum),
            _decimal_or_none(aggregate.maximum),
            sorted(aggregate.distinct),
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )


def parse_bucket_value(text: str) -> BucketAggregate:
    count, value_count, total, minimum, maximum, distinct = json.loads(text)
    return BucketAggregate(
        count,
        value_count,
        None if total is None else Decimal(total),
        None if minimum is None else Decimal(minimum),
        None if maximum is None else Decimal(maximum),
        frozenset(distinct),
    )


def rule_entry(rule: Rule, bucket_ms: int) -> dict[str, str]:
    """The fields of ``velocity:rule:<id>``."""
    signature = rule.signature
    return {
        "ruleId": str(rule.rule_id),
        "version": str(rule.version),
        "ruleState": rule.state.value,
        "signatureId": signature.signature_id,
        "groupingKeyNames": json.dumps(list(signature.grouping_keys)),
        "aggregatorFunctionType": rule.aggregator.value,
        "windowMs": str(rule.window_ms),
        "bucketMs": str(bucket_ms),
        "limitOperatorType": rule.operator.value,
        "limit": format_decimal(rule.limit),
    }


def key_for_lookup(entry: Mapping[str, str], key_values: Mapping[str, str]) -> str:
    """The bucket hash of a rule entry and a key given by field name (any order).

    Raises ``KeyError`` naming a grouping field the caller did not give.
    """
    names: Sequence[str] = json.loads(entry["groupingKeyNames"])
    missing = [n for n in names if n not in key_values]
    if missing:
        raise KeyError(f"the key needs {names}; missing {missing}")
    return bucket_hash_key(entry["signatureId"], key_text([str(key_values[n]) for n in names]))


def state_lock_key(data_dir: str) -> str:
    """The lock that serialises writers of one data dir's bucket state (stream batches,
    compaction, backfill rebuilds); named by a digest of the data dir, so two data dirs on
    one Redis never block each other."""
    digest = hashlib.sha256(data_dir.encode("utf-8")).hexdigest()[:16]
    return f"{PREFIX}:lock:{{{digest}}}"
