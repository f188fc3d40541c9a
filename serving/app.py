"""The HTTP API: routes, hydration, health and the JSON error contract (DESIGN §7).

This module owns the HTTP edge of the read path and composes the rest: timeline
assembly (hybrid merge, read-time fallback) is :mod:`serving.timeline`, cursors
:mod:`serving.cursor`, bearer tokens :mod:`serving.auth`, ``?after=`` waits
:mod:`serving.freshness`, ``/metrics`` :mod:`serving.metrics`, the write routes
:mod:`serving.writes` (producing through ingest's producer, mounted here with
serving's auth). Here a page of ids
becomes JSON: two bulk reads per page (tweets, then their authors), ids rendered as
decimal strings; every failure becomes one JSON shape ``{"error", "message",
"field"?}`` (:mod:`serving.handlers`) — never FastAPI's 422 shape, never HTML.

:func:`create_app` does no I/O: the store is built and opened in the lifespan
handler and the producer connects on the first write, so constructing the app in a
test or a CLI is free (docs/style.md §4). It does check the settings: with auth on and no
secret it raises :class:`~serving.errors.ConfigError` before anything listens.
"""

# No ``from __future__ import annotations``: FastAPI must resolve the parameter types
# that _timeline_routes builds at run time (they carry the configured max_page).

import functools
import gc
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path as FilePath
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ingest.consistency import MAX_TOKEN
from ingest.settings import KafkaSettings
from ingest.snowflake import Snowflake
from ingest.writer import SharedProducer
from serving.activity import ActivityLog
from serving.auth import Auth
from serving.callers import MONITOR_HEADER
from serving.celebrities import CelebrityCache
from serving.errors import ConfigError, Forbidden, Unavailable
from serving.freshness import Freshness
from serving.handlers import ErrorBody, install_error_handlers, on_unexpected
from serving.ids import ID_NOTE, ID_PATH_SCHEMA, parse_id
from serving.metrics import CONTENT_TYPE, Metrics, RequestMetrics, shared_dir, worker_exited
from serving.middleware import BodyLimit, ContainErrors
from serving.pagecache import PageCache
from serving.pageversions import PageVersions
from serving.query import only_query
from serving.reads import FastPath, FastReads, Pages, Read, sent_headers
from serving.render import iso_millis
from serving.settings import STREAM_MAX_LIMIT, ServingSettings
from serving.shapes import NEW_COUNT_CAP, NewCount, TimelinePage
from serving.stream import StreamHub
from serving.switch import Served, ViewFollower, served
from serving.workers import run as run_workers
from serving.writes import write_router
from views import pointer
from views.pointer import ViewRecord
from views.settings import TIMELINE_CAP_ENV
from views.stores import store_from_url
from views.stores.contract import Store, TimelineReader

__all__ = ("create_app", "iso_millis", "serve")

log = logging.getLogger(__name__)


# -- response bodies (also the OpenAPI schema; the timelines' are serving.shapes) ---
class Health(BaseModel):
    """Liveness plus what the view has applied (cheap: no table scans)."""

    status: str = Field(examples=["ok"])
    store: str = Field(description="Which store is read (credentials redacted).")
    broker: str | None = Field(None, description="ok or unreachable; absent when no "
                                                 "broker is configured (writes answer 503).")
    applied_offsets: dict[str, dict[str, int]] = Field(
        description="Highest applied changelog offset: topic → partition → offset.")


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Bad id, limit, cursor, since or consistency "
                                             "token; since with cursor."},
    "4XX": {"model": ErrorBody, "description": "Client error."},
    "5XX": {"model": ErrorBody, "description": "Server error or store unavailable."},
}

_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing, invalid or expired bearer token."},
    403: {"model": ErrorBody, "description": "The token is another user's."},
}


