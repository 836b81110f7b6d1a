"""The outcome of a rule change, shown once on the page after the change's redirect.

It travels in a short-lived cookie signed with a key from the api-server's secret, not in
the URL: a link someone crafts cannot make the page say a change succeeded.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from velocity_airflow.page.home_html import Flash

COOKIE = "velocity_flash"
# A cookie holds about 4 KB: the message's UTF-8 bytes, base64'd and signed, stay well below.
MAX_BYTES = 2000


def seal(flash: Flash, key: bytes) -> str:
    """``flash`` as a signed cookie value; a longer message is cut, and says so."""
    text = flash.text
    if len(text.encode()) > MAX_BYTES:
        text = text.encode()[: MAX_BYTES - 3].decode(errors="ignore") + "…"
    body = base64.urlsafe_b64encode(json.dumps([flash.ok, text], ensure_ascii=False).encode())
    return f"{body.decode()}.{_signature(body, key)}"


def unseal(value: str, key: bytes) -> Flash | None:
    """The flash a cookie value holds; None when it is not one this key signed."""
    body, _, signature = value.rpartition(".")
    if not body or not hmac.compare_digest(signature, _signature(body.encode(), key)):
        return None
    try:
        ok, text = json.loads(base64.urlsafe_b64decode(body))
    except (ValueError, TypeError):
        return None
    if not isinstance(ok, bool) or not isinstance(text, str):
        return None
    return Flash(ok, text)


def _signature(body: bytes, key: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()
