"""A micro-batch's commit as velocity_stream_commit's arguments: flat, so Redis decodes
nothing (pure: Arrow and NumPy only).

The commit was one JSON document a part; decoding it was a quarter of the commit's time
in Redis, which is the one process of the stream that more machines cannot share. Now
every changed (signature, key) is a *run* of plain arguments, counted lists one after
another (``KeyChange.args``), and the whole call is framed as RESP by Arrow kernels
(``resp_bulk_strings``), so neither the driver nor Redis handles an argument in an
interpreted loop of its own.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from velocity.redis.keys import NOTIFIED_FIELD, RAW_FIELD, one_chunk, packed_fields, packed_text

# One row per changed (signature, key): its hash's name without ``:buckets`` and its run.
KEY_RUNS = pa.schema([pa.field("base", pa.string()), pa.field("args", pa.list_(pa.string()))])


# A key's run kinds: a dense key's changes ("0"), or its state whole, packed (with no
# raw-events change: "p"; else "q"; each with its expire) or dense ("f").
DENSE_CHANGES_RUN, PACKED_ONLY_RUN, PACKED_RUN, DENSE_RUN = "0", "p", "q", "f"


@dataclass(frozen=True)
class KeyChange:
    """One key's writes: its state's name without ``:buckets`` (``RedisKeys.key_base``)
    and either its state ``whole`` (its fields: packed, or ``dense``: a hash with
    roll-ups from now on; ``expire``: "1" its newest bucket moved, so its TTL starts
    again, "2" it was dense, so its hash goes too, "0" neither)
    or a dense key's changes: the buckets set (start, value), the raw events of buckets
    new to the key (start, fragment: fields ``~<start>`` beside them), the buckets
    dropped, and its rules' last notified alerts (field ``n:<rule>:<version>``, value:
    SPEC §3 cooldown state). Either way, the raw events no longer kept (starts) and the
    raw events appended to (start, fragment)."""

    base: str
    sets: Sequence[tuple[int, str]] = ()
    started: Sequence[tuple[int, str]] = ()
    drops: Sequence[int] = ()
    removed: Sequence[int] = ()
    appended: Sequence[tuple[int, str]] = ()
    notified: Sequence[tuple[str, str]] = ()
    whole: Sequence[tuple[str, str]] | None = None
    dense: bool = False
    expire: str = "1"  # a packed key: "1" its newest bucket moved, "2" it was dense

    def args(self) -> list[str]:
        """The run (velocity.lua's apply_bucket_changes): ``state p<expire> value`` (a
        packed key, no raw-events change), else ``base q<expire> value``, ``base f
        n_fields (field value)…`` or ``base 0 n_sets n_fields (start value)… (~start
        fragment)… (n:rule:version last)… n_drops start…``, then ``n_removed start…
        n_appended (start fragment)…``."""
        if self.whole is not None and self.dense:
            out = [self.base, DENSE_RUN, str(len(self.whole))]
            out.extend(text for pair in self.whole for text in pair)
        elif self.whole is not None and not (self.removed or self.appended):
            return [f"{self.base}:buckets", PACKED_ONLY_RUN + self.expire, packed_text(self.whole)]
        elif self.whole is not None:
            out = [self.base, PACKED_RUN + self.expire, packed_text(self.whole)]
        else:
            fields = len(self.started) + len(self.notified)
            out = [self.base, DENSE_CHANGES_RUN, str(len(self.sets)), str(fields)]
            out.extend(text for start, value in self.sets for text in (str(start), value))
            out.extend(t for start, frag in self.started for t in (f"{RAW_FIELD}{start}", frag))
            out.extend(t for pair in self.notified for t in pair)
            out.append(str(len(self.drops)))
            out.extend(map(str, self.drops))
        out.append(str(len(self.removed)))
        out.extend(map(str, self.removed))
        out.append(str(len(self.appended)))
        out.extend(text for start, fragment in self.appended for text in (str(start), fragment))
        return out

    @classmethod
    def parse(cls, args: Sequence[str]) -> KeyChange:
        """The inverse of ``args`` (one whole run)."""
        base, kind = args[:2]
        at = 2

        def take(count: int, width: int) -> list[str]:
            nonlocal at
            items = list(args[at : at + count * width])
            at += count * width
            return items

        def counted(width: int) -> list[str]:
            nonlocal at
            count = int(args[at])
            at += 1
            return take(count, width)

        whole: list[tuple[str, str]] | None = None
        sets: list[str] = []
        beside: list[tuple[str, str]] = []
        drops: list[str] = []
        expire = "1"
        if kind[0] == PACKED_ONLY_RUN:
            if len(args) != 3:
                raise ValueError(f"a packed key's run has {len(args) - 3} arguments too many")
            whole = list(packed_fields(args[2]).items())
            return cls(base.removesuffix(":buckets"), [], [], [], [], [], [], whole,
                       expire=kind[1:])  # fmt: skip
        if kind[0] == PACKED_RUN:
            whole = list(packed_fields(args[2]).items())
            expire = kind[1:]
            at = 3
        elif kind == DENSE_RUN:
            whole = _text_pairs(counted(2))
        elif kind == DENSE_CHANGES_RUN:
            n_sets, n_beside = int(args[2]), int(args[3])
            at = 4
            sets = take(n_sets, 2)
            beside = _text_pairs(take(n_beside, 2))
            drops = counted(1)
        else:
            raise ValueError(f"a key's run has the unknown kind {kind!r}")
        removed, appended = counted(1), counted(2)
        if at != len(args):
            raise ValueError(f"a key's run has {len(args) - at} arguments too many")
        return cls(
            base,
            _pairs(sets),
            [(int(s.removeprefix(RAW_FIELD)), f) for s, f in beside if s.startswith(RAW_FIELD)],
            [int(s) for s in drops],
            [int(s) for s in removed],
            _pairs(appended),
            [(s, f) for s, f in beside if s.startswith(NOTIFIED_FIELD)],
            whole,
            kind == DENSE_RUN,
            expire,
        )


def _text_pairs(items: Sequence[str]) -> list[tuple[str, str]]:
    return [(items[i], items[i + 1]) for i in range(0, len(items), 2)]


def _pairs(items: Sequence[str]) -> list[tuple[int, str]]:
    return [(int(start), value) for start, value in _text_pairs(items)]


@dataclass
class BucketChanges:
    """A micro-batch's writes to bucket hashes: ``KEY_RUNS`` rows, one a changed key."""

    runs: pa.Table = field(default_factory=KEY_RUNS.empty_table)

    @classmethod
    def of(cls, changes: Iterable[KeyChange]) -> BucketChanges:
        changes = list(changes)
        return cls(
            pa.table(
                {"base": [c.base for c in changes], "args": [c.args() for c in changes]},
                schema=KEY_RUNS,
            )
        )

    def extend(self, other: BucketChanges) -> None:
        self.runs = pa.concat_tables([self.runs, other.runs])

    def __len__(self) -> int:
        return self.runs.num_rows

    def key_changes(self) -> Iterator[KeyChange]:
        """Each key's change, parsed back (``KeyChange.parse``): what a commit writes, read."""
        for args in self.runs.column("args").to_pylist():
            yield KeyChange.parse(args)

    def pieces(self, count: int) -> list[BucketChanges]:
        """The changes cut into ``count`` pieces by a hash of each key's name (CRC-32: the
        same in every process), so a key is in the same piece whatever else changed."""
        if count == 1:
            return [self]
        piece = (
            np.fromiter(
                (zlib.crc32(base.encode()) for base in self.runs.column("base").to_pylist()),
                np.int64,
                len(self),
            )
            % count
        )
        return [BucketChanges(self.runs.filter(pa.array(piece == n))) for n in range(count)]

    def flat(self) -> pa.Array:
        """Every run's arguments, one after another."""
        return (
            one_chunk(self.runs.column("args")).flatten()
            if len(self)
            else pa.array([], pa.string())
        )


