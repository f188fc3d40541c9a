"""Errors of the serving package, rooted at one class; each maps to an HTTP status."""

from __future__ import annotations


class ServingError(Exception):
    """Base of every error the API turns into a JSON response."""

    status = 500
    code = "internal"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

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
