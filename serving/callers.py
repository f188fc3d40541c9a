"""Who a request is from: bearer tokens bound to a user, and the headers a client names itself by.

A token is ``f1.<payload>.<mac>``, both parts base64url without padding: the payload
is ``<user_id>:<expiry>`` (expiry in epoch seconds) and the mac is HMAC-SHA256 of
the payload under the API's secret (``FANOUT_AUTH_SECRET``), compared in constant
time. Tokens are stateless: nothing is stored, a token cannot be revoked before it
expires, and rotating the secret revokes them all. ``fanout token USER`` mints one.

Clients (the ``fanout`` commands, the checkers, the load generator) mint tokens and
name headers here without importing the web framework, which costs every ``fanout``
command a fifth of a second; the API's request dependencies that check them are
:mod:`serving.auth`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from typing import Final

from ingest.events import MAX_ID
from serving.errors import Unauthorized

_VERSION: Final = "f1"
_CONTEXT: Final = b"fanout-bearer-token/1\n"  # domain separation of the MAC
MAX_TOKEN: Final = 200
#: The caller's id when auth is off (serving.auth).
USER_HEADER: Final = "X-User-Id"
#: A request header that marks a home read as a monitor's (the live verifier's,
#: ``infra.checks.verifier``): answered like any read, but not appended to the activity log
#: (serving.activity), since a monitor reading a timeline is not its user coming back.
MONITOR_HEADER: Final = "x-fanout-monitor"


def mint(user_id: int, secret: bytes, ttl: int, now: float | None = None) -> str:
    """A token that lets its bearer act as ``user_id`` for ``ttl`` seconds."""
    if not 1 <= user_id <= MAX_ID:
        msg = f"user id must be in [1, 2^63-1], got {user_id}"
        raise ValueError(msg)
    if ttl < 1:
        msg = f"ttl must be at least 1 second, got {ttl}"
        raise ValueError(msg)
    expiry = int(time.time() if now is None else now) + ttl
    payload = f"{user_id}:{expiry}".encode("ascii")
    return f"{_VERSION}.{_b64(payload)}.{_b64(_mac(secret, payload))}"


def verify(token: str, secret: bytes, now: float) -> int:
    """The user a genuine, unexpired token names, or :class:`Unauthorized`."""
    payload, mac = _split(token)
    if not hmac.compare_digest(mac, _mac(secret, payload)):
        msg = "bearer token is invalid (bad signature)"
        raise Unauthorized(msg)
    user, expiry = _claims(payload)
    if now >= expiry:
        msg = "bearer token has expired: mint a new one (`fanout token USER`)"
        raise Unauthorized(msg)
    return user


def claimed_user(token: str) -> int:
    """The user a token names, signature unchecked (only for auth off)."""
    return _claims(_split(token)[0])[0]


def _mac(secret: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, _CONTEXT + payload, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    if not text or not text.isascii():
        msg = "empty or non-ASCII part"
        raise ValueError(msg)
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _split(token: str) -> tuple[bytes, bytes]:
    parts = token.split(".") if len(token) <= MAX_TOKEN else []
    if len(parts) != 3 or parts[0] != _VERSION:
        msg = "bearer token is malformed (not one `fanout token` mints)"
        raise Unauthorized(msg)
    try:
        return _unb64(parts[1]), _unb64(parts[2])
    except (binascii.Error, ValueError):
        msg = "bearer token is malformed (bad base64url)"
        raise Unauthorized(msg) from None


def _claims(payload: bytes) -> tuple[int, int]:
    fields = payload.split(b":")
    if len(fields) != 2 or not all(f.isdigit() and len(f) <= 20 for f in fields):
        msg = "bearer token is malformed (bad payload)"
        raise Unauthorized(msg)
    user, expiry = int(fields[0]), int(fields[1])
    if not 1 <= user <= MAX_ID:
        msg = "bearer token names no valid user"
        raise Unauthorized(msg)
    return user, expiry


def expiry_of(token: str) -> int:
    """When a well-formed token expires (epoch seconds), signature unchecked."""
    return _claims(_split(token)[0])[1]
