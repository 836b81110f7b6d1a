"""The Redis bucket value, byte for byte (docs/serving/redis.md, "The key layout")."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_kernel import _ARROW
from velocity.domain.buckets import BucketAggregate, merge_all
from velocity.domain.decimals import format_decimal
from velocity.domain.stream_batch import KeyState
from velocity.domain.windows import KeyedEvent
from velocity.engine.key_partition import STORED_SCHEMA
from velocity.redis.hot_state import hot_state
from velocity.redis.keys import (
    HASH_MARK,
    KEY_SEPARATOR,
    RAW_FIELD,
    RedisKeys,
    bucket_value,
    bucket_value_texts,
    default_prefix,
    key_field_rows,
    packed_text,
    parse_bucket,
    parse_recent,
    read_keys_texts,
    recent_fragment,
    recent_fragment_texts,
)

pytestmark = pytest.mark.timeout(120)

amounts = st.decimals(min_value=0, max_value=10**18 - 1, places=8, allow_nan=False)
values = st.one_of(st.none(), st.sampled_from(["10.0.0.1", "ü-ip", 'q"uote', "7"]))


@st.composite
def aggregates(draw: st.DrawFn) -> BucketAggregate:
    parts = [
        BucketAggregate.of_event(value, draw(amounts) if value is not None else None)
        for value in draw(st.lists(values, min_size=1, max_size=5))
    ]
    return merge_all(parts)


@given(aggregate=aggregates(), last_time=st.one_of(st.none(), st.integers(0, 2**62)))
def test_bucket_value_is_the_documented_json_and_reads_back(aggregate, last_time) -> None:
    def text(value: Decimal | None) -> str | None:
        return None if value is None else format_decimal(value)

    documented = [
        aggregate.count,
        aggregate.value_count,
        text(aggregate.total),
        text(aggregate.minimum),
        text(aggregate.maximum),
        sorted(aggregate.distinct),
    ]
    if last_time is not None:
        documented.append(last_time)
    written = bucket_value(aggregate, last_time)
    assert written == json.dumps(documented, separators=(",", ":"), ensure_ascii=False)
    assert parse_bucket(written) == (aggregate, last_time)


def test_a_bucket_of_one_payment() -> None:
    one = BucketAggregate.of_event("12.5", Decimal("12.50"))
    assert bucket_value(one, 1767225600000) == '[1,1,"12.5","12.5","12.5",["12.5"],1767225600000]'
    assert bucket_value(BucketAggregate(2)) == "[2,0,null,null,null,[]]"


@pytest.mark.parametrize("key", ['["p-1"]', '["a:b","}c{"]', '[":"]', "[]"])
def test_a_bucket_hash_name_reads_back_as_its_signature_and_key(key: str) -> None:
    keys = RedisKeys("velocity:d1", "/srv/v")
    assert keys.parse_bucket_hash(keys.bucket_hash("5f3a9c", key)) == ("5f3a9c", key)


@pytest.mark.parametrize(
    "name",
    [
        "velocity:d1:rule:1",
        "velocity:d1:{5f3a9c}:buckets",
        "velocity:d2:{a:b}:buckets",
        "velocity:{a:b}:buckets",
        "velocity:d1:alerts",
    ],
)
def test_other_names_are_not_bucket_hashes(name: str) -> None:
    assert RedisKeys("velocity:d1", "/srv/v").parse_bucket_hash(name) is None


def test_two_data_dirs_never_share_a_key() -> None:
    a, b = (RedisKeys(default_prefix(d), d) for d in ("/srv/velocity/a", "/srv/velocity/b"))
    assert a.prefix.startswith("velocity:") and a.prefix != b.prefix
    for name in ("alert_stream", "buckets_epoch", "mirror_marker", "stream_progress",
                 "seen_prefix", "state_lock", "rule_entries", "bucket_hashes"):  # fmt: skip
        assert getattr(a, name).startswith(a.prefix + ":")
        assert getattr(a, name) != getattr(b, name)
    assert a.bucket_hash("s", '["k"]') == a.prefix + ':{s:["k"]}:buckets'
    assert a.rule_entry(7) == a.prefix + ":rule:7"


_TEXTS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=6
)
_AMOUNTS = st.one_of(
    st.decimals(min_value=0, max_value=10**12, places=8, allow_nan=False),
    st.sampled_from([Decimal("0"), Decimal("1E-8"), Decimal("0.0000005"), Decimal("100")]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.one_of(st.none(), _AMOUNTS),
            st.one_of(st.none(), _AMOUNTS),
            st.frozensets(st.one_of(_TEXTS, st.sampled_from(['a"b', "c\\d", "e\nf", "ü"]))),
            st.one_of(st.none(), st.integers(0, 2**53)),
        ),
        max_size=8,
    )
)
def test_bucket_values_built_column_by_column_equal_bucket_value(rows) -> None:
    table = pa.Table.from_pylist(
        [
            {
                "signature_id": "sig",
                "key": '["k"]',
                "bucket_start": 0,
                "last_time": last,
                "event_count": count,
                "value_count": count,
                "value_sum": total,
                "value_min": low,
                "value_max": total,
                "distinct_values": sorted(distinct),
            }
            for count, total, low, distinct, last in rows
        ],
        schema=STORED_SCHEMA,
    )
    expected = [
        bucket_value(BucketAggregate(c, c, t, low, t, frozenset(d)), last)
        for c, t, low, d, last in rows
    ]
    assert bucket_value_texts(table).to_pylist() == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**53),
            st.one_of(_TEXTS, st.sampled_from(['t"x', "t\\x"])),
            st.one_of(st.none(), _TEXTS),
            st.one_of(st.none(), _AMOUNTS),
        ),
        max_size=8,
    )
)
def test_raw_event_fragments_built_column_by_column_equal_recent_fragment(rows) -> None:
    events = [KeyedEvent(*row) for row in rows]
    table = pa.Table.from_pylist(
        [
            {"signature_id": "s", "key": "k", "eventTime": e.event_time,
             "transactionId": e.transaction_id, "value": e.value, "number": e.number}
            for e in events
        ],
        schema=_ARROW,
    )  # fmt: skip
    texts = recent_fragment_texts(table).to_pylist()
    assert texts == [recent_fragment([e]) for e in events]
    if events:
        assert parse_recent("".join(texts)) == tuple(events)


tricky = st.sampled_from(["a],5", 'x","y', "back\\slash", "tab\there", "[]", "", "ü"])


@st.composite
def hot_keys(draw: st.DrawFn) -> dict[tuple[str, str], KeyState]:
    """Keys' hot states as the stream leaves them: buckets (negative sums, distinct values
    that look like the value's own syntax), newest eventTimes known or not, and raw events
    of some buckets, whole (as many as the bucket counts) or not."""
    states = {}
    for n in range(draw(st.integers(0, 4))):
        state = KeyState()
        for start in draw(st.sets(st.integers(0, 50), max_size=4)):
            parts = [
                BucketAggregate.of_event(v, draw(st.decimals(-(10**12), 10**12, places=8)))
                for v in draw(st.lists(st.one_of(values, tricky), min_size=1, max_size=4))
            ]
            aggregate = merge_all(parts)
            state.buckets[start * 60_000] = aggregate
            state.last_times[start * 60_000] = draw(st.one_of(st.none(), st.integers(0, 2**62)))
            events = [KeyedEvent(start * 60_000 + i, f"tx-{i}") for i in range(aggregate.count)]
            whole = draw(st.sampled_from([None, True, False]))
            if whole is not None:
                state.recent[start * 60_000] = tuple(events if whole else events[1:])
        states[("sig", f'["p-{n}"]')] = state
    return states


@settings(max_examples=150, deadline=None)
@given(hot_keys())
def test_the_hot_state_read_column_by_column_is_what_was_written(states) -> None:
    """velocity.lua's read_keys text (a packed text a key asked, in order), parsed column
    by column, gives back every bucket and newest eventTime, and the raw events that
    account for their bucket whole, from packed keys, dense ones (their fields after a
    HASH_MARK line) and keys Redis does not hold alike."""
    keys = RedisKeys("P", "/data")
    texts = []  # one a key asked, "" for a key Redis does not hold
    for n, state in enumerate(states.values()):
        fields = [(HASH_MARK, "")] if n % 2 else []
        for start, aggregate in state.buckets.items():
            fields.append((str(start), bucket_value(aggregate, state.last_times[start])))
        for start, events in state.recent.items():
            fields.append((f"{RAW_FIELD}{start}", recent_fragment(events)))
        texts.append(packed_text(fields))
    asked = pa.table(
        {
            "hash": pa.array([keys.bucket_hash(*slot) for slot in states], pa.string()),
            "signature_id": pa.array([sig for sig, _ in states], pa.string()),
            "key": pa.array([key for _, key in states], pa.string()),
        }
    )
    read = key_field_rows(read_keys_texts(KEY_SEPARATOR.join(texts)), asked.column("hash"))
    got = hot_state(read, asked).key_states()
    expected = {
        slot: KeyState(
            state.buckets,
            state.last_times,
            {s: e for s, e in state.recent.items() if len(e) == state.buckets[s].count},
        )
        for slot, state in states.items()
        if state.buckets
    }
    assert got == expected


def test_the_thresholds_and_bounds_are_the_same_in_python_and_lua() -> None:
    """The stream (Python) decides when a key turns dense and back; the Functions (Lua)
    build and drop roll-ups at the same edges: a drift would leave a dense key without
    roll-ups, or a packed one with a hash."""
    import re
    from importlib import resources

    from velocity.domain.buckets import ALLOWED_BUCKET_SECONDS
    from velocity.domain.rules import MAX_WINDOW_MINUTES
    from velocity.redis import mirror

    lua = (resources.files("velocity") / "redis" / "velocity.lua").read_text(encoding="utf-8")

    def lua_constant(name: str) -> int:
        found = re.findall(rf"^local {name} = (\d+)$", lua, re.MULTILINE)
        assert len(found) == 1, f"velocity.lua defines {name} {len(found)} times"
        return int(found[0])

    assert lua_constant("ROLLUP_MIN_BUCKETS") == mirror.DENSE_MIN_BUCKETS
    assert lua_constant("ROLLUP_KEEP_FIELDS") == mirror.DENSE_KEEP_BUCKETS
    # The window read's bounds: a rule's widest window and the data dir's bucket widths.
    assert lua_constant("MAX_WINDOW_MS") == MAX_WINDOW_MINUTES * 60_000
    [widths] = re.findall(r"^local BUCKET_WIDTHS_MS = \{(.*?)\}$", lua, re.MULTILINE | re.DOTALL)
    assert sorted(int(w) for w in re.findall(r"\[(\d+)\] = true", widths)) == [
        s * 1000 for s in ALLOWED_BUCKET_SECONDS
    ]


def test_the_check_reads_an_event_as_the_schema_declares_it() -> None:
    """velocity_check validates a payment in Lua: its fields, required ones, payment types,
    amount bounds and the rules hash's progress field are the schema's and the layout's."""
    import re
    from importlib import resources

    from velocity.domain.schema import AMOUNT_DECIMAL_PLACES, EVENT_FIELDS, FIELDS_BY_NAME
    from velocity.redis.keys import CHECK_MAX_FUTURE_FIELD, CHECK_PROGRESS_FIELD, PIECES_SUFFIX

    lua = (resources.files("velocity") / "redis" / "velocity.lua").read_text(encoding="utf-8")

    def lua_table(name: str) -> str:
        [body] = re.findall(rf"^local {name} = \{{(.*?)\}}$", lua, re.MULTILINE | re.DOTALL)
        return body

    assert re.findall(r'"(\w+)"', lua_table("CHECK_REQUIRED")) == [
        f.name for f in EVENT_FIELDS if f.required
    ]
    assert sorted(re.findall(r"(\w+) = true", lua_table("CHECK_DECLARED"))) == sorted(
        f.name for f in EVENT_FIELDS
    )
    assert sorted(re.findall(r"(\w+) = true", lua_table("PAYMENT_TYPES"))) == sorted(
        FIELDS_BY_NAME["paymentType"].allowed
    )
    assert f"local AMOUNT_MAX_PLACES = {AMOUNT_DECIMAL_PLACES}\n" in lua
    assert f'local CHECK_PROGRESS_FIELD = "{CHECK_PROGRESS_FIELD}"\n' in lua
    assert f'local CHECK_MAX_FUTURE_FIELD = "{CHECK_MAX_FUTURE_FIELD}"\n' in lua
    assert f'local PIECES_SUFFIX = "{PIECES_SUFFIX}"\n' in lua
