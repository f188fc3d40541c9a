"""Bearer tokens for simulated users, minted from the API's secret (``--fanout-auth-secret``).

The format is the API's (``serving/auth.py`` documents it): ``f1.<payload>.<mac>``,
both parts base64url without padding, the payload ``<user_id>:<expiry>`` and the mac
HMAC-SHA256 of a fixed context line plus the payload. loadgen talks to the API over
HTTP only and may not import ``serving`` (DESIGN §2), so the few lines are repeated
here; ``tests/loadgen/test_loadgen.py`` checks that the API accepts what this mints. The
usual route is the other one: ``fanout load`` mints with the API's own code and hands
Locust a tokens file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Final

_VERSION: Final = "f1"
_CONTEXT: Final = b"fanout-bearer-token/1\n"


def mint(user_id: int, secret: bytes, ttl: int, now: float | None = None) -> str:
    """A token that lets its bearer act as ``user_id`` for ``ttl`` seconds."""
    expiry = int(time.time() if now is None else now) + ttl
    payload = f"{user_id}:{expiry}".encode("ascii")
    mac = hmac.new(secret, _CONTEXT + payload, hashlib.sha256).digest()
    return f"{_VERSION}.{_b64(payload)}.{_b64(mac)}"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
