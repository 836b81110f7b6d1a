"""The Redis layout, as a published contract (README "Reading aggregates from Redis").

Pure: names and values only, so the layout is tested byte for byte without a server.

- ``velocity:{<signature_id>:<key>}:buckets`` — hash of one (signature, key): field =
  bucket start (epoch ms, decimal), value = ``bucket_value``. The hash tag keeps one
  (signature, key) in one cluster slot and spreads keys over slots.
- ``velocity:rule:<ruleId>`` — hash describing a rule in force: what a client needs to
  name the bucket hash and call ``velocity_window``.
- ``velocity:stream:{<data dir digest>}`` — hash of the stream's progress: ``batch`` (the
  last micro-batch committed to Redis) and ``newest`` (the newest accepted eventTime).
- ``velocity:seen:{<data dir digest>}:<transactionId>`` — an accepted transactionId,
  kept for the de-duplication horizon (its value: the batch that accepted it).
- ``velocity:buckets-epoch`` — bumped by every writer of bucket hashes other than the
  stream (rebuild, repair, backfill, eviction), so the stream drops its in-memory copy.
- ``velocity:mirror`` — the data dir whose buckets Redis holds; gone after a flush.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal

from velocity.buckets import BucketAggregate
from velocity.decimals import format_decimal, json_string
from velocity.rules import Rule, key_text

PREFIX = "velocity"


def bucket_hash_key(signature_id: str, key: str) -> str:
    """The hash of one (signature, key); ``key`` is ``velocity.rules.key_text`` of the values."""
    return f"{PREFIX}:{{{signature_id}:{key}}}:buckets"


def parse_bucket_hash_key(name: str) -> tuple[str, str] | None:
    """(signature_id, key) of a ``bucket_hash_key`` name; None for any other name."""
    head, tail = f"{PREFIX}:{{", "}:buckets"
    if not (name.startswith(head) and name.endswith(tail)):
        return None
    signature_id, sep, key = name[len(head) : -len(tail)].partition(":")
    return (signature_id, key) if sep else None


def rule_entry_key(rule_id: int) -> str:
    return f"{PREFIX}:rule:{rule_id}"


BUCKETS_EPOCH = f"{PREFIX}:buckets-epoch"
MIRROR_MARKER = f"{PREFIX}:mirror"


def _data_dir_tag(data_dir: str) -> str:
    return hashlib.sha256(data_dir.encode("utf-8")).hexdigest()[:16]


def stream_progress_key(data_dir: str) -> str:
    return f"{PREFIX}:stream:{{{_data_dir_tag(data_dir)}}}"


def seen_key_prefix(data_dir: str) -> str:
    """``seen_key_prefix(d) + transactionId`` names an accepted transactionId of data dir d."""
    return f"{PREFIX}:seen:{{{_data_dir_tag(data_dir)}}}:"


def bucket_value(aggregate: BucketAggregate, last_time: int | None = None) -> str:
    """``[event_count, value_count, sum, min, max, [distinct…]]``, decimals as strings, and
    the newest eventTime counted when known (the stream writes it; readers may ignore it).

    Compact JSON (no spaces, non-ASCII kept), built by hand: the stream writes one per
    changed bucket on its hot path.
    """
    total = _json_decimal(aggregate.total)
    minimum = total if aggregate.minimum is aggregate.total else _json_decimal(aggregate.minimum)
    maximum = total if aggregate.maximum is aggregate.total else _json_decimal(aggregate.maximum)
    distinct = "[" + ",".join(map(json_string, sorted(aggregate.distinct))) + "]"
    last = "" if last_time is None else f",{last_time}"
    return (
        f"[{aggregate.count},{aggregate.value_count},{total},{minimum},{maximum},{distinct}{last}]"
    )


def _json_decimal(value: Decimal | None) -> str:
    return "null" if value is None else f'"{format_decimal(value)}"'


def parse_bucket(text: str) -> tuple[BucketAggregate, int | None]:
    """A bucket value as its aggregate and its newest eventTime (None when not recorded)."""
    count, value_count, total, minimum, maximum, distinct, *last = json.loads(text)
    aggregate = BucketAggregate(
        count,
        value_count,
        None if total is None else Decimal(total),
        None if minimum is None else Decimal(minimum),
        None if maximum is None else Decimal(maximum),
        frozenset(distinct),
    )
    return aggregate, (last[0] if last else None)


def parse_bucket_value(text: str) -> BucketAggregate:
    return parse_bucket(text)[0]


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
    return f"{PREFIX}:lock:{{{_data_dir_tag(data_dir)}}}"
