"""Bearer tokens bound to a user, and the request dependencies that check them.

A token is ``f1.<payload>.<mac>``, both parts base64url without padding: the payload
is ``<user_id>:<expiry>`` (expiry in epoch seconds) and the mac is HMAC-SHA256 of
the payload under the API's secret (``FANOUT_AUTH_SECRET``), compared in constant
time. Tokens are stateless: nothing is stored, a token cannot be revoked before it
expires, and rotating the secret revokes them all. ``fanout token USER`` mints one.

With auth on, writes need the acting user's token and home timelines need their
owner's (401 when missing, malformed, tampered or expired; 403 for another user's
resource); an author's own tweets are public. With auth off (demos, load tests of the
read path) the caller is whoever the request says: the ``X-User-Id`` header, else the
user a bearer token names (its signature unchecked), else the ``user_id`` in the path.
"""

# No ``from __future__ import annotations``: FastAPI resolves the dependency signatures.

import base64
import binascii
import hashlib
import hmac
import time
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ingest.events import MAX_ID
from serving.errors import Unauthorized
from serving.ids import parse_id
from serving.settings import ServingSettings

_VERSION: Final = "f1"
_CONTEXT: Final = b"fanout-bearer-token/1\n"  # domain separation of the MAC
MAX_TOKEN: Final = 200
USER_HEADER: Final = "X-User-Id"

_bearer = HTTPBearer(auto_error=False, scheme_name="bearer", bearerFormat="fanout-hmac",
                     description="A token from `fanout token USER` (auth on).")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


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


class Auth:
    """The request dependencies for one app's settings (built at app creation)."""

    def __init__(self, settings: ServingSettings) -> None:
        self.on = settings.auth
        self._secret = settings.secret() if settings.auth else b""

    async def caller(self, credentials: Credentials) -> int | None:
        """Dependency: the verified caller's id (401 without one); None when auth is off.

        Async although it does no I/O: FastAPI runs a sync dependency on a worker thread.
        """
        if not self.on:
            return None
        return self._verified(credentials)

    async def until(self, credentials: Credentials) -> float | None:
        """Dependency: when the caller's token expires (epoch seconds); None when auth is off.

        A live stream ends then (``token_expired``): a token's right to read is bounded in
        time, and a connection held open must not outlive it.
        """
        if not self.on or credentials is None:
            return None
        return float(_claims(_split(credentials.credentials)[0])[1])

    def bearer(self, authorization: str | None) -> int | None:
        """The caller an ``Authorization`` header proves (None when auth is off).

        For :class:`serving.reads.FastReads`; raises like :meth:`caller` on a missing
        or bad token, which sends the request on to the route to answer it.
        """
        if not self.on:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            msg = "missing bearer token"
            raise Unauthorized(msg)
        return verify(token, self._secret, time.time())

    def acting(self, request: Request, credentials: Credentials) -> int:
        """Dependency: the user a write acts as (see the module docstring)."""
        if self.on:
            return self._verified(credentials)
        return _asserted(request, credentials)

    def _verified(self, credentials: HTTPAuthorizationCredentials | None) -> int:
        if credentials is None:
            msg = "missing bearer token: send `Authorization: Bearer TOKEN` (`fanout token USER`)"
            raise Unauthorized(msg)
        return verify(credentials.credentials, self._secret, time.time())


def _asserted(request: Request, credentials: HTTPAuthorizationCredentials | None) -> int:
    header = request.headers.get(USER_HEADER)
    if header is not None:
        return parse_id(header, USER_HEADER)
    if credentials is not None:
        return claimed_user(credentials.credentials)
    path = request.path_params.get("user_id")
    if path is not None:
        return parse_id(path, "user_id")
    msg = f"auth is off, but the request names no user: send {USER_HEADER}: ID"
    raise Unauthorized(msg)

