"""The API's request dependencies that check who a request is from (:mod:`serving.callers`).

With auth on, writes need the acting user's token and home timelines need their
owner's (401 when missing, malformed, tampered or expired; 403 for another user's
resource); an author's own tweets are public. With auth off (demos, load tests of the
read path) the caller is whoever the request says: the ``X-User-Id`` header, else the
user a bearer token names (its signature unchecked), else the ``user_id`` in the path.
"""

# No ``from __future__ import annotations``: FastAPI resolves the dependency signatures.

import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serving.callers import USER_HEADER, claimed_user, expiry_of, verify
from serving.errors import Unauthorized
from serving.ids import parse_id
from serving.settings import ServingSettings

_bearer = HTTPBearer(auto_error=False, scheme_name="bearer", bearerFormat="fanout-hmac",
                     description="A token from `fanout token USER` (auth on).")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


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
        return float(expiry_of(credentials.credentials))

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

