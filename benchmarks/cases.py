"""How long the case queue takes to read its cases (not a test): `make bench-cases`.

A ``case_events`` table as a long-running stream leaves it (``--groups`` write-behind
flushes of ``--alerts`` alerts each over ``--payers`` payers, one file per flush, as
``CaseStore.gather_alerts`` writes them), then, side by side in one process:
- the whole fold: every case event read and folded, what the page did at every look;
- ``CaseStore.cases()`` the first time (the same work, once per process);
- ``CaseStore.cases()`` after one more flush: only the new file is read.

Then the first look of a fresh process (``velocity cases show`` run as a subprocess, timed
from outside: interpreter, imports and all), with the case book's snapshot that
maintenance writes (``CaseStore.write_snapshot``) and ``--after`` flushes written after
it, and without it (the whole fold), side by side on the same table; the two print the
same. And what maintenance pays: the first snapshot, and a refresh from the last one.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

from deltalake import DeltaTable, write_deltalake

from benchmarks import figures as figures_file
from velocity.analyst.cases import (
    CaseAlert,
    OpenCases,
    case_key_text,
    fold_cases,
    stream_case_events,
)
from velocity.delta.case_snapshot import snapshot_root
from velocity.delta.case_store import CaseStore, _event_rows, _events, ensure_case_tables
from velocity.delta.file_folds import forget_table
from velocity.settings import Settings


def _flush(store: CaseStore, index: OpenCases, group: int, alerts: int, payers: int) -> None:
    batch = [
        CaseAlert(
            f"a-{group}-{n}",
            4,
            f"tx-{group}-{n}",
            1_700_000_000_000 + group * 1_000 + n,
            case_key_text("payerId", f"p-{(group * alerts + n) * 7919 % payers}"),
            Decimal("12.50"),
        )
        for n in range(alerts)
    ]
    keys = {a.case_key for a in batch}
    events, _ = stream_case_events(batch, index.open_case_of(keys), group, 1_700_000_000_000)
    index.add(events)
    write_deltalake(str(store.events_path), _event_rows(events), mode="append")


def _timed(what: str, run) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """(seconds, cases found)."""
    started = time.perf_counter()
    found = run()
    seconds = time.perf_counter() - started
    print(f"  {what:<44} {seconds:8.3f} s  ({len(found):,} cases)")
    return seconds, len(found)


def _snapshot(what: str, store: CaseStore) -> float:
    started = time.perf_counter()
    written = store.write_snapshot()
    seconds = time.perf_counter() - started
    assert written is not None
    print(f"  {what:<44} {seconds:8.3f} s  ({written.cases:,} cases, {written.events:,} events)")
    return seconds


def _fresh_looks(store: CaseStore, case_id: str, runs: int) -> tuple[list[float], list[float], str]:
    """Wall seconds and CPU seconds (user + system: what a busy machine's other work does
    not stretch) of ``runs`` fresh ``velocity cases show <case>`` processes on the data
    dir, and what the last printed. Each imports from bytecode cached by a run before
    them (as an installed Velocity does, whatever PYTHONDONTWRITEBYTECODE says here)."""
    command = [str(Path(sys.executable).parent / "velocity"), "cases", "show", case_id[:8]]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["VELOCITY_DATA_DIR"] = str(store.settings.data_dir)
    env["PYTHONPYCACHEPREFIX"] = str(store.settings.data_dir / "pycache")
    subprocess.run(command, env=env, capture_output=True, check=True)
    seconds, cpu, shown = [], [], ""
    for _ in range(runs):
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        seconds.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime)
        shown = done.stdout
    return seconds, cpu, shown


def _fresh_side_by_side(store: CaseStore, runs: int) -> dict[str, float]:
    """Median wall and CPU seconds of a fresh process's first look with the snapshot,
    then without it (its folder moved aside, then back)."""
    case_id = min(store.cases())
    with_snapshot, with_cpu, shown = _fresh_looks(store, case_id, runs)
    root = snapshot_root(store.settings.data_dir)
    aside = root.with_name(root.name + "-aside")
    root.rename(aside)
    try:
        without, without_cpu, shown_without = _fresh_looks(store, case_id, runs)
    finally:
        aside.rename(root)
    if shown != shown_without:
        raise SystemExit("the first look with the snapshot printed another case than without")
    medians = {
        "fresh_first_look_snapshot_seconds": statistics.median(with_snapshot),
        "fresh_first_look_whole_fold_seconds": statistics.median(without),
        "fresh_first_look_snapshot_cpu_seconds": statistics.median(with_cpu),
        "fresh_first_look_whole_fold_cpu_seconds": statistics.median(without_cpu),
    }
    fast, slow, *_ = medians.values()
    print(f"  fresh `velocity cases show`, with the snapshot: {_runs(with_snapshot, with_cpu)}")
    print(f"  fresh `velocity cases show`, whole fold:        {_runs(without, without_cpu)}")
    print(f"  median {fast:.2f} s against {slow:.2f} s: {slow / fast:,.1f}x faster")
    return {k: round(v, 3) for k, v in medians.items()}


def _runs(seconds: list[float], cpu: list[float]) -> str:
    return ", ".join(f"{s:.2f} s ({c:.2f} s CPU)" for s, c in zip(seconds, cpu, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--alerts", type=int, default=2_000)
    parser.add_argument("--payers", type=int, default=150_000)
    parser.add_argument(
        "--after", type=int, default=10, help="flushes written after the snapshot (default 10)"
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="fresh processes timed each way (default 3)"
    )
    figures_file.add_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        store = CaseStore(Settings(data_dir=Path(work)))
        ensure_case_tables(store.settings)
        index = OpenCases()
        for group in range(args.groups):
            _flush(store, index, group, args.alerts, args.payers)
        print(
            f"case_events: {args.groups} files, {args.groups * args.alerts:,} alerts "
            f"over {args.payers:,} payers"
        )
        whole, whole_cases = _timed(
            "whole fold (every look, before)",
            lambda: fold_cases(_events(DeltaTable(str(store.events_path)))),
        )
        first, first_cases = _timed("CaseStore.cases(), first look", store.cases)
        _flush(store, index, args.groups, args.alerts, args.payers)
        again, again_cases = _timed("CaseStore.cases(), after one more flush", store.cases)
        print(f"  a look after a flush: {whole / again:,.0f}x faster than the whole fold")

        # The first snapshot is written from this process's fold (every history in memory).
        snapshot = _snapshot("snapshot written (maintenance, the first)", store)
        for group in range(args.groups + 1, args.groups + 1 + args.after):
            _flush(store, index, group, args.alerts, args.payers)
        print(
            f"  then {args.after} flushes after the snapshot; fresh processes, timed from outside:"
        )
        fresh = _fresh_side_by_side(store, args.runs)
        forget_table(store.events_path)  # as maintenance's own process: from the snapshot
        refresh = _snapshot("snapshot refreshed (maintenance, from the last)", store)
    figures_file.write(
        args.figures,
        {
            "after_flushes": args.after,
            **fresh,
            "fresh_speed_up": round(
                fresh["fresh_first_look_whole_fold_seconds"]
                / fresh["fresh_first_look_snapshot_seconds"],
                1,
            ),
            "snapshot_write_seconds": round(snapshot, 3),
            "snapshot_refresh_seconds": round(refresh, 3),
            "alerts": args.groups * args.alerts,
            "whole_fold_seconds": round(whole, 4),
            "whole_fold_cases": whole_cases,
            "first_look_seconds": round(first, 4),
            "first_look_cases": first_cases,
            "look_after_flush_seconds": round(again, 4),
            "look_after_flush_cases": again_cases,
            "speed_up": round(whole / again, 1),
        },
    )


if __name__ == "__main__":
    main()
