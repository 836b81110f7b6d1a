"""Synthetic payment events (SPEC §1) for demos, tests and benchmarks: `velocity generate`.

What callers rely on:
- Reproducible: the same ``GenerateOptions`` (seed included) give byte-identical files. Nothing
  reads the wall clock, the environment or Python's salted ``hash``; one seeded PRNG is consumed
  in arrival order. With ``seed=None`` a seed is drawn and reported in the summary.
- TransactionIds are unique across runs: each holds the run's tag (``run_tag``: a digest of the
  seed, the first eventTime and the file prefix; ``tx-<tag>-<n>``, or the digits ``<tag><n:010>``
  as a JSON integer), so a second run into the same folder or topic (a new seed, a later start
  or another prefix) adds payments instead of repeating the first run's ids, which a stream
  would drop as duplicates. Only a run with the same seed, start and prefix, the same events
  byte for byte, repeats them.
- Arrival order is the files in lexicographic name order (``events-000000.jsonl``, ...), then
  the lines in each file. Every line ends with ``\\n``; every line but the malformed ones is one
  JSON object.
- Apart from late events, eventTime never decreases along arrival order, so each key's events
  arrive in non-decreasing eventTime order (what SPEC §3 needs for the stream to equal the
  complete-data result). A late event's eventTime is more than ``late_min_ms`` (and at most
  ``late_max_ms``) below the highest eventTime of the valid events written before it.
- Categories are disjoint and sum to the lines written: ``valid`` (first occurrence of a
  transactionId, schema-valid; it includes ``spikes`` and ``late``), ``duplicates`` (schema-valid,
  repeating the transactionId of an earlier valid line) and ``malformed`` (rejected by
  ``velocity.domain.schema.parse_event_line``, or a year or more ahead of the events before it so
  ``velocity.domain.arrival`` quarantines it, with the reason counted in ``malformed_by_reason``).
- Spike events are the only events with an amount of at least ``SPIKE_MIN_AMOUNT``: bursts of
  3 to 8 payments from one payer to one beneficiary within two minutes.
- Files land atomically: each is written under a hidden temporary name in the same folder, then
  renamed, so a folder-watching stream never reads half a file (Spark skips names starting
  with ``.``). Their modification times grow by at least a millisecond in name order, so
  Spark's file source (which orders by modification time) takes them in name order.

Pure Python: no Spark, Redis or Airflow.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path

from velocity.domain.schema import RejectReason
from velocity.errors import UsageError

# 2026-01-01T00:00:00Z, the instant the SPEC's examples use.
DEFAULT_START_MS = 1_767_225_600_000
SPIKE_MIN_AMOUNT = Decimal(10_000)
SPIKE_MAX_AMOUNT = Decimal(100_000)
MAX_IPS = 1 << 24  # ips are 10.x.y.z

_SPIKE_MIN_CENTS = int(SPIKE_MIN_AMOUNT * 100)
_SPIKE_MAX_CENTS = int(SPIKE_MAX_AMOUNT * 100)
_BURST_MIN, _BURST_MAX = 3, 8
_BURST_MEAN = (_BURST_MIN + _BURST_MAX) / 2
_BURST_SPAN_MS = (20_000, 110_000)
# Duplicates repeat one of the last few thousand valid lines, well inside any dedup horizon.
_RECENT = 4096
_CHUNK_LINES = 8192


@dataclass(frozen=True)
class GenerateOptions:
    """What to generate. Every field maps to one ``velocity generate`` flag.

    Fractions are of all lines written; together they must not exceed 1. Derived
    cardinalities (``None``) follow ``payers``: half as many beneficiaries and ips, 20% more
    devices than payers.
    """

    events: int = 10_000
    """Lines to write (valid, duplicate and malformed together)."""
    rate: float = 100.0
    """Events per second of event time: eventTimes span about ``events / rate`` seconds."""
    start_ms: int = DEFAULT_START_MS
    """eventTime of the first event, epoch milliseconds."""
    payers: int = 1_000
    """Key cardinality: distinct payerIds."""
    beneficiaries: int | None = None
    devices: int | None = None
    ips: int | None = None
    files: int = 1
    """Output files; lines are split across them in arrival order."""
    spike_fraction: float = 0.01
    late_fraction: float = 0.01
    duplicate_fraction: float = 0.005
    malformed_fraction: float = 0.005
    late_min_ms: int = 10 * 60_000
    """Late events are more than this behind the highest eventTime before them; keep it above
    the engine's allowed lateness (default 5 minutes) so they really are late."""
    late_max_ms: int = 60 * 60_000
    seed: int | None = None
    prefix: str = "events"
    """File names are ``<prefix>-<6 digits>.jsonl``."""
    overwrite: bool = False
    """Replace files of the same names; otherwise an existing file is a usage error."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.events < 1:
            problems.append(f"events must be >= 1, got {self.events}")
        if not self.rate > 0:
            problems.append(f"rate must be > 0 events per second, got {self.rate}")
        if self.start_ms < 0:
            problems.append(f"start_ms must be >= 0 (epoch milliseconds), got {self.start_ms}")
        if self.payers < 1:
            problems.append(f"payers must be >= 1, got {self.payers}")
        for name in ("beneficiaries", "devices", "ips"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1 (or unset to derive it), got {value}")
        if self.ip_count > MAX_IPS:
            problems.append(f"ips must be <= {MAX_IPS}, got {self.ip_count}")
        if not 1 <= self.files <= max(self.events, 1):
            problems.append(f"files must be between 1 and events ({self.events}), got {self.files}")
        fractions = {
            "spike_fraction": self.spike_fraction,
            "late_fraction": self.late_fraction,
            "duplicate_fraction": self.duplicate_fraction,
            "malformed_fraction": self.malformed_fraction,
        }
        for name, value in fractions.items():
            if not 0 <= value <= 1:
                problems.append(f"{name} must be between 0 and 1, got {value}")
        if sum(fractions.values()) > 1:
            total = sum(fractions.values())
            problems.append(f"the fractions add up to {total:g}; lower them to <= 1")
        if not 0 <= self.late_min_ms < self.late_max_ms:
            problems.append(
                "need 0 <= late_min_ms < late_max_ms, "
                f"got {self.late_min_ms} and {self.late_max_ms}"
            )
        if not self.prefix or "/" in self.prefix or self.prefix.startswith((".", "_")):
            problems.append(
                f"prefix {self.prefix!r} must be a plain, non-hidden file name part (e.g. 'events')"
            )
        if problems:
            raise UsageError("bad generate options: " + "; ".join(problems))

    @property
    def beneficiary_count(self) -> int:
        return self.beneficiaries if self.beneficiaries is not None else max(1, self.payers // 2)

    @property
    def device_count(self) -> int:
        return self.devices if self.devices is not None else self.payers + self.payers // 5

    @property
    def ip_count(self) -> int:
        return self.ips if self.ips is not None else max(1, self.payers // 2)


@dataclass(frozen=True)
class GenerateSummary:
    """What was written; ``lines == valid + duplicates + malformed``."""

    files: tuple[Path, ...]
    seed: int
    lines: int
    valid: int
    spikes: int
    late: int
    duplicates: int
    malformed: int
    malformed_by_reason: Mapping[str, int] = field(default_factory=dict)
    min_event_time: int | None = None
    """Lowest eventTime of the valid events (late ones included); None when there are none."""
    max_event_time: int | None = None
    run_tag: int = 0
    """The run's part of every transactionId (see ``run_tag``)."""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form for the CLI."""
        return {
            "files": [str(p) for p in self.files],
            "seed": self.seed,
            "lines": self.lines,
            "valid": self.valid,
            "spikes": self.spikes,
            "late": self.late,
            "duplicates": self.duplicates,
            "malformed": self.malformed,
            "malformedByReason": dict(sorted(self.malformed_by_reason.items())),
            "minEventTime": self.min_event_time,
            "maxEventTime": self.max_event_time,
            "runTag": self.run_tag,
        }


