"""The Redis layout, as a published contract (docs/serving/redis.md, "The key layout").

Pure: names and values only, so the layout is tested byte for byte without a server.

Every key of one deployment (a data dir) lives under its prefix ``P``
(``VELOCITY_REDIS_KEY_PREFIX``; by default ``velocity:<data dir digest>``), so two data
dirs share one Redis without touching each other's keys:

- ``P:{<signature_id>:<key>}:buckets`` — the state of one (signature, key), its fields:
  field = bucket start (epoch ms, decimal), value = ``bucket_value``; ``~<bucket start>``
  = the raw events of a bucket new to the key; ``n:<ruleId>:<version>`` = the rule
  version's last notified alert of the key. A string: the fields as lines
  ``<field>\t<value>\n`` (``packed_text``) while the key has fewer than 128 buckets
  (packed); from 128 on (dense), only the line ``#\t\n``, its fields (and roll-ups)
  being the hash ``P:{<signature_id>:<key>}:dense``. The hash tag keeps one
  (signature, key) in one cluster slot and spreads keys over slots.
- ``P:{<signature_id>:<key>}:raw:<bucket start>`` — string of the raw events of one of
  the key's two newest buckets (``recent_fragment``s, appended batch by batch), which
  the stream decides an out-of-order event's own bucket from; until a second batch adds
  to a bucket, they are its state's field ``~<bucket start>`` instead.
- ``P:rule:<ruleId>`` — hash describing a rule in force: what a client needs to name the
  bucket hash and call ``velocity_window``.
- ``P:rules`` — hash of the ACTIVE rules in force as the pre-authorization check
  (``velocity_check``) reads them: field = ruleId, value = ``check_rule``'s JSON; field
  ``~progress`` = the name of the stream's progress hash (the check's ``stateAsOf``). On a
  Redis Cluster each master also holds a copy, ``P:rules:{r<n>}`` (``cluster.rules_copies``).
- ``P:alerts`` — the alert stream (unless ``VELOCITY_REDIS_ALERT_STREAM`` names another).
- ``P:alerts:shadow`` — the SHADOW rules' alerts (the alert stream's name plus ``:shadow``).
- ``P:stream:{<data dir digest>}`` — hash of the stream's progress: ``batch`` (the last
  micro-batch committed to Redis), ``newest`` (the newest accepted eventTime), ``at``.
- ``P:stream:{<data dir digest>}:alert-pieces`` — ``<batch>/<pieces>``: how many pieces of
  a micro-batch's alerts went on the alert streams ahead of its commit
  (``commit_args.ALERTS_A_PIECE`` a piece), so a replay publishes none twice.
- ``P:seen:{<data dir digest>}:<n>`` — hash of the transactionIds accepted in the n-th
  span of the de-duplication horizon h since the epoch (field = transactionId, value =
  the batch that accepted it); it expires when span n + 1 ends, so an id is remembered
  for h to 2h.
- ``P:lock:{<data dir digest>}`` — the state lock.
- ``P:buckets-epoch`` — bumped by every writer of bucket hashes other than the stream
  (rebuild, repair, backfill, eviction).
- ``P:mirror`` — the data dir whose buckets Redis holds; gone after a flush.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.domain.buckets import BucketAggregate, bucket_from_columns
from velocity.domain.decimals import format_decimal, json_string
from velocity.domain.rules import Rule, key_text
from velocity.domain.windows import KeyedEvent
from velocity.engine.texts import decimal_texts, json_string_texts

# A field of a bucket hash holding a bucket's raw events while one batch has added to them.
RAW_FIELD = "~"
# A field of a bucket hash holding a rule version's last notified alert of the key (SPEC §3
# cooldown): ``n:<ruleId>:<version>`` = ``[<eventTime>,<transactionId as JSON>]``.
NOTIFIED_FIELD = "n:"


def data_dir_tag(data_dir: str) -> str:
    return hashlib.sha256(data_dir.encode("utf-8")).hexdigest()[:16]


def default_prefix(data_dir: str) -> str:
    """The key prefix of a data dir when ``VELOCITY_REDIS_KEY_PREFIX`` is not set."""
    return f"velocity:{data_dir_tag(data_dir)}"


@dataclass(frozen=True)
class RedisKeys:
    """The names of one deployment's keys: its ``prefix`` and its data dir."""

    prefix: str
    data_dir: str

    def key_base(self, signature_id: str, key: str) -> str:
        """What the names of one (signature, key)'s keys start with (its slot's tag)."""
        return f"{self.prefix}:{{{signature_id}:{key}}}"

    def bucket_hash(self, signature_id: str, key: str) -> str:
        """The hash of one (signature, key); ``key`` is ``velocity.domain.rules.key_text``."""
        return f"{self.key_base(signature_id, key)}:buckets"

    @staticmethod
    def dense_hash_of(state: str) -> str:
        """The hash of a dense key's fields, beside its state string ``state`` (a
        ``bucket_hash``; velocity.lua's dense_of)."""
        return state.removesuffix(":buckets") + ":dense"

    def recent_events(self, signature_id: str, key: str, start: int) -> str:
        """The raw events of one of a key's newest buckets (beside its hash, one slot)."""
        return f"{self.key_base(signature_id, key)}:raw:{start}"

    def key_base_texts(self, signature_ids: pa.ChunkedArray, keys: pa.ChunkedArray) -> pa.Array:
        """``key_base`` of every (signature, key) of two columns, column by column."""
        return pc.binary_join_element_wise(f"{self.prefix}:{{", signature_ids, ":", keys, "}", "")

    @property
    def bucket_hashes(self) -> str:
        """SCAN pattern of every bucket hash of this deployment."""
        return f"{self.prefix}:{{*}}:buckets"

    def parse_bucket_hash(self, name: str) -> tuple[str, str] | None:
        """(signature_id, key) of a ``bucket_hash`` name; None for any other name."""
        head, tail = f"{self.prefix}:{{", "}:buckets"
        if not (name.startswith(head) and name.endswith(tail)):
            return None
        signature_id, sep, key = name[len(head) : -len(tail)].partition(":")
        return (signature_id, key) if sep else None

    def rule_entry(self, rule_id: int) -> str:
        return f"{self.prefix}:rule:{rule_id}"

    @property
    def check_rules(self) -> str:
        """The rules the pre-authorization check evaluates (``velocity_check``'s key)."""
        return f"{self.prefix}:rules"

    def check_rules_copy(self, tag: str) -> str:
        """A Redis Cluster master's copy of ``check_rules`` (the check reads its own master's)."""
        return f"{self.prefix}:rules:{{{tag}}}"

    @property
    def check_rules_copies(self) -> str:
        """SCAN pattern of every master's copy of ``check_rules``."""
        return f"{self.prefix}:rules:{{*}}"

    @property
    def rule_entries(self) -> str:
        """SCAN pattern of every rule entry."""
        return f"{self.prefix}:rule:*"

    @property
    def alert_stream(self) -> str:
        return f"{self.prefix}:alerts"

    @property
    def buckets_epoch(self) -> str:
        return f"{self.prefix}:buckets-epoch"

    @property
    def mirror_marker(self) -> str:
        return f"{self.prefix}:mirror"

    @property
    def stream_progress(self) -> str:
        return f"{self.prefix}:stream:{{{data_dir_tag(self.data_dir)}}}"

    @property
    def seen_prefix(self) -> str:
        """``seen_prefix + <span>`` names the hash of the transactionIds accepted in that
        horizon-long span since the epoch (velocity.lua's ``seen_indices``)."""
        return f"{self.prefix}:seen:{{{data_dir_tag(self.data_dir)}}}:"

    def partition_record(self, batch: int, partition: int) -> str:
        """What a micro-batch's key-partition committed (velocity_partition_commit), kept
        until the batch's own commit: in the data dir's slot, beside the progress."""
        return f"{self.prefix}:partition:{{{data_dir_tag(self.data_dir)}}}:{batch}:{partition}"

    @property
    def partition_records(self) -> str:
        """SCAN pattern of every partition record."""
        return f"{self.prefix}:partition:*"

    @property
    def batch_plan(self) -> str:
        """How the micro-batch in flight is cut into key-partitions, and what it is decided
        with (velocity_batch_plan)."""
        return f"{self.prefix}:plan:{{{data_dir_tag(self.data_dir)}}}"

    @property
    def state_lock(self) -> str:
        """The lock that serialises writers of the data dir's bucket state (stream batches,
        compaction, backfill rebuilds); tagged by the data dir's digest."""
        return f"{self.prefix}:lock:{{{data_dir_tag(self.data_dir)}}}"

    def for_lookup(self, entry: Mapping[str, str], key_values: Mapping[str, str]) -> str:
        """The bucket hash of a rule entry and a key given by field name (any order).

        Raises ``KeyError`` naming a grouping field the caller did not give.
        """
        names: Sequence[str] = json.loads(entry["groupingKeyNames"])
        missing = [n for n in names if n not in key_values]
        if missing:
            raise KeyError(f"the key needs {names}; missing {missing}")
        return self.bucket_hash(entry["signatureId"], key_text([str(key_values[n]) for n in names]))


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


