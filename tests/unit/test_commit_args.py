"""The commit's flat arguments (velocity.redis.commit_args), without a server."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.connection import Connection

from velocity.redis.commit_args import KeyChange, flat_runs, resp_bulk_strings, resp_command

pytestmark = pytest.mark.timeout(120)

texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
pairs = st.lists(st.tuples(st.integers(0, 10**13), texts), max_size=4)
starts = st.lists(st.integers(0, 10**13), max_size=4)
notified = st.lists(st.tuples(st.integers(1, 99).map(lambda r: f"n:{r}:1"), texts), max_size=3)
changes = st.builds(KeyChange, texts, pairs, pairs, starts, starts, pairs, notified)


@settings(max_examples=200, deadline=None)
@given(changes)
def test_a_keys_run_parses_back_to_its_change(change: KeyChange) -> None:
    assert KeyChange.parse(change.args()) == KeyChange(
        change.base,
        list(change.sets),
        list(change.started),
        list(change.drops),
        list(change.removed),
        list(change.appended),
        list(change.notified),
    )


# A key state's field names and values hold no tab or newline (velocity.lua's packed_lines).
field_texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=12)
wholes = st.dictionaries(field_texts.filter(bool), field_texts, max_size=4)


@settings(max_examples=200, deadline=None)
@given(texts, wholes, st.booleans(), st.sampled_from("012"), starts, pairs)
def test_a_whole_keys_run_parses_back_to_its_change(
    base: str, whole: dict, dense: bool, expire: str, removed: list, appended: list
) -> None:
    """A key's state whole, packed ("p" alone: three arguments; "q" with raw-events
    changes) or dense ("f"), parses back."""
    change = KeyChange(
        base, removed=removed, appended=appended, whole=list(whole.items()),
        dense=dense, expire="1" if dense else expire,
    )  # fmt: skip
    args = change.args()
    if not dense and not (removed or appended):
        assert args == [f"{base}:buckets", f"p{expire}", change.args()[2]]
    assert KeyChange.parse(args) == KeyChange(
        base, [], [], [], list(removed), list(appended), [], list(whole.items()), dense,
        change.expire,
    )  # fmt: skip


segments = st.lists(st.lists(st.tuples(st.integers(0, 5), texts)), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), segments)
def test_flat_runs_put_each_keys_texts_segment_by_segment_in_order(
    keys: int, drawn: list[list[tuple[int, str]]]
) -> None:
    segments = [[(owner % keys, text) for owner, text in segment] for segment in drawn]
    runs = flat_runs(
        keys,
        [
            (np.array([o for o, _ in s], np.int64), pa.array([t for _, t in s], pa.string()))
            for s in segments
        ],
    )
    expected = [[t for s in segments for o, t in s if o == key] for key in range(keys)]
    assert runs.to_pylist() == expected


@given(st.lists(texts, max_size=20))
def test_resp_framing_is_what_redis_py_sends(args: list[str]) -> None:
    packed = b"".join(Connection().pack_command("FCALL", *args))
    ours = resp_command(pa.array(["FCALL", *args], pa.string()))
    assert b"".join(bytes(part) for part in ours) == packed
    assert bytes(resp_bulk_strings(pa.array(args, pa.string()).slice(1))) == b"".join(
        f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args[1:]
    )
