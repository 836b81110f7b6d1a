"""A window lookup: a rule's window aggregate for a key, from Redis."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, status

from velocity_airflow.page import access
from velocity_airflow.plans import rule_id_text

router = APIRouter()


def lookup(settings: Any, rule: str, key: str) -> dict[str, Any]:
    from velocity.domain.schema import parse_key_values
    from velocity.redis import mirror

    rule_id = rule_id_text(rule.strip())
    if rule_id is None:
        raise ValueError(f"ruleId must be a number, got {rule!r}")
    return mirror.lookup(
        mirror.connect(settings), settings.redis_keys, rule_id, parse_key_values(key)
    )


@router.get("/api/lookup")
def lookup_json(rule: str, key: str) -> dict[str, Any]:
    from velocity.errors import UsageError

    try:
        return lookup(access.settings(), rule, key)
    except (ValueError, KeyError, UsageError) as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
