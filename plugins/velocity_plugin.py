"""Registers Velocity's page with Airflow: its FastAPI app and an entry in the UI's nav.

Airflow loads every ``.py`` file of the plugins folder as a module; ``.airflowignore``
keeps it to this one, and ``velocity_airflow`` is imported as the package it is.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

from velocity_airflow.page.app import URL_PREFIX, app


class VelocityPlugin(AirflowPlugin):
    name = "velocity"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [
        {"name": "Velocity", "app": app, "url_prefix": URL_PREFIX}
    ]
    external_views: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "Velocity",
            "href": f"{URL_PREFIX}/",
            "url_route": "velocity",
            "destination": "nav",
            "nav_top_level": True,
        }
    ]
