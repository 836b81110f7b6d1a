"""The Redis mirror of the Delta buckets, the alert stream, and the lookup.

Redis is never the only copy: every write here sets absolute values read from Delta
(a replayed batch writes the same values again), and ``rebuild`` refills it from Delta.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import redis
from redis.cluster import RedisCluster

from velocity.domain.buckets import bucket_from_columns
from velocity.domain.decimals import json_string
from velocity.domain.rules import Rule, RuleState
from velocity.domain.stream_batch import BucketSlot, SignatureKey
from velocity.domain.windows import horizon_seconds
from velocity.engine.cooldown import LAST_NOTIFIED
from velocity.engine.kernel import BUCKET_FIGURES
from velocity.errors import UnknownRuleError, VelocityError
from velocity.redis import cluster
from velocity.redis.commit_args import (
    BucketChanges,
    PartitionCommit,
    StreamCommit,
    resp_command,
)
from velocity.redis.connection import connect, is_cluster, read_hash
from velocity.redis.hot_state import HotState, hot_state
from velocity.redis.keys import (
    CHECK_MAX_FUTURE_FIELD,
    CHECK_PROGRESS_FIELD,
    DENSE_TEXT,
    HASH_FIELDS,
    HASH_MARK,
    PIECES_SUFFIX,
    RedisKeys,
    bucket_value_texts,
    check_rule,
    key_field_rows,
    notified_field_texts,
    one_chunk,
    parse_bucket_value,
    read_keys_texts,
    rule_entry,
)
from velocity.redis.lease import Lease, StateLockLost
from velocity.redis.lock import state_lock
from velocity.settings import Settings

_PIPELINE_CHUNK = 1000
# A key's state is packed (one string) until it has this many buckets, then dense: a hash
# with roll-ups (velocity.lua's ROLLUP_MIN_BUCKETS), until it has fewer than
# DENSE_KEEP_BUCKETS (so a key at the edge does not change layout every batch).
DENSE_MIN_BUCKETS = 128
DENSE_KEEP_BUCKETS = 64
# The stream's progress hash records the layout its keys' states are in (velocity.lua's
# commits write it); one without it but with a batch was written before 0.3.
STATE_LAYOUT_FIELD, STATE_LAYOUT = "layout", "packed"
# velocity_stream_commit's and velocity_partition_commit's answers (nothing written).
FENCED, REPLAYED = cluster.FENCED, cluster.REPLAYED


def key_ttl_seconds(rules: Sequence[Rule], settings: Settings) -> int:
    """How long a (signature, key) hash lives after its last write: its buckets' horizon,
    or longer when a rule's cooldown is (its last notified alert lives in the hash)."""
    longest = max((r.cooldown_ms for r in rules), default=0)
    cooldown = (longest + settings.allowed_lateness_ms + settings.bucket_width_ms) // 1000 + 1
    return max(horizon_seconds(rules, settings), cooldown)


def write_bucket_rows(
    client: redis.Redis,
    keys: RedisKeys,
    rows: Iterable[Mapping[str, Any]],
    bucket_ms: int,
    ttl_seconds: int,
    evict_before: int | None = None,
) -> int:
    """``write_bucket_table`` of rows given as mappings (``BUCKET_ROWS``' columns)."""
    table = pa.Table.from_pylist(list(rows), BUCKET_ROWS)
    return write_bucket_table(client, keys, table, bucket_ms, ttl_seconds, evict_before)


def write_bucket_table(
    client: redis.Redis,
    keys: RedisKeys,
    buckets: pa.Table,
    bucket_ms: int,
    ttl_seconds: int,
    evict_before: int | None = None,
) -> int:
    """Set each bucket's absolute value and refresh its key's TTL and roll-ups; returns
    rows written. ``buckets``: Delta's g-wide rows (``BUCKET_ROWS``), their values made
    column by column.

    With ``evict_before``, each written key also drops its buckets older than that, so a
    busy key never outgrows the horizon (an idle one expires whole by its TTL).
    """
    # A key's rows side by side: one velocity_put_buckets call a key a chunk.
    buckets = buckets.sort_by([("signature_id", "ascending"), ("key", "ascending")])
    names = pc.binary_join_element_wise(
        keys.key_base_texts(buckets.column("signature_id"), buckets.column("key")), ":buckets", ""
    )
    values = bucket_value_texts(
        buckets.select(list(BUCKET_FIGURES)).append_column(
            "last_time", pa.nulls(buckets.num_rows, pa.int64())
        )
    )
    changes = zip(
        names.to_pylist(),
        buckets.column("bucket_start").to_pylist(),
        values.to_pylist(),
        strict=True,
    )
    evict = "" if evict_before is None else str(evict_before)
    return _put_buckets(client, keys, changes, str(bucket_ms), str(ttl_seconds * 1000), evict)


