"""A window lookup: a rule's window aggregate for a key, from Redis; as JSON, and as the
page's part its form reads in place."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Response, status

from velocity_airflow.page import access, common
from velocity_airflow.page.home_html import lookup_part
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


@router.get("/lookup")
def lookup_part_json(lookup_rule: str = "", lookup_key: str = "") -> Response:
    """The lookup's result as the page draws it (``parts["lookup-result"]``), for its form
    to show in place; 400 (``ok`` false) when it cannot be looked up, the part saying why."""
    found, error = common.read(
        "window aggregate", lambda: lookup(access.settings(), lookup_rule, lookup_key)
    )
    part = {"lookup-result": lookup_part(found, error)}
    return common.parts_json(error is None, "", part, status.HTTP_400_BAD_REQUEST)