# A batch's alerts go on the alert streams in pieces of this many, each its own call
# (velocity_stream_alerts, some 7 µs an alert), the last with the commit: a check waits
# behind no long call.
ALERTS_A_PIECE = 96


@dataclass(frozen=True)
class StreamCommit:
    """One micro-batch's commit (``stream_commit``), ready to send."""

    # the progress hash, the alert stream, the state lock, the shadow alert stream
    keys: tuple[str, str, str, str]
    token: str  # the state lock's token the commit is fenced by
    batch: int
    newest: str  # the newest accepted eventTime ("" when none)
    bucket_ttl_ms: int
    seen_ttl_ms: int
    bucket_ms: int
    seen_prefix: str
    alert_retention: str  # what the alert streams keep: "<entries>" or "age:<ms>"
    changes: BucketChanges
    accepted: Sequence[str]  # transactionIds
    alerts: Sequence[str]  # SPEC §4 JSON
    shadow_alerts: Sequence[str] = ()  # SPEC §4 JSON of SHADOW rules

    def args(self, alerts: Sequence[str] | None = None, shadow: Sequence[str] = ()) -> pa.Array:
        """velocity_stream_commit's whole call: ``FCALL velocity_stream_commit 4 <keys>
        <token> <batch> <newest> <bucket ttl ms> <seen ttl ms> <alert maxlen> <bucket ms>
        <seen prefix> <keys changed> <transactionIds> <each key's run>…
        <transactionId>… <alert>… <shadow alert>… <shadow alerts>`` (velocity.lua), with
        ``alerts`` and ``shadow`` in place of the batch's own when given (the last piece)."""
        if alerts is None:
            alerts, shadow = self.alerts, self.shadow_alerts
        head = [
            "FCALL", "velocity_stream_commit", "4", *self.keys, self.token, str(self.batch),
            self.newest, str(self.bucket_ttl_ms), str(self.seen_ttl_ms),
            self.alert_retention, str(self.bucket_ms), self.seen_prefix,
            str(len(self.changes)), str(len(self.accepted)),
        ]  # fmt: skip
        return pa.concat_arrays(
            [
                pa.array(head, pa.string()),
                self.changes.flat(),
                pa.array(self.accepted, pa.string()),
                pa.array(alerts, pa.string()),
                pa.array(shadow, pa.string()),
                pa.array([str(len(shadow))], pa.string()),
            ]
        )

    def alert_pieces(self) -> list[tuple[Sequence[str], Sequence[str]]]:
        """The batch's alerts and shadow alerts cut into pieces of ``ALERTS_A_PIECE``
        (alerts first): (alerts, shadow alerts) of each. The cut depends on their counts
        only, so a replay of the batch cuts its (same) alerts as its first attempt did."""
        everything = [*self.alerts, *self.shadow_alerts]
        shadow_from = len(self.alerts)
        pieces: list[tuple[Sequence[str], Sequence[str]]] = []
        for first in range(0, max(1, len(everything)), ALERTS_A_PIECE):
            last = min(len(everything), first + ALERTS_A_PIECE)
            split = min(max(shadow_from, first), last)
            pieces.append((everything[first:split], everything[split:last]))
        return pieces

    def calls(self) -> list[pa.Array]:
        """Every call of the commit on one Redis: velocity_stream_alerts for each piece of
        the alerts but the last, then velocity_stream_commit with the last."""
        pieces = self.alert_pieces()
        calls = []
        for number, (alerts, shadow) in enumerate(pieces[:-1], start=1):
            head = [
                "FCALL", "velocity_stream_alerts", "4", *self.keys, self.token,
                str(self.batch), str(number), self.alert_retention,
            ]  # fmt: skip
            calls.append(pa.array([*head, *alerts, *shadow, str(len(shadow))], pa.string()))
        return [*calls, self.args(*pieces[-1])]