def generate_events(
    out_dir: Path | str,
    options: GenerateOptions,
    on_lines: Callable[[int], None] | None = None,
) -> GenerateSummary:
    """Write ``options.events`` lines into ``options.files`` files under ``out_dir``.

    Creates ``out_dir`` if needed. Raises ``UsageError`` when a target file exists and
    ``options.overwrite`` is false (nothing is written then). ``on_lines`` hears the lines
    written so far, after each chunk.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [out / f"{options.prefix}-{i:06d}.jsonl" for i in range(options.files)]
    if not options.overwrite:
        existing = [p for p in names if p.exists()]
        if existing:
            raise UsageError(
                f"{existing[0]} already exists; choose another --out folder or prefix, "
                "or allow overwriting"
            )
    source = _LineSource(options)
    landed = 0
    for index, path in enumerate(names):
        begin = options.events * index // options.files
        end = options.events * (index + 1) // options.files
        chunks = source.chunks(end - begin)
        if on_lines is not None:
            chunks = _reporting(chunks, begin, on_lines)
        landed = _write_atomically(path, chunks, landed)
    return source.summary(tuple(names))


def _reporting(
    chunks: Iterator[str], before: int, on_lines: Callable[[int], None]
) -> Iterator[str]:
    written = before
    for chunk in chunks:
        yield chunk
        written += chunk.count("\n")
        on_lines(written)


def stream_events(
    out_dir: Path | str,
    options: GenerateOptions,
    *,
    interval_seconds: float = 1.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    should_stop: Callable[[], bool] | None = None,
) -> GenerateSummary:
    """Write events over real time: ``options.rate`` per wall-clock second, eventTime = now.

    Every ``interval_seconds`` the events that fell due since the last file land as one new
    file (atomically), named ``<prefix>-<start ms, 13 digits>-<6-digit sequence>.jsonl`` so
    that names sort in arrival order, also across restarts. See ``follow`` for the timing.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    landed = 0

    def land(source: _LineSource, count: int) -> None:
        nonlocal landed
        path = out / f"{options.prefix}-{source.o.start_ms:013d}-{len(paths):06d}.jsonl"
        if path.exists() and not options.overwrite:
            raise UsageError(f"{path} already exists; choose another --out folder or prefix")
        landed = _write_atomically(path, source.chunks(count), landed)
        paths.append(path)

    source = follow(
        options, land, interval_seconds=interval_seconds, clock=clock, sleep=sleep,
        should_stop=should_stop,
    )  # fmt: skip
    return source.summary(tuple(paths))


