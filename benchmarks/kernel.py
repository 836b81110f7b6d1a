"""The decision kernel alone (not a test): `python -m benchmarks.kernel`.

Keyed events made with numpy (payers, beneficiaries, actions, ips, amounts with up to 8
places, one day of event time), fanned out to the signatures of a rules file the way the
Spark fan-out does, then decided by ``velocity.engine.kernel.decide_history`` in this
process; prints rows, decisions, seconds and µs per keyed row and per event, best of
``--runs``. With ``--reference N`` the per-event reference engine
(``velocity.domain.windows.evaluate_key_history``) decides the first N events' keys too, and the
ratio follows (both on the same rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks import figures as figures_file
from velocity.domain.rules import (
    RuleSignature,
    deciding_rules,
    key_text,
    parse_rules,
    rules_by_signature,
)
from velocity.domain.windows import KeyedEvent, evaluate_key_history
from velocity.engine.kernel import decide_history

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RULES = ROOT / "jobs" / "velocity" / "resources" / "sample_rules.json"
DAY_MS = 86_400_000
ACTIONS = np.array(["PAY", "PAY", "PAY", "TRANSFER", "TRANSFER", "WITHDRAW"])


def synthetic_events(n: int, payers: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    payer = rng.integers(0, payers, n)
    cents = (100 * 10 ** (rng.random(n) * 3.7)).astype(np.int64)
    return {
        "transactionId": np.array([f"tx-{i}" for i in range(n)]),
        "eventTime": 1_767_225_600_000 + np.sort(rng.integers(0, DAY_MS, n)),
        "payerId": np.char.add("p", payer.astype(str)),
        "beneficiaryId": np.char.add("b", rng.integers(0, payers // 2 + 1, n).astype(str)),
        "deviceId": np.char.add("d", (payer + rng.integers(0, 2, n)).astype(str)),
        "ip": np.char.add("10.0.", (payer % 7 + rng.integers(0, 3, n)).astype(str)),
        "action": ACTIONS[rng.integers(0, len(ACTIONS), n)],
        "paymentType": np.where(rng.random(n) < 0.6, "CRD", "CSH"),
        "paymentAmount": np.array([f"{c // 100}.{c % 100:02d}" for c in cents.tolist()]),
    }


def keyed(events: dict[str, np.ndarray], signatures: list[RuleSignature]) -> pa.Table:
    """The Spark fan-out (``velocity.spark.evaluate.keyed_events``), in numpy."""
    parts = []
    for signature in signatures:
        chosen = np.ones(len(events["eventTime"]), dtype=bool)
        for name, allowed in signature.filter:
            chosen &= np.isin(events[name], list(allowed))
        index = np.flatnonzero(chosen)
        keys = (
            [
                key_text(list(values))
                for values in zip(
                    *(events[n][index].tolist() for n in signature.grouping_keys), strict=True
                )
            ]
            if signature.grouping_keys
            else ["[]"] * len(index)
        )
        field = signature.aggregate_field
        values = events[field][index] if field else np.full(len(index), None)
        numeric = field == "paymentAmount"
        parts.append(
            pa.table(
                {
                    "signature_id": pa.array([signature.signature_id] * len(index)),
                    "key": pa.array(keys, pa.string()),
                    "eventTime": pa.array(events["eventTime"][index], pa.int64()),
                    "transactionId": pa.array(events["transactionId"][index]),
                    "value": pa.array(values.tolist(), pa.string()),
                    "number": pa.array(
                        [Decimal(v) for v in values.tolist()] if numeric else [None] * len(index),
                        pa.decimal128(26, 8),
                    ),
                }
            )
        )
    return pa.concat_tables(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--payers", type=int, default=100_000)
    parser.add_argument("--rules", type=Path, default=SAMPLE_RULES)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reference", type=int, default=0, help="events for the reference")
    figures_file.add_option(parser)
    args = parser.parse_args()

    rules = deciding_rules(parse_rules(args.rules.read_text()))  # type: ignore[arg-type]
    events = synthetic_events(args.events, args.payers, seed=1)
    table = keyed(events, list(rules_by_signature(rules)))
    best = float("inf")
    for _ in range(args.runs):
        started = time.perf_counter()
        decisions = decide_history(table, rules, 60_000)
        best = min(best, time.perf_counter() - started)
    figures = {
        "rules": str(args.rules),
        "events": args.events,
        "keyed_rows": table.num_rows,
        "decisions": len(decisions),
        "kernel_seconds": round(best, 3),
        "us_per_keyed_row": round(best / table.num_rows * 1e6, 2),
        "us_per_event": round(best / args.events * 1e6, 2),
    }
    if args.reference:
        subset = table.filter(
            pa.compute.less(
                table.column("eventTime"), int(events["eventTime"][args.reference - 1]) + 1
            )
        )
        started = time.perf_counter()
        kernel_count = len(decide_history(subset, rules, 60_000))
        kernel_seconds = time.perf_counter() - started
        by_signature = {s.signature_id: g for s, g in rules_by_signature(rules).items()}
        histories: dict[tuple[str, str], list[KeyedEvent]] = {}
        for row in subset.to_pylist():
            histories.setdefault((row["signature_id"], row["key"]), []).append(
                KeyedEvent(row["eventTime"], row["transactionId"], row["value"], row["number"])
            )
        started = time.perf_counter()
        reference_count = sum(
            len(list(evaluate_key_history(h, by_signature[s], 60_000)))
            for (s, _), h in histories.items()
        )
        reference_seconds = time.perf_counter() - started
        figures |= {
            "reference_events": args.reference,
            "reference_seconds": round(reference_seconds, 3),
            "kernel_seconds_same_rows": round(kernel_seconds, 3),
            "reference_over_kernel": round(reference_seconds / kernel_seconds, 1),
            "same_decision_count": kernel_count == reference_count,
        }
    print(json.dumps(figures))
    figures_file.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