# -- the app -------------------------------------------------------------------------
def create_app(settings: ServingSettings, store: Store | None = None, *,
               kafka: KafkaSettings | None = None, freeze_heap: bool = False,
               metrics_dir: FilePath | None = None, metrics_leader: bool = True) -> FastAPI:
    """The API; ``store`` if given is the caller's (already open, not closed here).

    Writes produce to ``kafka`` (default: the environment's ``KafkaSettings``).
    ``freeze_heap``: once started, move every object alive into the garbage
    collector's permanent generation (``gc.freeze``), so a full collection while
    serving walks only what came after — the 60-120 ms pauses of walking the whole
    app in the middle of reads were most of the open-loop tail. For a
    process that serves one app (:func:`serve`); a test process making many would
    keep each one's cycles forever. ``metrics_dir``: the multiprocess directory of a
    worker of several; ``metrics_leader``: whether this app feeds the series read
    from the store's batch log (one worker of several does; :mod:`serving.metrics`).
    """
    auth = Auth(settings)
    writer = write_producer(settings, kafka or KafkaSettings())
    app = FastAPI(title="fanout API", version="1",
                  lifespan=_lifespan(settings, store, writer, lambda: activity, freeze_heap,
                                     lambda: metrics, lambda: hub),
                  description="Home timelines as a materialized view. " + ID_NOTE,
                  docs_url="/docs", openapi_url="/openapi.json")
    activity = _activity_log(settings, writer)
    freshness = Freshness(settings.after_timeout_ms / 1000, settings.after_max_waiters)
    # fan-out on read (read_mode "read"): every home page is the query, evaluated here
    cache = PageCache(settings.page_cache_mb << 20)
    pages = Pages(cache, freshness, fan_out=settings.read_mode == "fanout", activity=activity)
    metrics = Metrics(lambda: getattr(app.state, "store", None), lambda: writer.stats,
                      lambda: (activity.sent, activity.failed) if activity else None,
                      lambda: (cache.hits, cache.misses), shared=metrics_dir,
                      leader=metrics_leader)
    app.state.streams = hub = StreamHub(settings, pages, app.state, metrics.streams)
    app.include_router(_timeline_routes(settings, auth, pages, hub))
    app.include_router(write_router(
        lambda: writer, auth.acting, timeout=settings.write_timeout_ms / 1000,
        retry_after=settings.retry_after_s, store_of=_store,
        ids=Snowflake(settings.worker_id)))
    app.include_router(_health_routes(writer))
    app.include_router(_metrics_routes(metrics))
    install_error_handlers(app)
    app.add_middleware(ContainErrors, answer=on_unexpected)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    if settings.fast_reads != "off":
        app.state.fast_path = fast = FastPath(pages, app.state, settings.max_page,
                                              settings.default_page, auth.bearer)
        app.add_middleware(FastReads, fast=fast)
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def _activity_log(settings: ServingSettings, writer: SharedProducer) -> ActivityLog | None:
    """Home reads into the activity log, if a broker is configured and it is on."""
    if settings.activity_every_s <= 0 or not writer.settings.bootstrap:
        return None
    return ActivityLog(lambda: writer, settings.activity_every_s)


#: Longest a produce request may go unanswered, and a connection take to be made, before
#: the API's producer drops the connection and sends the records again on a fresh one
#: (milliseconds; a quarter of the delivery timeout if that is less).
STALLED_MS = 10_000


