"""The SHADOW candidates, each beside its rule in force (``velocity.analyst.shadow_compare``),
to promote or discard (``rules``)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from velocity_airflow.page import access

router = APIRouter()


def comparisons(settings: Any, history: Any, reviews: list[Any] | None) -> list[Any]:
    """Each SHADOW candidate beside its rule in force, as of now (``history``: every rule
    version, read already; ``reviews``: every review, when read already)."""
    from velocity.delta.reader import shadow_comparisons

    return shadow_comparisons(settings, int(time.time() * 1000), history, reviews)


@router.get("/api/shadow")
def shadow_json() -> list[dict[str, Any]]:
    """Each SHADOW candidate beside its rule in force over the last 24 h (from when the
    candidate was applied, if later): per side its alerts (transactions fired on), reviews
    and precision, and the transactions both fired on, only the candidate, only the rule in
    force. Promote or discard one with `POST /velocity/rules/ID/promote|discard`."""
    from velocity.delta.reader import rule_history

    settings = access.settings()
    return [c.to_json() for c in comparisons(settings, rule_history(settings), None)]
