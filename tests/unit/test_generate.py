"""The event generator: reproducible, honest about its categories, readable by the schema."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path

import pytest

from velocity.domain.arrival import Arrivals, Verdict
from velocity.domain.schema import Event, Rejection, RejectReason, parse_event_line
from velocity.errors import UsageError
from velocity.generate import (
    DEFAULT_START_MS,
    SPIKE_MIN_AMOUNT,
    GenerateOptions,
    GenerateSummary,
    generate_events,
    run_tag,
    stream_events,
)
from velocity.settings import Settings

TWO_MINUTES_MS = 120_000


@dataclass(frozen=True)
class Line:
    text: str
    parsed: Event | Rejection


def read_lines(summary: GenerateSummary) -> list[Line]:
    """Every line in arrival order: files in lexicographic name order, lines in order; an
    event too far ahead (the default ``max_future``) parsed as its quarantine."""
    lines: list[Line] = []
    arrivals = Arrivals((), None, Settings.model_fields["max_future_seconds"].default * 1000)
    for path in sorted(summary.files, key=lambda p: p.name):
        with open(path, encoding="utf-8", newline="") as handle:
            for text in handle:
                parsed = parse_event_line(text)
                if isinstance(parsed, Event) and (
                    arrivals.admit(parsed.transaction_id, parsed.event_time) is Verdict.FUTURE
                ):
                    parsed = arrivals.future_rejection(parsed.event_time)
                lines.append(Line(text, parsed))
    return lines


def first_occurrences(lines: list[Line]) -> list[Event]:
    seen: set[str] = set()
    events = []
    for line in lines:
        if isinstance(line.parsed, Event) and line.parsed.transaction_id not in seen:
            seen.add(line.parsed.transaction_id)
            events.append(line.parsed)
    return events


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[GenerateOptions, GenerateSummary]:
    options = GenerateOptions(
        events=40_000,
        rate=50.0,
        payers=300,
        files=7,
        spike_fraction=0.03,
        late_fraction=0.02,
        duplicate_fraction=0.02,
        malformed_fraction=0.03,
        seed=1234,
    )
    return options, generate_events(tmp_path_factory.mktemp("mixed"), options)


def test_same_options_and_seed_give_byte_identical_files(tmp_path: Path) -> None:
    options = GenerateOptions(events=5_000, files=3, seed=42, late_fraction=0.05)
    first = generate_events(tmp_path / "a", options)
    second = generate_events(tmp_path / "b", options)
    assert [p.name for p in first.files] == [p.name for p in second.files]
    for a, b in zip(first.files, second.files, strict=True):
        assert a.read_bytes() == b.read_bytes()
    other = generate_events(tmp_path / "c", GenerateOptions(events=5_000, files=3, seed=43))
    assert first.files[0].read_bytes() != other.files[0].read_bytes()


def test_a_drawn_seed_is_reported_and_reproduces_the_run(tmp_path: Path) -> None:
    drawn = generate_events(tmp_path / "a", GenerateOptions(events=2_000))
    again = generate_events(tmp_path / "b", GenerateOptions(events=2_000, seed=drawn.seed))
    assert drawn.files[0].read_bytes() == again.files[0].read_bytes()


def test_files_are_named_in_arrival_order_and_share_the_lines(tmp_path: Path) -> None:
    summary = generate_events(tmp_path, GenerateOptions(events=10_001, files=12, seed=1))
    names = [p.name for p in summary.files]
    assert names == [f"events-{i:06d}.jsonl" for i in range(12)]
    assert names == sorted(names)
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # no temporary files left behind
    counts = [sum(1 for _ in p.open()) for p in summary.files]
    assert sum(counts) == summary.lines == 10_001
    assert max(counts) - min(counts) <= 1


def test_files_land_one_millisecond_apart_or_more_in_name_order(tmp_path: Path) -> None:
    """Spark's file source orders by modification time in ms and breaks ties arbitrarily."""
    summary = generate_events(tmp_path, GenerateOptions(events=200, files=40, seed=2))
    times = [p.stat().st_mtime_ns // 1_000_000 for p in sorted(summary.files)]
    assert all(a < b for a, b in pairwise(times))


def test_every_line_is_accepted_or_rejected_exactly_as_the_summary_says(
    mixed: tuple[GenerateOptions, GenerateSummary],
) -> None:
    _, summary = mixed
    lines = read_lines(summary)
    assert len(lines) == summary.lines == summary.valid + summary.duplicates + summary.malformed
    assert all(line.text.endswith("\n") and line.text.count("\n") == 1 for line in lines)
    reasons = Counter(
        line.parsed.code.value for line in lines if isinstance(line.parsed, Rejection)
    )
    assert dict(reasons) == dict(summary.malformed_by_reason)
    assert sum(reasons.values()) == summary.malformed
    accepted = [line.parsed for line in lines if isinstance(line.parsed, Event)]
    assert len(accepted) == summary.valid + summary.duplicates
    assert len(first_occurrences(lines)) == summary.valid


def test_malformed_lines_cover_every_kind_of_bad_input(
    mixed: tuple[GenerateOptions, GenerateSummary],
) -> None:
    _, summary = mixed
    assert set(summary.malformed_by_reason) == {reason.value for reason in RejectReason}


def test_fractions_are_roughly_honoured(mixed: tuple[GenerateOptions, GenerateSummary]) -> None:
    options, summary = mixed
    for count, fraction in [
        (summary.spikes, options.spike_fraction),
        (summary.late, options.late_fraction),
        (summary.duplicates, options.duplicate_fraction),
        (summary.malformed, options.malformed_fraction),
    ]:
        assert count == pytest.approx(fraction * options.events, rel=0.2)


def test_late_events_are_older_than_the_lateness_and_the_rest_never_go_back(
    mixed: tuple[GenerateOptions, GenerateSummary],
) -> None:
    options, summary = mixed
    max_seen: int | None = None
    late = 0
    for event in first_occurrences(read_lines(summary)):
        if max_seen is not None and event.event_time < max_seen:
            behind = max_seen - event.event_time
            assert options.late_min_ms < behind <= options.late_max_ms
            late += 1
        else:
            max_seen = event.event_time
    assert late == summary.late > 0
    assert max_seen == summary.max_event_time


def test_event_times_span_events_over_rate(tmp_path: Path) -> None:
    options = GenerateOptions(events=6_000, rate=20.0, seed=5, late_fraction=0)
    summary = generate_events(tmp_path, options)
    assert summary.min_event_time == options.start_ms
    span_ms = (summary.max_event_time or 0) - options.start_ms
    assert span_ms == pytest.approx(options.events / options.rate * 1000, rel=0.01)


def test_duplicates_repeat_earlier_ids_identically_or_with_other_content(
    mixed: tuple[GenerateOptions, GenerateSummary],
) -> None:
    _, summary = mixed
    first_text: dict[str, str] = {}
    identical = different = 0
    for line in read_lines(summary):
        if not isinstance(line.parsed, Event):
            continue
        original = first_text.get(line.parsed.transaction_id)
        if original is None:
            first_text[line.parsed.transaction_id] = line.text
        elif original == line.text:
            identical += 1
        else:
            different += 1
    assert identical + different == summary.duplicates
    assert identical > 0 and different > 0


def test_spikes_are_bursts_of_large_payments_within_two_minutes(
    mixed: tuple[GenerateOptions, GenerateSummary],
) -> None:
    _, summary = mixed
    events = first_occurrences(read_lines(summary))
    large = [e for e in events if e.amount >= SPIKE_MIN_AMOUNT]
    assert len(large) == summary.spikes > 0
    assert_bursts(large, end_ms=summary.max_event_time or 0)


def test_slow_traffic_still_packs_bursts_into_two_minutes(tmp_path: Path) -> None:
    # One event every 20 s: a burst cannot take consecutive slots' times.
    options = GenerateOptions(events=3_000, rate=0.05, spike_fraction=0.2, late_fraction=0, seed=9)
    summary = generate_events(tmp_path, options)
    events = first_occurrences(read_lines(summary))
    large = [e for e in events if e.amount >= SPIKE_MIN_AMOUNT]
    assert len(large) == summary.spikes == pytest.approx(0.2 * options.events, rel=0.2)
    assert_bursts(large, end_ms=summary.max_event_time or 0)
    times = [e.event_time for e in events]
    assert times == sorted(times)  # packing a burst never sends time backwards


def assert_bursts(large: list[Event], *, end_ms: int) -> None:
    by_pair: dict[tuple[str | None, str | None], list[int]] = defaultdict(list)
    for event in large:
        by_pair[(event.value("payerId"), event.value("beneficiaryId"))].append(event.event_time)
    for pair, times in by_pair.items():
        clusters: list[list[int]] = []
        for t in times:
            if clusters and t - clusters[-1][-1] <= TWO_MINUTES_MS:
                clusters[-1].append(t)
            else:
                clusters.append([t])
        for cluster in clusters:
            assert cluster[-1] - cluster[0] <= TWO_MINUTES_MS, (pair, cluster)
            # A burst cut short by the end of the run may hold fewer than three events.
            assert len(cluster) >= 3 or cluster[0] >= end_ms - TWO_MINUTES_MS, (pair, cluster)


def test_normal_events_use_every_allowed_shape(tmp_path: Path) -> None:
    summary = generate_events(tmp_path, GenerateOptions(events=20_000, seed=3))
    texts = [line.text for line in read_lines(summary) if isinstance(line.parsed, Event)]
    assert any(re.search(r'"transactionId":\d', t) for t in texts)
    assert any('"transactionId":"tx-' in t for t in texts)
    assert any(re.search(r'"payerId":\d', t) for t in texts)
    assert any(re.search(r'"payerId":"\d', t) for t in texts)
    assert any(re.search(r'"beneficiaryId":\d', t) for t in texts)
    assert any(re.search(r'"paymentAmount":"\d+(\.\d\d)?"', t) for t in texts)
    assert any(re.search(r'"paymentAmount":\d+\.\d\d[,}]', t) for t in texts)
    assert all(re.search(r'"paymentAmount":"?\d+(\.\d\d)?"?[,}]', t) for t in texts)
    for optional in ("ip", "deviceId", "action"):
        present = sum(f'"{optional}":' in t for t in texts)
        assert 0.8 * len(texts) < present < len(texts)
    assert any('"channel":' in t or '"note":' in t or '"tags":' in t for t in texts)
    assert {('"CRD"' in t) for t in texts} == {True, False}


def test_the_same_numeric_payer_is_written_as_integer_and_as_string(tmp_path: Path) -> None:
    summary = generate_events(tmp_path, GenerateOptions(events=5_000, payers=4, seed=8))
    texts = [line.text for line in read_lines(summary) if isinstance(line.parsed, Event)]
    assert any('"payerId":0,' in t for t in texts)
    assert any('"payerId":"0",' in t for t in texts)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"events": 0}, "events must be >= 1"),
        ({"rate": 0}, "rate must be > 0"),
        ({"files": 11, "events": 10}, "files must be between 1 and events"),
        ({"spike_fraction": 0.6, "malformed_fraction": 0.5}, "add up to 1.1"),
        ({"late_fraction": -0.1}, "late_fraction must be between 0 and 1"),
        ({"late_min_ms": 60_000, "late_max_ms": 60_000}, "late_min_ms < late_max_ms"),
        ({"prefix": ".hidden"}, "prefix '.hidden'"),
        ({"ips": 1 << 25}, "ips must be <="),
    ],
)
def test_bad_options_are_usage_errors(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(UsageError, match=re.escape(fragment)):
        GenerateOptions(**changes)  # type: ignore[arg-type]


def test_existing_files_are_not_overwritten_unless_asked(tmp_path: Path) -> None:
    options = GenerateOptions(events=100, seed=1)
    generate_events(tmp_path, options)
    before = (tmp_path / "events-000000.jsonl").read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        generate_events(tmp_path, GenerateOptions(events=100, seed=2))
    assert (tmp_path / "events-000000.jsonl").read_bytes() == before
    generate_events(tmp_path, GenerateOptions(events=100, seed=2, overwrite=True))
    assert (tmp_path / "events-000000.jsonl").read_bytes() != before


class FakeClock:
    """Epoch seconds that only move when the code under test sleeps."""

    def __init__(self, start: float) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_stream_writes_due_events_each_interval_with_event_time_now(tmp_path: Path) -> None:
    clock = FakeClock(1_767_225_600.0)
    options = GenerateOptions(events=95, rate=20.0, seed=4, late_fraction=0, prefix="live")
    landed: list[float] = []

    def record() -> bool:
        landed.append(clock.now)
        return False

    summary = stream_events(
        tmp_path,
        options,
        interval_seconds=1.0,
        clock=clock.time,
        sleep=clock.sleep,
        should_stop=record,
    )
    assert summary.lines == 95
    assert clock.sleeps == [1.0] * 5  # 20/s for 95 events: due by the 5th second
    names = [p.name for p in summary.files]
    assert names == sorted(names) == sorted(p.name for p in tmp_path.iterdir())
    assert all(re.fullmatch(r"live-1767225600000-\d{6}\.jsonl", n) for n in names)
    counts = [sum(1 for _ in p.open()) for p in summary.files]
    assert counts == [21, 20, 20, 20, 14]  # slots at 0, 50, ... ms: 21 are due after 1 s
    # A first occurrence's eventTime is when it fell due: after the previous file landed and
    # no later than its own file landing.
    seen: set[str] = set()
    previous_landing_ms = 1_767_225_600_000 - 1
    for path, landed_at in zip(summary.files, landed, strict=True):
        landing_ms = int(landed_at * 1000)
        for text in path.open():
            event = parse_event_line(text)
            if isinstance(event, Event) and event.transaction_id not in seen:
                seen.add(event.transaction_id)
                assert previous_landing_ms < event.event_time <= landing_ms
        previous_landing_ms = landing_ms
    assert len(seen) == summary.valid


def test_stream_stops_when_asked(tmp_path: Path) -> None:
    clock = FakeClock(1_000.0)
    calls = iter([False, True])
    summary = stream_events(
        tmp_path,
        GenerateOptions(events=1_000_000, rate=10.0, seed=1),
        clock=clock.time,
        sleep=clock.sleep,
        should_stop=lambda: next(calls),
    )
    assert len(summary.files) == 2
    assert summary.lines == 21


def ids_by_run(runs: list[GenerateSummary]) -> list[tuple[list[str], list[str]]]:
    """Each run's (first occurrences, repeats) of transactionIds, its lines read in order."""
    out = []
    for summary in runs:
        seen: set[str] = set()
        first, repeats = [], []
        for line in read_lines(summary):
            if isinstance(line.parsed, Event):
                tx = line.parsed.transaction_id
                (repeats if tx in seen else first).append(tx)
                seen.add(tx)
        out.append((first, repeats))
    return out


def assert_runs_share_no_ids(runs: list[GenerateSummary]) -> None:
    """Read together (one folder, one topic), the runs repeat no id but their own duplicates:
    a stream drops exactly the lines each run meant as duplicates."""
    by_run = ids_by_run(runs)
    everything = [tx for first, _ in by_run for tx in first]
    assert len(everything) == len(set(everything)) == sum(s.valid for s in runs)
    for (first, repeats), summary in zip(by_run, runs, strict=True):
        assert len(repeats) == summary.duplicates > 0
        assert set(repeats) <= set(first)  # a duplicate repeats an id of its own run
    assert len({s.run_tag for s in runs}) == len(runs)


@pytest.mark.timeout(60)
def test_two_runs_into_one_folder_share_no_transaction_ids(tmp_path: Path) -> None:
    """The second run of `velocity generate` (or of `make demo`) once started its ids at 0
    again, and the stream dropped its payments as duplicates of the first run's."""
    options = GenerateOptions(events=4_000, files=2, duplicate_fraction=0.02)
    drawn = [  # no --seed: each run draws one
        generate_events(tmp_path / "drawn", replace(options, prefix=prefix))
        for prefix in ("first", "second")
    ]
    assert_runs_share_no_ids(drawn)
    # The same seed into one folder: another prefix (the same names are refused), so
    # other ids, with the same events otherwise.
    same_seed = [
        generate_events(tmp_path / "seeded", replace(options, seed=7, prefix=prefix))
        for prefix in ("first", "second")
    ]
    assert_runs_share_no_ids(same_seed)
    # --follow (and --kafka): the seed the same, the runs started at other times.
    followed = []
    for start in (1_767_225_600.0, 1_767_225_700.0):
        clock = FakeClock(start)
        followed.append(
            stream_events(
                tmp_path / "live", replace(options, events=2_000, rate=500.0, seed=7),
                clock=clock.time, sleep=clock.sleep,
            )
        )  # fmt: skip
    assert_runs_share_no_ids(followed)


@pytest.mark.timeout(60)
def test_ids_carry_the_run_tag_and_keep_their_two_spellings(tmp_path: Path) -> None:
    summary = generate_events(tmp_path, GenerateOptions(events=3_000, seed=3))
    assert summary.run_tag == run_tag(3, DEFAULT_START_MS, "events")
    assert 100_000_000 <= summary.run_tag < 900_000_000
    tag = summary.run_tag
    ids = [
        json.loads(line.text)["transactionId"]
        for line in read_lines(summary)
        if isinstance(line.parsed, Event)
    ]
    as_text = [tx for tx in ids if isinstance(tx, str)]
    as_integers = [tx for tx in ids if isinstance(tx, int)]
    assert as_text and as_integers
    assert all(re.fullmatch(rf"tx-{tag}-\d+", tx) or tx.startswith(str(tag)) for tx in as_text)
    # An integer id is the tag and a 10-digit count: inside the signed 64-bit range.
    assert all(str(tx).startswith(str(tag)) and len(str(tx)) == 19 for tx in as_integers)
    assert max(as_integers) < 2**63
    # The same seed, start and prefix: the same run, so the same ids.
    assert run_tag(3, DEFAULT_START_MS, "events") == tag
    assert run_tag(3, DEFAULT_START_MS + 1, "events") != tag
    assert summary.to_dict()["runTag"] == tag
