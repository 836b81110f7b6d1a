"""The alert record of SPEC §4 and its deterministic identity."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from enum import StrEnum
from hashlib import sha1
from typing import Any

from velocity.domain.rules import Outcome, Rule, RuleState
from velocity.domain.schema import format_decimal
from velocity.domain.windows import Decision, format_aggregate

# Fixed forever: changing it would give every replayed alert a new identity.
_ALERT_NAMESPACE = uuid.UUID("6f1c7c52-3d0e-4f59-9a53-6b1f0d6ad0a1")


class AlertKind(StrEnum):
    ALERT = "ALERT"
    CORRECTION = "CORRECTION"
    RETRACTION = "RETRACTION"


def alert_id(
    rule_id: int, rule_version: int, transaction_id: str, kind: AlertKind, run_id: str = ""
) -> str:
    """Deterministic in (ruleId, ruleVersion, transactionId, kind) and, for a backfill's
    amendment, its run: a replay yields the same id, and a decision amended again by a
    later run gets new ids (a consumer that de-duplicates by alertId keeps both)."""
    run = f"|{run_id}" if run_id else ""
    return str(
        uuid.uuid5(_ALERT_NAMESPACE, f"{rule_id}|{rule_version}|{kind.value}|{transaction_id}{run}")
    )


def alert_ids(
    rule_id: int, rule_version: int, kind: AlertKind, transaction_ids: Sequence[str]
) -> list[str]:
    """``alert_id`` of many transactions of one rule version and kind (no backfill run):
    the same UUID 5 (SHA-1 of the namespace and the name, version and variant bits set),
    without a ``uuid.UUID`` object per alert."""
    prefix = f"{rule_id}|{rule_version}|{kind.value}|".encode()
    namespace = _ALERT_NAMESPACE.bytes
    out = []
    for transaction_id in transaction_ids:
        digest = bytearray(sha1(namespace + prefix + transaction_id.encode()).digest()[:16])
        digest[6] = (digest[6] & 0x0F) | 0x50
        digest[8] = (digest[8] & 0x3F) | 0x80
        text = digest.hex()
        out.append(f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}")
    return out


def rule_key(rule: Rule, signature_key: Sequence[str]) -> dict[str, str]:
    """The key of an alert by the rule's grouping field names.

    ``signature_key`` holds values in the signature's (sorted) field order.
    """
    by_name = dict(zip(rule.signature.grouping_keys, signature_key, strict=True))
    return {name: by_name[name] for name in rule.grouping_keys}


def alert_record(
    decision: Decision,
    key: Mapping[str, str],
    decision_time: int,
    kind: AlertKind = AlertKind.ALERT,
) -> dict[str, Any]:
    """The SPEC §4 record of one decision (``"shadow": true`` for a SHADOW rule's)."""
    rule = decision.rule
    record = {
        "alertId": alert_id(rule.rule_id, rule.version, decision.event.transaction_id, kind),
        "kind": kind.value,
        "ruleId": rule.rule_id,
        "ruleVersion": rule.version,
        "transactionId": decision.event.transaction_id,
        "key": dict(key),
        "eventTime": decision.event.event_time,
        "aggregatorFunctionType": rule.aggregator.value,
        "aggregateValue": format_aggregate(decision.value),
        "limitOperatorType": rule.operator.value,
        "limit": format_decimal(rule.limit),
        "windowStart": decision.window_start,
        "windowEnd": decision.event.event_time,
        "decisionTime": decision_time,
        "outcome": rule.outcome.value,
    }
    if rule.state is RuleState.SHADOW:
        record["shadow"] = True
    return record


ALERT_FIELDS: tuple[str, ...] = (
    "alertId", "kind", "ruleId", "ruleVersion", "transactionId", "key", "eventTime",
    "aggregatorFunctionType", "aggregateValue", "limitOperatorType", "limit",
    "windowStart", "windowEnd", "decisionTime", "outcome",
)  # fmt: skip


def stored_outcome(row: Mapping[str, Any]) -> str:
    """The ``outcome`` of a stored alert row or record: its rule version's (SPEC §4); a
    row of a Velocity before outcome existed has none, and every rule then was ALERT."""
    return str(row.get("outcome") or Outcome.ALERT.value)


def record_of_stored(row: Mapping[str, Any]) -> dict[str, Any]:
    """The SPEC §4 record of a stored alert row (its key may be a map or key/value pairs);
    a shadow rule's says so (``"shadow": true``), a rule in force's has no such field; a
    suppressed one says so and names its suppressor (``"suppressedBy"``: the notified
    alert's transactionId)."""
    record = {name: row[name] for name in ALERT_FIELDS if name != "outcome"}
    record["key"] = dict(row["key"])
    record["outcome"] = stored_outcome(row)
    if row.get("shadow"):
        record["shadow"] = True
    if row.get("suppressed"):
        record["suppressed"] = True
        record["suppressedBy"] = row.get("suppressedBy")
    return record


def is_suppressed(record: Mapping[str, Any]) -> bool:
    """An alert its rule's cooldown suppressed: recorded, never published (SPEC §3)."""
    return bool(record.get("suppressed"))


def is_shadow(record: Mapping[str, Any]) -> bool:
    """A shadow rule's alert: for the alerts table and the shadow stream only, never for
    the alert stream or topic downstream services consume."""
    return bool(record.get("shadow"))


def amended(
    record: Mapping[str, Any], kind: AlertKind, decision_time: int, run_id: str
) -> dict[str, Any]:
    """A backfill's CORRECTION or RETRACTION of a decision (SPEC §3).

    A CORRECTION carries the complete-data decision (its value and window); a RETRACTION
    repeats the alert it takes back. The id is deterministic in (rule, version,
    transaction, kind, backfill run), so the run's recovery republishes the same ids.
    """
    if kind is AlertKind.ALERT:
        raise ValueError("a backfill amends with CORRECTION or RETRACTION, not ALERT")
    out = {name: record[name] for name in ALERT_FIELDS if name != "outcome"}
    out["key"] = dict(record["key"])
    out["outcome"] = stored_outcome(record)  # the amended version's, as its alert said
    if is_shadow(record):
        out["shadow"] = True
    out["kind"] = kind.value
    out["alertId"] = alert_id(
        record["ruleId"], record["ruleVersion"], record["transactionId"], kind, run_id
    )
    out["decisionTime"] = decision_time
    return out
