"""The stream's health: the `velocity stream-status` verdict and its figures."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from velocity_airflow.page import access, common
from velocity_airflow.page.home_html import health_html

router = APIRouter()


def health_section(settings: Any) -> str:
    from velocity.operating import stream_control

    health, error = common.read(
        "stream status", lambda: stream_control.check_health(settings).to_json()
    )
    return health_html(health, error)


@router.get("/api/health")
def health_json() -> dict[str, Any]:
    from velocity.operating import stream_control

    return stream_control.check_health(access.settings()).to_json()
