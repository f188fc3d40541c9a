"""The HTTP read API: routes, hydration, health and the JSON error contract (DESIGN §7).

This module owns the HTTP edge of the read path. Timeline assembly (hybrid merge,
read-time fallback) is :mod:`serving.timeline`; cursors are :mod:`serving.cursor`.
Here a page of ids becomes JSON: two bulk reads per page (tweets, then their
authors), ids rendered as decimal strings, and every failure turned into one JSON
shape ``{"error", "message", "field"?}`` — never FastAPI's 422 shape, never HTML.

:func:`create_app` does no I/O: the store is built and opened in the lifespan
handler, so constructing the app in a test or a CLI is free (STYLE §4).
"""

# No ``from __future__ import annotations``: FastAPI must resolve the parameter types
# that _timeline_routes builds at run time (they carry the configured max_page).

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from http import HTTPStatus
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import uvicorn
from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingest.events import MAX_ID
from serving.cursor import decode_cursor, encode_cursor
from serving.errors import BadRequest, ServingError, Unavailable
from serving.settings import ServingSettings
from serving.timeline import PageFn, author_page, home_page, read_time_page
from views.delta import Key
from views.errors import StoreError
from views.stores import store_from_url
from views.stores.base import Entry, Store, TweetRow, UserRow

logger = logging.getLogger(__name__)

ID_NOTE = ("Ids are positive 64-bit integers up to 2^63-1 and are emitted as decimal "
           "JSON strings: JavaScript numbers hold integers exactly only up to 2^53.")
_EPOCH = datetime(1970, 1, 1)  # naive UTC, rendered with a "Z" suffix


# -- response bodies (also the OpenAPI schema) ---------------------------------------
class Author(BaseModel):
    """A tweet's author; handle and name are null when no profile has been seen."""

    id: str = Field(description="Author id as a decimal string. " + ID_NOTE,
                    examples=["9223372036854775807"])
    handle: str | None
    name: str | None


class TimelineEntry(BaseModel):
    """One hydrated tweet."""

    tweet_id: str = Field(description="Tweet id as a decimal string. " + ID_NOTE,
                          examples=["9223372036854775806"])
    created_at: int = Field(description="Event time in epoch milliseconds.")
    created_at_iso: str = Field(description="created_at as ISO 8601 UTC, e.g. "
                                            "2024-05-01T12:00:00.000Z.")
    text: str
    author: Author


class TimelinePage(BaseModel):
    """A page of a timeline, newest first."""

    user_id: str = Field(description="The user (or author) whose timeline this is. " + ID_NOTE)
    entries: list[TimelineEntry]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) "
                                                "page; null when there is none.")


class Health(BaseModel):
    """Liveness plus what the view has applied (cheap: no table scans)."""

    status: str = Field(examples=["ok"])
    store: str = Field(description="Which store is read (credentials redacted).")
    applied_offsets: dict[str, dict[str, int]] = Field(
        description="Highest applied changelog offset: topic → partition → offset.")


class ErrorBody(BaseModel):
    """Every 4xx/5xx response."""

    error: str = Field(examples=["bad_request"])
    message: str = Field(examples=["user_id must be a decimal integer in [1, 2^63-1]"])
    field: str | None = Field(None, description="The offending parameter, when one is.")


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Bad id, limit or cursor."},
    "4XX": {"model": ErrorBody, "description": "Client error."},
    "5XX": {"model": ErrorBody, "description": "Server error or store unavailable."},
}


# -- the app -------------------------------------------------------------------------
def create_app(settings: ServingSettings, store: Store | None = None) -> FastAPI:
    """The read API; ``store`` if given is the caller's (already open, not closed here)."""
    app = FastAPI(title="fanout read API", version="1", lifespan=_lifespan(settings, store),
                  description="Home timelines as a materialized view. " + ID_NOTE,
                  docs_url="/docs", openapi_url="/openapi.json")
    app.include_router(_timeline_routes(settings))
    app.include_router(_health_routes())
    _install_error_handlers(app)
    app.add_middleware(_ContainErrors)
    return app


def serve(settings: ServingSettings) -> None:
    """Run the API under uvicorn on ``settings.host:settings.port`` until stopped."""
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level="info", access_log=settings.access_log)


def _lifespan(settings: ServingSettings,
              injected: Store | None) -> Callable[[FastAPI], Any]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if injected is not None:
            app.state.store, app.state.store_label = injected, type(injected).__name__
            yield
            return
        store = store_from_url(settings.store_url, cap=settings.timeline_cap).open()
        app.state.store, app.state.store_label = store, _redact(settings.store_url)
        logger.info("serving from %s", app.state.store_label)
        try:
            yield
        finally:
            store.close()

    return lifespan


def _store(request: Request) -> Store:
    store = getattr(request.app.state, "store", None)
    if store is None:
        msg = "the store is not open"
        raise Unavailable(msg)
    return store


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


# -- timelines -----------------------------------------------------------------------


