"""Times as people read them: epoch milliseconds (every stored and JSON time) as ISO-8601
UTC text with milliseconds, ``2026-11-28T10:15:02.123Z``. Text output only; JSON keeps
the numbers."""

from __future__ import annotations

from datetime import UTC, datetime


def iso_utc(ms: int) -> str:
    """``ms`` (epoch milliseconds) as ``YYYY-MM-DDTHH:MM:SS.mmmZ``; exact to the millisecond
    (integer arithmetic: no float rounding), before 1970 too."""
    seconds, millis = divmod(int(ms), 1000)
    moment = datetime.fromtimestamp(seconds, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{millis:03d}Z"
