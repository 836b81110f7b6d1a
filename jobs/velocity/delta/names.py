"""The names of the Delta tables under a table root (no Spark: readers without a JVM use them)."""

from __future__ import annotations

EVENTS = "events"
QUARANTINE = "quarantine"
DUPLICATES = "duplicates"
BUCKETS = "buckets"
ALERTS = "alerts"
RULES = "rules"
LATE_EVENTS = "late_events"
SIGNATURES = "signatures"
BACKFILLS = "backfills"
RULE_EPOCHS = "rule_epochs"
ALERT_REVIEWS = "alert_reviews"
CASES = "cases"
CASE_EVENTS = "case_events"
