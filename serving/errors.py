"""Errors of the serving package, rooted at one class; each maps to an HTTP status."""

from __future__ import annotations


class ServingError(Exception):
    """Base of every error the API turns into a JSON response."""

    status = 500
    code = "internal"
    headers: dict[str, str] = {}

    def __init__(self, message: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if headers is not None:  # else the class's (Unauthorized's WWW-Authenticate)
            self.headers = headers

    def body(self) -> dict[str, object]:
        out: dict[str, object] = {"error": self.code, "message": self.message}
        if self.field:
            out["field"] = self.field
        return out


class BadRequest(ServingError):
    """The request is malformed (400)."""

    status = 400
    code = "bad_request"


class NotFound(ServingError):
    """No such resource (404)."""

    status = 404
    code = "not_found"


class Unavailable(ServingError):
    """A dependency is down; retry later (503)."""

    status = 503
    code = "unavailable"


class Unauthorized(ServingError):
    """No valid bearer token (401); the answer names the scheme to use."""

    status = 401
    code = "unauthorized"
    headers = {"WWW-Authenticate": 'Bearer realm="fanout"'}


class Forbidden(ServingError):
    """A valid token, but for another user's resource (403)."""

    status = 403
    code = "forbidden"


class ConfigError(ServingError):
    """The API's settings cannot work (raised at startup, never answered)."""


class Conflict(ServingError):
    """The request contradicts the current state (409): already done, say."""

    status = 409
    code = "conflict"
