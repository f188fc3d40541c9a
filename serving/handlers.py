"""The API's one JSON error shape, and the handlers that turn every failure into it.

Every 4xx/5xx answer is ``{"error", "message", "field"?}``: serving's own errors
(reads and writes alike), store failures (503), FastAPI's validation errors (400,
never its 422 shape), Starlette's 404/405/413 and anything unexpected (500, details
only in the log).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from serving.errors import ServingError, Unavailable
from views.errors import StoreError

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    """Every 4xx/5xx response."""

    error: str = Field(examples=["bad_request"])
    message: str = Field(examples=["user_id must be a decimal integer in [1, 2^63-1]"])
    field: str | None = Field(None, description="The offending parameter, when one is.")


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure to the JSON error shape."""
    app.add_exception_handler(ServingError, _on_serving_error)  # type: ignore[arg-type]
    app.add_exception_handler(StoreError, _on_store_error)
    app.add_exception_handler(RequestValidationError,
                              _on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, on_unexpected)


def _error(status: int, code: str, message: str, field: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=code, message=message, field=field)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


async def _on_serving_error(request: Request, exc: ServingError) -> JSONResponse:
    return _error(exc.status, exc.code, exc.message, exc.field, exc.headers)


#: Retry-After of a read refused because the store is down (a node restarting).
STORE_RETRY_AFTER_S = 5


async def _on_store_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("store error on %s %s: %s", request.method, request.url.path, exc)
    return _error(Unavailable.status, Unavailable.code, "the store cannot be read right now",
                  headers={"Retry-After": str(STORE_RETRY_AFTER_S)})


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":  # its loc holds a character position
        reason = str(first.get("ctx", {}).get("error", "")).strip() or "syntax error"
        return _error(400, "bad_request", f"request body is not valid JSON: {reason}")
    names = [str(part) for part in first.get("loc", ())[1:]]
    field = ".".join(names) or None
    reason = str(first.get("msg", "invalid request"))
    return _error(400, "bad_request", f"{field}: {reason}" if field else reason, field)


async def _on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    status = exc.status_code
    if status == 404:
        message = f"no such route: {request.url.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    code = HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    return _error(status, code, message, headers=exc.headers)


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    """The 500 answer: a fixed message; the exception goes to the log only."""
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal", "internal server error")
