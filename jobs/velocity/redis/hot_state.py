"""A key-partition's keys' hot state as Redis holds it, read column by column (pure).

Redis answers with each key's packed text (an MGET; velocity.lua's read_keys for dense
keys and on a cluster), split into fields by ``keys.key_field_rows``; here
those become the stored buckets (``STORED_SCHEMA``) and the raw-events texts kept
beside them, without a Python object per bucket: a bucket's figures are parsed by Arrow
kernels (``keys.bucket_value_columns``). Raw events are parsed only for the few own
buckets that need them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from velocity.domain.buckets import bucket_from_columns
from velocity.domain.stream_batch import BucketSlot, KeyState, SignatureKey
from velocity.domain.windows import KeyedEvent
from velocity.engine.bucketing import BUCKET_ROWS
from velocity.engine.cooldown import LAST_NOTIFIED
from velocity.engine.key_partition import STORED_SCHEMA
from velocity.engine.micro_batch import SLOT
from velocity.redis.keys import (
    HASH_MARK,
    NOTIFIED_FIELD,
    RAW_FIELD,
    bucket_value_columns,
    one_chunk,
    parse_notified_fields,
    parse_recent,
)

# The raw events a key's hash holds of a bucket new to it (``~<start>``), unread.
RAW_TEXTS = pa.schema([*(BUCKET_ROWS.field(name) for name in SLOT), pa.field("text", pa.string())])
# Every field of the keys read, as stored (a dense key's first is ``keys.HASH_MARK``): what
# a packed key's commit rewrites whole, unchanged where the batch did not change it.
STORED_FIELDS = pa.schema(
    [
        BUCKET_ROWS.field("signature_id"),
        BUCKET_ROWS.field("key"),
        pa.field("field", pa.string()),
        pa.field("value", pa.string()),
    ]
)


@dataclass(frozen=True)
class HotState:
    """A key-partition's keys' hot state as Redis holds it, as columns: every stored
    bucket (``STORED_SCHEMA``), the raw-events texts kept beside them (``RAW_TEXTS``,
    not yet trusted: parsed only for the own buckets that need them), and each rule
    version's last notified alert of the key (``LAST_NOTIFIED``: the cooldown's state),
    and every field as stored (``STORED_FIELDS``)."""

    buckets: pa.Table
    raw: pa.Table
    notified: pa.Table = field(default_factory=LAST_NOTIFIED.empty_table)
    stored: pa.Table = field(default_factory=STORED_FIELDS.empty_table)

    def recent_events(
        self, slots: Sequence[BucketSlot], texts: Mapping[BucketSlot, str] | None = None
    ) -> dict[BucketSlot, tuple[KeyedEvent, ...]]:
        """The raw events of ``slots`` that are trusted: from ``texts`` (read apart), else
        the hash's own text. They are a subset of a bucket's events by construction, so as
        many as the bucket counts means all of them, whatever happened in between (a
        rebuild from Delta, a signature built again)."""
        if not slots:
            return {}
        wanted = pa.table(
            {name: pa.array([s[i] for s in slots], RAW_TEXTS.field(name).type)
             for i, name in enumerate(SLOT)}
        )  # fmt: skip
        counted = wanted.join(
            self.buckets.select([*SLOT, "event_count"]), keys=list(SLOT), use_threads=False
        ).join(self.raw, keys=list(SLOT), use_threads=False)
        out = {}
        for row in counted.to_pylist():
            slot = (row["signature_id"], row["key"], row["bucket_start"])
            text = (texts or {}).get(slot, row["text"])
            if row["event_count"] is None or text is None:
                continue
            events = parse_recent(text)
            if len(events) == row["event_count"]:
                out[slot] = events
        return out

    def key_states(self) -> dict[SignatureKey, KeyState]:
        """Each key's buckets (and newest eventTimes) and trusted recent events, by key."""
        states: dict[SignatureKey, KeyState] = {}
        for row in self.buckets.to_pylist():
            state = states.setdefault((row["signature_id"], row["key"]), KeyState())
            state.buckets[row["bucket_start"]] = bucket_from_columns(row)
            state.last_times[row["bucket_start"]] = row["last_time"]
        slots = list(zip(*(self.raw.column(n).to_pylist() for n in SLOT), strict=True))
        for (sig, key, start), events in self.recent_events(slots).items():
            states[(sig, key)].recent[start] = events
        return states


def hot_state(fields: pa.Table, hashes: pa.Table) -> HotState:
    """The hot state in ``fields`` (``keys.HASH_FIELDS`` rows) of the ``hashes`` asked
    (columns hash, signature_id, key: each bucket hash's name and its key)."""
    owner = pc.index_in(fields.column("hash"), value_set=one_chunk(hashes.column("hash")))
    field = fields.column("field")
    is_raw = pc.starts_with(field, RAW_FIELD)
    is_notified = pc.starts_with(field, NOTIFIED_FIELD)

    def slots(rows: pa.Array, starts: pa.Array | pa.ChunkedArray) -> dict[str, pa.Array]:
        which = owner.filter(rows)
        return {
            "signature_id": hashes.column("signature_id").take(which),
            "key": hashes.column("key").take(which),
            "bucket_start": pc.cast(starts, pa.int64()),
        }

    is_mark = pc.equal(field, HASH_MARK)
    is_bucket = pc.invert(pc.or_(pc.or_(is_raw, is_notified), is_mark))
    values = bucket_value_columns(fields.column("value").filter(is_bucket), STORED_SCHEMA)
    buckets = pa.table(
        {
            **slots(is_bucket, field.filter(is_bucket)),
            **{name: values.column(name) for name in values.column_names},
        }
    ).select(STORED_SCHEMA.names)
    raw = pa.table(
        {
            **slots(is_raw, pc.utf8_slice_codeunits(field.filter(is_raw), len(RAW_FIELD))),
            "text": fields.column("value").filter(is_raw),
        }
    )
    last = parse_notified_fields(
        field.filter(is_notified), fields.column("value").filter(is_notified)
    )
    owners = slots(is_notified, pa.nulls(last.num_rows, pa.int64()))
    notified = pa.table(
        {
            "signature_id": owners["signature_id"],
            "key": owners["key"],
            **{n: last.column(n) for n in last.column_names},
        }
    )
    stored = pa.table(
        {
            "signature_id": hashes.column("signature_id").take(owner),
            "key": hashes.column("key").take(owner),
            "field": field,
            "value": fields.column("value"),
        }
    )
    return HotState(
        buckets.cast(STORED_SCHEMA),
        raw.cast(RAW_TEXTS),
        notified.cast(LAST_NOTIFIED),
        stored.cast(STORED_FIELDS),
    )