# A key-partition's commit is cut into pieces of about this many keys: a call of a
# millisecond or so in Redis (about 4-8 µs a key), so a check waits behind no long call.
PIECE_KEYS = 64


def partition_pieces(keys: int) -> int:
    """How many pieces a key-partition of ``keys`` (signature, key)s is committed in: the
    same for every attempt at the partition, as its keys are."""
    return max(1, -(-keys // PIECE_KEYS))


@dataclass(frozen=True)
class PartitionCommit:
    """One key-partition's commit, ready to send: its bucket changes and the outcome its
    task returns, idempotent on (batch, partition record), in ``pieces`` calls
    (velocity_partition_commit with the first piece and the record, then
    velocity_partition_piece)."""

    keys: tuple[str, str, str]  # the progress hash, the state lock, the partition record
    token: str  # the state lock's token the commit is fenced by
    batch: int
    record_ttl_ms: int
    bucket_ttl_ms: int
    bucket_ms: int
    changes: BucketChanges
    outcome: str
    pieces: int = 1

    def args(self, changes: BucketChanges | None = None) -> pa.Array:
        """The first call, with ``changes`` (the first piece's, or on a cluster none: each
        master's are applied apart) in place of the partition's own."""
        changes = self.changes if changes is None else changes
        head = [
            "FCALL", "velocity_partition_commit", "3", *self.keys, self.token,
            str(self.batch), str(self.record_ttl_ms), str(self.bucket_ttl_ms),
            str(self.bucket_ms), str(len(changes)), str(self.pieces), self.outcome,
        ]  # fmt: skip
        return pa.concat_arrays([pa.array(head, pa.string()), changes.flat()])

    def piece_args(self, piece: int, changes: BucketChanges) -> pa.Array:
        """The call of piece ``piece`` (2, 3, …) holding ``changes``."""
        head = [
            "FCALL", "velocity_partition_piece", "3", *self.keys, self.token,
            str(self.batch), str(piece), str(self.bucket_ttl_ms), str(self.bucket_ms),
            str(len(changes)),
        ]  # fmt: skip
        return pa.concat_arrays([pa.array(head, pa.string()), changes.flat()])

    def calls(self) -> list[pa.Array]:
        """Every call of the commit, the record's first: each key in piece
        ``BucketChanges.pieces`` puts it in."""
        pieces = self.changes.pieces(self.pieces)
        return [self.args(pieces[0])] + [
            self.piece_args(n, changes) for n, changes in enumerate(pieces[1:], start=2)
        ]


def flat_runs(keys: int, segments: Sequence[tuple[np.ndarray, pa.Array]]) -> pa.ListArray:
    """One run of texts per key out of ``segments``, each (the key index of each text, the
    texts): a key's run is its texts of the first segment, then of the second, and so on,
    each segment's in their given order. Index arithmetic and one take, no loop per text."""
    counts = [np.bincount(owner, minlength=keys) for owner, _ in segments]
    run_starts = np.zeros(keys + 1, np.int64)
    np.cumsum(np.sum(counts, axis=0), out=run_starts[1:])
    earlier = np.zeros(keys, np.int64)  # a key's texts in the segments before this one
    places = []
    for (owner, _), count in zip(segments, counts, strict=True):
        order = np.argsort(owner, kind="stable")
        owners = owner[order]
        firsts = np.zeros(keys, np.int64)
        np.cumsum(count[:-1], out=firsts[1:])
        place = np.empty(len(owner), np.int64)
        place[order] = run_starts[owners] + earlier[owners] + np.arange(len(owner)) - firsts[owners]
        places.append(place)
        earlier += count
    pool = pa.concat_arrays([one_chunk(texts).cast(pa.string()) for _, texts in segments])
    where = np.empty(len(pool), np.int64)
    where[np.concatenate(places)] = np.arange(len(pool))
    return pa.ListArray.from_arrays(pa.array(run_starts, pa.int32()), pool.take(pa.array(where)))


def resp_bulk_strings(texts: pa.Array) -> pa.Buffer:
    """``texts`` as RESP bulk strings (``$<bytes>\\r\\n<text>\\r\\n``) back to back: the
    framed texts' data buffer is exactly that, so it is sent as it is."""
    if len(texts) == 0:
        return pa.py_buffer(b"")
    lengths = pc.cast(pc.binary_length(texts), pa.string())
    framed = one_chunk(pc.binary_join_element_wise("$", lengths, "\r\n", texts, "\r\n", ""))
    wide = pa.types.is_large_string(framed.type)
    offsets = np.frombuffer(framed.buffers()[1], np.int64 if wide else np.int32)
    first, end = int(offsets[framed.offset]), int(offsets[framed.offset + len(framed)])
    return framed.buffers()[2].slice(first, end - first)


def resp_command(args: pa.Array) -> list[bytes | pa.Buffer]:
    """A whole command (its name the first of ``args``) as RESP, ready to send."""
    return [f"*{len(args)}\r\n".encode(), resp_bulk_strings(args)]