def bucket_table_writer(
    settings: Settings, ttl_seconds: int, evict_before: int | None = None
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: each Spark task writes its buckets itself and answers
    how many (``WRITTEN``)."""

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = connect(settings)
        try:
            for batch in batches:
                written = write_bucket_table(
                    client,
                    settings.redis_keys,
                    pa.Table.from_batches([batch]),
                    settings.bucket_width_ms,
                    ttl_seconds,
                    evict_before,
                )
                yield pa.RecordBatch.from_pydict({"written": [written]}, WRITTEN)
        finally:
            client.close()

    return write


WRITTEN = pa.schema([pa.field("written", pa.int64(), False)])


def write_last_notified(
    client: redis.Redis, keys: RedisKeys, rows: Iterable[Mapping[str, Any]], ttl_seconds: int
) -> int:
    """Each rule version's last notified alert of a key (``LAST_NOTIFIED`` rows) into
    the key's state, as the stream's commit writes it (the cooldown's state), through
    velocity_put_buckets (either layout); returns the rows written."""
    last = pa.Table.from_pylist(list(rows), schema=LAST_NOTIFIED)
    names, values = notified_field_texts(last)
    owners = zip(*(last.column(n).to_pylist() for n in ("signature_id", "key")), strict=True)
    states = [keys.bucket_hash(signature_id, key) for signature_id, key in owners]
    changes = zip(states, names.to_pylist(), values.to_pylist(), strict=True)
    return _put_buckets(client, keys, changes, "", str(ttl_seconds * 1000), "")


def remove_buckets(
    client: redis.Redis, keys: RedisKeys, slots: Iterable[tuple[str, str, int]]
) -> None:
    """Remove the given (signature, key, bucket start) buckets."""
    changes = ((keys.bucket_hash(sig, key), start, "") for sig, key, start in slots)
    _put_buckets(client, keys, changes, "", "", "")


def _put_buckets(
    client: redis.Redis,
    keys: RedisKeys,
    changes: Iterable[tuple[str, int | str, str]],
    bucket_ms: str,
    ttl_ms: str,
    evict_before: str,
) -> int:
    """(key state, bucket start or another field, value or "" to remove) changes through
    velocity_put_buckets,
    which keeps each hash's roll-ups in step: one call per hash per chunk, pipelined."""
    done = 0
    pipe = client.pipeline(transaction=False)
    pipe.incr(keys.buckets_epoch)  # the stream's in-memory copy is stale from here on
    pending: dict[str, list[str]] = {}

    def send() -> None:
        for name, pairs in pending.items():
            pipe.fcall("velocity_put_buckets", 1, name, bucket_ms, ttl_ms, evict_before, *pairs)
        pending.clear()
        pipe.execute()

    for name, start, value in changes:
        pending.setdefault(name, []).extend((str(start), value))
        done += 1
        if done % _PIPELINE_CHUNK == 0:
            send()
    send()
    return done


def publish_backfill(
    client: redis.Redis, stream: str, retention: str, alerts: Sequence[Mapping[str, Any]]
) -> int:
    """Append a backfill's CORRECTION and RETRACTION records to the alert stream, trimmed
    to ``retention`` (``Settings.alert_stream_retention``).

    Unlike a micro-batch (``stream_commit``), a backfill publishes at least once (a
    rerun after a crash may repeat an entry); consumers drop repeats by ``alertId``, which
    is deterministic.
    """
    if not alerts:
        return 0
    payload = [json.dumps(a, separators=(",", ":")) for a in alerts]
    added = 0
    for start in range(0, len(payload), _PIPELINE_CHUNK):
        chunk = payload[start : start + _PIPELINE_CHUNK]
        added += int(
            client.fcall(  # type: ignore[arg-type]
                "velocity_publish_backfill", 1, stream, retention, *chunk
            )
        )
    return added


def newest_alert_entries(client: redis.Redis, stream: str) -> Iterator[dict[str, Any]]:
    """The alert stream's entries (their fields), newest first, read back 500 at a time as
    the caller consumes them."""
    upper = "+"
    while True:
        page = cast(list[Any], client.xrevrange(stream, max=upper, min="-", count=500))
        for _, fields in page:
            yield fields
        if len(page) < 500:
            return
        upper = "(" + page[-1][0]


def batch_alerts(client: redis.Redis, stream: str, batch_id: int) -> list[str]:
    """The alerts micro-batch ``batch_id`` published on the alert stream (SPEC §4 JSON, in
    order), read back from the stream's end: a replay of the newest committed batch
    publishes them to Kafka again. Backfill entries (marked ``backfill``) are left out."""
    found: list[str] = []
    for fields in newest_alert_entries(client, stream):
        if fields.get("backfill"):
            continue
        batch = int(fields.get("batch", -1))
        if batch < batch_id:
            break
        if batch == batch_id:
            found.append(fields["alert"])
    return found[::-1]


def publish_rules(
    client: redis.Redis,
    keys: RedisKeys,
    rules: Sequence[Rule],
    bucket_ms: int,
    max_future_ms: int | None = None,
) -> None:
    """Make ``<prefix>:rule:<id>`` and ``<prefix>:rules`` (the check's) describe exactly the
    given ACTIVE rules (others are removed), in one MULTI/EXEC: a lookup or a check never
    sees a rule between its DEL and its HSET. A SHADOW candidate gets no entry: its ruleId's
    entry is the rule in force's. ``max_future_ms`` (the stream's VELOCITY_MAX_FUTURE_SECONDS)
    makes the check refuse a payment the stream would quarantine as future_event_time."""
    active = [r for r in rules if r.state is RuleState.ACTIVE]
    wanted = {keys.rule_entry(r.rule_id): rule_entry(r, bucket_ms) for r in active}
    checked = {str(r.rule_id): check_rule(r, bucket_ms) for r in active}
    checked[CHECK_PROGRESS_FIELD] = keys.stream_progress
    if max_future_ms is not None:
        checked[CHECK_MAX_FUTURE_FIELD] = str(max_future_ms)
    present = set(client.scan_iter(match=keys.rule_entries, count=1000))
    # A cluster has no MULTI across slots: there a lookup may see a rule in between.
    pipe = client.pipeline(transaction=not is_cluster(client))
    for name in present - set(wanted):
        pipe.delete(name)
    for name, entry in wanted.items():
        pipe.delete(name)
        pipe.hset(name, mapping=entry)
    copies = [keys.check_rules]
    if is_cluster(client):
        # Each master reads the rules of a check from its own copy.
        wanted_copies = {
            c.name for c in cluster.rules_copies(cast(RedisCluster, client), keys).values()
        }
        for stale in (
            set(client.scan_iter(match=keys.check_rules_copies, count=1000)) - wanted_copies
        ):
            pipe.delete(stale)
        copies += sorted(wanted_copies)
    for name in copies:
        pipe.delete(name)
        pipe.hset(name, mapping=checked)
    pipe.execute()


def lookup(
    client: redis.Redis,
    keys: RedisKeys,
    rule_id: int,
    key_values: Mapping[str, str],
    at_ms: int | None = None,
) -> dict[str, Any]:
    """The window aggregate of (rule, key) as of ``at_ms`` (None: the server's now)."""
    entry = read_hash(client, keys.rule_entry(rule_id))
    if not entry:
        raise UnknownRuleError(
            f"ruleId {rule_id} is not published in Redis: it is not in force, or the stream "
            "has not run since Redis was emptied (`velocity mirror rebuild` refills it)"
        )
    names = json.loads(entry["groupingKeyNames"])
    bucket_key = keys.for_lookup(entry, key_values)
    args = [entry["aggregatorFunctionType"], entry["windowMs"], entry["bucketMs"]]
    if at_ms is not None:
        args.append(str(at_ms))
    result = json.loads(client.fcall("velocity_window", 1, bucket_key, *args))  # type: ignore[arg-type]
    return {
        "ruleId": rule_id,
        "key": {n: str(key_values[n]) for n in names},
        "aggregateValue": result["aggregateValue"],
        "windowStart": result["windowStart"],
        "windowEnd": result["windowEnd"],
    }


@dataclass
class Drift:
    """Differences between Redis and Delta for the buckets Redis should hold."""

    checked: int = 0
    missing: list[tuple[str, str, int]] = field(default_factory=list)
    different: list[tuple[str, str, int]] = field(default_factory=list)
    extra: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.missing or self.different or self.extra)


def bucket_hashes(client: redis.Redis, keys: RedisKeys) -> Iterator[tuple[str, SignatureKey]]:
    """Every bucket hash of the deployment (SCAN): its name and (signature, key)."""
    for name in client.scan_iter(match=keys.bucket_hashes, count=1000):
        slot = keys.parse_bucket_hash(name)
        if slot is not None:
            yield name, slot


def key_fields(client: redis.Redis, name: str) -> dict[str, str]:
    """The fields of one (signature, key)'s state whatever its layout (packed or dense),
    roll-ups left out: its buckets, raw events and last notified alerts."""
    text = client.fcall("velocity_read_keys", 1, name, json.dumps([name]))
    rows = key_field_rows(read_keys_texts(cast(str, text)), pa.array([name], pa.string()))
    pairs = zip(rows.column("field").to_pylist(), rows.column("value").to_pylist(), strict=True)
    return {field: value for field, value in pairs if field != HASH_MARK}


def pack_hashes(client: redis.Redis, settings: Settings) -> tuple[int, int, int]:
    """Migrate a data dir's Redis state from the layout before 0.3 (every (signature, key)
    a hash): a hash with fewer than DENSE_MIN_BUCKETS buckets becomes one packed string, a
    larger one moves to its dense hash (velocity_pack, TTLs kept), and the stream's
    progress records the layout, under the state lock so that no batch commits in between.
    Returns (keys packed, keys made dense, keys looked at). Idempotent."""
    keys = settings.redis_keys
    done: list[int] = []
    with state_lock(client, settings, "mirror migrate"):
        client.incr(keys.buckets_epoch)
        names = [name for name, _ in bucket_hashes(client, keys)]
        for first in range(0, len(names), _PIPELINE_CHUNK):
            pipe = client.pipeline(transaction=False)
            for name in names[first : first + _PIPELINE_CHUNK]:
                pipe.fcall("velocity_pack", 1, name)
            done.extend(int(answer) for answer in pipe.execute())
        client.hset(keys.stream_progress, STATE_LAYOUT_FIELD, STATE_LAYOUT)
    return done.count(1), done.count(2), len(names)


# Delta's g-wide bucket rows as ``compare_buckets`` takes them (Spark's BUCKET_SCHEMA
# figures, as Arrow).
BUCKET_ROWS = pa.schema(
    [
        pa.field("signature_id", pa.string()),
        pa.field("key", pa.string()),
        pa.field("bucket_start", pa.int64()),
        pa.field("event_count", pa.int64()),
        pa.field("value_count", pa.int64()),
        pa.field("value_sum", pa.decimal128(38, 8)),
        pa.field("value_min", pa.decimal128(26, 8)),
        pa.field("value_max", pa.decimal128(26, 8)),
        pa.field("distinct_values", pa.list_(pa.string())),
    ]
)
# A key state read of the comparison: this many keys' MGETs in one round trip.
_STATE_READS_A_ROUND = 4096
# A bucket's field in a key's state: its start (roll-ups and notified alerts are not).
_BUCKET_FIELD = r"^\d+$"
# A stored bucket value's newest eventTime (``bucket_value``'s optional last part): the
# stream records it, Delta does not.
_LAST_TIME = r",-?\d+\]$"


def key_field_states(client: redis.Redis, names: pa.Array) -> pa.Table:
    """The fields (``HASH_FIELDS`` rows) of the key states ``names``, either layout: MGETs
    of READ_KEYS_A_CALL keys, pipelined, a dense key's hash read beside them (as the
    stream reads); on a Redis Cluster one read_keys call a key (each its own slot)."""
    listed = names.to_pylist()
    if is_cluster(client):
        texts = [
            read_keys_texts(
                cast(
                    str,
                    client.fcall("velocity_read_keys", 1, n, json.dumps([n], ensure_ascii=False)),
                )
            ).cast(pa.string())
            for n in listed
        ]
        return key_field_rows(
            pa.concat_arrays(texts) if texts else pa.array([], pa.string()), names
        )
    rows = []
    for first in range(0, len(listed), _STATE_READS_A_ROUND):
        chunk = listed[first : first + _STATE_READS_A_ROUND]
        pipe = client.pipeline(transaction=False)
        for at in range(0, len(chunk), READ_KEYS_A_CALL):
            pipe.mget(chunk[at : at + READ_KEYS_A_CALL])
        stored = [text for part in pipe.execute() for text in part]
        chunk_names = pa.array(chunk, pa.string())
        rows.append(key_field_rows(key_states_texts(client, chunk_names, stored), chunk_names))
    return pa.concat_tables(rows) if rows else HASH_FIELDS.empty_table()


def compare_buckets(
    client: redis.Redis,
    keys: RedisKeys,
    expected: pa.Table,
    since: int | None = None,
    also: Sequence[str] = (),
) -> Drift:
    """Compare Delta's bucket rows ``expected`` (signature_id, key, bucket_start and the
    figures; every row of each (signature, key) it holds) with the states Redis holds of
    those keys and of the key states ``also`` (hashes Delta has no row for: all their
    buckets are extra).

    Column by column: each row's value as the mirror writes it against the stored one (the
    newest eventTime the stream records left out), and only the rows whose texts differ
    parsed and compared as aggregates (a value written in another order of its distinct
    values is no drift). Redis buckets older than ``since`` are not drift: the stream's
    own eviction trails the horizon by up to a batch, and such buckets expire with their
    key.
    """
    drift = Drift(checked=expected.num_rows)
    hashes = one_chunk(
        pc.binary_join_element_wise(
            keys.key_base_texts(expected.column("signature_id"), expected.column("key")),
            ":buckets",
            "",
        )
    )
    figures = expected.select(list(BUCKET_FIGURES))
    want = pa.table(
        {
            "hash": hashes,
            "bucket_start": expected.column("bucket_start").cast(pa.int64()),
            "want": bucket_value_texts(
                figures.append_column("last_time", pa.nulls(expected.num_rows, pa.int64()))
            ),
            "row": pa.array(range(expected.num_rows), pa.int64()),
        }
    )
    names = pc.unique(pa.concat_arrays([hashes, pa.array(list(also), pa.string())]))
    fields = key_field_states(client, names)
    fields = fields.filter(pc.match_substring_regex(fields.column("field"), _BUCKET_FIELD))
    stored = pa.table(
        {
            "hash": fields.column("hash"),
            "bucket_start": pc.cast(fields.column("field"), pa.int64()),
            "got": pc.replace_substring_regex(fields.column("value"), _LAST_TIME, "]"),
        }
    )
    both = want.join(stored, keys=["hash", "bucket_start"], join_type="full outer")
    has_want, has_got = pc.is_valid(both.column("want")), pc.is_valid(both.column("got"))
    owner = dict(
        zip(
            hashes.to_pylist(),
            zip(
                expected.column("signature_id").to_pylist(),
                expected.column("key").to_pylist(),
                strict=True,
            ),
            strict=True,
        )
    )

    def slots(rows: pa.Table) -> list[tuple[str, str, int]]:
        found = []
        for name, start in zip(
            rows.column("hash").to_pylist(), rows.column("bucket_start").to_pylist(), strict=True
        ):
            slot = owner.get(name) or keys.parse_bucket_hash(name)
            if slot is not None:
                found.append((slot[0], slot[1], start))
        return sorted(found)

    drift.missing = slots(both.filter(pc.invert(has_got)))
    extra = both.filter(pc.invert(has_want))
    if since is not None:
        extra = extra.filter(pc.greater_equal(extra.column("bucket_start"), since))
    drift.extra = slots(extra)
    unequal = both.filter(
        pc.and_(pc.and_(has_want, has_got), pc.not_equal(both.column("want"), both.column("got")))
    )
    rows = expected.take(unequal.column("row")).select(list(BUCKET_FIGURES)).to_pylist()
    really = [
        parse_bucket_value(got) != bucket_from_columns(row)
        for got, row in zip(unequal.column("got").to_pylist(), rows, strict=True)
    ]
    drift.different = slots(unequal.filter(pa.array(really, pa.bool_())))
    return drift


# --- the stream's hot state: one read and one atomic commit per micro-batch --------------


# No keys asked (the driver's read of the progress and seen transactionIds).
ASKED_NONE = pa.table({"signature_id": pa.array([], pa.string()), "key": pa.array([], pa.string())})


@dataclass
class StreamRead:
    """What a micro-batch reads from Redis before deciding, in one round trip."""

    committed_batch: int | None  # the last batch committed to Redis
    newest_event_time: int | None  # the newest accepted eventTime of the committed batches
    epoch: str  # <prefix>:buckets-epoch: changes when anyone but the stream rewrote buckets
    mirror_of: str  # the data dir Redis holds the buckets of ("" after a flush)
    seen: set[str]  # transactionIds accepted by earlier batches (of those asked)
    hot: HotState  # the asked (signature, key)s' buckets and raw events that Redis holds


def committed_batch(client: redis.Redis, settings: Settings) -> int | None:
    """The last micro-batch the stream committed to Redis (None: none, or Redis lost it)."""
    value = client.hget(settings.redis_keys.stream_progress, "batch")
    return None if value is None else int(value)  # type: ignore[arg-type]


# The keys' states are read by MGETs of this many keys (about 0.1-0.3 ms each in Redis),
# pipelined: one MGET of a partition's 3,000 keys held Redis 10-45 ms, and every check
# waited behind it.
READ_KEYS_A_CALL = 256


def read_stream_state(
    client: redis.Redis,
    settings: Settings,
    transaction_ids: Sequence[str],
    asked: pa.Table | None = None,
) -> StreamRead:
    """The stream's progress, the seen transactionIds among ``transaction_ids`` and the
    hot state of the ``asked`` keys (columns signature_id, key), in one round trip: a
    Function call (velocity_stream_read) and MGETs of the keys' states beside it. Not
    one atomic read, and need not be: only the state lock's holder writes those keys."""
    keys = settings.redis_keys
    asked = ASKED_NONE if asked is None else asked.select(ASKED_NONE.column_names)
    names = one_chunk(
        pc.binary_join_element_wise(
            keys.key_base_texts(asked.column("signature_id"), asked.column("key")), ":buckets", ""
        )
    )
    if is_cluster(client):
        progress, seen_indices, epoch, mirror_of, texts = cluster.read_stream_state(
            cast(RedisCluster, client), settings, transaction_ids, names.to_pylist()
        )
        states = pa.array(texts, pa.string())
    else:
        request = (
            f'{{"s":{json.dumps(list(transaction_ids), ensure_ascii=False)},'
            f'"sp":{json_string(keys.seen_prefix)},"sh":{settings.dedup_horizon_seconds * 1000}}}'
        )
        pipe = client.pipeline(transaction=False)
        pipe.fcall(
            "velocity_stream_read",
            3,
            keys.stream_progress,
            keys.buckets_epoch,
            keys.mirror_marker,
            request,
        )
        listed = names.to_pylist()
        for first in range(0, len(listed), READ_KEYS_A_CALL):
            pipe.mget(listed[first : first + READ_KEYS_A_CALL])
        answer, *stored = pipe.execute()
        reply = json.loads(answer)
        progress = reply["p"] or {}
        seen_indices = {i - 1 for i in reply["s"] or []}
        epoch, mirror_of = str(reply["e"]), str(reply["m"])
        states = key_states_texts(client, names, [text for part in stored for text in part])
    if "batch" in progress and progress.get(STATE_LAYOUT_FIELD) != STATE_LAYOUT:
        raise VelocityError(
            "Redis holds this data dir's state in the layout before Velocity 0.3 (a hash "
            "per key): stop the stream and run `velocity mirror migrate` once"
        )
    return StreamRead(
        committed_batch=int(progress["batch"]) if "batch" in progress else None,
        newest_event_time=int(progress["newest"]) if progress.get("newest") else None,
        epoch=epoch,
        mirror_of=mirror_of,
        seen={transaction_ids[i] for i in seen_indices},
        hot=hot_state(key_field_rows(states, names), asked.append_column("hash", names)),
    )


def key_states_texts(
    client: redis.Redis, names: pa.Array, stored: Sequence[str | None]
) -> pa.Array:
    """The ``stored`` state strings of the keys ``names`` (an MGET's answer) as read_keys
    gives them: a dense key's with its hash's fields (read_keys, for those alone), "" for
    a key that has none."""
    texts = pc.fill_null(pa.array(stored, pa.string()), "")
    dense = pc.equal(texts, DENSE_TEXT)
    if not pc.any(dense).as_py():
        return texts
    dense_names = names.filter(dense).to_pylist()
    answer = client.fcall(
        "velocity_read_keys", 1, dense_names[0], json.dumps(dense_names, ensure_ascii=False)
    )
    return pc.replace_with_mask(texts, dense, read_keys_texts(cast(str, answer)).cast(pa.string()))


def read_recent_texts(
    client: redis.Redis, keys: RedisKeys, slots: Sequence[BucketSlot]
) -> dict[BucketSlot, str]:
    """The raw-events strings Redis holds of the given (signature, key, bucket start)s, in
    one pipelined round trip (untrusted: ``HotState.recent_events`` checks them against
    the bucket)."""
    if not slots:
        return {}
    pipe = client.pipeline(transaction=False)
    for sig, key, start in slots:
        pipe.get(keys.recent_events(sig, key, start))
    return {slot: text for slot, text in zip(slots, pipe.execute(), strict=True) if text}


def stream_commit(
    settings: Settings,
    batch_id: int,
    newest_event_time: int | None,
    changes: BucketChanges,
    accepted: Iterable[str],
    alerts: Sequence[str],
    bucket_ttl_seconds: int,
    lease: Lease,
    shadow_alerts: Sequence[str] = (),
) -> StreamCommit:
    """One micro-batch's commit to Redis: the bucket ``changes``, the accepted
    transactionIds, the ``alerts`` (SPEC §4 JSON; ``shadow_alerts`` to the shadow stream)
    and the progress, applied atomically by
    ``send_stream_commit`` or ``PendingCommit`` (built apart from the call, so the stream
    sends it and goes on while Redis runs it). Redis refuses a batch committed before (-1:
    a replay writes nothing) and writes nothing unless the state lock still holds
    ``lease``'s token."""
    keys = settings.redis_keys
    return StreamCommit(
        (keys.stream_progress, settings.alert_stream, lease.name, settings.shadow_alert_stream),
        lease.token,
        batch_id,
        "" if newest_event_time is None else str(newest_event_time),
        bucket_ttl_seconds * 1000,
        settings.dedup_horizon_seconds * 1000,
        settings.bucket_width_ms,
        keys.seen_prefix,
        settings.alert_stream_retention,
        changes,
        list(accepted),
        list(alerts),
        list(shadow_alerts),
    )


def send_stream_commit(
    client: redis.Redis, settings: Settings, commit: StreamCommit, lease: Lease
) -> int:
    """Run a built ``stream_commit`` in Redis: the alerts published, -1 for a replay;
    ``StateLockLost`` when fenced (nothing written)."""
    return begin_stream_commit(client, settings, commit, lease).result()


def begin_stream_commit(
    client: redis.Redis, settings: Settings, commit: StreamCommit, lease: Lease
) -> PendingCommit | cluster.ClusterCommit:
    """Send a built ``stream_commit``; its ``result()`` is the answer. On one server Redis
    runs it while the caller goes on; on a cluster it is staged and done here."""
    if is_cluster(client):
        return cluster.ClusterCommit(cast(RedisCluster, client), settings, commit, lease)
    return PendingCommit(client, commit, lease)


# A partition record outlives any restart of a crashed batch; the batch's commit drops it.
PARTITION_RECORD_TTL_MS = 86_400_000


def batch_plan(
    client: redis.Redis, settings: Settings, lease: Lease, batch_id: int, plan: str
) -> str:
    """The plan (JSON, its "batch" as text) a micro-batch is cut and decided by: the one
    recorded for ``batch_id`` when a first attempt recorded one, else ``plan``, recorded
    now (velocity_batch_plan). ``StateLockLost`` when fenced."""
    keys = settings.redis_keys
    reply = client.fcall(
        "velocity_batch_plan", 2, keys.state_lock, keys.batch_plan, lease.token, str(batch_id), plan
    )
    if reply == FENCED:
        lease.lost.set()
        lease.check()
    return cast(str, reply)


def partition_outcome(client: redis.Redis, record: str) -> str | None:
    """The outcome a key-partition committed already (its changes applied in full), or
    None: a retried task, or a replayed batch, returns it instead of deciding again. A
    partition whose pieces were not all applied (its task died between them) is None
    too: its task decides again and finishes them (``commit_partition``)."""
    if is_cluster(client):
        recorded = cast(str | None, client.get(record))
        return (
            None
            if recorded is None
            else cluster.finish_partition(cast(RedisCluster, client), recorded)
        )
    recorded, pieces = cast(list[str | None], client.mget(record, record + PIECES_SUFFIX))
    if pieces is not None:
        applied, count = pieces.split("/")
        if applied != count:
            return None
    return recorded


def commit_partition(client: redis.Redis, settings: Settings, commit: PartitionCommit) -> str:
    """Apply a key-partition's changes and record its outcome, once per (batch,
    partition), fenced by the state lock: the record with the first piece
    (velocity_partition_commit), then the other pieces (velocity_partition_piece), sent
    together; Redis serves other clients between them. Returns the outcome that counts:
    ``commit``'s, or the one an earlier attempt recorded (of its pieces, those it had not
    applied yet are applied from this attempt's, decided as it decided them)."""
    if is_cluster(client):
        reply = cluster.commit_partition(cast(RedisCluster, client), settings.redis_keys, commit)
    else:
        calls = commit.calls()
        connection = client.connection_pool.get_connection()
        try:
            connection.send_packed_command([part for call in calls for part in resp_command(call)])
            replies = [connection.read_response() for _ in calls]
        except BaseException:
            connection.disconnect()
            raise
        finally:
            client.connection_pool.release(connection)
        reply = replies[0][0] if isinstance(replies[0], list) else replies[0]
        if FENCED in replies:
            reply = FENCED
    if reply == FENCED:
        raise StateLockLost(
            f"batch {commit.batch}: the state lock is no longer this stream's; "
            "a key-partition's commit was refused"
        )
    # -1: the batch is committed already (a straggling task): nothing was applied, and
    # the batch's commit, refused as a replay, uses no outcome.
    return commit.outcome if reply in (0, REPLAYED) else cast(str, reply)


def forget_partitions(
    client: redis.Redis, keys: RedisKeys, batch: int | None = None, count: int = 0
) -> None:
    """Drop the partition records of ``batch`` (its ``count`` partitions) once the batch is
    committed; with no batch, every one (a rebuild from Delta: the batch after it must
    be decided and applied anew)."""
    if batch is None:
        names = list(client.scan_iter(match=keys.partition_records, count=1000))
    else:
        records = [keys.partition_record(batch, p) for p in range(count)]
        names = records + [record + PIECES_SUFFIX for record in records]
    for first in range(0, len(names), 1000):
        if is_cluster(client) and batch is None:
            for name in names[first : first + 1000]:
                client.delete(name)
        else:  # one slot: the data dir's
            client.delete(*names[first : first + 1000])


class PendingCommit:
    """A ``stream_commit`` sent to Redis and not yet answered: Redis runs it on its own
    core while the caller goes on; ``result`` reads the answer. Sent on a connection of
    its own, in this thread, so it is on its way before the caller's next step."""

    def __init__(self, client: redis.Redis, commit: StreamCommit, lease: Lease) -> None:
        self._pool = client.connection_pool
        self._lease = lease
        self._connection: Any = self._pool.get_connection()
        calls = commit.calls()
        self._replies = len(calls)
        try:
            self._connection.send_packed_command(
                [part for call in calls for part in resp_command(call)]
            )
        except BaseException:
            self._connection.disconnect()
            self._release()
            raise

    def _release(self) -> None:
        if self._connection is not None:
            self._pool.release(self._connection)
            self._connection = None

    def result(self) -> int:
        """The alerts published, -1 for a replay; ``StateLockLost`` when fenced. Waits
        for Redis; call once (a failed read leaves the connection closed)."""
        try:
            # The alerts' pieces, then the commit: every reply read before any is judged.
            replies: list[int] = []
            failure: redis.ResponseError | None = None
            for _ in range(self._replies):
                try:
                    replies.append(int(self._connection.read_response()))
                except redis.ResponseError as exc:
                    failure = failure or exc
        except BaseException:
            self._connection.disconnect()
            raise
        finally:
            self._release()
        if FENCED in replies:
            self._lease.lost.set()
            self._lease.check()
        if failure is not None:
            raise failure
        result = replies[-1]
        return result + sum(max(0, n) for n in replies[:-1]) if result >= 0 else result