def _timeline_routes(settings: ServingSettings) -> APIRouter:
    home_fn = home_page if settings.read_mode == "fanout" else read_time_page
    router = APIRouter(prefix="/v1/users/{user_id}", tags=["timelines"], responses=_ERRORS)
    user_id_t = Annotated[str, Path(
        description="User id, decimal, in [1, 2^63-1]. " + ID_NOTE,
        examples=["9223372036854775807"])]
    limit_t = Annotated[int | None, Query(
        ge=1, le=settings.max_page,
        description=f"Entries per page, 1..{settings.max_page} "
                    f"(default {settings.default_page}).")]
    cursor_t = Annotated[str | None, Query(
        description="The next_cursor of the previous page; omit for the newest page.")]

    @router.get("/home", summary="Home timeline, newest first")
    def home(request: Request, user_id: user_id_t, limit: limit_t = None,
             cursor: cursor_t = None) -> TimelinePage:
        """Tweets of everyone the user follows (fan-out cache merged with celebrities)."""
        return _timeline(_store(request), home_fn, user_id, cursor,
                         limit or settings.default_page)

    @router.get("/tweets", summary="An author's own tweets, newest first")
    def tweets(request: Request, user_id: user_id_t, limit: limit_t = None,
               cursor: cursor_t = None) -> TimelinePage:
        """The user's own live tweets."""
        return _timeline(_store(request), author_page, user_id, cursor,
                         limit or settings.default_page)

    return router


def _timeline(store: Store, page_fn: PageFn, raw_user: str, cursor: str | None,
              limit: int) -> TimelinePage:
    user = parse_id(raw_user, "user_id")
    page = page_fn(store, user, _below(cursor), limit)
    return TimelinePage(
        user_id=str(user), entries=hydrate(store, page.entries),
        next_cursor=encode_cursor(page.next_key) if page.next_key is not None else None)


def parse_id(raw: str, field: str) -> int:
    """A positive 64-bit id from its decimal form, or :class:`BadRequest` naming ``field``."""
    if not (raw.isascii() and raw.isdigit()):
        msg = f"{field} must be a decimal integer in [1, 2^63-1], got {raw[:40]!r}"
        raise BadRequest(msg, field=field)
    value = int(raw) if len(raw) <= 20 else MAX_ID + 1
    if not 1 <= value <= MAX_ID:
        msg = f"{field} must be in [1, 2^63-1], got {raw[:40]}"
        raise BadRequest(msg, field=field)
    return value


def _below(cursor: str | None) -> Key | None:
    if cursor is None:
        return None
    return decode_cursor(cursor)


def hydrate(store: Store, entries: list[Entry]) -> list[TimelineEntry]:
    """Entries with text and author, in two bulk reads; tweets deleted meanwhile are dropped."""
    if not entries:
        return []
    found = store.tweets([e.tweet_id for e in entries])
    live = [t for e in entries if (t := found.get(e.tweet_id)) is not None and not t.deleted]
    users = store.users(list(dict.fromkeys(t.author_id for t in live))) if live else {}
    return [_entry(t, users.get(t.author_id)) for t in live]


def _entry(tweet: TweetRow, user: UserRow | None) -> TimelineEntry:
    author = Author(id=str(tweet.author_id), handle=user.handle if user else None,
                    name=user.name if user else None)
    return TimelineEntry(tweet_id=str(tweet.tweet_id), created_at=tweet.created_at,
                         created_at_iso=iso_millis(tweet.created_at), text=tweet.text,
                         author=author)


def iso_millis(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds and a ``Z``."""
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds") + "Z"


# -- health --------------------------------------------------------------------------
def _health_routes() -> APIRouter:
    router = APIRouter(tags=["operations"])

    @router.get("/healthz", response_model=Health, summary="Liveness and applied offsets",
                responses={503: {"model": ErrorBody, "description": "Store unreadable."}})
    def healthz(request: Request) -> Any:
        """``ok`` with the applied offsets, or 503 ``degraded`` if the store cannot be read."""
        label = getattr(request.app.state, "store_label", "none")
        try:
            offsets = _store(request).applied_offsets()
        except Exception:
            logger.exception("health check: the store cannot be read")
            return JSONResponse(status_code=503, content={
                "status": "degraded", "store": label, "error": Unavailable.code,
                "message": "the store cannot be read"})
        nested: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            nested.setdefault(topic, {})[str(partition)] = offset
        return Health(status="ok", store=label, applied_offsets=nested)

    return router


# -- errors --------------------------------------------------------------------------
def _install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServingError, _on_serving_error)  # type: ignore[arg-type]
    app.add_exception_handler(StoreError, _on_store_error)
    app.add_exception_handler(RequestValidationError,
                              _on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_unexpected)


def _error(status: int, code: str, message: str, field: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=code, message=message, field=field)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


async def _on_serving_error(request: Request, exc: ServingError) -> JSONResponse:
    return _error(exc.status, exc.code, exc.message, exc.field)


async def _on_store_error(request: Request, exc: Exception) -> JSONResponse:
    logger.error("store error on %s %s: %s", request.method, request.url.path, exc)
    return _error(Unavailable.status, Unavailable.code, "the store cannot be read right now")


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    names = [str(part) for part in first.get("loc", ())[1:]]
    field = ".".join(names) or None
    reason = str(first.get("msg", "invalid request"))
    return _error(400, BadRequest.code, f"{field}: {reason}" if field else reason, field)


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


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal", "internal server error")


class _ContainErrors:
    """Answer an unexpected exception with the JSON 500 and keep the connection.

    The app's ``Exception`` handler alone is not enough: Starlette's
    ServerErrorMiddleware re-raises after answering (so servers can log), and
    uvicorn then closes the keep-alive connection under the client. This sits inside
    it and stops the exception once the 500 has been sent.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            if started:
                raise
            response = await _on_unexpected(Request(scope), exc)
            await response(scope, receive, send)
