"""Which decisions are notified and which suppressed by their rule's cooldown (SPEC §3),
column by column (pure).

For one rule version and one key, ordered by (eventTime, transactionId): the first alert
is notified, and each next one when its eventTime is at least the cooldown after the last
notified one's; the others are suppressed. The notified alerts form a chain: from each
alert, the next notified candidate is the first of its key at or past its eventTime plus
the cooldown (one ``searchsorted``). The chain from each key's first notified alert is
marked by pointer doubling (the set reached doubles its length per round, the jump
doubles its stride), so a key that alerts thousands of times costs a dozen numpy passes,
not a Python loop per alert.

A key's last notified alert before these decisions (``LAST_NOTIFIED``, the stream's hot
state) moves where its chain starts; the newest notified alert per key is returned as
the next state. The per-event reference is
``velocity.domain.cooldown_reference.notified_reference``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.domain.rules import Rule
from velocity.engine.kernel import Decisions, KeyTimeOrder, dictionary_codes

# The last notified alert of a rule version and key: the cooldown's state.
LAST_NOTIFIED = pa.schema(
    [
        pa.field("signature_id", pa.string()),
        pa.field("key", pa.string()),
        pa.field("ruleId", pa.int64()),
        pa.field("ruleVersion", pa.int64()),
        pa.field("eventTime", pa.int64()),
        pa.field("transactionId", pa.string()),
    ]
)
_GROUP = ("signature_id", "key", "ruleId", "ruleVersion")


@dataclass(frozen=True)
class Notified:
    """Per decision, the transactionId of the notified alert that suppressed it (null:
    notified), and per (rule version, key) with a notified alert here, the newest one
    (``LAST_NOTIFIED``)."""

    suppressed_by: pa.Array
    last: pa.Table

    @property
    def suppressed(self) -> np.ndarray:
        return self.suppressed_by.is_valid().to_numpy(zero_copy_only=False)


def notify(
    decisions: Decisions,
    events: pa.Table,
    rules: Sequence[Rule],
    last: pa.Table | None = None,
) -> Notified:
    """The cooldown of ``decisions`` (over ``events``: the kernel's input, with
    ``signature_id``, ``key``, ``eventTime`` and ``transactionId``), given each key's
    ``last`` notified alert before them (LAST_NOTIFIED; None: none)."""
    m = len(decisions)
    cooldowns = np.array([r.cooldown_ms for r in rules] or [0], dtype=np.int64)
    cooled = np.flatnonzero(cooldowns[decisions.rules] > 0) if m else np.zeros(0, np.int64)
    if len(cooled) == 0:
        return Notified(pa.nulls(m, pa.string()), LAST_NOTIFIED.empty_table())
    rows = pa.array(decisions.rows[cooled])
    taken = events.select(["signature_id", "key", "eventTime", "transactionId"]).take(rows)
    rule_index = decisions.rules[cooled]
    ids = np.array([(r.rule_id, r.version) for r in rules], dtype=np.int64).reshape(-1, 2)
    key_codes, _ = dictionary_codes(
        [pc.binary_join_element_wise(taken.column("signature_id"), taken.column("key"), "\x1f")]
    )
    group_codes = rule_index * (int(key_codes.max()) + 1) + key_codes
    table = pa.table(
        {
            "group": group_codes,
            "eventTime": taken.column("eventTime").cast(pa.int64()),
            "transactionId": taken.column("transactionId").cast(pa.string()),
        }
    )
    order = pc.sort_indices(
        table, sort_keys=[(n, "ascending") for n in ("group", "eventTime", "transactionId")]
    ).to_numpy()
    group = group_codes[order]
    times = table.column("eventTime").to_numpy()[order]
    cooldown = cooldowns[rule_index[order]]
    firsts, group_rank = _runs(group)
    first_rows = np.flatnonzero(firsts)
    ends = np.r_[first_rows[1:], len(group)]
    sorted_taken = taken.take(pa.array(order))
    heads = sorted_taken.take(pa.array(first_rows))
    head_rules = rule_index[order][first_rows]
    groups = pa.table(
        {
            "signature_id": heads.column("signature_id").cast(pa.string()),
            "key": heads.column("key").cast(pa.string()),
            "ruleId": pa.array(ids[head_rules, 0], pa.int64()),
            "ruleVersion": pa.array(ids[head_rules, 1], pa.int64()),
            "_group": pa.array(np.arange(len(first_rows), dtype=np.int64)),
        }
    )
    known_time, known_id = _last_of(groups, last)
    has_last = known_time > np.iinfo(np.int64).min
    # Where each key's chain starts: its first alert, or (after a notified one before
    # these) its first at or past that one's eventTime plus the cooldown.
    head_cooldown = cooldown[first_rows]
    starts_at = np.where(has_last, known_time + head_cooldown, times[first_rows])
    key_time = KeyTimeOrder.of(group_rank, times)
    composite = key_time.composite(group_rank, times)

    def first_at_or_past(at: np.ndarray, owner: np.ndarray) -> np.ndarray:
        found = np.searchsorted(composite, key_time.composite(owner, at))
        return np.where(found < ends[owner], found, len(group))

    sentinel = len(group)
    jump = np.append(first_at_or_past(times + cooldown, group_rank), sentinel)
    starts = first_at_or_past(starts_at, np.arange(len(first_rows)))
    reached = np.zeros(sentinel + 1, dtype=bool)
    reached[starts] = True
    while True:
        at = np.flatnonzero(reached[:sentinel])
        targets = jump[at]
        fresh = targets[~reached[targets]]
        fresh = fresh[fresh != sentinel]
        if len(fresh) == 0:
            break
        reached[fresh] = True
        jump = jump[jump]
    notified = reached[:sentinel]
    # Each suppressed alert's suppressor: the key's last notified alert before it, else
    # the one before these decisions.
    position = np.arange(sentinel)
    latest = np.maximum.accumulate(np.where(notified, position, -1))
    own = latest >= first_rows[group_rank]
    # Taken by Arrow from [the sorted alerts' transactionIds, each key's before these]:
    # millions of alerts are no rarity (a preview), so no Python string per alert.
    sorted_ids = sorted_taken.column("transactionId").cast(pa.string()).combine_chunks()
    source = np.where(own, np.maximum(latest, 0), sentinel + group_rank)
    source[notified] = -1  # (a key with no alert notified before has a null there)
    by = np.full(m, -1, dtype=np.int64)
    by[cooled[order]] = source
    suppressed_by = pa.concat_arrays([sorted_ids, known_id]).take(pa.array(by, mask=by < 0))
    newest = latest[ends - 1]
    moved = newest >= first_rows
    chosen = newest[moved]
    next_last = groups.filter(pa.array(moved)).drop_columns(["_group"])
    next_last = next_last.append_column(
        "eventTime", pa.array(times[chosen], pa.int64())
    ).append_column("transactionId", sorted_ids.take(pa.array(chosen, pa.int64())))
    return Notified(suppressed_by, next_last.select(LAST_NOTIFIED.names))


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.r_[True, values[1:] != values[:-1]] if len(values) else np.zeros(0, bool)
    return starts, np.cumsum(starts, dtype=np.int64) - 1


def _last_of(groups: pa.Table, last: pa.Table | None) -> tuple[np.ndarray, pa.Array]:
    """Each group's last notified (eventTime, transactionId) before: int64 min and null
    where it has none."""
    n = groups.num_rows
    times = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    if last is None or last.num_rows == 0 or n == 0:
        return times, pa.nulls(n, pa.string())
    known = last.select(LAST_NOTIFIED.names).cast(LAST_NOTIFIED)
    joined = groups.join(known, keys=list(_GROUP), join_type="inner", use_threads=False)
    at = joined.column("_group").to_numpy()
    times[at] = joined.column("eventTime").to_numpy()
    row = np.full(n, -1, dtype=np.int64)
    row[at] = np.arange(len(at))
    ids = joined.column("transactionId").combine_chunks().take(pa.array(row, mask=row < 0))
    return times, ids
