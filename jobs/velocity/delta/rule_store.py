"""The rules in force, versioned in a Delta table (append-only: old versions stay readable).

Applying a file is all-or-nothing: every entry is checked against the rules in
force first, then all new versions land in one Delta commit. Concurrent appliers
are serialised by Delta's optimistic concurrency (an insert-only MERGE on
(ruleId, version)); the loser re-reads and retries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from velocity.decimals import dumps_json
from velocity.delta.tables import RULE_SCHEMA, create_if_missing, read_table
from velocity.errors import VelocityError
from velocity.rule_changes import ApplyResult, in_force, latest_versions, plan_changes, stored_rule
from velocity.rules import Rule, RuleEntry

_APPLY_ATTEMPTS = 3


class RuleStore:
    """Versioned rules in the Delta table at ``path``."""

    def __init__(self, spark: SparkSession, path: Path) -> None:
        self._spark = spark
        self._path = path

    def _ensure(self) -> None:
        create_if_missing(self._spark, self._path, RULE_SCHEMA)

    def history(self) -> list[Rule]:
        """Every version of every rule, by (ruleId, version)."""
        self._ensure()
        rows = read_table(self._spark, self._path).orderBy("ruleId", "version").collect()
        return [stored_rule(row.asDict()) for row in rows]

    def latest(self) -> dict[int, Rule]:
        """The latest version of each ruleId, deleted ones included."""
        return latest_versions(self.history())

    def in_force(self) -> list[Rule]:
        """ACTIVE and PAUSE rules at their latest version, by ruleId."""
        return in_force(self.history())

    def apply(self, entries: Sequence[RuleEntry], now_ms: int | None = None) -> ApplyResult:
        """Write the versions ``entries`` make, in one commit; nothing on any error."""
        from delta.exceptions import ConcurrentAppendException
        from delta.tables import DeltaTable

        self._ensure()
        for attempt in range(_APPLY_ATTEMPTS):
            written, result = plan_changes(self.latest(), entries)
            if not written:
                return result
            applied_at = now_ms if now_ms is not None else int(time.time() * 1000)
            rows = [
                (
                    r.rule_id,
                    r.version,
                    r.state.value,
                    dumps_json(r.to_json()),
                    r.signature.signature_id,
                    applied_at,
                )
                for r in written
            ]
            updates = self._spark.createDataFrame(rows, RULE_SCHEMA)
            try:
                metrics = (
                    DeltaTable.forPath(self._spark, str(self._path))
                    .alias("t")
                    .merge(updates.alias("u"), "t.ruleId = u.ruleId AND t.version = u.version")
                    .whenNotMatchedInsertAll()
                    .execute()
                    .first()
                )
            except ConcurrentAppendException:
                continue
            inserted = metrics["num_inserted_rows"] if metrics is not None else len(rows)
            if inserted == len(rows):
                return result
            if attempt == _APPLY_ATTEMPTS - 1 or inserted:
                break
        raise VelocityError(
            "another writer changed the rules at the same time; nothing or part was applied — "
            "check `velocity rules list` and apply again"
        )
