"""How the Velocity page shows values (pure HTML; everything shown is escaped).

- A moment something happened reads relative ("3 min ago"), with the absolute UTC time in
  its title; a few lines of script (``AGO_SCRIPT``) keep it current while the page stays
  open. A time that is data (an event's time in a window, a window's bounds) stays
  absolute (``time_text``), so it can be copied into a filter.
- A key never wraps inside a value: each ``field=value`` is unbreakable, a line may only
  break between them; fields in the rule's grouping order, the rest by name, so the same
  key always reads the same.
- A number reads with its thousands grouped (``1,234,567.5``), exactly as stored.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from html import escape
from typing import Any
from urllib.parse import urlencode

STYLE = """
.kv { white-space: nowrap; } time.ago { white-space: nowrap; }
td.figure, th.figure { text-align: right; font-variant-numeric: tabular-nums; }
"""

# Relative times redrawn every 15 s from their data-ms, with the words of ``ago_text``.
# One timer per window: a page drawn again by document.write keeps the window (and would
# otherwise add a timer each time).
AGO_SCRIPT = """
(function () {
  function ago(ms) {
    var s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
    if (s < 5) { return "just now"; }
    if (s < 60) { return s + " s ago"; }
    var m = Math.floor(s / 60);
    if (m < 60) { return m + " min ago"; }
    var h = Math.floor(m / 60);
    return h < 48 ? h + " h ago" : Math.floor(h / 24) + " d ago";
  }
  function redraw() {
    document.querySelectorAll("time.ago[data-ms]").forEach(function (t) {
      t.textContent = ago(Number(t.dataset.ms));
    });
  }
  window.velocityAgo = redraw;
  if (window.velocityAgoTimer) { clearInterval(window.velocityAgoTimer); }
  window.velocityAgoTimer = setInterval(redraw, 15000);
})();
"""


def time_text(ms: object) -> str:
    """Epoch ms as UTC time (``2026-01-01 10:05:00.123Z``); anything else as escaped text."""
    if isinstance(ms, bool) or not isinstance(ms, int):
        return "" if ms is None else escape(str(ms))
    try:
        moment = datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return escape(str(ms))
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def ago_text(ms: int, now_ms: int) -> str:
    """How long before ``now_ms`` ``ms`` was: ``just now``, ``42 s ago``, ``3 min ago``,
    ``5 h ago``, ``3 d ago`` (a moment after now, a clock's skew, reads ``just now``)."""
    seconds = max(0, now_ms - ms) // 1000
    if seconds < 5:
        return "just now"
    if seconds < 60:
        return f"{seconds} s ago"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min ago"
    hours = minutes // 60
    return f"{hours} h ago" if hours < 48 else f"{hours // 24} d ago"


def time_ago(ms: object, now_ms: int) -> str:
    """``<time>`` reading ``3 min ago``, its title the UTC time; anything but epoch ms as
    escaped text, None as nothing."""
    if isinstance(ms, bool) or not isinstance(ms, int):
        return time_text(ms)
    exact = time_text(ms)
    try:
        iso = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return exact
    return (
        f'<time class="ago" datetime="{iso.replace("+00:00", "Z")}" data-ms="{ms}" '
        f'title="{exact}">{ago_text(ms, now_ms)}</time>'
    )


def key_order(key: Mapping[str, Any], order: Sequence[str] = ()) -> list[str]:
    """The fields of ``key`` as shown: ``order``'s first (the rule's grouping keys), the
    rest by name."""
    return [n for n in order if n in key] + sorted(n for n in key if n not in order)


def key_html(key: Mapping[str, Any] | None, order: Sequence[str] = ()) -> str:
    """``payerId=p-4041, beneficiaryId=2034`` with each field=value unbreakable (the text
    is ``velocity.analyst.alert_search.key_text``'s, so a key shown can be pasted into a filter)."""
    if not key:
        return "(all)"
    return ", ".join(
        f'<span class="kv">{escape(name)}={escape(str(key[name]))}</span>'
        for name in key_order(key, order)
    )


def number_text(value: object) -> str:
    """A decimal (or its text) with its thousands grouped, every digit kept
    (``1234567.50`` → ``1,234,567.50``); anything else as escaped text."""
    if value is None:
        return ""
    try:
        number = value if isinstance(value, Decimal) else Decimal(str(value))
    except (InvalidOperation, ValueError):
        return escape(str(value))
    if not number.is_finite():
        return escape(str(value))
    return f"{number:,f}"


def hidden_inputs(params: Mapping[str, str], leave_out: Collection[str] = ()) -> str:
    """The page's other URL parameters as hidden fields, so a GET form keeps them."""
    return "".join(
        f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">'
        for name, value in params.items()
        if name not in leave_out and value
    )


def token_input(token: str) -> str:
    """The page's token (``access.csrf_token``) as the hidden field every form that posts
    carries: the server refuses a post from the browser without it."""
    return f'<input type="hidden" name="csrf_token" value="{escape(token)}">'


def token_meta(token: str) -> str:
    """The page's token where its script reads it (``X-CSRF-Token`` of each post it sends)."""
    return f'<meta name="csrf-token" content="{escape(token)}">'


def query_string(params: Mapping[str, str], leave_out: Collection[str] = ()) -> str:
    """``params`` (the page's URL parameters) as a query string, without ``leave_out``."""
    return urlencode({k: v for k, v in params.items() if k not in leave_out and v})