# The field of ``P:rules`` naming the stream's progress hash (velocity.lua's
# CHECK_PROGRESS_FIELD).
CHECK_PROGRESS_FIELD = "~progress"
# A partition record's companion "<record>:pieces" = "<applied>/<pieces>", for a partition
# committed in more than one piece (velocity.lua's PIECES_SUFFIX).
PIECES_SUFFIX = ":pieces"
# The field of ``P:rules`` holding VELOCITY_MAX_FUTURE_SECONDS in ms (velocity.lua's
# CHECK_MAX_FUTURE_FIELD): a payment the stream would quarantine is not checked.
CHECK_MAX_FUTURE_FIELD = "~maxFutureMs"


def check_rule(rule: Rule, bucket_ms: int) -> str:
    """A rule as ``velocity_check`` reads it (a field of ``P:rules``): its signature's
    grouping keys (sorted, as keys are named), filter and field, and its decision."""
    signature = rule.signature
    return json.dumps(
        {
            "ruleId": rule.rule_id,
            "ruleVersion": rule.version,
            "outcome": rule.outcome.value,
            "signatureId": signature.signature_id,
            "groupingKeyNames": list(signature.grouping_keys),
            "filter": [[name, list(values)] for name, values in signature.filter],
            "aggregateFieldName": signature.aggregate_field,
            "aggregatorFunctionType": rule.aggregator.value,
            "limitOperatorType": rule.operator.value,
            "limit": format_decimal(rule.limit),
            "windowMs": rule.window_ms,
            "bucketMs": bucket_ms,
            "cooldownMs": rule.cooldown_ms,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


# A text JSON must escape: the few such values go through the Python encoder.
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def recent_fragment(events: Sequence[KeyedEvent]) -> str:
    """Raw events as a fragment of a key's raw-events string: ``,[eventTime,
    "transactionId", value, "amount"]`` each, so a batch's events are appended."""
    return "".join(
        f",[{e.event_time},{json_string(e.transaction_id)},"
        f"{'null' if e.value is None else json_string(e.value)},{_json_decimal(e.number)}]"
        for e in events
    )


def _json_string_or_null(texts: pa.ChunkedArray) -> pa.ChunkedArray:
    """Texts that need no escaping as JSON strings, nulls as ``null``."""
    return pc.if_else(pc.is_valid(texts), pc.binary_join_element_wise('"', texts, '"', ""), "null")


def recent_fragment_texts(rows: pa.Table) -> pa.Array:
    """``recent_fragment`` of each row of keyed rows (``eventTime``, ``transactionId``,
    ``value``, ``number``), column by column (a text JSON must escape through Python)."""
    if rows.num_rows == 0:
        return pa.array([], pa.string())

    texts = pc.binary_join_element_wise(
        ",[",
        pc.cast(rows.column("eventTime"), pa.string()),
        ",",
        _json_string_or_null(rows.column("transactionId")),
        ",",
        _json_string_or_null(rows.column("value")),
        ",",
        _json_string_or_null(decimal_texts(rows.column("number"))),
        "]",
        "",
    )
    escape = pc.or_(
        pc.match_substring_regex(rows.column("transactionId"), _NEEDS_ESCAPE),
        pc.fill_null(pc.match_substring_regex(rows.column("value"), _NEEDS_ESCAPE), False),
    ).to_numpy(zero_copy_only=False)
    if not escape.any():
        return one_chunk(texts)
    out = texts.to_pylist()
    for row in np.flatnonzero(escape).tolist():
        one = rows.slice(row, 1).to_pylist()[0]
        event = KeyedEvent(one["eventTime"], one["transactionId"], one["value"], one["number"])
        out[row] = recent_fragment([event])
    return pa.array(out, pa.string())


def notified_field_texts(last: pa.Table) -> tuple[pa.Array, pa.Array]:
    """The hash fields (names, values) of last notified alerts (``ruleId``,
    ``ruleVersion``, ``eventTime``, ``transactionId`` columns)."""
    if last.num_rows == 0:
        return pa.array([], pa.string()), pa.array([], pa.string())
    names = pc.binary_join_element_wise(
        NOTIFIED_FIELD,
        pc.cast(last.column("ruleId"), pa.string()),
        ":",
        pc.cast(last.column("ruleVersion"), pa.string()),
        "",
    )
    values = pc.binary_join_element_wise(
        "[",
        pc.cast(last.column("eventTime"), pa.string()),
        ",",
        json_string_texts(last.column("transactionId")),
        "]",
        "",
    )
    return one_chunk(names), one_chunk(values)


def parse_notified_fields(
    names: pa.Array | pa.ChunkedArray, values: pa.Array | pa.ChunkedArray
) -> pa.Table:
    """``notified_field_texts``' fields back as columns ``ruleId``, ``ruleVersion``,
    ``eventTime``, ``transactionId``."""
    parts = [name[len(NOTIFIED_FIELD) :].split(":") for name in names.to_pylist()]
    decoded = [json.loads(value) for value in values.to_pylist()]
    return pa.table(
        {
            "ruleId": pa.array([int(rule) for rule, _ in parts], pa.int64()),
            "ruleVersion": pa.array([int(version) for _, version in parts], pa.int64()),
            "eventTime": pa.array([int(t) for t, _ in decoded], pa.int64()),
            "transactionId": pa.array([tx for _, tx in decoded], pa.string()),
        }
    )


def one_chunk(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one array (Arrow kernels may hand back chunked ones)."""
    return texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts


def parse_recent(text: str) -> tuple[KeyedEvent, ...]:
    """A raw-events string (``recent_fragment``s one after another) as the events."""
    return tuple(
        KeyedEvent(t, tx, value, None if number is None else Decimal(number))
        for t, tx, value, number in json.loads("[" + text[1:] + "]")
    )


def bucket_value_texts(buckets: pa.Table) -> pa.Array:
    """``bucket_value`` of every row of ``buckets`` (the buckets' figures and
    ``last_time``), built column by column: the stream writes one per changed bucket."""
    n = buckets.num_rows
    if n == 0:
        return pa.array([], pa.string())

    lists = buckets.column("distinct_values").combine_chunks().fill_null([])
    flat = pc.list_flatten(lists)
    quoted = pc.binary_join_element_wise('"', flat, '"', "")
    joined = pc.binary_join(pa.ListArray.from_arrays(lists.offsets, quoted), ",")
    last = buckets.column("last_time")
    tail = pc.if_else(
        pc.is_valid(last), pc.binary_join_element_wise(",", pc.cast(last, pa.string()), ""), ""
    )
    texts = pc.binary_join_element_wise(
        "[",
        pc.cast(buckets.column("event_count"), pa.string()),
        ",",
        pc.cast(buckets.column("value_count"), pa.string()),
        ",",
        _json_string_or_null(decimal_texts(buckets.column("value_sum"))),
        ",",
        _json_string_or_null(decimal_texts(buckets.column("value_min"))),
        ",",
        _json_string_or_null(decimal_texts(buckets.column("value_max"))),
        ",[",
        joined,
        "]",
        tail,
        "]",
        "",
    )
    escaped = pc.match_substring_regex(flat, _NEEDS_ESCAPE).to_numpy(zero_copy_only=False)
    if not escaped.any():
        return one_chunk(texts)
    out = texts.to_pylist()
    parents = pc.list_parent_indices(lists).to_numpy()
    for row in np.unique(parents[escaped]).tolist():
        values = buckets.slice(row, 1).to_pylist()[0]
        out[row] = bucket_value(bucket_from_columns(values), values["last_time"])
    return pa.array(out, pa.string())


# A bucket value's parts (``bucket_value``); decimals hold no quote, so "[^"]*" is one.
_BUCKET_VALUE = (
    r'^\[(?P<event_count>\d+),(?P<value_count>\d+),(?:null|"(?P<value_sum>[^"]*)"),'
    r'(?:null|"(?P<value_min>[^"]*)"),(?:null|"(?P<value_max>[^"]*)"),'
    r"(?P<distinct_values>\[.*\])(?:,(?P<last_time>-?\d+))?\]$"
)
# velocity.lua's read_keys: each named key's packed text (lines "<field>\t<value>\n",
# velocity.lua's packed_lines) in the names' order, joined by "\x1e".
KEY_SEPARATOR = "\x1e"
# A dense key's state string holds only this field's line; read_keys gives its hash's fields
# after that line.
HASH_MARK = "#"
DENSE_TEXT = f"{HASH_MARK}\t\n"
HASH_FIELDS = pa.schema(
    [pa.field("hash", pa.string()), pa.field("field", pa.string()), pa.field("value", pa.string())]
)


def packed_text(fields: Iterable[tuple[str, str]]) -> str:
    """A key's fields in the packed layout (velocity.lua's packed_lines)."""
    return "".join(f"{field}\t{value}\n" for field, value in fields)


def packed_fields(text: str) -> dict[str, str]:
    """The fields of a packed text (``packed_text``'s inverse)."""
    return dict(line.split("\t", 1) for line in text.split("\n") if line)


def read_keys_texts(text: str) -> pa.Array:
    """read_keys' answer as one packed text a key, in the names' order."""
    return pc.split_pattern(pa.array([text], pa.large_string()), KEY_SEPARATOR)[0].values


def key_field_rows(texts: pa.Array, names: pa.Array | pa.ChunkedArray) -> pa.Table:
    """The packed ``texts`` of the keys ``names`` (one each, as read_keys gives them) as
    columns (``HASH_FIELDS``), one row a field, split by Arrow kernels: no field or value
    holds a tab or a newline (values are JSON, control characters escaped)."""
    names = one_chunk(names)
    if len(names) == 0:
        return HASH_FIELDS.empty_table()
    if len(texts) != len(names):
        raise ValueError(f"read {len(texts)} key states for {len(names)} keys")
    lines = pc.split_pattern(texts, "\n")
    owner = pc.list_parent_indices(lines)
    line = pc.list_flatten(lines)
    real = pc.not_equal(line, "")
    pairs = pc.split_pattern(line.filter(real), "\t", max_splits=1)
    return pa.table(
        {
            "hash": names.take(owner.filter(real)),
            "field": pc.list_element(pairs, 0),
            "value": pc.list_element(pairs, 1),
        }
    ).cast(HASH_FIELDS)


def bucket_value_columns(texts: pa.Array | pa.ChunkedArray, schema: pa.Schema) -> pa.Table:
    """``parse_bucket`` of every text, column by column: the figures and ``last_time`` as
    ``schema`` types them. A distinct value holding an escape goes through the JSON
    parser (rare: the column split needs plain texts)."""
    texts = one_chunk(texts)
    parts = pc.extract_regex(texts, _BUCKET_VALUE)
    if parts.null_count:
        bad = texts.filter(pc.is_null(parts))[0].as_py()
        raise ValueError(f"not a bucket value: {bad!r}")
    columns = {}
    for name in ("event_count", "value_count", "value_sum", "value_min", "value_max", "last_time"):
        part = parts.field(name)
        typed = pc.if_else(pc.equal(part, ""), pa.scalar(None, pa.string()), part)
        columns[name] = pc.cast(typed, schema.field(name).type)
    lists = parts.field("distinct_values")
    inner = pc.if_else(
        pc.equal(lists, "[]"), pa.scalar(None, pa.string()), pc.utf8_slice_codeunits(lists, 2, -2)
    )
    kind = schema.field("distinct_values").type
    distinct = pc.fill_null(pc.split_pattern(inner, '","'), pa.scalar([], kind))
    escaped = pc.match_substring(lists, "\\").to_numpy(zero_copy_only=False)
    if escaped.any():
        values = distinct.to_pylist()
        for row in np.flatnonzero(escaped).tolist():
            values[row] = json.loads(lists[row].as_py())
        distinct = pa.array(values, kind)
    columns["distinct_values"] = distinct.cast(kind)
    return pa.table(columns)
