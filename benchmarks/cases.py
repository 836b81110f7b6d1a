"""How long the case queue takes to read its cases (not a test): `make bench-cases`.

A ``case_events`` table as a long-running stream leaves it (``--groups`` write-behind
flushes of ``--alerts`` alerts each over ``--payers`` payers, one file per flush, as
``CaseStore.gather_alerts`` writes them), then, side by side in one process:
- the whole fold: every case event read and folded, what the page did at every look;
- ``CaseStore.cases()`` the first time (the same work, once per process);
- ``CaseStore.cases()`` after one more flush: only the new file is read.
"""

from __future__ import annotations

import argparse
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
from velocity.delta.case_store import CaseStore, _event_rows, _events, ensure_case_tables
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--alerts", type=int, default=2_000)
    parser.add_argument("--payers", type=int, default=150_000)
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
    figures_file.write(
        args.figures,
        {
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