def follow(
    options: GenerateOptions,
    land: Callable[[_LineSource, int], None],
    *,
    interval_seconds: float = 1.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    should_stop: Callable[[], bool] | None = None,
) -> _LineSource:
    """Events over real time: ``options.rate`` per wall-clock second, eventTime = now.

    Every ``interval_seconds``, ``land(source, n)`` takes the ``n`` events that fell due
    since the last call (``source.chunks(n)``). An event's eventTime is the clock time at
    which it fell due (spikes and late events are placed as in ``generate_events``), so it
    is never later than the moment it lands. Stops after ``options.events`` lines or when
    ``should_stop()`` returns true after a landing. ``options.start_ms`` and
    ``options.files`` are not used. ``clock`` returns epoch seconds and ``sleep`` waits;
    tests pass fakes to run without waiting. If landing falls behind, the next one
    catches up, so the average rate holds.
    """
    if not interval_seconds > 0:
        raise UsageError(f"interval_seconds must be > 0, got {interval_seconds}")
    began = clock()
    source = _LineSource(replace(options, start_ms=int(began * 1000)))
    written = 0
    next_tick = began
    while written < options.events:
        next_tick += interval_seconds
        wait = next_tick - clock()
        if wait > 0:
            sleep(wait)
        now_ms = int(clock() * 1000)
        due = min(options.events, source.slots_due_by(now_ms))
        if due > written:
            land(source, due - written)
            written = due
        if should_stop is not None and should_stop():
            break
    return source


_MS_NS = 1_000_000