def write_producer(settings: ServingSettings, kafka: KafkaSettings) -> SharedProducer:
    """The producer the write routes share: a 503 at the write timeout, delivery tried on."""
    # The request answers 503 at the write timeout; the record is tried on for the
    # delivery timeout, past a leader failover, so it never times out in flight: that
    # bumps the idempotent producer's epoch, and records retried under the new epoch can
    # land twice (librdkafka#4953). One request in flight per broker: an out-of-order
    # answer behind a failed request bumps the epoch too. Linger 1 ms: writes wait one
    # by one.
    # A request's own timeout is librdkafka's socket.timeout.ms (60 s by default),
    # capped by its oldest record's delivery timeout: a request sent into a cut-off link
    # stays in flight on its dead TCP connection past the heal (the retransmits back
    # off) until its records time out in flight, and holds every write behind it. So a
    # request is given up after STALLED_MS and its records go again, with the same
    # sequence numbers, on a new connection; the broker answers a slow acks=all write
    # (an in-sync replica cut off) before that, with a retriable timeout.
    stalled = max(1_000, min(STALLED_MS, settings.delivery_timeout_ms // 4))
    return SharedProducer(kafka, connect_timeout=settings.write_timeout_ms / 1000,
                          cooldown=settings.retry_after_s, probe_every=settings.broker_check_s,
                          message_timeout_ms=settings.delivery_timeout_ms,
                          socket_timeout_ms=stalled,
                          socket_connection_setup_timeout_ms=stalled,
                          request_timeout_ms=stalled // 2,
                          max_in_flight_requests_per_connection=1, linger_ms=1)


def serve(settings: ServingSettings, kafka: KafkaSettings | None = None) -> None:
    """Run the API under uvicorn on ``settings.host:settings.port`` until stopped.

    Exits with status 2 and one clear log line when the settings cannot work (auth on
    without a secret), before binding the port.
    With ``settings.workers`` > 1 (0: one per core), that many processes serve the
    port (:mod:`serving.workers`).
    """
    kafka = kafka or KafkaSettings()
    try:
        app = create_app(settings, kafka=kafka, freeze_heap=True)
    except ConfigError as exc:
        log.error("cannot start the API: %s", exc.message)
        raise SystemExit(2) from None
    workers = settings.workers or os.cpu_count() or 1
    if workers == 1:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info",
                    access_log=settings.access_log, http="httptools")
        return
    first_id = settings.worker_id if settings.worker_id is not None else secrets.randbelow(1024)

    with shared_dir() as metrics_dir:

        def config(index: int) -> uvicorn.Config:
            # Each process mints tweet ids with its own Snowflake worker id.
            own = settings.model_copy(update={"worker_id": (first_id + index) % 1024})
            app = create_app(own, kafka=kafka, freeze_heap=True, metrics_dir=metrics_dir,
                             metrics_leader=index == 0)
            return uvicorn.Config(app, log_level="info", access_log=settings.access_log,
                                  http="httptools")

        status = run_workers(config, settings.host, settings.port, workers,
                             on_exit=functools.partial(worker_exited, metrics_dir))
    if status:
        raise SystemExit(status)


def _lifespan(settings: ServingSettings, injected: Store | None, writer: SharedProducer,
              activity: Callable[[], ActivityLog | None], freeze_heap: bool,
              metrics: Callable[[], Metrics], hub: Callable[[], StreamHub]
              ) -> Callable[[FastAPI], Any]:
    cache = functools.partial(_celebrity_cache, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        follower = None
        if injected is not None:
            _install(app.state, served(injected, type(injected).__name__, cache,
                                       shards=settings.shards()))
        else:
            follower = _follow_views(settings, app.state, cache)
            log.info("serving from %s (auth %s)", app.state.store_label,
                        "on" if settings.auth else "OFF")
        if freeze_heap:
            gc.collect()
            gc.freeze()
        metrics().start()
        try:
            yield
        finally:
            await hub().close()
            metrics().stop()
            if follower is not None:
                follower.stop()
            app.state.served.close(own_store=injected is None)
            log_ = activity()
            if log_ is not None:
                log_.close()
            writer.close()

    return lifespan


def _install(state: Any, view: Served) -> Served:
    """Make ``view`` the one requests read from now on; return the one it replaces.

    ``state.served`` is what a request resolves once (:mod:`serving.switch`); the
    single fields beside it are for what reads one thing at a time (writes' look-ups,
    metrics, health).
    """
    old = getattr(state, "served", None)
    state.served = view
    state.store, state.versions, state.celebrities = view.store, view.versions, view.celebrities
    state.store_label = view.label
    return old if old is not None else view


def _follow_views(settings: ServingSettings, state: Any,
                  cache: Callable[[TimelineReader, PageVersions], CelebrityCache | None]
                  ) -> ViewFollower | None:
    """Open the store to serve: the pointer file's view if there is one, else store_url.

    With a pointer file, the returned follower switches to whatever view it names
    later (:mod:`serving.switch`).
    """
    def open_view(record: ViewRecord) -> Served:
        cap = int(record.settings.get(TIMELINE_CAP_ENV, settings.timeline_cap))
        store = store_from_url(record.store_url, cap=cap).open()
        return served(store, _redact(record.store_url), cache, record, settings.shards())

    if settings.view_file is None or pointer.read(settings.view_file) is None:
        store = store_from_url(settings.store_url, cap=settings.timeline_cap).open()
        _install(state, served(store, _redact(settings.store_url), cache,
                               shards=settings.shards()))
    if settings.view_file is None:
        return None
    # Grace for a request still on a replaced view: the longest ?after= wait, and more.
    grace = settings.after_timeout_ms / 1000 + 10.0
    return ViewFollower(settings.view_file, open_view, functools.partial(_install, state),
                        lambda: getattr(state, "served", None), grace).start()


def _celebrity_cache(settings: ServingSettings, store: TimelineReader,
                     versions: PageVersions) -> CelebrityCache | None:
    """The in-process cache of celebrities' tweets (none in fan-out-on-read mode)."""
    if settings.read_mode != "fanout" or settings.celebrity_refresh_s <= 0:
        return None
    return CelebrityCache(store, depth=settings.timeline_cap, version=versions.position,
                          refresh_s=settings.celebrity_refresh_s,
                          full_every_s=settings.celebrity_full_reload_s).start()


def _store(request: Request) -> TimelineReader:
    return _served(request).store


def _served(request: Request) -> Served:
    """The view this request reads, all of it (resolved once: :mod:`serving.switch`)."""
    view = getattr(request.app.state, "served", None)
    if view is None:
        msg = "the store is not open"
        raise Unavailable(msg)
    return view


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


# -- timelines -----------------------------------------------------------------------


_NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not modified: If-None-Match named this page's current ETag."},
    404: {"model": ErrorBody, "description": "The account is deleted."}}


def _timeline_routes(settings: ServingSettings, auth: Auth, pages: Pages,
                     hub: StreamHub) -> APIRouter:
    router = APIRouter(prefix="/v1/users/{user_id}", tags=["timelines"], responses=_ERRORS)
    user_id_t = Annotated[str, Path(
        description="User id, decimal, in [1, 2^63-1]. " + ID_NOTE,
        examples=["9223372036854775807"], json_schema_extra=ID_PATH_SCHEMA)]
    limit_t = Annotated[int | None, Query(
        ge=1, le=settings.max_page,
        description=f"Entries per page, 1..{settings.max_page} "
                    f"(default {settings.default_page}).")]
    cursor_t = Annotated[str | None, Query(
        description="The next_cursor of the previous page; omit for the newest page.")]
    after_t = Annotated[str | None, Query(
        max_length=MAX_TOKEN,
        description="A write's consistency token: wait (bounded) until the view has "
                    "applied that write; the page then says whether it had (consistent).")]
    since_t = Annotated[str | None, Query(
        description="A page's top_cursor (or any position cursor): only the entries "
                    "newer than it, newest first; or a since page's gap_cursor: the "
                    "entries of that gap, from the bottom up. Not with cursor.")]
    caller_t = Annotated[int | None, Depends(auth.caller)]
    until_t = Annotated[float | None, Depends(auth.until)]

    def owner(user_id: str, caller: int | None) -> int:
        user = parse_id(user_id, "user_id")
        if caller is not None and caller != user:
            msg = f"the bearer token is user {caller}'s; it cannot read user {user}'s home"
            raise Forbidden(msg, field="user_id")
        return user

    @router.get("/home", summary="Home timeline, newest first", response_model=TimelinePage,
                response_model_exclude_unset=True, responses={**_AUTH_ERRORS, **_NOT_MODIFIED},
                dependencies=[Depends(only_query({"limit", "cursor", "after", "since"}))])
    async def home(request: Request, user_id: user_id_t, caller: caller_t,
                   limit: limit_t = None, cursor: cursor_t = None,
                   after: after_t = None, since: since_t = None) -> Response:
        """Posts, replies and reposts by everyone the user follows (DESIGN §4b).

        Without blocked (either way), muted or deleted accounts, deleted tweets, replies
        to users the reader does not follow, and with one entry per original tweet (its
        newest appearance). A deleted account's home answers 404. With auth on, only the user's own bearer token may read it. Pages without
        ``after`` carry an ``ETag``; ``If-None-Match`` with it answers 304 while the
        page is unchanged.

        With ``since`` (a page's ``top_cursor``): the entries newer than that position,
        newest first, at most ``limit``; if more are new, ``gap`` is true and
        ``gap_cursor``, passed as ``since``, reads the rest from the bottom up (the
        oldest first) until a page says ``gap: false``.
        """
        user = owner(user_id, caller)
        view = _served(request)
        read = Read(view.store, user, cursor, limit or settings.default_page, after,
                    since=since)
        read.monitor = MONITOR_HEADER in request.headers
        return _response(*await pages.answer(view, read, "home",
                                             request.headers.get("if-none-match")))

    @router.get("/home/new_count", summary="How many home entries are new since a position",
                response_model=NewCount, response_model_exclude_unset=True,
                responses={**_AUTH_ERRORS, **_NOT_MODIFIED},
                dependencies=[Depends(only_query({"since", "after"}))])
    async def new_count(request: Request, user_id: user_id_t, caller: caller_t,
                        since: Annotated[str, Query(
                            description="A home page's top_cursor, or a gap_cursor.")],
                        after: after_t = None) -> Response:
        """How many entries ``GET …/home?since=`` would read, at most the cap.

        The same entries, decided by the same filter, but not rendered; the owner's
        token, ``ETag`` and 304 as for the home.
        """
        user = owner(user_id, caller)
        view = _served(request)
        read = Read(view.store, user, None, NEW_COUNT_CAP, after, since=since, count=True)
        read.monitor = MONITOR_HEADER in request.headers
        return _response(*await pages.answer(view, read, "home",
                                             request.headers.get("if-none-match")))

    stream_limit_t = Annotated[int | None, Query(
        ge=1, le=STREAM_MAX_LIMIT,
        description=f"The first page's size the stream follows, 1..{STREAM_MAX_LIMIT} "
                    f"(default {min(settings.default_page, STREAM_MAX_LIMIT)}).")]
    last_event_id_t = Annotated[str | None, Header(
        alias="Last-Event-ID", description="The id of the last event received: the stream "
                                           "sends what changed since.")]

    @router.get("/home/stream", summary="Live changes to the first home page (SSE)",
                response_class=Response, responses={
                    200: {"content": {"text/event-stream": {}},
                          "description": "Server-Sent Events: add, remove, reset, end."},
                    **_AUTH_ERRORS, 404: _NOT_MODIFIED[404],
                    421: {"model": ErrorBody, "description": "The user's pages are in a feed "
                          "shard this API process does not read (FANOUT_FEED_SHARDS); the "
                          "X-Fanout-Feed-Shard header names it: open the stream on one "
                          "that does."}},
                dependencies=[Depends(only_query({"limit"}))])
    async def home_stream(request: Request, user_id: user_id_t, caller: caller_t,
                          until: until_t, limit: stream_limit_t = None,
                          last_event_id: last_event_id_t = None) -> Response:
        """The user's first home page at ``limit``, as it changes (DESIGN §7, *Live stream*).

        ``add`` (``entry`` as ``/home`` renders it, its ``cursor`` and ``index``) and
        ``remove`` (``tweet_id``, ``cursor``) events; applying each and keeping the newest
        ``limit`` entries gives the page ``GET /home`` serves. A first connect sends
        the page as adds. Each event's ``id`` resumes exactly, in any API process:
        reconnect with ``Last-Event-ID``. ``reset``: drop what you hold, the page follows
        as adds (an id past the retention, or of another view); ``end``: the stream
        closes, with a ``reason`` (``too_slow``, ``account_deleted``, ``shutdown``,
        ``token_expired``: when the bearer token expires; reconnect with a new one and
        ``Last-Event-ID``). Comment lines are heartbeats. The owner's token, as for the home.
        """
        user = owner(user_id, caller)
        view = _served(request)
        size = limit or min(settings.default_page, STREAM_MAX_LIMIT)
        return await hub.open(view, user, size, last_event_id, until)

    @router.get("/tweets", summary="An author's own tweets, newest first",
                response_model=TimelinePage, response_model_exclude_unset=True,
                responses=_NOT_MODIFIED,
                dependencies=[Depends(only_query({"limit", "cursor", "after"}))])
    async def tweets(request: Request, user_id: user_id_t, limit: limit_t = None,
                     cursor: cursor_t = None, after: after_t = None) -> Response:
        """The user's own live posts and reposts (public); ETag and 304 as for the home.

        A repost is listed while its original is live; a deleted account's page is 404.
        """
        user = parse_id(user_id, "user_id")
        view = _served(request)
        read = Read(view.store, user, cursor, limit or settings.default_page, after)
        return _response(*await pages.answer(view, read, "tweets",
                                             request.headers.get("if-none-match")))

    return router


def _response(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> Response:
    """A page answer with the headers the fast path sends, in their order."""
    response = Response(body, status_code=status)
    response.raw_headers = sent_headers(status, headers, body)
    return response


# -- health and metrics ----------------------------------------------------------------
def _health_routes(writer: SharedProducer) -> APIRouter:
    router = APIRouter(tags=["operations"])

    @router.get("/healthz", response_model=Health, response_model_exclude_none=True,
                summary="Liveness, broker reachability and applied offsets",
                responses={503: {"model": ErrorBody,
                                 "description": "Store unreadable or broker unreachable."}})
    def healthz(request: Request) -> Any:
        """``ok`` with the applied offsets, or 503 ``degraded``.

        Degraded: the store cannot be read, or the broker is unreachable (asked at
        most every few seconds; the answer is cached in between).
        """
        view = getattr(request.app.state, "served", None)
        label = view.label if view is not None else "none"
        reachable = writer.broker_reachable()
        broker = None if reachable is None else "ok" if reachable else "unreachable"
        try:
            offsets = _served(request).store.applied_offsets()
        except Exception:
            log.exception("health check: the store cannot be read")
            return _degraded(label, broker, "the store cannot be read")
        if broker == "unreachable":
            return _degraded(label, broker, "the broker is unreachable: writes answer 503")
        nested: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            nested.setdefault(topic, {})[str(partition)] = offset
        return Health(status="ok", store=label, broker=broker, applied_offsets=nested)

    return router


def _degraded(store: str, broker: str | None, message: str) -> JSONResponse:
    body = {"status": "degraded", "store": store, "broker": broker,
            "error": Unavailable.code, "message": message}
    return JSONResponse({k: v for k, v in body.items() if v is not None}, status_code=503)


def _metrics_routes(metrics: Metrics) -> APIRouter:
    router = APIRouter(tags=["operations"])

    @router.get("/metrics", summary="Prometheus metrics", response_class=Response,
                responses={200: {"content": {CONTENT_TYPE: {}},
                                 "description": "Prometheus text exposition format."}})
    def prometheus() -> Response:
        """Request latencies, write outcomes, view lag, batches, dead letters, celebrities."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return router
