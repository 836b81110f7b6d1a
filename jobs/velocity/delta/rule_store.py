"""The rules in force, versioned in a Delta table (append-only: old versions stay readable).

Written and read with delta-rs, without a JVM: a rule change from `velocity rules` or
the Airflow page takes a fraction of a second where a Spark session took tens. The table
stays an ordinary Delta table (reader 1, writer 2; the columns of
``velocity.delta.tables.RULE_SCHEMA``), so Spark reads it as before (the stream checks
its version through Delta's log every micro-batch), and a table that Spark created is
appended to here.

Applying is all-or-nothing: every entry is checked against the latest versions first
(``velocity.domain.rule_changes.plan_changes``), then all new versions land in one commit.
Concurrent appliers: the commit is conditional on the table version the plan was read
from (no commit retries); the loser re-reads, plans again and commits on top, so a
(ruleId, version) pair is never written twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from arro3.core import Table
from deltalake import DeltaTable

from velocity.delta.small_tables import (
    append_planned,
    create_if_missing,
    open_table,
    read_rows,
    rows_table,
)
from velocity.domain.decimals import dumps_json
from velocity.domain.rule_changes import (
    ApplyResult,
    Change,
    Promotion,
    RuleBook,
    plan_changes,
    stored_rule,
)
from velocity.domain.rules import Rule, RuleState, StateChange

# RULE_SCHEMA as Arrow. Nullable throughout, as Spark makes a table it creates from a
# DataFrame: the table is the same whichever of the two created it.
RULE_ARROW_SCHEMA = pa.schema(
    [
        pa.field("ruleId", pa.int64()),
        pa.field("version", pa.int32()),
        pa.field("ruleState", pa.string()),
        pa.field("rule_json", pa.string()),
        pa.field("signature_id", pa.string()),
        pa.field("applied_at", pa.int64()),
    ]
)
_READ_COLUMNS = ["ruleId", "version", "ruleState", "rule_json"]


class RuleStore:
    """Versioned rules in the Delta table at ``path`` (the table's one writer)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    @property
    def path(self) -> Path:
        return self._path

    def create_if_missing(self) -> DeltaTable:
        """The table, created empty unless it is there (safe to call repeatedly, and
        concurrently)."""
        return create_if_missing(self._path, RULE_ARROW_SCHEMA)

    def history(self) -> list[Rule]:
        """Every version of every rule, by (ruleId, version); empty before the first apply."""
        table = open_table(self._path)
        return [] if table is None else _history(table)

    def applied_times(self) -> dict[tuple[int, int], int]:
        """When each version was applied (epoch ms), by (ruleId, version)."""
        table = open_table(self._path)
        rows = [] if table is None else read_rows(table, ["ruleId", "version", "applied_at"])
        return {(int(r["ruleId"]), int(r["version"])): int(r["applied_at"]) for r in rows}

    def latest(self) -> dict[int, Rule]:
        """The latest version of each ruleId's rule in force, deleted ones included."""
        return dict(self.book().live)

    def book(self) -> RuleBook:
        """The rules in force and the shadow candidates beside them."""
        return RuleBook.of(self.history())

    def in_force(self) -> list[Rule]:
        """ACTIVE and PAUSE rules at their latest version and the standing SHADOW
        candidates, by (ruleId, version)."""
        return self.book().in_force()

    def promote(self, rule_id: int, now_ms: int | None = None) -> ApplyResult:
        """The candidate of ``rule_id`` becomes its ACTIVE version, in one table version
        (the stream switches over on its next micro-batch)."""
        return self.apply([Promotion(rule_id)], now_ms)

    def discard(self, rule_id: int, now_ms: int | None = None) -> ApplyResult:
        """Withdraw the candidate of ``rule_id``; the rule in force is unchanged."""
        return self.apply([StateChange(rule_id, RuleState.DISCARD)], now_ms)

    def apply(self, entries: Sequence[Change], now_ms: int | None = None) -> ApplyResult:
        """Write the versions ``entries`` make, in one commit; nothing on any error
        (``InvalidRuleError`` / ``UnknownRuleError`` name what is wrong)."""

        def plan(table: DeltaTable) -> tuple[Table | None, ApplyResult]:
            written, result = plan_changes(RuleBook.of(_history(table)), entries)
            if not written:
                return None, result
            applied_at = now_ms if now_ms is not None else int(time.time() * 1000)
            return _rows_table(written, applied_at), result

        # Conditional: versions planned from an older snapshot would write a (ruleId,
        # version) twice.
        return append_planned(
            self._path,
            RULE_ARROW_SCHEMA,
            plan,
            "nothing was applied — check `velocity rules list` and apply again",
        )


def _rows_table(written: Sequence[Rule], applied_at: int) -> Table:
    """The rows of ``written``."""
    return rows_table(
        RULE_ARROW_SCHEMA,
        {
            "ruleId": [r.rule_id for r in written],
            "version": [r.version for r in written],
            "ruleState": [r.state.value for r in written],
            "rule_json": [dumps_json(r.to_json()) for r in written],
            "signature_id": [r.signature.signature_id for r in written],
            "applied_at": [applied_at] * len(written),
        },
    )


def _history(table: DeltaTable) -> list[Rule]:
    rows = read_rows(table, _READ_COLUMNS)
    return sorted((stored_rule(row) for row in rows), key=lambda r: (r.rule_id, r.version))