def _write_atomically(path: Path, chunks: Iterator[str], after_ns: int = 0) -> int:
    """Write ``path`` whole (a hidden temporary, then a rename), its modification time at
    least one millisecond past ``after_ns``; returns that time.

    Spark's file source orders new files by modification time in milliseconds and breaks
    ties arbitrarily: files that landed within one millisecond would arrive out of name
    order (and a different duplicate would win).
    """
    temp = path.with_name(f".{path.name}.tmp")
    try:
        with open(temp, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as handle:
            for chunk in chunks:
                handle.write(chunk)
        landed = max(time.time_ns(), after_ns - after_ns % _MS_NS + _MS_NS)
        os.utime(temp, ns=(landed, landed))
        os.replace(temp, path)
        return landed
    finally:
        temp.unlink(missing_ok=True)


# One malformed-line recipe: a name (for readers of this code) and the reason the schema
# must give. Each recipe breaks exactly one thing, so the reason is unambiguous.
_MALFORMED: tuple[tuple[str, RejectReason], ...] = (
    ("truncated", RejectReason.NOT_JSON),
    ("garbage", RejectReason.NOT_JSON),
    ("nan_amount", RejectReason.NOT_JSON),
    ("array", RejectReason.NOT_OBJECT),
    ("missing_field", RejectReason.MISSING_FIELD),
    ("null_field", RejectReason.MISSING_FIELD),
    ("empty_field", RejectReason.MISSING_FIELD),
    ("object_or_array_field", RejectReason.WRONG_TYPE),
    ("boolean_field", RejectReason.WRONG_TYPE),
    ("bad_event_time", RejectReason.WRONG_TYPE),
    ("amount_not_numeric", RejectReason.WRONG_TYPE),
    ("negative_event_time", RejectReason.TIME_OUT_OF_RANGE),
    ("amount_out_of_range", RejectReason.AMOUNT_OUT_OF_RANGE),
    ("amount_too_many_decimals", RejectReason.AMOUNT_PRECISION),
    ("unknown_payment_type", RejectReason.UNKNOWN_ENUM),
    ("far_future_event_time", RejectReason.FUTURE_EVENT_TIME),
)
_REQUIRED = (
    "transactionId",
    "eventTime",
    "payerId",
    "beneficiaryId",
    "paymentAmount",
    "paymentType",
)
_SCALAR_FIELDS = (*_REQUIRED, "ip", "deviceId", "action")
_ACTIONS = ('"PAY"', '"PAY"', '"PAY"', '"TRANSFER"', '"TRANSFER"', '"WITHDRAW"')
_EXTRAS = (
    '"channel":"web"',
    '"channel":"mobile"',
    '"note":{"source":"velocity-generate","v":1}',
    '"tags":["demo"]',
)
_Fields = list[tuple[str, str]]

# A run's tag has 9 digits, so an integer id (tag, then a 10-digit count) stays below 9e18,
# inside the signed 64-bit range every JSON reader takes as an integer.
_TAG_LOW, _TAG_SPAN = 100_000_000, 800_000_000
_COUNT_DIGITS = 10


def run_tag(seed: int, start_ms: int, prefix: str) -> int:
    """The 9-digit tag of a run's transactionIds: a digest of what makes two runs differ
    (``--seed``, drawn when not given; the first eventTime, the clock's with ``--follow`` or
    ``--kafka``; the file prefix). The same three give the same tag, and so the same ids."""
    digest = hashlib.blake2b(f"{seed}/{start_ms}/{prefix}".encode(), digest_size=8).digest()
    return _TAG_LOW + int.from_bytes(digest, "big") % _TAG_SPAN


class _LineSource:
    """Produces lines in arrival order; slot ``i`` is the i-th line, due at ``slot_time(i)``."""

    def __init__(self, options: GenerateOptions) -> None:
        self.o = options
        seed = options.seed
        self.seed = seed if seed is not None else random.SystemRandom().getrandbits(63)
        self.rng = random.Random(self.seed)
        self.tag = run_tag(self.seed, options.start_ms, options.prefix)
        self.gap_ms = 1000.0 / options.rate
        self.payers = options.payers
        self.benes = options.beneficiary_count
        self.devices = options.device_count
        self.ips = options.ip_count
        # A burst's first event takes the slot that started it; the others pre-empt the slots
        # they are scheduled into. Every category is drawn on the remaining slots only, so
        # scale the probabilities up to keep each category's share of all lines.
        scale = 1.0 / (1.0 - options.spike_fraction * (_BURST_MEAN - 1) / _BURST_MEAN)
        self.p_malformed = options.malformed_fraction * scale
        self.p_duplicate = self.p_malformed + options.duplicate_fraction * scale
        self.p_late = self.p_duplicate + options.late_fraction * scale
        self.p_burst = self.p_late + options.spike_fraction * scale / _BURST_MEAN
        self.slot = 0
        self.next_id = 0
        self.max_seen: int | None = None
        self.min_seen: int | None = None
        self.pending: dict[int, tuple[int, _Fields]] = {}
        self.recent: list[tuple[str, str]] = []
        self.valid = self.spikes = self.late = self.duplicates = self.malformed = 0
        self.reasons: Counter[str] = Counter()

    def slot_time(self, slot: int) -> int:
        return self.o.start_ms + int(slot * self.gap_ms)

    def slots_due_by(self, now_ms: int) -> int:
        """How many slots have ``slot_time <= now_ms``."""
        if now_ms < self.o.start_ms:
            return 0
        count = int((now_ms - self.o.start_ms) / self.gap_ms) + 1
        # Float division may be off by one either way at the boundary; settle it exactly.
        while count > 0 and self.slot_time(count - 1) > now_ms:
            count -= 1
        while self.slot_time(count) <= now_ms:
            count += 1
        return count

    def chunks(self, count: int) -> Iterator[str]:
        """The next ``count`` lines, joined into chunks of a few thousand."""
        while count > 0:
            size = min(count, _CHUNK_LINES)
            yield "".join([self.next_line() for _ in range(size)])
            count -= size

    def summary(self, files: tuple[Path, ...]) -> GenerateSummary:
        return GenerateSummary(
            files=files,
            seed=self.seed,
            lines=self.valid + self.duplicates + self.malformed,
            valid=self.valid,
            spikes=self.spikes,
            late=self.late,
            duplicates=self.duplicates,
            malformed=self.malformed,
            malformed_by_reason=dict(sorted(self.reasons.items())),
            min_event_time=self.min_seen,
            max_event_time=self.max_seen,
            run_tag=self.tag,
        )

    # -- one line ---------------------------------------------------------------------------

    def next_line(self) -> str:
        slot = self.slot
        self.slot += 1
        base = self.slot_time(slot)
        scheduled = self.pending.pop(slot, None)
        if scheduled is not None:
            planned, fields = scheduled
            return self._emit_valid(fields, self._floor(planned), spike=True)
        draw = self.rng.random()
        if draw < self.p_malformed:
            return self._malformed(base)
        if draw < self.p_duplicate and self.recent:
            return self._duplicate(base)
        if draw < self.p_late and self.max_seen is not None:
            lateness = self.rng.randint(self.o.late_min_ms + 1, self.o.late_max_ms)
            if self.max_seen - lateness >= 0:
                self.late += 1
                return self._emit_valid(self._normal_fields(), self.max_seen - lateness, late=True)
        if self.p_late <= draw < self.p_burst:
            return self._start_burst(slot, base)
        return self._emit_valid(self._normal_fields(), self._floor(base))

    def _floor(self, base: int) -> int:
        # Never below an eventTime already written: keeps every key's times non-decreasing
        # even when a burst packed its events closer than the slot spacing.
        return base if self.max_seen is None or base >= self.max_seen else self.max_seen

    def _emit_valid(
        self, fields: _Fields, event_time: int, *, spike: bool = False, late: bool = False
    ) -> str:
        fields[1] = ("eventTime", str(event_time))
        line = _join(fields)
        self.valid += 1
        if spike:
            self.spikes += 1
        if not late and (self.max_seen is None or event_time > self.max_seen):
            self.max_seen = event_time
        if self.min_seen is None or event_time < self.min_seen:
            self.min_seen = event_time
        entry = (fields[0][1], line)
        if len(self.recent) < _RECENT:
            self.recent.append(entry)
        else:
            self.recent[self.valid % _RECENT] = entry
        return line

    def _new_id(self) -> str:
        number = self.next_id
        self.next_id += 1
        if self.rng.random() < 0.1:
            return f"{self.tag}{number:0{_COUNT_DIGITS}d}"
        return f'"tx-{self.tag}-{number}"'

    def _payer(self, k: int) -> str:
        # A quarter of payers have numeric ids, written as JSON integers or numeric strings:
        # both spellings are one key (SPEC §1's canonical value).
        if k % 4:
            return f'"p-{k}"'
        return str(k) if self.rng.random() < 0.5 else f'"{k}"'

    def _beneficiary(self, k: int) -> str:
        if k % 3:
            return f'"b-{k}"'
        return str(k) if self.rng.random() < 0.5 else f'"{k}"'

    @staticmethod
    def _ip(k: int) -> str:
        return f'"10.{(k >> 16) & 255}.{(k >> 8) & 255}.{k & 255}"'

    def _amount(self, cents: int) -> str:
        whole, frac = divmod(cents, 100)
        draw = self.rng.random()
        text = str(whole) if frac == 0 and draw < 0.5 else f"{whole}.{frac:02d}"
        return f'"{text}"' if draw >= 0.7 else text

    def _normal_fields(self) -> _Fields:
        r = self.rng.random
        k = int(r() * self.payers)
        fields: _Fields = [
            ("transactionId", self._new_id()),
            ("eventTime", ""),
            ("payerId", self._payer(k)),
            ("beneficiaryId", self._beneficiary(int(r() * self.benes))),
            # Log-uniform between 1 and about 5000: many small payments, few large ones.
            ("paymentAmount", self._amount(int(100 * 10 ** (r() * 3.7)))),
            ("paymentType", '"CRD"' if r() < 0.6 else '"CSH"'),
        ]
        # Most payers keep one home ip and device; the rest of the time they roam.
        if r() < 0.9:
            ip = (k * 104_729 + 7) % self.ips if r() < 0.8 else int(r() * self.ips)
            fields.append(("ip", self._ip(ip)))
        if r() < 0.9:
            device = (k * 7_919 + 13) % self.devices if r() < 0.9 else int(r() * self.devices)
            fields.append(("deviceId", f'"d-{device}"'))
        if r() < 0.95:
            fields.append(("action", _ACTIONS[int(r() * len(_ACTIONS))]))
        if r() < 0.01:
            fields.append(("", _EXTRAS[int(r() * len(_EXTRAS))]))
        return fields

    def _start_burst(self, slot: int, base: int) -> str:
        """A payer sends several large payments to one beneficiary within two minutes."""
        rng = self.rng
        size = rng.randint(_BURST_MIN, _BURST_MAX)
        span_ms = rng.randint(*_BURST_SPAN_MS)
        payer = int(rng.random() * self.payers)
        bene = int(rng.random() * self.benes)
        ip = self._ip(int(rng.random() * self.ips))
        device = f'"d-{int(rng.random() * self.devices)}"'
        span_slots = int(span_ms / self.gap_ms)
        if span_slots >= size:
            # Fast enough traffic: interleave the burst with other events over the span.
            offsets = [0, *sorted(rng.sample(range(1, span_slots), size - 1))]
            times = [self.slot_time(slot + off) for off in offsets]
        else:
            # Slow traffic: back-to-back slots, eventTimes packed into the span.
            offsets = list(range(size))
            times = [base + int(j * span_ms / size) for j in range(size)]
        events = []
        for planned in times:
            fields: _Fields = [
                ("transactionId", self._new_id()),
                ("eventTime", ""),
                ("payerId", self._payer(payer)),
                ("beneficiaryId", self._beneficiary(bene)),
                ("paymentAmount", self._amount(rng.randrange(_SPIKE_MIN_CENTS, _SPIKE_MAX_CENTS))),
                ("paymentType", '"CRD"'),
                ("ip", ip),
                ("deviceId", device),
                ("action", '"TRANSFER"'),
            ]
            events.append((planned, fields))
        for offset, event in zip(offsets[1:], events[1:], strict=True):
            target = slot + offset
            while target in self.pending:  # another burst holds it: take the next free slot
                target += 1
            self.pending[target] = event
        return self._emit_valid(events[0][1], self._floor(events[0][0]), spike=True)

    def _duplicate(self, base: int) -> str:
        rng = self.rng
        self.duplicates += 1
        tx, line = self.recent[int(rng.random() * len(self.recent))]
        draw = rng.random()
        if draw < 0.5:
            return line
        if draw < 0.7 and not tx.startswith('"'):
            tx = f'"{tx}"'  # the same id spelt as a string: still the same canonical id
        fields = self._normal_fields()
        self.next_id -= 1  # the fresh id _normal_fields took is not used
        fields[0] = ("transactionId", tx)
        fields[1] = ("eventTime", str(self._floor(base)))
        return _join(fields)

    def _malformed(self, base: int) -> str:
        rng = self.rng
        name, reason = _MALFORMED[int(rng.random() * len(_MALFORMED))]
        self.malformed += 1
        self.reasons[reason.value] += 1
        fields = self._normal_fields()
        fields[1] = ("eventTime", str(self._floor(base)))
        pick = rng.choice
        if name == "truncated":
            line = _join(fields)
            return line[: 1 + int(rng.random() * (len(line) - 3))] + "\n"
        if name == "garbage":
            return f"payment {fields[0][1]} {fields[2][1]} -> {fields[3][1]} failed\n"
        if name == "array":
            return f"[{_join(fields).rstrip()}]\n"
        if name == "missing_field":
            drop = pick(_REQUIRED)
            return _join([f for f in fields if f[0] != drop])
        if name == "bad_event_time":
            value = pick(
                (f'"{base}"', f"{base}.5", f"{base / 1000:.3f}e3", "true", '"2026-01-01T00:00:00Z"')
            )
            return _join(_set(fields, "eventTime", value))
        if name == "far_future_event_time":  # a year or more ahead: past any max_future
            ahead = _YEAR_MS * (1 + int(rng.random() * 30))
            return _join(_set(fields, "eventTime", str(self._floor(base) + ahead)))
        if name == "negative_event_time":
            return _join(_set(fields, "eventTime", f"-{1 + int(rng.random() * base)}"))
        target, value = {
            "nan_amount": lambda: ("paymentAmount", pick(("NaN", "Infinity"))),
            "null_field": lambda: (pick(_REQUIRED), "null"),
            "empty_field": lambda: (pick(_REQUIRED), pick(('""', '"  "'))),
            "object_or_array_field": lambda: (
                pick(_SCALAR_FIELDS),
                pick(('{"id":1}', "[1,2]", "[]", "{}")),
            ),
            "boolean_field": lambda: (pick(_SCALAR_FIELDS), pick(("true", "false"))),
            "amount_not_numeric": lambda: ("paymentAmount", pick(('"12,50"', '"ten"', '"1.2.3"'))),
            "amount_out_of_range": lambda: (
                "paymentAmount",
                pick(("-0.01", '"-25.00"', "1000000000000000000", '"5e18"')),
            ),
            "amount_too_many_decimals": lambda: (
                "paymentAmount",
                pick(("12.123456789", '"0.0000000001"', '"99.1234567891"')),
            ),
            "unknown_payment_type": lambda: ("paymentType", pick(('"WIRE"', '"BTC"', '"CHQ"'))),
        }[name]()
        return _join(_set(fields, target, value))


_YEAR_MS = 366 * 24 * 3600 * 1000


def _set(fields: _Fields, name: str, value: str) -> _Fields:
    """``fields`` with ``name`` set to ``value`` (appended when the event lacked it)."""
    out = [(k, value) if k == name else (k, v) for k, v in fields]
    if all(k != name for k, _ in fields):
        out.insert(len(_REQUIRED), (name, value))
    return out


def _join(fields: _Fields) -> str:
    # Every fragment is already JSON (ids, numbers and fixed strings without characters that
    # need escaping), so plain concatenation is valid JSON and much faster than json.dumps.
    return "{" + ",".join(f'"{k}":{v}' if k else v for k, v in fields) + "}\n"
